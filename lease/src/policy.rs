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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::backend::{AcquireLimits, LeaseBackend};
use crate::memory::MemoryBackend;
use crate::metrics::Metrics;
use crate::redis_backend::RedisBackend;
use poolgate_core::lease::{
    Denial, DenyReason, LeaseId, LeaseTerms, LostReason, Renewal, Resumption, UserLimit,
};
use poolgate_core::{AccountId, millis};
use poolgate_runtime::error::BackendError;

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

/// Work done on the fallback during an outage that Redis must see when it returns.
enum OutageRecord {
    Release {
        lease_id: LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
    },
    Spend {
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    },
}

/// See `PolicyBackend::transition`.
#[derive(Debug, Clone, Copy)]
struct Transition {
    until: tokio::time::Instant,
    /// The registry as it was during the outage (Redis may have come back empty, without it).
    view: RegistryView,
}

#[derive(Debug, Clone, Copy)]
struct RegistryView {
    replicas: u32,
    /// This replica's rank among the live replicas; `None` until the registry was read.
    rank: Option<u32>,
}

/// Redis with a failure policy in front. Implements the same backend trait, so the engine does
/// not know whether Redis is up.
pub struct PolicyBackend {
    redis: RedisBackend,
    fallback: MemoryBackend,
    settings: PolicySettings,
    member: String,
    degraded: AtomicBool,
    /// Registry heartbeats that timed out in a row (two make an outage; one is a slow moment).
    registry_timeouts: std::sync::atomic::AtomicU32,
    registry: Mutex<RegistryView>,
    outage: Mutex<Vec<OutageRecord>>,
    /// Leases this replica's streams hold (lease -> ttl ms), wherever they were granted. When
    /// Redis goes away they are adopted by the fallback, so the fallback counts what is already
    /// running: without them a replica would admit a full limit on top of the requests Redis
    /// admitted, and N replicas could exceed N × limit.
    held: Mutex<HashMap<LeaseId, u64>>,
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
    ) -> Arc<Self> {
        let expected = settings.expected_replicas.max(1);
        Arc::new(PolicyBackend {
            redis,
            fallback: MemoryBackend::new(),
            member: format!("{:016x}", fastrand::u64(..)),
            settings,
            degraded: AtomicBool::new(false),
            registry_timeouts: std::sync::atomic::AtomicU32::new(0),
            registry: Mutex::new(RegistryView {
                replicas: expected,
                rank: None,
            }),
            outage: Mutex::new(Vec::new()),
            held: Mutex::new(HashMap::new()),
            adoption: tokio::sync::RwLock::new(()),
            transition: Mutex::new(None),
            transition_gate: tokio::sync::Mutex::new(()),
            rpm_window_ms: millis(rpm_window),
            metrics,
        })
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Ordering::SeqCst)
    }

    /// (live replicas, this replica's rank) as last read from the registry.
    pub fn registry_view(&self) -> (u32, Option<u32>) {
        let view = *self.registry.lock().unwrap_or_else(|p| p.into_inner());
        (view.replicas, view.rank)
    }

    /// Redis round trips this replica made (a script or pipeline is one).
    pub fn redis_round_trips(&self) -> u64 {
        self.redis.handle().round_trips()
    }

    pub fn policy(&self) -> FailurePolicy {
        self.settings.policy
    }

    async fn enter_degraded(&self, operation: &'static str, error: &BackendError) {
        if self.is_degraded() {
            return;
        }
        let _adopting = self.adoption.write().await;
        if !self.degraded.swap(true, Ordering::SeqCst) {
            tracing::warn!(%error, operation, policy = self.settings.policy.as_str(), "redis unavailable; failure policy in force");
            self.metrics.degraded.set(1);
            self.adopt_held().await;
        }
    }

    /// Moves the leases this replica holds into the fallback (see `held`).
    async fn adopt_held(&self) {
        let held: Vec<(LeaseId, u64)> = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(lease, ttl)| (lease.clone(), *ttl))
            .collect();
        for (lease, ttl_ms) in &held {
            // The memory backend cannot fail; a lease released meanwhile is removed again by
            // its release, which now runs on the fallback. Adopted whatever the limit: these
            // requests are already running.
            let _ = self.fallback.renew(lease, *ttl_ms, Some(0)).await;
        }
        if !held.is_empty() {
            tracing::info!(
                leases = held.len(),
                "leases held by this replica counted by the fallback"
            );
        }
    }

    /// Records a lease this replica now holds. Granted by Redis just as Redis went away (after
    /// the adoption read `held`), it is adopted here: either the adoption saw it, or this sees
    /// the degraded flag the adoption set first.
    async fn hold(&self, lease_id: &LeaseId, ttl_ms: u64) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(lease_id.clone(), ttl_ms);
        if self.is_degraded() {
            let _ = self.fallback.renew(lease_id, ttl_ms, Some(0)).await;
        }
    }

    /// Forgets a lease this replica's stream held but lost (see `held`).
    pub fn forget_held(&self, lease_id: &LeaseId) {
        self.unhold(lease_id);
    }

    /// How many leases this replica's streams hold (for tests and debugging).
    pub fn held_count(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn unhold(&self, lease_id: &LeaseId) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(lease_id);
    }

    fn count_fallback(&self, operation: &'static str, reason: &'static str) {
        self.metrics
            .fallbacks
            .with_label_values(&[operation, reason])
            .inc();
    }

    /// Runs `on_redis` unless degraded; on failure (or when degraded) runs `on_fallback`.
    async fn guarded<T>(
        &self,
        operation: &'static str,
        on_redis: impl Future<Output = Result<T, BackendError>>,
        on_fallback: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        self.guarded_or(operation, on_redis, on_fallback, None)
            .await
    }

    /// Like `guarded`, but a *timeout* (Redis slow, not gone: the operation may even have been
    /// applied) never switches to the fallback: it answers `on_timeout` when given, the timeout
    /// otherwise. Admitting from the fallback while Redis is merely slow would over-admit exactly
    /// when it is overloaded; connection failures (Redis gone) still switch, and the registry
    /// probe decides about an outage that only shows as timeouts, and when Redis is back.
    async fn guarded_or<T>(
        &self,
        operation: &'static str,
        on_redis: impl Future<Output = Result<T, BackendError>>,
        on_fallback: impl Future<Output = Result<T, BackendError>>,
        on_timeout: Option<T>,
    ) -> Result<T, BackendError> {
        if self.is_degraded() {
            let _gate = self.adoption.read().await;
            // Still degraded under the gate (recovery may have finished while this waited).
            if self.is_degraded() {
                self.count_fallback(operation, "degraded");
                return on_fallback.await;
            }
        }
        match on_redis.await {
            Ok(value) => Ok(value),
            Err(BackendError::Timeout) => {
                self.metrics
                    .redis_timeouts
                    .with_label_values(&[operation])
                    .inc();
                match on_timeout {
                    Some(answer) => {
                        self.count_fallback(operation, "timeout");
                        Ok(answer)
                    }
                    None => Err(BackendError::Timeout),
                }
            }
            Err(error) => {
                self.enter_degraded(operation, &error).await;
                self.count_fallback(operation, "error");
                let _adopted = self.adoption.read().await;
                on_fallback.await
            }
        }
    }

    /// This replica's share of `limit` under `divided`; `limit` itself otherwise.
    fn share(&self, limit: i32) -> i32 {
        if limit <= 0 || self.settings.policy != FailurePolicy::Divided {
            return limit;
        }
        let view = *self.registry.lock().unwrap_or_else(|p| p.into_inner());
        Self::share_of(view, limit)
    }

    fn share_of(view: RegistryView, limit: i32) -> i32 {
        let replicas = view.replicas.max(1) as i32;
        let base = limit / replicas;
        let extra = match view.rank {
            Some(rank) if (rank as i32) < limit % replicas => 1,
            _ => 0,
        };
        base + extra
    }

    fn unavailable() -> Denial {
        Denial::new(DenyReason::BackendUnavailable, 1000)
    }

    /// Heartbeats into the registry; on success while degraded, recovers. Run every
    /// `registry_interval` by the server.
    pub async fn tick(&self) {
        let ttl = millis(self.settings.registry_ttl);
        match self.redis.registry_heartbeat(&self.member, ttl).await {
            Ok(members) => {
                self.registry_timeouts.store(0, Ordering::SeqCst);
                let rank = members
                    .iter()
                    .position(|m| *m == self.member)
                    .map(|r| r as u32);
                let outage_view = {
                    let mut view = self.registry.lock().unwrap_or_else(|p| p.into_inner());
                    let outage_view = *view;
                    view.replicas = (members.len() as u32).max(1);
                    view.rank = rank;
                    outage_view
                };
                if self.is_degraded()
                    && self.recover().await
                    && self.settings.policy == FailurePolicy::Divided
                {
                    *self.transition.lock().unwrap_or_else(|p| p.into_inner()) = Some(Transition {
                        until: tokio::time::Instant::now() + self.settings.registry_ttl,
                        view: outage_view,
                    });
                }
            }
            Err(BackendError::Timeout)
                if self.registry_timeouts.fetch_add(1, Ordering::SeqCst) == 0 =>
            {
                self.metrics
                    .redis_timeouts
                    .with_label_values(&["registry"])
                    .inc();
            }
            Err(error) => {
                self.registry_timeouts.store(0, Ordering::SeqCst);
                self.enter_degraded("registry", &error).await
            }
        }
    }

    /// Writes what the fallback admitted into Redis, resumes Redis, then replays the outage's
    /// releases and spend. Any failure leaves the replica degraded for the next tick. Returns
    /// whether this call recovered.
    async fn recover(&self) -> bool {
        // No fallback operation runs until the switch is complete (see `adoption`).
        let _recovering = self.adoption.write().await;
        if !self.is_degraded() {
            return false;
        }
        let snapshot = self.fallback.snapshot(self.rpm_window_ms);
        if let Err(error) = self.redis.restore(&snapshot).await {
            tracing::warn!(%error, "redis answers again but the fallback leases could not be written; staying degraded");
            return false;
        }
        self.fallback.forget(&snapshot);
        self.degraded.store(false, Ordering::SeqCst);
        self.metrics.degraded.set(0);
        // A safety net: with the gate held no fallback operation ran since the snapshot.
        let late = self.fallback.snapshot(self.rpm_window_ms);
        if !late.is_empty() {
            match self.redis.restore(&late).await {
                Ok(()) => self.fallback.forget(&late),
                Err(error) => {
                    tracing::warn!(%error, "late fallback leases not written; they expire by themselves")
                }
            }
        }
        let records: Vec<OutageRecord> =
            std::mem::take(&mut *self.outage.lock().unwrap_or_else(|p| p.into_inner()));
        let mut failed = Vec::new();
        for record in records {
            let result = match &record {
                OutageRecord::Release {
                    lease_id,
                    spend_micros,
                    session_window_ms,
                    fence_ms,
                } => self
                    .redis
                    .release(lease_id, *spend_micros, *session_window_ms, *fence_ms)
                    .await
                    .map(|_| ()),
                OutageRecord::Spend {
                    account_id,
                    spend_micros,
                    session_window_ms,
                } => self
                    .redis
                    .record_spend(*account_id, *spend_micros, *session_window_ms)
                    .await
                    .map(|_| ()),
            };
            if result.is_err() {
                failed.push(record);
            }
        }
        let unreplayed = failed.len();
        self.outage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(failed);
        self.metrics.degraded.set(0);
        tracing::info!(
            restored_accounts = snapshot.accounts.len(),
            unreplayed,
            "redis is back; fallback leases written, global enforcement resumed"
        );
        true
    }

    /// The outage's registry view while the `divided` transition after a recovery lasts.
    fn transition_view(&self) -> Option<RegistryView> {
        let mut transition = self.transition.lock().unwrap_or_else(|p| p.into_inner());
        match *transition {
            Some(t) if t.until > tokio::time::Instant::now() => Some(t.view),
            Some(_) => {
                *transition = None;
                None
            }
            None => None,
        }
    }

    /// Leases of `account_id` this replica's streams hold.
    fn held_on(&self, account_id: AccountId) -> usize {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .filter(|lease| lease.account_id() == account_id)
            .count()
    }

    /// Leaves the registry on shutdown.
    pub async fn leave(&self) {
        if let Err(error) = self.redis.registry_leave(&self.member).await {
            tracing::debug!(%error, "could not leave the replica registry; the entry expires");
        }
    }

    fn push_outage(&self, record: OutageRecord) {
        self.outage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(record);
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
    ) -> Result<Option<Denial>, BackendError> {
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

    async fn refund_user(&self, user_id: &str, event_id: &str) -> Result<(), BackendError> {
        self.guarded(
            "refund_user",
            self.redis.refund_user(user_id, event_id),
            self.fallback.refund_user(user_id, event_id),
        )
        .await
    }

    async fn acquire(
        &self,
        terms: &LeaseTerms,
        lease_id: &LeaseId,
        limits: AcquireLimits,
    ) -> Result<Option<Denial>, BackendError> {
        let fallback = async {
            match self.settings.policy {
                FailurePolicy::Closed => Ok(Some(Self::unavailable())),
                FailurePolicy::Open => self.fallback.acquire(terms, lease_id, limits).await,
                FailurePolicy::Divided => {
                    let concurrency = self.share(terms.concurrency_limit);
                    let rpm = self.share(terms.rpm_limit);
                    if terms.concurrency_limit > 0 && concurrency == 0 {
                        return Ok(Some(Denial::new(DenyReason::Concurrency, 0)));
                    }
                    if terms.rpm_limit > 0 && rpm == 0 {
                        return Ok(Some(Denial::new(DenyReason::Rpm, 1000)));
                    }
                    let user = match &terms.user {
                        Some(user) if user.rpm_limit > 0 => {
                            let share = self.share(user.rpm_limit);
                            if share == 0 {
                                return Ok(Some(Denial::new(DenyReason::UserRpm, 1000)));
                            }
                            Some(UserLimit {
                                rpm_limit: share,
                                ..user.clone()
                            })
                        }
                        other => other.clone(),
                    };
                    let shared = LeaseTerms {
                        concurrency_limit: concurrency,
                        rpm_limit: rpm,
                        user,
                        ..terms.clone()
                    };
                    self.fallback.acquire(&shared, lease_id, limits).await
                }
            }
        };
        // The `divided` transition after a recovery: Redis may not hold the other replicas'
        // fallback leases yet, so this replica keeps to its outage share too (see `transition`).
        let transition = match self.transition_view() {
            Some(view) if terms.concurrency_limit > 0 && !self.is_degraded() => {
                let serial = self.transition_gate.lock().await;
                if self.held_on(terms.account_id)
                    >= Self::share_of(view, terms.concurrency_limit).max(0) as usize
                {
                    return Ok(Some(Denial::new(DenyReason::Concurrency, 0)));
                }
                Some(serial)
            }
            _ => None,
        };
        let answer = self
            .guarded_or(
                "acquire",
                self.redis.acquire(terms, lease_id, limits),
                fallback,
                Some(Some(Self::unavailable())),
            )
            .await;
        if let Ok(None) = answer {
            self.hold(lease_id, limits.ttl_ms).await;
        }
        drop(transition);
        answer
    }

    async fn renew(
        &self,
        lease_id: &LeaseId,
        ttl_ms: u64,
        restore_within: Option<i32>,
    ) -> Result<Renewal, BackendError> {
        // A lease Redis granted before the outage moves into the fallback on its first renewal,
        // whatever the limit (the request is already running), so it is counted locally and
        // written back on recovery. Only a release made during the outage fences it there.
        let fallback = async {
            if self.settings.policy == FailurePolicy::Closed {
                return Err(BackendError::Failed(
                    "redis unavailable (policy closed)".into(),
                ));
            }
            let adopt = restore_within.map(|_| 0);
            Ok(match self.fallback.renew(lease_id, ttl_ms, adopt).await? {
                Renewal::Lost(reason) => Renewal::Lost(reason),
                Renewal::Renewed | Renewal::Restored => Renewal::Renewed,
            })
        };
        let renewal = self
            .guarded(
                "renew",
                self.redis.renew(lease_id, ttl_ms, restore_within),
                fallback,
            )
            .await;
        if let Ok(Renewal::Lost(_)) = renewal {
            // Not held any more: the next outage must not adopt it.
            self.unhold(lease_id);
        }
        renewal
    }

    async fn resume(&self, lease_id: &LeaseId, ttl_ms: u64) -> Result<Resumption, BackendError> {
        let fallback = async {
            if self.settings.policy == FailurePolicy::Closed {
                return Err(BackendError::Failed(
                    "redis unavailable (policy closed)".into(),
                ));
            }
            // Redis cannot be asked whether the lease is live; the holder says it is running.
            // Only a release made during the outage (fenced in the fallback) refuses it.
            if let Renewal::Lost(LostReason::Released) =
                self.fallback.renew(lease_id, ttl_ms, Some(0)).await?
            {
                return Ok(Resumption::Released);
            }
            Ok(match self.fallback.resume(lease_id, ttl_ms).await? {
                Resumption::Resumed { holder_epoch } => Resumption::Resumed { holder_epoch },
                Resumption::Unknown | Resumption::Released => {
                    Resumption::Resumed { holder_epoch: 1 }
                }
            })
        };
        let resumed = self
            .guarded("resume", self.redis.resume(lease_id, ttl_ms), fallback)
            .await;
        if let Ok(Resumption::Resumed { .. }) = resumed {
            self.hold(lease_id, ttl_ms).await;
        }
        resumed
    }

    async fn attempt(
        &self,
        lease_id: &LeaseId,
        rpm_limit: i32,
        event_id: &str,
        window_ms: u64,
    ) -> Result<Option<Denial>, BackendError> {
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

    async fn release(
        &self,
        lease_id: &LeaseId,
        spend_micros: i64,
        session_window_ms: u64,
        fence_ms: u64,
    ) -> Result<bool, BackendError> {
        self.unhold(lease_id);
        let fallback = async {
            let removed = self
                .fallback
                .release(lease_id, 0, session_window_ms, fence_ms)
                .await?;
            // Redis may still hold the lease (granted before the outage) and must get the spend.
            self.push_outage(OutageRecord::Release {
                lease_id: lease_id.clone(),
                spend_micros,
                session_window_ms,
                fence_ms,
            });
            Ok(removed)
        };
        self.guarded(
            "release",
            self.redis
                .release(lease_id, spend_micros, session_window_ms, fence_ms),
            fallback,
        )
        .await
    }

    async fn orphan(
        &self,
        lease_id: &LeaseId,
        grace_ms: u64,
        holder_epoch: u64,
        fence_ms: u64,
    ) -> Result<(), BackendError> {
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

    async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, BackendError> {
        // Only this replica's view while degraded: the others' leases are in an unreachable Redis.
        self.guarded(
            "inflight",
            self.redis.inflight(account_ids),
            self.fallback.inflight(account_ids),
        )
        .await
    }

    async fn record_spend(
        &self,
        account_id: AccountId,
        spend_micros: i64,
        session_window_ms: u64,
    ) -> Result<i64, BackendError> {
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

    async fn set_cooldown(&self, account_id: AccountId, ttl_ms: u64) -> Result<(), BackendError> {
        self.guarded(
            "set_cooldown",
            self.redis.set_cooldown(account_id, ttl_ms),
            self.fallback.set_cooldown(account_id, ttl_ms),
        )
        .await
    }

    async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), BackendError> {
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
    ) -> Result<Option<u32>, BackendError> {
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
    ) -> Result<(), BackendError> {
        self.guarded(
            "remove_waiter",
            self.redis.remove_waiter(account_id, waiter_id),
            self.fallback.remove_waiter(account_id, waiter_id),
        )
        .await
    }
}
