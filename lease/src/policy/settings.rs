//! The failure policy's settings: which policy (open, divided, closed) and the replica
//! registry's timing.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    Open,
    Divided,
    Closed,
}

impl FailurePolicy {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "open" => Ok(FailurePolicy::Open),
            "divided" => Ok(FailurePolicy::Divided),
            "closed" => Ok(FailurePolicy::Closed),
            other => Err(format!(
                "unknown failure policy {other:?} (open, divided, closed)"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FailurePolicy::Open => "open",
            FailurePolicy::Divided => "divided",
            FailurePolicy::Closed => "closed",
        }
    }
}

/// Failure policy settings.
#[derive(Debug, Clone)]
pub struct PolicySettings {
    pub policy: FailurePolicy,
    /// Replica count assumed by `divided` when the registry was never read.
    pub expected_replicas: u32,
    /// How often each replica heartbeats into the registry (and probes Redis while degraded).
    pub registry_interval: Duration,
    /// How long a registry entry lives without a heartbeat.
    pub registry_ttl: Duration,
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings {
            policy: FailurePolicy::Open,
            expected_replicas: 1,
            registry_interval: Duration::from_secs(1),
            registry_ttl: Duration::from_secs(5),
        }
    }
}
