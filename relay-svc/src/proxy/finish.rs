//! Bookkeeping after the answer's last byte, off the client's latency path: the lease released
//! with the request's spend and tokens, the success reported, the session and response bound,
//! the usage record queued.

use std::sync::Arc;
use std::time::Instant;

use poolgate_core::classify::Classified;
use poolgate_core::money::usd_to_micros;
use poolgate_core::outcome::OutcomeClass;
use poolgate_core::price::PriceSource;

use super::{Inbound, Relay};
use crate::ports::{Caller, Lease, PlannedAccount, UsageRecord};
use crate::usage::{SseScanner, Usage};

/// Bookkeeping after the last byte: report, bind, spend on release, usage record.
pub(super) struct Finish {
    pub(super) relay: Arc<Relay>,
    pub(super) account: PlannedAccount,
    caller: Caller,
    session_hash: Option<String>,
    model: String,
    started: Instant,
    status: u16,
    /// Ungoverned requests (count_tokens) change no shared state: no outcome report, no binding.
    pub(super) governed: bool,
}

impl Finish {
    /// The bookkeeping of `inbound`'s answer from `account` (`status`), started at `started`.
    pub(super) fn new(
        relay: Arc<Relay>,
        inbound: &Inbound,
        account: &PlannedAccount,
        started: Instant,
        status: u16,
    ) -> Self {
        Finish {
            relay,
            account: account.clone(),
            caller: inbound.caller.clone(),
            session_hash: inbound.session_hash.clone(),
            model: inbound.model.clone(),
            started,
            status,
            governed: !inbound.ungoverned,
        }
    }

    /// Binds the conversation to the account that answered it (sticky sessions), for the
    /// caller's key only.
    pub(super) async fn bind_session(&self) {
        if !self.governed {
            return;
        }
        if let Some(session) = &self.session_hash {
            self.relay
                .bind_session(
                    self.caller.api_key_id,
                    &self.caller.group,
                    session,
                    self.account.id,
                )
                .await;
        }
    }

    /// Binds a response's `resp_` id to the account that produced it, for the caller's key
    /// only: another key naming it is refused (docs/SECURITY.md).
    pub(super) async fn bind_response(&self, response_id: &str) {
        if !self.governed {
            return;
        }
        self.relay
            .bind_response(self.caller.api_key_id, response_id, self.account.id)
            .await;
    }

    /// Binds a streamed response's `resp_` id the first time the scanner has seen it.
    pub(super) async fn bind_response_once(&self, scanner: &SseScanner, bound: &mut bool) {
        if *bound || !self.governed {
            return;
        }
        if let Some(response_id) = &scanner.response_id {
            self.bind_response(response_id).await;
            *bound = true;
        }
    }

    /// Release, outcome report, usage. The session and response bindings are made earlier,
    /// before the client can ask again.
    pub(super) async fn run(self, lease: Box<dyn Lease>, usage: Usage, succeeded: bool) {
        let priced = &self.account.price;
        let cost = usage.cost_usd(&priced.price);
        if usage != Usage::default() && !priced.is_stated() {
            self.relay.note_unpriced(
                &self.account.mapped_model,
                priced.source,
                &priced.fallback_from,
            );
        }
        // Spend and tokens travel with the release, in the same script: the account's session
        // window and the client key's budgets and TPM are charged from them.
        lease.release(cost, usage.tokens()).await;
        if succeeded && self.governed {
            let success = Classified {
                class: OutcomeClass::Success,
                reset_at_ms: None,
                label: "success",
            };
            self.relay
                .report(self.account.id, &success, self.status, "", None)
                .await;
        }
        self.relay
            .metrics
            .spend_micros
            .inc_by(usd_to_micros(cost).unwrap_or(0).max(0) as u64);
        self.relay.usage.record(UsageRecord {
            api_key_id: self.caller.api_key_id,
            user: self.caller.user.clone(),
            account_id: self.account.id,
            model: self.model.clone(),
            input_tokens: usage.input,
            output_tokens: usage.output,
            cache_write_tokens: usage.cache_write,
            cache_read_tokens: usage.cache_read,
            cost_usd: cost,
            price_source: Some(priced.source),
            status: self.status,
            latency_ms: self.started.elapsed().as_millis().min(u32::MAX as u128) as u32,
            at_ms: self.relay.clock.wall_ms().max(0) as u64,
        });
    }
}

/// Models whose answers had tokens but no price of their own, each logged once (bounded: past 1 000
/// models only the counter grows).
#[derive(Default)]
pub struct UnpricedModels {
    seen: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl UnpricedModels {
    /// Whether `model` is new here (and so worth a log line).
    fn first_time(&self, model: &str) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.len() < 1000 && seen.insert(model.to_owned())
    }
}

impl Relay {
    /// Counts an answer whose model has no price of its own (`source` is a fallback or none),
    /// and logs each such model once.
    fn note_unpriced(&self, model: &str, source: PriceSource, fallback_from: &str) {
        let pricing = if source == PriceSource::Fallback {
            "fallback"
        } else {
            "none"
        };
        self.metrics
            .unpriced_usage
            .with_label_values(&[pricing])
            .inc();
        if self.unpriced_models.first_time(model) {
            if source == PriceSource::Fallback {
                tracing::warn!(
                    model,
                    fallback_from,
                    "no price for this model: its usage is charged at its family's highest catalogue price (set a price)"
                );
            } else {
                tracing::warn!(
                    model,
                    "no price for this model: its usage is recorded at $0 (set a price)"
                );
            }
        }
    }
}
