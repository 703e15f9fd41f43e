//! The admission engine: takes, renews, charges and frees leases on a backend, waits for slots,
//! and retries releases the backend could not take. Transport-free: `grpc.rs` and `session.rs`
//! call it; tests may too.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{AcquireLimits, Budget, KeyCharge, KeyGate, LeaseBackend};
use crate::calendar::{Calendar, TOTAL_PERIOD};
use crate::metrics::Metrics;
use crate::policy::PolicyBackend;
use poolgate_core::lease::{
    Denial, DenyReason, KeyLimits, LeaseId, LeaseTerms, Renewal, Resumption, Settings,
};
use poolgate_core::{AccountId, Clock, millis};
use poolgate_runtime::error::StateError;

mod guards;
mod release;

use guards::{UserCharge, WaiterGuard};
use release::PendingRelease;

/// What an acquire came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    Granted(LeaseId),
    Denied(Denial),
    /// The caller went away while waiting; nothing is held.
    Cancelled,
}

/// How long a key's budget counter outlives its period (so a late reader still sees the last
/// period, and a clock a little behind Redis' never writes into a counter that expired).
const BUDGET_COUNTER_MARGIN_MS: u64 = 7 * 24 * 3_600_000;

pub struct LeaseEngine {
    backend: Arc<dyn LeaseBackend>,
    settings: Settings,
    instance: String,
    sequence: AtomicU64,
    /// Waiters on this replica per account, woken at once by a release here.
    local_wakeups: Mutex<HashMap<AccountId, Arc<Notify>>>,
    /// Acquires of this replica waiting per account. A new acquire does not barge in front of
    /// them (see `acquire`).
    local_waiting: Arc<Mutex<HashMap<AccountId, usize>>>,
    pending_releases: Mutex<Vec<PendingRelease>>,
    metrics: Metrics,
    /// The Redis failure policy layer, when the backend is Redis.
    policy: Option<Arc<PolicyBackend>>,
    /// Waiters on this replica per client key (a key at its concurrency limit), woken by a
    /// release of one of the key's leases here.
    key_wakeups: Mutex<HashMap<i64, Arc<Notify>>>,
    /// The budgets' calendar (time zone, week start).
    calendar: Calendar,
    /// The process's clock (docs/DESIGN.md §4): a holder's time since its last renewal, and
    /// budget periods where the backend has no clock of its own.
    clock: Clock,
}

/// A random per-process instance id: 12 lowercase hex digits.
fn new_instance_id() -> String {
    format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff)
}

impl LeaseEngine {
    pub fn new(
        backend: Arc<dyn LeaseBackend>,
        settings: Settings,
        metrics: Metrics,
        clock: Clock,
    ) -> Arc<Self> {
        Self::build(backend, None, settings, metrics, clock)
    }

    /// An engine on Redis behind its failure policy.
    pub fn with_policy(
        policy: Arc<PolicyBackend>,
        settings: Settings,
        metrics: Metrics,
        clock: Clock,
    ) -> Arc<Self> {
        Self::build(policy.clone(), Some(policy), settings, metrics, clock)
    }

    fn build(
        backend: Arc<dyn LeaseBackend>,
        policy: Option<Arc<PolicyBackend>>,
        settings: Settings,
        metrics: Metrics,
        clock: Clock,
    ) -> Arc<Self> {
        let calendar = Calendar::new(&settings.budget_time_zone, settings.budget_week_start)
            .unwrap_or_else(|error| {
                // The services check the zone at start (`Calendar::new`); an embedder that did
                // not gets UTC, said loudly.
                tracing::error!(%error, "budget time zone unusable; budgets follow UTC");
                Calendar::default()
            });
        Arc::new(LeaseEngine {
            key_wakeups: Mutex::new(HashMap::new()),
            calendar,
            clock,
            policy,
            backend,
            settings,
            instance: new_instance_id(),
            sequence: AtomicU64::new(0),
            local_wakeups: Mutex::new(HashMap::new()),
            local_waiting: Arc::new(Mutex::new(HashMap::new())),
            pending_releases: Mutex::new(Vec::new()),
            metrics,
        })
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn instance_id(&self) -> &str {
        &self.instance
    }

    /// The failure policy layer, when the backend is Redis.
    pub fn policy(&self) -> Option<&Arc<PolicyBackend>> {
        self.policy.as_ref()
    }

    /// Whether Redis is unreachable and the failure policy decides.
    pub fn is_degraded(&self) -> bool {
        self.policy
            .as_ref()
            .is_some_and(|policy| policy.is_degraded())
    }

    fn next_lease_id(&self, account_id: AccountId) -> LeaseId {
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        LeaseId::new(account_id, &self.instance, sequence)
    }

    /// A lease id for `terms`: keyed when the client key has a limit, so every later operation
    /// (also a unary `Release` with the id alone) finds the key's slot.
    fn lease_id_for(&self, terms: &LeaseTerms) -> LeaseId {
        match key_of(terms) {
            Some(key) => {
                let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
                LeaseId::keyed(terms.account_id, key.api_key_id, &self.instance, sequence)
            }
            None => self.next_lease_id(terms.account_id),
        }
    }

    /// The clock the engine and its memory backend run on.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// The time budget periods are computed from: the backend's (Redis time on Redis, a shared
    /// decision), or a manual clock's, which stands in for Redis' too so a test crosses a day
    /// or a DST change on every store.
    async fn wall_now_ms(&self) -> Result<i64, StateError> {
        if self.clock.is_manual() {
            return Ok(self.clock.wall_ms());
        }
        self.backend.wall_now_ms().await
    }

    /// The key's gates for an acquire now: its limits and the budget periods of this instant.
    async fn key_gate(&self, key: &KeyLimits) -> Result<KeyGate, StateError> {
        let now = self.wall_now_ms().await?;
        let periods = self.calendar.periods(now);
        let resets = |ends_ms: i64| u64::try_from(ends_ms - now).unwrap_or(0).max(1);
        Ok(KeyGate {
            api_key_id: key.api_key_id,
            concurrency_limit: key.concurrency_limit,
            tpm_limit: key.tpm_limit,
            tpm_window_ms: millis(self.settings.rpm_window),
            budgets: [
                Budget {
                    period_id: TOTAL_PERIOD.to_owned(),
                    limit_micros: key.budget_total_micros,
                    resets_in_ms: 0,
                },
                Budget {
                    period_id: periods.day.id,
                    limit_micros: key.budget_day_micros,
                    resets_in_ms: resets(periods.day.ends_ms),
                },
                Budget {
                    period_id: periods.week.id,
                    limit_micros: key.budget_week_micros,
                    resets_in_ms: resets(periods.week.ends_ms),
                },
                Budget {
                    period_id: periods.month.id,
                    limit_micros: key.budget_month_micros,
                    resets_in_ms: resets(periods.month.ends_ms),
                },
            ],
        })
    }

    /// What a keyed lease's release charges its key: the tokens, and the spend to the periods
    /// of this instant (each counter kept past its period's end).
    async fn key_charge(&self, spend_micros: i64, tokens: u64) -> KeyCharge {
        // A clock that cannot be read (Redis away) costs the periods' precision, not the charge.
        let now = self
            .wall_now_ms()
            .await
            .unwrap_or_else(|_| self.clock.wall_ms());
        let periods = self.calendar.periods(now);
        let ttl =
            |ends_ms: i64| u64::try_from(ends_ms - now).unwrap_or(0) + BUDGET_COUNTER_MARGIN_MS;
        KeyCharge {
            tokens,
            spend_micros: spend_micros.max(0),
            tpm_window_ms: millis(self.settings.rpm_window),
            periods: [
                (TOTAL_PERIOD.to_owned(), 0),
                (periods.day.id, ttl(periods.day.ends_ms)),
                (periods.week.id, ttl(periods.week.ends_ms)),
                (periods.month.id, ttl(periods.month.ends_ms)),
            ],
        }
    }

    fn key_wakeup(&self, api_key_id: i64) -> Arc<Notify> {
        let mut wakeups = self.key_wakeups.lock().unwrap_or_else(|p| p.into_inner());
        wakeups.entry(api_key_id).or_default().clone()
    }

    /// A slot of the lease's account, and of its key, freed up here.
    fn wake_for(&self, lease_id: &LeaseId) {
        self.wake_one(lease_id.account_id());
        if let Some(api_key_id) = lease_id.api_key_id() {
            let wakeups = self.key_wakeups.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(notify) = wakeups.get(&api_key_id) {
                notify.notify_one();
            }
        }
    }

    /// Another replica's release freed a slot of this lease's account (and key): one local
    /// waiter of each tries at once instead of at its next poll (`redis_backend::wake`).
    pub(crate) fn wake_for_release_elsewhere(&self, lease_id: &LeaseId) {
        if self.has_local_waiters(lease_id.account_id()) {
            self.metrics.wakes_received.inc();
            self.wake_for(lease_id);
        }
    }

    fn ttl_ms(&self) -> u64 {
        millis(self.settings.lease_ttl)
    }

    /// How long a released lease stays fenced: its last holder heartbeats at most a ttl after
    /// its last renewal, and an orphaned one is resumable for the grace, so after this no
    /// holder of it can still be asking.
    fn fence_ms(&self) -> u64 {
        millis(self.settings.lease_ttl + self.settings.orphan_grace)
    }

    fn limits(&self, terms: &LeaseTerms) -> AcquireLimits {
        AcquireLimits {
            ttl_ms: self.ttl_ms(),
            rpm_window_ms: millis(self.settings.rpm_window),
            window_limit_micros: terms.effective_window_limit_micros(self.settings.sticky_reserve),
            session_window_ms: millis(self.settings.session_window),
        }
    }

    fn wakeup(&self, account_id: AccountId) -> Arc<Notify> {
        let mut wakeups = self.local_wakeups.lock().unwrap_or_else(|p| p.into_inner());
        wakeups.entry(account_id).or_default().clone()
    }

    fn wake_one(&self, account_id: AccountId) {
        let wakeups = self.local_wakeups.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(notify) = wakeups.get(&account_id) {
            notify.notify_one();
        }
    }

    fn has_local_waiters(&self, account_id: AccountId) -> bool {
        let waiting = self.local_waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.get(&account_id).is_some_and(|n| *n > 0)
    }

    /// One try at every gate. Where the backend joins the user gate (one Redis node, memory) it
    /// is one step that writes nothing when refused; otherwise `terms` carries no user here (the
    /// user was charged once for the whole acquire, see `acquire`).
    async fn try_acquire(&self, terms: &LeaseTerms) -> Result<AcquireOutcome, StateError> {
        let lease_id = self.lease_id_for(terms);
        if untracked(terms) {
            return Ok(AcquireOutcome::Granted(lease_id));
        }
        let gate = match key_of(terms) {
            Some(key) => Some(self.key_gate(key).await?),
            None => None,
        };
        let denial = self
            .backend
            .acquire_keyed(terms, &lease_id, self.limits(terms), gate.as_ref())
            .await?;
        Ok(match denial {
            None => AcquireOutcome::Granted(lease_id),
            Some(denial) => AcquireOutcome::Denied(denial),
        })
    }

    /// Takes a lease, waiting up to `wait` for a slot (or an RPM event) to free up. `on_queued`
    /// is told the queue position once the acquire registers as a waiter. `cancel` ends the wait
    /// (the client went away); a script already running is allowed to finish so its result is
    /// never lost.
    ///
    /// The user RPM gate joins the account gates in one step where the backend can
    /// (`joins_user_gate`). Otherwise (a Redis Cluster, or an unlimited account) the user is
    /// charged once, before the first try, with an event id of its own (the charge is idempotent
    /// by it), kept through the wait (no charge per poll), and refunded when no lease came of
    /// it — also when the caller goes away (the refund then runs detached).
    pub async fn acquire(
        &self,
        terms: &LeaseTerms,
        wait: Duration,
        cancel: &CancellationToken,
        on_queued: impl FnMut(u32),
    ) -> Result<AcquireOutcome, StateError> {
        let separate_user = terms
            .user
            .as_ref()
            .filter(|user| user.rpm_limit > 0)
            .filter(|_| untracked(terms) || !self.backend.joins_user_gate());
        let Some(user) = separate_user else {
            return self.wait_for_grant(terms, wait, cancel, on_queued).await;
        };
        let event_id = format!("u{}", self.next_lease_id(terms.account_id));
        let charged = self
            .backend
            .charge_user(
                &user.user_id,
                user.rpm_limit,
                &event_id,
                millis(self.settings.rpm_window),
            )
            .await;
        match charged {
            Ok(None) => {}
            Ok(Some(denial)) => {
                let outcome = Ok(AcquireOutcome::Denied(denial));
                self.record_decision(&outcome);
                return outcome;
            }
            Err(error) => {
                let outcome = Err(error);
                self.record_decision(&outcome);
                return outcome;
            }
        }
        let charge = UserCharge {
            backend: self.backend.clone(),
            user_id: user.user_id.clone(),
            event_id,
            armed: true,
        };
        let account_terms = LeaseTerms {
            user: None,
            ..terms.clone()
        };
        let outcome = self
            .wait_for_grant(&account_terms, wait, cancel, on_queued)
            .await;
        match outcome {
            Ok(AcquireOutcome::Granted(_)) => charge.keep(),
            _ => charge.refund().await,
        }
        outcome
    }

    /// The wait loop of `acquire`: tries, registers as a waiter, sleeps until woken or the next
    /// poll, until granted, refused for good, or cancelled.
    async fn wait_for_grant(
        &self,
        terms: &LeaseTerms,
        wait: Duration,
        cancel: &CancellationToken,
        mut on_queued: impl FnMut(u32),
    ) -> Result<AcquireOutcome, StateError> {
        // A wait, on Tokio's timer, not the engine's clock (core/src/clock.rs: a clock tells the
        // time, it does not sleep).
        let deadline = Instant::now() + wait;
        let mut waiter: Option<WaiterGuard> = None;
        let mut delay = self.settings.wait_poll_initial;
        // Fairness: while acquires of this replica wait for the account, a new one queues behind
        // them instead of taking a slot one of them is about to get (under overload, new
        // requests probing with no wait would otherwise win every freed slot and starve the
        // queue). It nudges a waiter instead, so a slot freed elsewhere is not left idle.
        let mut queue_first = !untracked(terms) && self.has_local_waiters(terms.account_id);
        let key_wakeup = key_of(terms).map(|key| self.key_wakeup(key.api_key_id));
        loop {
            let outcome = if std::mem::take(&mut queue_first) {
                self.wake_one(terms.account_id);
                Ok(AcquireOutcome::Denied(Denial::new(
                    DenyReason::Concurrency,
                    0,
                )))
            } else {
                self.try_acquire(terms).await
            };
            let denial = match outcome {
                Ok(AcquireOutcome::Denied(denial)) => denial,
                other => {
                    self.record_decision(&other);
                    return other;
                }
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            let hopeless = !denial.reason.is_waitable()
                || remaining.is_zero()
                || Duration::from_millis(denial.retry_after_ms) > remaining;
            if hopeless {
                let outcome = Ok(AcquireOutcome::Denied(denial));
                self.record_decision(&outcome);
                return outcome;
            }
            if waiter.is_none() {
                let waiter_id = format!("w{}", self.next_lease_id(terms.account_id));
                // The entry outlives the wait a little so a slow poll never finds itself gone.
                let ttl_ms = millis(remaining) + millis(self.settings.wait_poll_max) + 1000;
                let position = self
                    .backend
                    .register_waiter(
                        terms.account_id,
                        &waiter_id,
                        self.settings.max_waiting,
                        ttl_ms,
                    )
                    .await?;
                let Some(position) = position else {
                    let outcome = Ok(AcquireOutcome::Denied(Denial::new(
                        DenyReason::QueueFull,
                        0,
                    )));
                    self.record_decision(&outcome);
                    return outcome;
                };
                self.metrics.waiters.inc();
                *self
                    .local_waiting
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(terms.account_id)
                    .or_default() += 1;
                waiter = Some(WaiterGuard {
                    backend: self.backend.clone(),
                    account_id: terms.account_id,
                    waiter_id,
                    metrics: self.metrics.clone(),
                    local_waiting: self.local_waiting.clone(),
                });
                on_queued(position);
            }
            // Jitter keeps replicas from polling in step; RPM refusals know when to come back.
            let jittered = delay.mul_f64(0.5 + fastrand::f64());
            let pause = jittered
                .max(Duration::from_millis(denial.retry_after_ms))
                .min(remaining);
            let wakeup = self.wakeup(terms.account_id);
            let key_freed = async {
                match &key_wakeup {
                    Some(notify) => notify.notified().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = wakeup.notified() => {}
                _ = key_freed => {}
                _ = tokio::time::sleep(pause) => {}
                _ = cancel.cancelled() => {
                    let outcome = Ok(AcquireOutcome::Cancelled);
                    self.record_decision(&outcome);
                    return outcome;
                }
            }
            delay = (delay * 2).min(self.settings.wait_poll_max);
        }
    }

    fn record_decision(&self, outcome: &Result<AcquireOutcome, StateError>) {
        let (result, reason) = match outcome {
            Ok(AcquireOutcome::Granted(_)) => ("granted", "none"),
            Ok(AcquireOutcome::Denied(denial)) => ("denied", denial.reason.as_str()),
            Ok(AcquireOutcome::Cancelled) => ("cancelled", "client_gone"),
            Err(StateError::Timeout) => ("error", "backend_timeout"),
            Err(StateError::Failed(_)) => ("error", "backend_error"),
        };
        self.metrics
            .decisions
            .with_label_values(&[result, reason])
            .inc();
    }

    /// Takes over a lease whose stream broke (or that another stream still holds: the last
    /// `Resume` holds it). Never adds a lease the backend does not have live.
    pub async fn resume(
        &self,
        lease_id: &LeaseId,
        terms: &LeaseTerms,
    ) -> Result<Resumption, StateError> {
        if untracked(terms) {
            return Ok(Resumption::Resumed { holder_epoch: 0 });
        }
        self.backend
            .resume(lease_id, self.ttl_ms(), key_limit(terms))
            .await
    }

    /// A renewal by a holder that renews every ttl/3 (the standalone relay's lease): see
    /// [`Self::heartbeat`].
    pub async fn renew(
        &self,
        lease_id: &LeaseId,
        terms: &LeaseTerms,
    ) -> Result<Renewal, StateError> {
        self.heartbeat(lease_id, terms, Duration::ZERO).await
    }

    /// A heartbeat: renews the lease, re-adds it if the backend lost it and the account has
    /// room, or reports it lost (released, no room). `since_renewal` is how long ago the
    /// holder's last renewal succeeded: after a whole ttl the lease surely expired, and it is
    /// not re-added (its release fence, which lasts a ttl plus the grace from the release, may
    /// have fallen already), so the holder is told `Lost{expired}`.
    pub async fn heartbeat(
        &self,
        lease_id: &LeaseId,
        terms: &LeaseTerms,
        since_renewal: Duration,
    ) -> Result<Renewal, StateError> {
        if untracked(terms) {
            return Ok(Renewal::Renewed);
        }
        let restore_within =
            (since_renewal < self.settings.lease_ttl).then_some(terms.concurrency_limit);
        let renewal = self
            .backend
            .renew(lease_id, self.ttl_ms(), restore_within, key_limit(terms))
            .await?;
        match renewal {
            Renewal::Renewed => {}
            Renewal::Restored => self.metrics.leases_restored.inc(),
            Renewal::Lost(reason) => self
                .metrics
                .leases_lost
                .with_label_values(&[reason.as_str()])
                .inc(),
        }
        Ok(renewal)
    }

    /// Charges account RPM for the `n`-th same-account retry on a held lease.
    pub async fn attempt(
        &self,
        lease_id: &LeaseId,
        terms: &LeaseTerms,
        attempt: u32,
    ) -> Result<Option<Denial>, StateError> {
        if terms.rpm_limit <= 0 {
            return Ok(None);
        }
        // Unique across resumes (a resumed stream counts its attempts from 1 again) and replicas:
        // an event id seen twice would be charged once.
        let sequence = self.sequence.fetch_add(1, Ordering::Relaxed);
        let event_id = format!("{lease_id}:{attempt}.{}.{sequence}", self.instance);
        let rpm_window_ms = millis(self.settings.rpm_window);
        let denial = self
            .backend
            .attempt(lease_id, terms.rpm_limit, &event_id, rpm_window_ms)
            .await?;
        let (result, reason) = match denial {
            None => ("granted", "none"),
            Some(denial) => ("denied", denial.reason.as_str()),
        };
        self.metrics
            .attempts
            .with_label_values(&[result, reason])
            .inc();
        Ok(denial)
    }

    pub async fn inflight(&self, account_ids: &[AccountId]) -> Result<Vec<u32>, StateError> {
        self.backend.inflight(account_ids).await
    }

    /// What accounts used of their rate limits, in the order asked: (requests admitted in the
    /// rolling RPM window, spend in the current session window in micro-USD), over this engine's
    /// windows. For the operator's status view.
    pub async fn usage(&self, account_ids: &[AccountId]) -> Result<Vec<(u32, i64)>, StateError> {
        self.backend
            .usage(
                account_ids,
                millis(self.settings.rpm_window),
                millis(self.settings.session_window),
            )
            .await
    }

    /// Admission's state as the registry (or, in process, this engine) tells it.
    pub async fn admission_status(&self) -> poolgate_core::status::AdmissionReport {
        self.backend.admission_status().await
    }

    /// Live leases of client keys' slots (keyed leases across every account), in the order
    /// asked: what a key's concurrency limit counts.
    pub async fn key_inflight(&self, api_key_ids: &[i64]) -> Result<Vec<u32>, StateError> {
        self.backend.key_inflight(api_key_ids).await
    }

    pub async fn record_spend(
        &self,
        account_id: AccountId,
        spend_micros: i64,
    ) -> Result<i64, StateError> {
        self.metrics.spend_micros.inc_by(spend_micros.max(0) as u64);
        self.backend
            .record_spend(
                account_id,
                spend_micros,
                millis(self.settings.session_window),
            )
            .await
    }

    /// Raises a client key's budget counter for `period_id` (`t`, `d:2026-12-02`, `w:…`, `m:…`)
    /// to `micros` where it holds less — absent after a flush or a restart, or recreated by the
    /// charges since — and never lowers it: the hook through which the usage ledger rebuilds
    /// budgets. The ledger and the counter both count only spend that happened, so the larger
    /// never counts a request twice. A new counter lives past its period's end like a charged
    /// one. Returns whether it was raised.
    pub async fn seed_budget(
        &self,
        api_key_id: i64,
        period_id: &str,
        micros: i64,
    ) -> Result<bool, StateError> {
        let expires_in_ms = match period_id {
            TOTAL_PERIOD => 0,
            _ => {
                let now = self.wall_now_ms().await?;
                let periods = self.calendar.periods(now);
                let ends_ms = [periods.day, periods.week, periods.month]
                    .into_iter()
                    .find(|period| period.id == period_id)
                    .map_or(now, |period| period.ends_ms);
                u64::try_from(ends_ms - now).unwrap_or(0) + BUDGET_COUNTER_MARGIN_MS
            }
        };
        self.backend
            .seed_budget(api_key_id, period_id, micros, expires_in_ms)
            .await
    }

    /// The calendar budgets are counted in (the settings' time zone and week start).
    pub fn calendar(&self) -> &Calendar {
        &self.calendar
    }

    /// The budget periods of this instant (day, week, month), as the engine names them.
    pub async fn budget_periods(&self) -> Result<crate::calendar::Periods, StateError> {
        Ok(self.calendar.periods(self.wall_now_ms().await?))
    }

    /// Hard-blocks an account (the selector's cooldown key; exposed for the in-process selector
    /// and tests).
    pub async fn set_cooldown(
        &self,
        account_id: AccountId,
        duration: Duration,
    ) -> Result<(), StateError> {
        self.backend
            .set_cooldown(account_id, millis(duration))
            .await
    }

    /// Lifts an account's hard block (the in-process selector's `clear` and the end of a
    /// confirmation it started).
    pub async fn clear_cooldown(&self, account_id: AccountId) -> Result<(), StateError> {
        self.backend.clear_cooldown(account_id).await
    }
}

/// The client key's limits, when it has any.
fn key_of(terms: &LeaseTerms) -> Option<&KeyLimits> {
    terms
        .key
        .as_ref()
        .filter(|key| key.any() && key.api_key_id > 0)
}

/// The key's concurrency limit (0: none), for a restore or a resume.
fn key_limit(terms: &LeaseTerms) -> i32 {
    key_of(terms).map_or(0, |key| key.concurrency_limit)
}

/// Terms that never touch the backend: an account without limits and no key limit either
/// (docs/DESIGN.md §4).
fn untracked(terms: &LeaseTerms) -> bool {
    terms.account_unlimited() && key_of(terms).is_none()
}
