//! A client key's slot in Redis: which of its keys (`poolgate_runtime::redis_keys::ClientKeyKeys`,
//! all in the hash slot of `{k:<api_key_id>}`) a script takes, and the script arguments of its
//! gate and its charge.

use poolgate_runtime::redis_keys::ClientKeyKeys;

use crate::backend::{KeyCharge, KeyGate};

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
