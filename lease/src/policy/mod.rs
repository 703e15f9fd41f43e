//! The Redis failure policy (docs/DESIGN.md §4): what admission does while Redis does not answer,
//! and how it returns without over-admitting.
//!
//! - `open` (default): fall back to the in-process limiter with the full limits; N replicas then
//!   admit up to N × limit. Availability over strictness, on purpose.
//! - `divided`: fall back to this replica's share of each limit — `floor(limit / N)`, plus one
//!   for the first `limit mod N` replicas by rank in the Redis replica registry — so the shares
//!   add up to exactly the limit. N is the last registry read, or `expected_replicas` when Redis
//!   was never reached (then without the "plus one": the rank is unknown and a share must never
//!   over-admit).
//! - `closed`: refuse with `backend_unavailable`.
//!
//! A replica enters the degraded state on the first Redis connection failure (or a registry
//! heartbeat that fails, or times out twice in a row) and stops sending operations to Redis; the
//! registry heartbeat doubles as the probe. A *timeout* of any other operation is not an outage:
//! Redis is slow, and may even have applied it. The operation answers as Redis being unavailable
//! for that one call (an acquire `backend_unavailable`, so the relay tries a sibling or waits; a
//! resume an error the relay retries; a heartbeat `NotRenewed`; a release is queued and retried)
//! instead of switching the whole replica to the fallback, which would over-admit exactly when
//! Redis is overloaded: a CI run under load caught an acquire doing that, and the chaos suite a
//! resume storm after an admission replica died (one resume timed out, the replica granted from
//! its fallback for the 0.4 s until the next probe, and three accounts ran over their limit).
//! When Redis answers again, the replica first writes the leases and RPM events it admitted on its
//! own into Redis, then serves from Redis again, then replays releases and spend recorded during
//! the outage — so the return neither over-admits nor loses spend. Under `divided`, the replicas
//! come back one tick apart: for one registry ttl after its recovery (by then every live replica
//! has ticked, and recovered) a replica also keeps to its outage share of each concurrency limit,
//! so the first one back does not grant from a Redis that lacks the others' fallback leases.
//!
//! This file holds `PolicyBackend`, its state and its `LeaseBackend` impl; `degraded.rs` enters
//! the degraded state and routes each operation, `registry.rs` heartbeats (and probes),
//! `recovery.rs` writes the fallback back and replays the outage, `held.rs` keeps the leases this
//! replica's streams hold, `divided.rs` the share and the transition, `settings.rs` the settings.

mod degraded;
mod divided;
mod held;
mod recovery;
mod registry;
mod settings;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::lease::{
    Denial, DenyReason, LeaseId, LeaseTerms, LostReason, Renewal, Resumption,
};
use poolgate_core::status::AdmissionReport;
use poolgate_core::{AccountId, Clock, millis};
use poolgate_runtime::error::StateError;

use crate::backend::{AcquireLimits, KeyCharge, KeyGate, LeaseBackend};
use crate::memory::MemoryBackend;
use crate::metrics::Metrics;
use crate::redis_backend::RedisBackend;
use divided::Transition;
use recovery::OutageRecord;
use registry::RegistryView;
pub use settings::{FailurePolicy, PolicySettings};

/// Redis with a failure policy in front. Implements the same backend trait, so the engine does
/// not know whether Redis is up.
pub struct PolicyBackend {
    redis: RedisBackend,
    fallback: MemoryBackend,
    settings: PolicySettings,
    member: String,
    degraded: AtomicBool,
    /// Registry heartbeats that timed out in a row (two make an outage; one is a slow moment).
    registry_timeouts: AtomicU32,
    registry: Mutex<RegistryView>,
    /// This replica's registry heartbeat was answered once: from then on its entry missing means
    /// Redis lost its state.
    registered: AtomicBool,
    outage: Mutex<Vec<OutageRecord>>,
    /// Leases this replica's streams hold (lease -> ttl ms), wherever they were granted. When
    /// Redis goes away they are adopted by the fallback, so the fallback counts what is already
    /// running: without them a replica would admit a full limit on top of the requests Redis
    /// admitted, and N replicas could exceed N × limit.
    held: Mutex<HashMap<LeaseId, held::Held>>,
    /// Every fallback operation holds it for reading; entering and leaving the degraded state
    /// hold it for writing. So no fallback decision is made on a fallback that does not count
    /// the adopted leases yet, and none runs while recovery moves the fallback's leases into
    /// Redis (a release or a grant in that window would be lost between the two).
    adoption: tokio::sync::RwLock<()>,
    /// `divided` only: after this replica recovers, until every live replica has ticked (one
    /// registry ttl), the others may still be degraded, granting from their fallbacks leases
    /// Redis does not hold yet. Until then this replica also keeps to its outage share (counted
    /// over the leases its streams hold), so the shares still add up to the limit.
    transition: Mutex<Option<Transition>>,
    /// Serializes the acquires made during the transition (count, then grant).
    transition_gate: tokio::sync::Mutex<()>,
    rpm_window_ms: u64,
    metrics: Metrics,
}

impl PolicyBackend {
    pub fn new(
        redis: RedisBackend,
        settings: PolicySettings,
        rpm_window: Duration,
        metrics: Metrics,
        clock: Clock,
    ) -> Arc<Self> {
        let expected = settings.expected_replicas.max(1);
        Arc::new(PolicyBackend {
            redis,
            fallback: MemoryBackend::new(clock),
            member: format!("{:016x}", fastrand::u64(..)),
            settings,
            degraded: AtomicBool::new(false),
            registry_timeouts: AtomicU32::new(0),
            registry: Mutex::new(RegistryView {
                replicas: expected,
                rank: None,
            }),
            registered: AtomicBool::new(false),
            outage: Mutex::new(Vec::new()),
            held: Mutex::new(HashMap::new()),
            adoption: tokio::sync::RwLock::new(()),
            transition: Mutex::new(None),
            transition_gate: tokio::sync::Mutex::new(()),
            rpm_window_ms: millis(rpm_window),
            metrics,
        })
    }

    /// Redis round trips this replica made (a script or pipeline is one).
    pub fn redis_round_trips(&self) -> u64 {
        self.redis.handle().round_trips()
    }

    pub fn policy(&self) -> FailurePolicy {
        self.settings.policy
    }

    fn unavailable() -> Denial {
        Denial::new(DenyReason::BackendUnavailable, 1000)
    }
}

#[async_trait]
impl LeaseBackend for PolicyBackend {
    fn joins_user_gate(&self) -> bool {
        self.redis.joins_user_gate()
    }

    async fn charge_user(
        &self,
        user_id: &str,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, StateError> {
        let fallback = async {
            if self.settings.policy == FailurePolicy::Closed {
                return Ok(Some(Self::unavailable()));
            }
            let share = self.share(rpm_limit);
            if share == 0 {
                return Ok(Some(Denial::new(DenyReason::UserRpm, 1000)));
            }
            self.fallback
                .charge_user(user_id, share, event_id, window_ms)
                .await
        };
        self.guarded_or(
            "charge_user",
            self.redis
                .charge_user(user_id, rpm_limit, event_id, window_ms),
            fallback,
            Some(Some(Self::unavailable())),
        )
        .await
    }

    async fn refund_user(&self, user_id: &str, event_id: &str) -> Result<(), StateError> {
        self.guarded(
            "refund_user",
            self.redis.refund_user(user_id, event_id),
            self.fallback.refund_user(user_id, event_id),
        )
        .await
    }

    async fn acquire_keyed(
        &self,
        terms: &LeaseTerms,
        lease_id: &LeaseId,
        limits: AcquireLimits,
        key: Option<&KeyGate>,
    ) -> Result<Option<Denial>, StateError> {
        // A key gets its share like an account: `open` the local limit, `divided` this
        // replica's share of its concurrency, TPM and budgets.
        let fallback = async {
            match self.settings.policy {
                FailurePolicy::Closed => Ok(Some(Self::unavailable())),
                FailurePolicy::Open => {
                    self.fallback
                        .acquire_keyed(terms, lease_id, limits, key)
                        .await
                }
                FailurePolicy::Divided => {
                    match self.divided_terms(terms).and_then(|shared| {
                        Ok((shared, key.map(|gate| self.divided_key(gate)).transpose()?))
                    }) {
                        Ok((shared, shared_key)) => {
                            self.fallback
                                .acquire_keyed(&shared, lease_id, limits, shared_key.as_ref())
                                .await
                        }
                        Err(denial) => Ok(Some(denial)),
                    }
                }
            }
        };
        // The `divided` transition after a recovery: Redis may not hold the other replicas'
        // fallback leases yet, so this replica keeps to its outage share too (see `transition`).
        let transition = match self
            .enter_transition(terms, lease_id.api_key_id().and(key))
            .await
        {
            Ok(serial) => serial,
            Err(denial) => return Ok(Some(denial)),
        };
        let answer = self
            .guarded_or(
                "acquire",
                self.redis.acquire_keyed(terms, lease_id, limits, key),
                fallback,
                Some(Some(Self::unavailable())),
            )
            .await;
        if let Ok(None) = answer {
            let key_limit = key.map_or(0, |gate| gate.concurrency_limit);
            self.hold(lease_id, limits.ttl_ms, key_limit).await;
        }
        drop(transition);
        answer
    }

    async fn renew(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        restore_within: Option<i32>,
        key_limit: i32,
    ) -> Result<Renewal, StateError> {
        // A lease Redis granted before the outage moves into the fallback on its first renewal,
        // whatever the limit (the request is already running), so it is counted locally and
        // written back on recovery. Only a release made during the outage fences it there.
        let fallback = async {
            if self.settings.policy == FailurePolicy::Closed {
                return Err(StateError::Failed(
                    "redis unavailable (policy closed)".into(),
                ));
            }
            let adopt = restore_within.map(|_| 0);
            Ok(
                match self.fallback.renew(lease_id, ttl_ms, adopt, 0).await? {
                    Renewal::Lost(reason) => Renewal::Lost(reason),
                    Renewal::Renewed | Renewal::Restored => Renewal::Renewed,
                },
            )
        };
        let renewal = self
            .guarded(
                "renew",
                self.redis
                    .renew(lease_id, ttl_ms, restore_within, key_limit),
                fallback,
            )
            .await;
        match renewal {
            // Not held any more: the next outage must not adopt it.
            Ok(Renewal::Lost(_)) => self.unhold(lease_id),
            Ok(Renewal::Renewed | Renewal::Restored) => self.renewed(lease_id),
            Err(_) => {}
        }
        renewal
    }

    async fn resume(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        key_limit: i32,
    ) -> Result<Resumption, StateError> {
        let fallback = async {
            if self.settings.policy == FailurePolicy::Closed {
                return Err(StateError::Failed(
                    "redis unavailable (policy closed)".into(),
                ));
            }
            // Redis cannot be asked whether the lease is live; the holder says it is running.
            // Only a release made during the outage (fenced in the fallback) refuses it.
            if let Renewal::Lost(LostReason::Released) =
                self.fallback.renew(lease_id, ttl_ms, Some(0), 0).await?
            {
                return Ok(Resumption::Released);
            }
            Ok(match self.fallback.resume(lease_id, ttl_ms, 0).await? {
                Resumption::Resumed { holder_epoch } => Resumption::Resumed { holder_epoch },
                Resumption::Unknown | Resumption::Released => {
                    Resumption::Resumed { holder_epoch: 1 }
                }
            })
        };
        let resumed = self
            .guarded(
                "resume",
                self.redis.resume(lease_id, ttl_ms, key_limit),
                fallback,
            )
            .await;
        if let Ok(Resumption::Resumed { .. }) = resumed {
            self.hold(lease_id, ttl_ms, key_limit).await;
        }
        resumed
    }

    async fn attempt(
        &self,
        lease_id: &LeaseId,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, StateError> {
        let fallback = async {
            if self.settings.policy == FailurePolicy::Closed {
                return Ok(Some(Self::unavailable()));
            }
            let share = self.share(rpm_limit);
            if share == 0 {
                return Ok(Some(Denial::new(DenyReason::Rpm, 1000)));
            }
            self.fallback
                .attempt(lease_id, share, event_id, window_ms)
                .await
        };
        self.guarded(
            "attempt",
            self.redis.attempt(lease_id, rpm_limit, event_id, window_ms),
            fallback,
        )
        .await
    }

    async fn release_charged(
        &self,
        lease_id: &LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
        key: Option<&KeyCharge>,
    ) -> Result<bool, StateError> {
        self.unhold(lease_id);
        let fallback = async {
            // The fallback counts the key's tokens and spend for the rest of the outage; Redis
            // gets them with the replayed release (charged there once per lease).
            let removed = self
                .fallback
                .release_charged(lease_id, 0, session_window_ms, fence_ms, key)
                .await?;
            // Redis may still hold the lease (granted before the outage) and must get the spend.
            self.push_outage(OutageRecord::Release {
                lease_id: lease_id.clone(),
                spend_micros,
                session_window_ms,
                fence_ms,
                key: key.cloned(),
            });
            Ok(removed)
        };
        self.guarded(
            "release",
            self.redis
                .release_charged(lease_id, spend_micros, session_window_ms, fence_ms, key),
            fallback,
        )
        .await
    }

    async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
        expires_in_ms: u64,
    ) -> Result<bool, StateError> {
        self.guarded(
            "seed_budget",
            self.redis
                .seed_budget(api_key_id, period_id, micros, expires_in_ms),
            self.fallback
                .seed_budget(api_key_id, period_id, micros, expires_in_ms),
        )
        .await
    }

    async fn wall_now_ms(&self) -> Result<i64, StateError> {
        if self.is_degraded() {
            return self.fallback.wall_now_ms().await;
        }
        match self.redis.wall_now_ms().await {
            Ok(now) => Ok(now),
            Err(_) => self.fallback.wall_now_ms().await,
        }
    }

    async fn orphan(
        &self,
        lease_id: &LeaseId,
        grace_ms: u64,
        holder_epoch: u64,
        fence_ms: u64,
    ) -> Result<(), StateError> {
        // The stream is gone: the lease is the orphan grace's now, on Redis or the fallback.
        self.unhold(lease_id);
        self.guarded(
            "orphan",
            self.redis
                .orphan(lease_id, grace_ms, holder_epoch, fence_ms),
            self.fallback
                .orphan(lease_id, grace_ms, holder_epoch, fence_ms),
        )
        .await
    }

    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, StateError> {
        // Only this replica's view while degraded: the others' leases are in an unreachable Redis.
        self.guarded(
            "inflight",
            self.redis.inflight(account_ids),
            self.fallback.inflight(account_ids),
        )
        .await
    }

    async fn usage(
        &self,
        account_ids: &[AccountId],
        rpm_window_ms: u64,
        session_window_ms: u64,
    ) -> Result<Vec<(u32, i64)>, StateError> {
        // A read for operators: it never switches the replica to its fallback.
        if self.is_degraded() {
            return self
                .fallback
                .usage(account_ids, rpm_window_ms, session_window_ms)
                .await;
        }
        self.redis
            .usage(account_ids, rpm_window_ms, session_window_ms)
            .await
    }

    async fn admission_status(&self) -> AdmissionReport {
        self.redis.admission_status().await
    }

    async fn key_inflight(&self, api_key_ids: &[i64]) -> Result<Vec<u32>, StateError> {
        self.guarded(
            "key_inflight",
            self.redis.key_inflight(api_key_ids),
            self.fallback.key_inflight(api_key_ids),
        )
        .await
    }

    async fn record_spend(
        &self,
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    ) -> Result<i64, StateError> {
        let fallback = async {
            self.push_outage(OutageRecord::Spend {
                account_id,
                spend_micros,
                session_window_ms,
            });
            self.fallback
                .record_spend(account_id, spend_micros, session_window_ms)
                .await
        };
        self.guarded(
            "record_spend",
            self.redis
                .record_spend(account_id, spend_micros, session_window_ms),
            fallback,
        )
        .await
    }

    async fn set_cooldown(&self, account_id: AccountId, ttl_ms: u64) -> Result<(), StateError> {
        self.guarded(
            "set_cooldown",
            self.redis.set_cooldown(account_id, ttl_ms),
            self.fallback.set_cooldown(account_id, ttl_ms),
        )
        .await
    }

    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), StateError> {
        self.guarded(
            "clear_cooldown",
            self.redis.clear_cooldown(account_id),
            self.fallback.clear_cooldown(account_id),
        )
        .await
    }

    async fn register_waiter(
        &self,
        account_id: AccountId,
        waiter_id: &str,
        max_waiting: u32,
        ttl_ms: u64,
    ) -> Result<Option<u32>, StateError> {
        self.guarded(
            "register_waiter",
            self.redis
                .register_waiter(account_id, waiter_id, max_waiting, ttl_ms),
            self.fallback
                .register_waiter(account_id, waiter_id, max_waiting, ttl_ms),
        )
        .await
    }

    async fn remove_waiter(
        &self,
        account_id: AccountId,
        waiter_id: &str,
    ) -> Result<(), StateError> {
        self.guarded(
            "remove_waiter",
            self.redis.remove_waiter(account_id, waiter_id),
            self.fallback.remove_waiter(account_id, waiter_id),
        )
        .await
    }
}
