//! A client key's slot in Redis: which of its keys (`poolgate_runtime::redis_keys::ClientKeyKeys`,
//! all in the hash slot of `{k:<api_key_id>}`) a script takes, the script arguments of its gate
//! and its charge, and on a Cluster (where the slot is another node's) the backend's own
//! operations on it.

use poolgate_core::lease::{Denial, LeaseId, Renewal};
use poolgate_runtime::error::StateError;
use poolgate_runtime::redis_keys::{AccountKeys, ClientKeyKeys};

use super::{RedisBackend, reply, uncertain};
use crate::backend::{AcquireLimits, KeyCharge, KeyGate};

/// Pushes the key's 8 KEYS in the order the scripts take them (`KEY_PRELUDE` in `scripts.rs`).
pub(super) fn push(keys: &ClientKeyKeys, invocation: &mut redis::ScriptInvocation<'_>) {
    invocation
        .key(&keys.leases)
        .key(&keys.released)
        .key(&keys.tpm)
        .key(&keys.billed);
    for spend in &keys.spend {
        invocation.key(spend);
    }
}

/// The keys an acquire's gate reads: the budget counters of the gate's periods.
pub(super) fn for_gate(gate: &KeyGate) -> ClientKeyKeys {
    ClientKeyKeys::new(
        gate.api_key_id,
        [
            gate.budgets[0].period_id.as_str(),
            gate.budgets[1].period_id.as_str(),
            gate.budgets[2].period_id.as_str(),
            gate.budgets[3].period_id.as_str(),
        ],
    )
}

/// The keys a release charges: the charge's periods, or the slot alone without a charge.
pub(super) fn for_charge(api_key_id: i64, charge: Option<&KeyCharge>) -> ClientKeyKeys {
    match charge {
        Some(charge) => ClientKeyKeys::new(
            api_key_id,
            [
                charge.periods[0].0.as_str(),
                charge.periods[1].0.as_str(),
                charge.periods[2].0.as_str(),
                charge.periods[3].0.as_str(),
            ],
        ),
        None => ClientKeyKeys::slot_only(api_key_id),
    }
}

/// The gate's ARGV (see `KEY_PRELUDE`).
pub(super) fn gate_args(invocation: &mut redis::ScriptInvocation<'_>, gate: &KeyGate) {
    invocation
        .arg(gate.concurrency_limit)
        .arg(gate.tpm_limit)
        .arg(gate.tpm_window_ms);
    for budget in &gate.budgets {
        invocation.arg(budget.limit_micros).arg(budget.resets_in_ms);
    }
}

/// The charge flag and ARGV (see `KEY_PRELUDE`); a release without a charge sends zeros.
pub(super) fn charge_args(
    invocation: &mut redis::ScriptInvocation<'_>,
    charge: Option<&KeyCharge>,
) {
    match charge {
        Some(charge) => {
            invocation
                .arg(1)
                .arg(charge.tokens)
                .arg(charge.spend_micros.max(0))
                .arg(charge.tpm_window_ms);
            for (_, ttl) in &charge.periods {
                invocation.arg(*ttl);
            }
        }
        None => {
            invocation.arg(0).arg(0).arg(0).arg(0);
            for _ in 0..4 {
                invocation.arg(0);
            }
        }
    }
}

impl RedisBackend {
    /// Cluster: takes the lease's slot of its key (another hash slot) before the account's
    /// script runs; `Some` when the key refuses (nothing written).
    pub(super) async fn charge_key(
        &self,
        gate: &KeyGate,
        key_keys: &ClientKeyKeys,
        lease_id: &LeaseId,
        limits: AcquireLimits,
    ) -> Result<Option<Denial>, StateError> {
        let mut invocation = self.scripts.key_acquire.prepare_invoke();
        push(key_keys, &mut invocation);
        invocation.arg(lease_id.as_str()).arg(limits.ttl_ms);
        gate_args(&mut invocation, gate);
        let mut conn = self.redis.conn().await?;
        let reply = tokio::time::timeout(
            self.redis.timeout(),
            invocation.invoke_async::<(String, u64, i64)>(&mut conn),
        )
        .await;
        match reply {
            Ok(Ok((reason, retry, now))) => {
                self.learn_clock(now);
                reply::acquire_denial(&reason, retry)
            }
            Ok(Err(error)) => Err(StateError::from(error)),
            Err(_) => {
                uncertain::remove_uncertain_key_slot(key_keys.leases.clone(), lease_id, conn);
                Err(StateError::Timeout)
            }
        }
    }

    /// Cluster: gives back a key slot charged for an acquire the account refused.
    pub(super) async fn refund_key(&self, key_keys: &ClientKeyKeys, lease_id: &LeaseId) {
        let mut invocation = self.scripts.key_release.prepare_invoke();
        push(key_keys, &mut invocation);
        invocation.arg(lease_id.as_str()).arg("refund").arg(1);
        charge_args(&mut invocation, None);
        if let Err(error) = self.script::<(i64, i64)>(&invocation).await {
            tracing::warn!(%error, lease_id = %lease_id, "key slot refund failed; it expires at the lease ttl");
        }
    }

    /// Cluster: renews (or, with the key's room, restores) a lease's key slot; the key's own
    /// answer (`Renewed`, `Restored`, `Lost{released}` under the key's fence, `Lost{no_room}`).
    pub(super) async fn renew_key_slot(
        &self,
        key_keys: &ClientKeyKeys,
        lease_id: &LeaseId,
        ttl_ms: u64,
        key_limit: i32,
    ) -> Result<Renewal, StateError> {
        let (state, now): (i64, i64) = self
            .script(
                self.scripts
                    .renew
                    .key(&key_keys.leases)
                    .key(&key_keys.released)
                    // No marker on a key's slot: the account's recount covers its leases.
                    .key(&key_keys.released)
                    .arg(lease_id.as_str())
                    .arg(ttl_ms)
                    .arg("1")
                    .arg(key_limit)
                    .arg(0)
                    .arg(0)
                    .arg(0),
            )
            .await?;
        self.learn_clock(now);
        reply::renewal(state)
    }

    /// Cluster: takes back the account's part of a lease its key's node refused (the key's
    /// release fence is up, or a restore found no room on the key), so the lease is not left
    /// running on the account alone.
    pub(super) async fn drop_account_part(&self, lease_id: &LeaseId) -> Result<(), StateError> {
        let mut conn = self.redis.conn().await?;
        self.redis
            .bounded(
                redis::cmd("ZREM")
                    .arg(AccountKeys::new(lease_id.account_id()).leases)
                    .arg(lease_id.as_str())
                    .query_async::<i64>(&mut conn),
            )
            .await?;
        Ok(())
    }
}
