//! Sticky sessions and response bindings: which account a request is bound to (read through a
//! short local cache, its TTL touched at most once a minute), binding a session or a response
//! to the account that served it, and refusing a response id bound for another client key.

use std::time::{Duration, Instant};

use crate::health::StateError;
use poolgate_core::{AccountId, millis};

use super::{SelectQuery, Selector, SelectorError};

/// A binding as this replica last read or wrote it, and when its TTL was last refreshed.
pub(super) struct StickyEntry {
    account: AccountId,
    fetched: Instant,
    touched: Instant,
}

/// How long a binding read from Redis is trusted locally, and how often its TTL is refreshed.
const STICKY_LOCAL: Duration = Duration::from_secs(5);
const STICKY_TOUCH: Duration = Duration::from_secs(60);

/// The response binding of `response_id` for one client key (0: an older relay's, unscoped).
/// The key's digits end at the first `:`, so no two (key, id) pairs share a name. Bindings of
/// the plain `<id>` form (before response bindings were scoped) are no longer read: they were
/// dropped once on upgrade (docs/SECURITY.md).
pub fn scoped_response(api_key_id: i64, response_id: &str) -> String {
    format!("k{api_key_id}:{response_id}")
}

/// Marks `response_id` as bound by poolgate for some client key (whichever: the mark does not
/// say), so another key's request naming it is refused instead of passed as unknown.
fn marked_response(response_id: &str) -> String {
    format!("any:{response_id}")
}

/// Session bindings are at most this many bytes.
const MAX_BINDING_BYTES: usize = 128;

/// The name a session is bound under: the session of client key `api_key_id`. Two keys sending
/// the same session id, or the same system prompt and first turn, never share a binding (a
/// client cannot steer its requests onto the account another key's conversation uses). At most
/// 128 bytes: a longer name is hashed (hex, so never of the `k<id>:` form). The one place a
/// binding's scope is decided: the engine's API applies it, and the gRPC client sends the name
/// it gives (the selector's wire carries the scoped name, `SelectRequest.session_hash`).
pub fn binding_key(api_key_id: i64, session: &str) -> String {
    let key = format!("k{api_key_id}:{session}");
    if key.len() > MAX_BINDING_BYTES {
        poolgate_core::short_hash(&key)
    } else {
        key
    }
}

impl Selector {
    /// The account bound to this request: the previous response's account (a binding of the
    /// request's own client key), else the session's. A Redis failure means "no binding", never
    /// an error.
    pub(super) async fn binding(&self, query: &SelectQuery) -> Option<AccountId> {
        if let Some(response_id) = &query.previous_response_id {
            let scoped = scoped_response(query.api_key_id, response_id);
            match self.health.response_get(&scoped).await {
                Ok(Some(id)) => return Some(id),
                Ok(None) => {}
                Err(error) => tracing::debug!(%error, "response binding unreadable"),
            }
        }
        let session = query.session_hash.as_ref()?;
        let key = (query.group.clone(), session.clone());
        {
            let now = self.clock.now();
            let mut cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(entry) = cache.get_mut(&key)
                && now.saturating_duration_since(entry.fetched) < STICKY_LOCAL
            {
                if now.saturating_duration_since(entry.touched) >= STICKY_TOUCH {
                    entry.touched = now;
                    let (health, ttl) = (self.health.clone(), millis(self.settings.sticky_ttl));
                    let (group, session) = key.clone();
                    tokio::spawn(async move {
                        let _ = health.sticky_touch(&group, &session, ttl).await;
                    });
                }
                return Some(entry.account);
            }
        }
        match self.health.sticky_get(&query.group, session).await {
            Ok(Some(account)) => {
                let now = self.clock.now();
                let mut cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
                let touched = cache.get(&key).map_or(now, |e| e.touched);
                if cache.len() > 100_000 {
                    cache.retain(|_, e| now.saturating_duration_since(e.fetched) < STICKY_LOCAL);
                }
                cache.insert(
                    key,
                    StickyEntry {
                        account,
                        fetched: now,
                        touched,
                    },
                );
                Some(account)
            }
            Ok(None) => None,
            Err(error) => {
                tracing::debug!(%error, "sticky binding unreadable; selecting without it");
                None
            }
        }
    }

    /// Binds a session to the account that served it; returns `hit`, `bound` or `rebind`.
    pub async fn bind_session(
        &self,
        group: &str,
        session: &str,
        account: AccountId,
    ) -> Result<&'static str, SelectorError> {
        // Bound here already and refreshed within a minute: a hit, no write (the binding's TTL is
        // refreshed at most once a minute).
        let now = self.clock.now();
        let cached_hit = {
            let cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
            cache
                .get(&(group.to_owned(), session.to_owned()))
                .is_some_and(|entry| {
                    entry.account == account
                        && now.saturating_duration_since(entry.touched) < STICKY_TOUCH
                })
        };
        if cached_hit {
            let platform = self
                .snapshot
                .get()
                .account(account)
                .map(|a| a.platform.as_str())
                .unwrap_or("unknown");
            self.metrics
                .sticky
                .with_label_values(&["hit", platform])
                .inc();
            return Ok("hit");
        }
        let previous = self
            .health
            .sticky_set(group, session, account, millis(self.settings.sticky_ttl))
            .await
            .map_err(|e| SelectorError::Unavailable(e.to_string()))?;
        let result = match previous {
            Some(id) if id == account => "hit",
            Some(_) => "rebind",
            None => "bound",
        };
        {
            let mut cache = self.sticky_cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.insert(
                (group.to_owned(), session.to_owned()),
                StickyEntry {
                    account,
                    fetched: self.clock.now(),
                    touched: self.clock.now(),
                },
            );
        }
        let platform = self
            .snapshot
            .get()
            .account(account)
            .map(|a| a.platform.as_str())
            .unwrap_or("unknown");
        self.metrics
            .sticky
            .with_label_values(&[result, platform])
            .inc();
        Ok(result)
    }

    /// Binds a response id to its account without a client key (an older relay's binding):
    /// found only by requests without a key, refused to none.
    pub async fn bind_response(
        &self,
        response_id: &str,
        account: AccountId,
    ) -> Result<(), SelectorError> {
        self.bind_response_for_key(0, response_id, account).await
    }

    /// Binds a response id to the account that produced it, for the client key it was made for
    /// (`api_key_id`; 0: none): only that key's requests continue it on the account, another
    /// key's are refused (`response_of_another_key`).
    pub async fn bind_response_for_key(
        &self,
        api_key_id: i64,
        response_id: &str,
        account: AccountId,
    ) -> Result<(), SelectorError> {
        let ttl = millis(self.settings.response_ttl);
        let unavailable = |e: StateError| SelectorError::Unavailable(e.to_string());
        // The key's own binding first: a mark without it would refuse the key its own response.
        self.health
            .response_set(&scoped_response(api_key_id, response_id), account, ttl)
            .await
            .map_err(unavailable)?;
        if api_key_id != 0 {
            self.health
                .response_set(&marked_response(response_id), account, ttl)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    /// Whether the query's `previous_response_id` was bound by poolgate for another client key:
    /// such a request is refused and never reaches an account (the upstream serves any response
    /// id of its organisation to whoever holds the credential). An id poolgate never bound
    /// passes, as does a query without a key (an older relay). A binding that cannot be read is
    /// an error: the request is not sent on a guess.
    pub async fn response_of_another_key(
        &self,
        query: &SelectQuery,
    ) -> Result<bool, SelectorError> {
        let Some(response_id) = query
            .previous_response_id
            .as_deref()
            .filter(|_| query.api_key_id != 0)
        else {
            return Ok(false);
        };
        let unavailable = |e: StateError| SelectorError::Unavailable(e.to_string());
        let own = self
            .health
            .response_get(&scoped_response(query.api_key_id, response_id))
            .await
            .map_err(unavailable)?;
        if own.is_some() {
            return Ok(false);
        }
        let bound = self
            .health
            .response_get(&marked_response(response_id))
            .await
            .map_err(unavailable)?;
        if bound.is_some() {
            return Ok(true);
        }
        // Bound to no one: whose it is cannot be checked when the bindings may have been lost
        // since it was made (Redis wiped, within the bindings' ttl): refused, never sent on a
        // guess (docs/SECURITY.md, "Bindings are the client key's own").
        let now = self.clock.wall_ms();
        let since = self.health.kept_since_ms(now).await.map_err(unavailable)?;
        let ttl = i64::try_from(self.settings.response_ttl.as_millis()).unwrap_or(i64::MAX);
        Ok(now.saturating_sub(since) < ttl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_bound_per_client_key() {
        assert_eq!(binding_key(7, "sess"), "k7:sess");
        assert_ne!(binding_key(7, "sess"), binding_key(8, "sess"));
        // The key's digits end at the first `:`: no other (key, session) pair gives the name.
        assert_ne!(binding_key(1, "2:s"), binding_key(12, "s"));
        let long = "s".repeat(MAX_BINDING_BYTES);
        assert_eq!(binding_key(7, &long).len(), 32);
        assert_ne!(binding_key(7, &long), binding_key(8, &long));
    }
}
