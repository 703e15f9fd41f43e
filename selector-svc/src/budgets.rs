//! Budgets that survive a Redis flush (docs/DESIGN.md §4, "Client key limits"): admission's
//! budget counters live in Redis, the spend they count in the usage ledger (Postgres). The
//! selector, which has both, rebuilds every counter Redis has lost from the ledger, at start and
//! every [`REBUILD_EVERY`], through the lease engine it already keeps for its probe (the same
//! scripts, the same Redis; `BudgetCounters` is implemented by the engine itself); the engine
//! only raises a counter to the ledger's sum, so nothing is counted twice.

use std::time::Duration;

/// How often lost counters are looked for (and once at start). Between a flush and the next
/// rebuild a counter holds only the charges since the flush; the rebuild raises it back.
pub const REBUILD_EVERY: Duration = Duration::from_secs(30);
