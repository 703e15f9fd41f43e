//! What the bench binaries share: latency samples, their percentiles, and the open-loop pace.

pub mod stats;
