//! A client key as its holder sees it (the self-service view, docs/DESIGN.md §6 "What a client
//! key reaches"): its own record and its usage per period, never another key's.

use poolgate_core::keys::{KeyDescription, PeriodUsage, UsagePeriod};

use crate::crypto::api_key_hash;

use super::{Selector, SelectorError};

impl Selector {
    /// Describes the key `api_key` to its holder: its record (a disabled or expired key too, so
    /// its holder learns why it is refused) and its usage in each of `UsagePeriod::ALL`, summed
    /// from the usage ledger up to now. An unknown or revoked key is `Unauthenticated`, with the
    /// same words for both (what a key is not, nobody learns from this call).
    pub async fn describe_key(&self, api_key: &str) -> Result<KeyDescription, SelectorError> {
        let record = match self.snapshot.get().api_key(&api_key_hash(api_key)) {
            Some(record) if record.active => record.clone(),
            _ => return Err(SelectorError::Unauthenticated("invalid API key".into())),
        };
        let now = poolgate_core::now_ms();
        let mut usage = Vec::with_capacity(UsagePeriod::ALL.len());
        for period in UsagePeriod::ALL {
            let from = period.start_ms(now);
            // `now + 1`: the ledger's range is half-open, and a record written this millisecond
            // belongs to the answer.
            let totals = self.source.read_usage(record.id, from, now + 1).await?;
            usage.push((
                period,
                from,
                PeriodUsage {
                    requests: totals.requests,
                    input_tokens: totals.input_tokens,
                    output_tokens: totals.output_tokens,
                    cost_usd: totals.cost_usd,
                },
            ));
        }
        Ok(KeyDescription { record, usage })
    }
}
