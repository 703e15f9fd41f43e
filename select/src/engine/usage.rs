//! The usage ledger's intake: records as every transport delivers them (the relays' batches
//! over gRPC, the standalone relay's sink), checked and written through the account source.

use poolgate_core::MAX_NAME_BYTES;
use poolgate_core::plan::UsageRecord;

use super::{Selector, SelectorError};
use crate::source::UsageInput;

/// Most records one batch may carry.
pub const MAX_USAGE_RECORDS: usize = 1000;
/// Longest model name a record may carry.
pub const MAX_MODEL_BYTES: usize = 256;

impl Selector {
    /// Checks and writes a batch of usage records; answers how many the ledger took. A batch
    /// with one bad record is refused whole, naming the field (nothing is written).
    pub async fn record_usage(&self, records: Vec<UsageRecord>) -> Result<u64, SelectorError> {
        if records.len() > MAX_USAGE_RECORDS {
            return Err(SelectorError::invalid(
                "records",
                format!("at most {MAX_USAGE_RECORDS} per call"),
            ));
        }
        let inputs = records
            .into_iter()
            .map(usage_input)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(self.source.insert_usage(&inputs).await?)
    }
}

fn usage_input(record: UsageRecord) -> Result<UsageInput, SelectorError> {
    if !(record.cost_usd.is_finite() && record.cost_usd >= 0.0) {
        return Err(SelectorError::invalid(
            "records.cost_usd",
            "must be finite and >= 0",
        ));
    }
    if record.user.len() > MAX_NAME_BYTES || record.model.len() > MAX_MODEL_BYTES {
        return Err(SelectorError::invalid("records", "user or model too long"));
    }
    let tokens = |n: u64| {
        i64::try_from(n).map_err(|_| SelectorError::invalid("records", "token count out of range"))
    };
    Ok(UsageInput {
        api_key_id: (record.api_key_id > 0).then_some(record.api_key_id),
        user: record.user,
        account_id: (record.account_id > 0).then_some(record.account_id),
        model: record.model,
        input_tokens: tokens(record.input_tokens)?,
        output_tokens: tokens(record.output_tokens)?,
        cache_write_tokens: tokens(record.cache_write_tokens)?,
        cache_read_tokens: tokens(record.cache_read_tokens)?,
        cost_usd: record.cost_usd,
        price_source: record.price_source,
        status: i32::from(record.status),
        latency_ms: i32::try_from(record.latency_ms).unwrap_or(i32::MAX),
        at_ms: (record.at_ms > 0).then(|| i64::try_from(record.at_ms).unwrap_or(i64::MAX)),
    })
}
