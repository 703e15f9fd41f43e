//! poolgate-select: the selection engine as a library. It answers "which accounts, in which
//! order, for this request", turns outcomes into health ("busy is not broken", confirmed by its
//! own probe), keeps sticky bindings and OAuth tokens fresh (docs/DESIGN.md §5).
//! Transport-free: selector-svc serves it over gRPC with its Postgres source, the relay's
//! standalone mode embeds it over its memory stores.
//!
//! `engine` (select, report, bind, authenticate) → `load_cache` (load reads) / `health` (a
//! `HealthStore`: Redis, or memory) / `source` (an `AccountSource`: the Postgres one lives in
//! selector-svc, the memory one here) over a `snapshot` of the config, with the ordering and
//! outcome decisions of `poolgate-core`. `confirmations` and `probe` are the only way a
//! suspicious outcome becomes a health write; `refresh` keeps OAuth tokens fresh. Leases and
//! cooldowns are reached through the ports of `poolgate_runtime::ports`.

pub mod api;
pub mod confirmations;
pub mod crypto;
pub mod edge;
pub mod engine;
pub mod health;
pub mod load_cache;
pub mod metrics;
pub mod prices;
pub mod probe;
pub mod refresh;
pub mod snapshot;
pub mod source;
pub mod usage_endpoint;
pub mod windows_cache;
