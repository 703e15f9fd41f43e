//! An account's live state as selection reads it (the health stores fill it in).

/// Breaker state as selection sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    Closed,
    /// Open for this many more ms.
    Open(u64),
    /// The open period ended: one probe may go through.
    HalfOpen,
}

/// One account's live state, read in one pipelined batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccountHealth {
    /// Live leases; `None` when unknown (last known blocks kept through a Redis outage).
    pub inflight: Option<u32>,
    /// Remaining hard block, ms (0: none).
    pub hard_block_ms: u64,
    /// Remaining soft block, ms (0: none).
    pub soft_block_ms: u64,
    pub breaker: Breaker,
    /// Consecutive broken outcomes counted toward the breaker.
    pub failures: u32,
}

impl AccountHealth {
    pub const HEALTHY: AccountHealth = AccountHealth {
        inflight: Some(0),
        hard_block_ms: 0,
        soft_block_ms: 0,
        breaker: Breaker::Closed,
        failures: 0,
    };
}
