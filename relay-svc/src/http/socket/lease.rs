//! A key's Responses sockets across the relays (docs/DESIGN.md §6, "Codex over WebSocket"):
//! each open socket holds a lease that admission counts like a key's requests in flight.

use std::time::Duration;

/// The lease account of every socket lease: no account has it, so no account's limits,
/// cooldown or load are touched; only the key gate counts.
pub const SOCKET_LEASE_ACCOUNT: i64 = i64::MAX;

/// Where a key's sockets are counted: its id moved past every key id, so its requests' own
/// concurrency (counted by its id) is another count.
pub const SOCKET_KEY_BASE: i64 = 1 << 62;

/// A key's socket as a lease held for the socket's life (docs/DESIGN.md §6, "Codex over
/// WebSocket"): admission counts the key's sockets across the relays as it counts a key's
/// requests in flight, renews the lease while the socket lives and reaps it when its relay
/// dies. `Err` when the key has `per_key` open; `Ok(None)` when admission cannot answer (the
/// socket opens: each turn still takes its own lease, and this relay's own bound holds).
pub(super) async fn socket_lease(
    relay: &crate::proxy::Relay,
    key: i64,
    per_key: usize,
) -> Result<Option<Box<dyn crate::ports::Lease>>, ()> {
    use poolgate_core::lease::{DenyReason, KeyLimits, LeaseTerms};
    if key <= 0 || key >= SOCKET_KEY_BASE {
        return Ok(None);
    }
    let terms = LeaseTerms {
        account_id: SOCKET_LEASE_ACCOUNT,
        concurrency_limit: 0,
        rpm_limit: 0,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: true,
        key: Some(KeyLimits {
            api_key_id: SOCKET_KEY_BASE + key,
            concurrency_limit: i32::try_from(per_key).unwrap_or(i32::MAX),
            tpm_limit: 0,
            budget_total_micros: 0,
            budget_day_micros: 0,
            budget_week_micros: 0,
            budget_month_micros: 0,
        }),
    };
    match relay.leases.acquire(terms, Duration::ZERO).await {
        Ok(crate::ports::Acquired::Granted(lease)) => Ok(Some(lease)),
        Ok(crate::ports::Acquired::Denied(denial))
            if denial.reason == DenyReason::KeyConcurrency =>
        {
            Err(())
        }
        Ok(crate::ports::Acquired::Denied(denial)) => {
            tracing::warn!(reason = ?denial.reason, "socket lease not taken; the socket opens on this relay's bound alone");
            Ok(None)
        }
        Err(error) => {
            tracing::warn!(%error, "socket lease not taken; the socket opens on this relay's bound alone");
            Ok(None)
        }
    }
}
