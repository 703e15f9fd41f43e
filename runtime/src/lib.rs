//! poolgate-runtime: what every poolgate process needs and no service owns, without gRPC (the
//! engines build on it without tonic; the gRPC pieces are `poolgate-rpc`). The Redis connection,
//! its clock and key layout, the storage error, the ports through which the selection engine
//! reaches the lease engine, secret flags and the cost of a wrong admin token, the shutdown
//! signal, Prometheus helpers.

pub mod clock;

/// The allocator every poolgate binary runs on (`#[global_allocator]` in each `main.rs`):
/// mimalloc. Under glibc's malloc the distributed request path spent about 13 % of its CPU in
/// allocation and its arena locks (docs/BENCHMARKS.md, "CPU per governed request"); mimalloc's
/// thread-local free lists take most of that away.
pub use mimalloc::MiMalloc as Allocator;
pub mod error;
pub mod failed_auth;
pub mod metrics;
pub mod ports;
pub mod redis;
pub mod redis_keys;
pub mod secret_flags;
pub mod shutdown;
