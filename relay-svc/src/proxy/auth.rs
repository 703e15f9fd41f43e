//! Client authentication: the selector's answer for a key, reused for `auth_cache_ttl` so a
//! revoked or disabled key is refused within a second and a key in steady use costs one call
//! per ttl, not one per request. And what a key may reach once known: its own response ids
//! only, and `count_tokens` at its own rates (docs/DESIGN.md §6, "What a client key reaches";
//! its expiry, disable and lists are `keys.rs`).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode};
use poolgate_core::lease::{DenyReason, KeyLimits, LeaseTerms, UserLimit};
use poolgate_core::short_hash;

use super::{Answer, Body, Inbound, Relay};
use crate::client_api::{Api, ErrorKind, RelayError};
use crate::ports::{Acquired, Caller, KeyCheck, KeyLimit, PlannedAccount};

/// Key checks kept at once (`TtlCache`'s bound): a flood of distinct keys costs selector calls,
/// never memory.
pub(super) const MAX_CACHED_CHECKS: usize = 100_000;

/// `count_tokens` requests one account takes a minute, from all clients together: Claude Code
/// calls it alongside its messages, and it must not hammer an upstream that limits it apart.
pub(super) const COUNT_TOKENS_ACCOUNT_RPM: i32 = 60;

/// Key checks a relay has in flight at once, and how long one waits for its turn.
pub(super) const MAX_KEY_LOOKUPS: usize = 64;
const KEY_LOOKUP_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The admission bucket of a user's `count_tokens` rate: apart from the user's Messages bucket
/// (keyed by the user alone), so counting tokens never spends a request of the user's RPM.
/// Per-key limits can join it under their own name. At most 128 bytes (admission's bound on a
/// name): a longer user is hashed.
pub(super) fn count_tokens_user_bucket(user: &str) -> String {
    let bucket = format!("{user}:count_tokens");
    if bucket.len() > poolgate_core::MAX_NAME_BYTES {
        format!("{}:count_tokens", short_hash(user))
    } else {
        bucket
    }
}

/// The admission bucket of an account's `count_tokens` cap.
pub(super) fn count_tokens_account_bucket(account_id: i64) -> String {
    format!("account:{account_id}:count_tokens")
}

/// The answer to a request whose `previous_response_id` poolgate bound for another client key:
/// what the upstream answers for an id it does not know (so the request learns nothing about
/// whose it is), and no account is called.
pub(super) fn previous_response_refusal(api: Api, response_id: &str) -> Answer {
    let message = format!("Previous response with id '{response_id}' not found.");
    let body = match api {
        Api::OpenAi => serde_json::json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }}),
        Api::Anthropic | Api::Cohere => RelayError::new(api, ErrorKind::NotFound, message).body(),
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Answer::Upstream {
        status: StatusCode::NOT_FOUND,
        headers,
        body: Body::Full(Bytes::from(body.to_string())),
    }
}

impl Relay {
    /// Authenticates a client key, reusing the selector's answers for `auth_cache_ttl` (so a
    /// revoked or disabled key is refused within a second of the change). A key refused as a
    /// whole (disabled, expired) gets that refusal, counted; a known key's expiry is checked
    /// again with the relay's clock, so it takes effect between two lookups too.
    pub async fn authenticate(&self, api: Api, key: Option<&str>) -> Result<Caller, RelayError> {
        match self.check_key(api, key).await? {
            KeyCheck::Known(caller) => match caller.access.check_key(self.clock.wall_ms()) {
                Ok(()) => Ok(caller),
                Err(refusal) => Err(self.key_refused(api, refusal.into())),
            },
            KeyCheck::Refused(refused) => Err(self.key_refused(api, refused)),
            KeyCheck::Unknown => Err(invalid_key(api)),
        }
    }

    /// The selector's answer for a client key, cached for `auth_cache_ttl` (a refusal and an
    /// unknown key too: a flood of one bad key costs one lookup per ttl).
    pub(super) async fn check_key(
        &self,
        api: Api,
        key: Option<&str>,
    ) -> Result<KeyCheck, RelayError> {
        let key = valid_key(api, key)?;
        if let Some(answer) = self.auth_cache.get(key) {
            return Ok(answer);
        }
        let answer = {
            let _permit = self.key_lookup_permit(api).await?;
            self.selection.check_key(key).await.map_err(|error| {
                tracing::debug!(%error, "client key check unavailable");
                unavailable(api, "authentication is unavailable; try again")
            })?
        };
        self.auth_cache.insert(key, answer.clone());
        Ok(answer)
    }

    /// A turn to ask the selector about a key not seen within the cache TTL: at most
    /// `MAX_KEY_LOOKUPS` at once, each waiting at most `KEY_LOOKUP_WAIT` for its turn.
    pub(super) async fn key_lookup_permit(
        &self,
        api: Api,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, RelayError> {
        match tokio::time::timeout(KEY_LOOKUP_WAIT, self.auth_lookups.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(unavailable(
                api,
                "too many API key checks at once; try again",
            )),
        }
    }
}

/// The key as sent, when it may be one (non-empty, at most 256 bytes).
pub(super) fn valid_key(api: Api, key: Option<&str>) -> Result<&str, RelayError> {
    key.filter(|k| !k.is_empty() && k.len() <= 256)
        .ok_or_else(|| {
            RelayError::new(
                api,
                ErrorKind::Authentication,
                "missing or malformed API key (x-api-key or Authorization: Bearer)",
            )
        })
}

/// 401 for a key the selector does not know (or knows as revoked: the same words).
pub(super) fn invalid_key(api: Api) -> RelayError {
    RelayError::new(api, ErrorKind::Authentication, "invalid API key")
}

/// 503, try again in a second.
pub(super) fn unavailable(api: Api, message: &str) -> RelayError {
    RelayError::new(api, ErrorKind::Overloaded, message).retry_after_ms(1000)
}

impl Relay {
    /// Charges a `count_tokens` request to its user's own rate (default: the user's RPM), once
    /// per request, before any account's cap is asked: `Some(429)` past it. The key's budget and
    /// TPM are asked with it (a key whose budget is used up is refused everything; count_tokens
    /// holds none of the key's concurrency slots and charges it nothing: docs/DESIGN.md §6).
    /// Nothing when neither applies; an admission that does not answer leaves the decision to
    /// the account leases that follow (they ask the same admission).
    pub(super) async fn charge_count_tokens(
        &self,
        inbound: &Inbound,
        account: &PlannedAccount,
    ) -> Option<Answer> {
        let caller = &inbound.caller;
        let user = (caller.user_rpm_limit > 0).then(|| UserLimit {
            user_id: count_tokens_user_bucket(&caller.user),
            rpm_limit: caller.user_rpm_limit,
        });
        let key = caller
            .key_limits()
            .map(|limits| KeyLimits {
                concurrency_limit: 0,
                ..limits
            })
            .filter(KeyLimits::any);
        if user.is_none() && key.is_none() {
            return None;
        }
        // A lease of no account limits: admission charges the user bucket, asks the key's
        // gates and grants at once; releasing it keeps the user's charge.
        let terms = LeaseTerms {
            account_id: account.id,
            concurrency_limit: 0,
            rpm_limit: 0,
            user,
            session_hash: None,
            session_window_limit_micros: 0,
            session_bound: false,
            ignore_cooldown: false,
            key,
        };
        match self.leases.acquire(terms, Duration::ZERO).await {
            Ok(Acquired::Granted(lease)) => {
                lease.release(0.0, 0).await;
                None
            }
            Ok(Acquired::Denied(denial)) if denial.reason == DenyReason::UserRpm => {
                Some(Answer::Error(
                    RelayError::new(
                        inbound.api,
                        ErrorKind::RateLimited,
                        "you sent too many count_tokens requests this minute",
                    )
                    .retry_after_ms(denial.retry_after_ms.max(1000)),
                ))
            }
            Ok(Acquired::Denied(denial)) if KeyLimit::of(denial.reason).is_some() => {
                Some(self.key_limited(inbound.api, denial))
            }
            Ok(Acquired::Denied(_)) => None,
            Err(error) => {
                tracing::warn!(%error, "admission unavailable for the count_tokens rate");
                None
            }
        }
    }
}
