//! Selection at the edge (docs/DESIGN.md §2, "Selection at the edge"): [`EdgeSelection`] is the
//! selection API a distributed relay holds. It plans, checks keys and lists models in the relay's
//! own process, with the selection engine over the view the selector streams (`WatchView`,
//! followed by [`follow_view`]); every write still goes to the selector: outcomes (a refused
//! OAuth token is answered with the new one, as before), bindings (written through; the relay
//! keeps its own), usage and usage windows.
//!
//! A client key the view does not hold (created since the last update) is asked of the selector.
//! A request makes no selector call unless it names a binding the relay does not hold: a
//! session it has not seen (or not within the trust time) asks the selector's `Select` once; a
//! `previous_response_id` it does not hold asks it, and is refused as before when the selector
//! cannot answer (docs/SECURITY.md: a continuation whose binding cannot be checked is not
//! served). With no usable view (none yet, or none heard for `max_age`), every call goes to the
//! selector as before the edge existed.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use poolgate_core::account::Platform;
use poolgate_core::api::ApiError;
use poolgate_core::caller::KeyCheck;
use poolgate_core::keys::KeyDescription;
use poolgate_core::outcome::Outcome;
use poolgate_core::plan::Effect;
use poolgate_core::view::ViewUpdate;
use poolgate_core::windows::WindowReading;
use poolgate_proto::selector::v1 as spb;
use poolgate_proto::selector::v1::selector_client::SelectorClient;
use poolgate_select::api::{Plan, PlanRequest, Reported, SelectionApi, UsageRecord};
use poolgate_select::edge::{EdgeView, Known};
use poolgate_select::engine::{Selector, binding_key, scoped_response};
use prometheus::{IntCounter, IntCounterVec, IntGauge};

use crate::Traced;
use crate::selection::RemoteSelection;

/// How a distributed relay selects at the edge.
#[derive(Debug, Clone)]
pub struct EdgeSelectionSettings {
    /// The groups this relay serves (the view holds only theirs); empty: every group.
    pub groups: Vec<String>,
    /// How long the relay keeps serving from a view it stopped hearing about (every selector
    /// down). Past it, calls go to the selector, and fail while it is down.
    pub max_age: Duration,
    /// How long a session binding the relay holds is planned with, without asking the
    /// selector (another relay may move a session after a failover).
    pub binding_trust: Duration,
    /// A write to the selector (an outcome, a binding) not answered within this is dropped and
    /// counted: the request does not wait on a selector that is down.
    pub write_deadline: Duration,
}

impl Default for EdgeSelectionSettings {
    fn default() -> Self {
        EdgeSelectionSettings {
            groups: Vec::new(),
            max_age: Duration::from_secs(600),
            binding_trust: Duration::from_secs(60),
            write_deadline: Duration::from_secs(2),
        }
    }
}

/// The edge's counters, in the relay's registry.
#[derive(Clone)]
pub struct EdgeMetrics {
    /// relay_edge_plans_total{path}: `edge` (no selector call), `binding_asked` (a binding the
    /// relay did not hold: the selector's plan), `binding_unchecked` (that call failed: planned
    /// at the edge as a new conversation), `no_view` (the selector's plan: no usable view).
    pub plans: IntCounterVec,
    /// relay_edge_writes_dropped_total{what}: outcome reports and bindings the selector did not
    /// take within the write deadline (or refused to answer): the request went on without them.
    pub writes_dropped: IntCounterVec,
    /// relay_view_updates_total: updates of the view taken.
    pub updates: IntCounter,
    /// relay_view_streams_total{event}: `opened`, `broken`, `unreadable`, `unimplemented`.
    pub streams: IntCounterVec,
    /// relay_view_age_seconds: since the last update (-1: no view yet).
    pub age: IntGauge,
}

impl EdgeMetrics {
    pub fn registered_in(registry: &prometheus::Registry) -> Self {
        use poolgate_runtime::metrics;
        EdgeMetrics {
            plans: metrics::counter_vec(
                registry,
                "relay_edge_plans_total",
                "Plans by how they were made: edge (in the relay, no selector call), binding_asked (a binding the relay did not hold: the selector planned), binding_unchecked (the selector could not answer: planned at the edge as a new conversation), no_view (no usable view: the selector planned).",
                &["path"],
            ),
            writes_dropped: metrics::counter_vec(
                registry,
                "relay_edge_writes_dropped_total",
                "Outcome reports and bindings the selector did not take within the write deadline, by what (report, session, response); the request went on without them.",
                &["what"],
            ),
            updates: metrics::counter(
                registry,
                "relay_view_updates_total",
                "Updates of the relay's view of the pool taken from the selector's stream.",
            ),
            streams: metrics::counter_vec(
                registry,
                "relay_view_streams_total",
                "The view stream from the selector by event: opened, broken, unreadable (an update this build cannot read: the view is kept, the stream reopened), unimplemented (an older selector: plans go through it).",
                &["event"],
            ),
            age: metrics::gauge(
                registry,
                "relay_view_age_seconds",
                "Seconds since the relay's view of the pool was last updated; -1: no view yet.",
            ),
        }
    }
}

/// The selection API of a distributed relay.
pub struct EdgeSelection {
    engine: Arc<Selector>,
    view: Arc<EdgeView>,
    remote: Arc<RemoteSelection>,
    settings: EdgeSelectionSettings,
    metrics: EdgeMetrics,
    follower: tokio::task::JoinHandle<()>,
    /// Session bindings being written through at once, at most (past it one is dropped and
    /// counted: the relay holds it, the selector learns it at the session's next write).
    binding_writes: Arc<tokio::sync::Semaphore>,
}

impl Drop for EdgeSelection {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

impl EdgeSelection {
    /// Follows the selector's view (a task this value owns) and selects over it with `engine`
    /// (built by `poolgate_select::edge::edge_selector` over `view`).
    pub fn start(
        engine: Selector,
        view: Arc<EdgeView>,
        remote: Arc<RemoteSelection>,
        settings: EdgeSelectionSettings,
        metrics: EdgeMetrics,
    ) -> Self {
        let follower = tokio::spawn(follow_view(
            remote.client(),
            settings.groups.clone(),
            Arc::downgrade(&view),
            metrics.clone(),
        ));
        EdgeSelection {
            engine: Arc::new(engine),
            view,
            remote,
            settings,
            metrics,
            follower,
            binding_writes: Arc::new(tokio::sync::Semaphore::new(MAX_BINDING_WRITES)),
        }
    }

    /// The view this relay selects from.
    pub fn view(&self) -> &Arc<EdgeView> {
        &self.view
    }

    /// Whether the view may be planned from: there is one, heard from within `max_age`.
    fn usable(&self) -> bool {
        self.view
            .age()
            .is_some_and(|age| age < self.settings.max_age)
    }

    /// Whether this relay serves `group` (`groups` empty: every group).
    fn serves(&self, group: &str) -> bool {
        self.settings.groups.is_empty() || self.settings.groups.iter().any(|g| g == group)
    }

    fn count(&self, path: &str) {
        self.metrics.plans.with_label_values(&[path]).inc();
    }

    /// The selector's plan, within the write deadline (a plan asked for a binding).
    async fn remote_plan(&self, request: &PlanRequest) -> Result<Plan, ApiError> {
        match tokio::time::timeout(self.settings.write_deadline, self.remote.plan(request)).await {
            Ok(answer) => answer,
            Err(_) => Err(ApiError::NoAnswer("the selector did not answer in time")),
        }
    }

    /// Runs a write to the selector within the deadline; a write it did not take is counted.
    async fn write<T>(
        &self,
        what: &str,
        call: impl std::future::Future<Output = Result<T, ApiError>>,
    ) -> Result<T, ApiError> {
        let answer = match tokio::time::timeout(self.settings.write_deadline, call).await {
            Ok(answer) => answer,
            Err(_) => Err(ApiError::NoAnswer("the selector did not answer in time")),
        };
        if answer.is_err() {
            self.metrics.writes_dropped.with_label_values(&[what]).inc();
        }
        answer
    }
}

#[async_trait]
impl SelectionApi for EdgeSelection {
    async fn check_key(&self, api_key: &str) -> Result<KeyCheck, ApiError> {
        if !self.usable() {
            return self.remote.check_key(api_key).await;
        }
        match SelectionApi::check_key(&*self.engine, api_key).await? {
            // A key the view does not hold may be one created since the last update: the
            // selector answers (the relay's own bound on key lookups applies, as before the
            // edge); unreachable, the view's answer stands.
            KeyCheck::Unknown => Ok(match self.remote.check_key(api_key).await {
                // A key of a group this relay does not serve is not this relay's.
                Ok(KeyCheck::Known(caller)) if !self.serves(&caller.group) => KeyCheck::Unknown,
                Ok(answer) => answer,
                Err(_) => KeyCheck::Unknown,
            }),
            known => Ok(known),
        }
    }

    async fn describe_key(&self, api_key: &str) -> Result<Option<KeyDescription>, ApiError> {
        // The key's usage is the selector's (Postgres): not on a request's hot path.
        self.remote.describe_key(api_key).await
    }

    async fn plan(&self, request: &PlanRequest) -> Result<Plan, ApiError> {
        if !self.usable() {
            self.count("no_view");
            return self
                .remote
                .plan(request)
                .await
                .map_err(|error| match error {
                    ApiError::Unavailable(why) | ApiError::Unreadable(why) => {
                        ApiError::Unavailable(format!(
                            "no current view of the pool, and the selector: {why}"
                        ))
                    }
                    other => other,
                });
        }
        if let Some(previous) = &request.previous_response_id {
            let scoped = scoped_response(request.api_key_id, previous);
            if self.view.response(&scoped).is_none() {
                // Only the selector can say whose response it is: asked, or refused as before.
                self.count("binding_asked");
                let plan = self.remote_plan(request).await?;
                if plan.sticky
                    && let Some(first) = plan.accounts.first()
                {
                    self.view.learn_response(&scoped, first.id);
                }
                return Ok(plan);
            }
        } else if let Some(session) = request
            .session_hash
            .as_ref()
            .filter(|_| !request.opens_conversation)
        {
            let key = binding_key(request.api_key_id, session);
            if !matches!(
                self.view
                    .session(&request.group, &key, self.settings.binding_trust),
                Known::Trusted(_)
            ) {
                match self.remote_plan(request).await {
                    Ok(plan) => {
                        self.count("binding_asked");
                        if plan.sticky
                            && let Some(first) = plan.accounts.first()
                        {
                            self.view.learn_session(&request.group, &key, first.id);
                        }
                        return Ok(plan);
                    }
                    Err(error) => {
                        // A new conversation (or the binding held, if any): served at the edge.
                        tracing::debug!(%error, "session binding not asked; planned at the edge");
                        self.count("binding_unchecked");
                        return SelectionApi::plan(&*self.engine, request).await;
                    }
                }
            }
        }
        self.count("edge");
        SelectionApi::plan(&*self.engine, request).await
    }

    async fn report(&self, outcome: Outcome) -> Result<Reported, ApiError> {
        let account_id = outcome.account_id;
        let reported = self.write("report", self.remote.report(outcome)).await?;
        match &reported {
            Reported::Applied(applied) => {
                self.view
                    .note_applied(account_id, applied.what, applied.block_ms)
            }
            Reported::Refreshed(_) => self.view.note_applied(account_id, Effect::Refreshed, 0),
        }
        Ok(reported)
    }

    async fn bind_session(
        &self,
        api_key_id: i64,
        group: &str,
        session: &str,
        account_id: i64,
    ) -> Result<(), ApiError> {
        let key = binding_key(api_key_id, session);
        let held = self.engine.bind_session(group, &key, account_id).await;
        if matches!(held, Ok("hit")) {
            // Held here and written through within the touch period: the selector has it.
            return Ok(());
        }
        // Written through off the request's path: the relay holds the binding already, and the
        // selector's copy is for the other relays and the next minute.
        let Ok(permit) = self.binding_writes.clone().try_acquire_owned() else {
            self.metrics
                .writes_dropped
                .with_label_values(&["session"])
                .inc();
            return Ok(());
        };
        let (remote, metrics, deadline) = (
            self.remote.clone(),
            self.metrics.clone(),
            self.settings.write_deadline,
        );
        let (group, session) = (group.to_owned(), session.to_owned());
        tokio::spawn(async move {
            let written = tokio::time::timeout(
                deadline,
                remote.bind_session(api_key_id, &group, &session, account_id),
            )
            .await;
            if !matches!(written, Ok(Ok(()))) {
                metrics.writes_dropped.with_label_values(&["session"]).inc();
            }
            drop(permit);
        });
        Ok(())
    }

    async fn bind_response(
        &self,
        api_key_id: i64,
        response_id: &str,
        account_id: i64,
    ) -> Result<(), ApiError> {
        self.view
            .learn_response(&scoped_response(api_key_id, response_id), account_id);
        self.write(
            "response",
            self.remote
                .bind_response(api_key_id, response_id, account_id),
        )
        .await
    }

    async fn record_usage(&self, records: Vec<UsageRecord>) -> Result<(), ApiError> {
        self.remote.record_usage(records).await
    }

    async fn record_windows(
        &self,
        account_id: i64,
        readings: Vec<WindowReading>,
    ) -> Result<(), ApiError> {
        self.view.note_windows(account_id, &readings);
        self.remote.record_windows(account_id, readings).await
    }

    async fn models(&self, group: &str, platform: Platform) -> Result<Vec<String>, ApiError> {
        if self.usable() {
            SelectionApi::models(&*self.engine, group, platform).await
        } else {
            self.remote.models(group, platform).await
        }
    }
}

/// Session bindings written through at once, at most.
const MAX_BINDING_WRITES: usize = 256;

/// Longest back-off between two attempts to open the stream.
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long an older selector (no `WatchView`) is left before it is asked again.
const UNIMPLEMENTED_RETRY: Duration = Duration::from_secs(60);

/// Keeps the view current while it lives: opens `WatchView` (any replica), applies each update,
/// and opens it again after a break, with a back-off. A stream that goes quiet for ten periods
/// (at least five seconds) is taken as broken.
pub async fn follow_view(
    client: SelectorClient<Traced>,
    groups: Vec<String>,
    view: Weak<EdgeView>,
    metrics: EdgeMetrics,
) {
    let mut backoff = Duration::from_millis(100);
    let age_task = tokio::spawn(show_age(view.clone(), metrics.age.clone()));
    let _age_task = AbortOnDrop(age_task);
    loop {
        let opened = client
            .clone()
            .watch_view(spb::WatchViewRequest {
                groups: groups.clone(),
            })
            .await;
        match opened {
            Ok(stream) => {
                metrics.streams.with_label_values(&["opened"]).inc();
                let mut stream = stream.into_inner();
                loop {
                    let quiet = view.upgrade().map_or(Duration::ZERO, |view| {
                        (view.period() * 10).max(Duration::from_secs(5))
                    });
                    if quiet.is_zero() {
                        return;
                    }
                    let update = match tokio::time::timeout(quiet, stream.message()).await {
                        Ok(Ok(Some(update))) => update,
                        Ok(Ok(None)) | Ok(Err(_)) | Err(_) => {
                            metrics.streams.with_label_values(&["broken"]).inc();
                            break;
                        }
                    };
                    match ViewUpdate::try_from(update) {
                        Ok(update) => {
                            let Some(view) = view.upgrade() else {
                                return;
                            };
                            view.apply(update);
                            metrics.updates.inc();
                            backoff = Duration::from_millis(100);
                        }
                        Err(error) => {
                            metrics.streams.with_label_values(&["unreadable"]).inc();
                            tracing::warn!(%error, "a view update this relay cannot read; view kept, stream reopened");
                            break;
                        }
                    }
                }
            }
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                metrics.streams.with_label_values(&["unimplemented"]).inc();
                tracing::info!(
                    "the selector does not stream views (an older release): plans go through it"
                );
                tokio::time::sleep(UNIMPLEMENTED_RETRY).await;
                continue;
            }
            Err(status) => {
                tracing::debug!(code = ?status.code(), "view stream not opened");
            }
        }
        if view.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Sets `relay_view_age_seconds` every second.
async fn show_age(view: Weak<EdgeView>, gauge: IntGauge) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(view) = view.upgrade() else {
            return;
        };
        gauge.set(
            view.age()
                .map_or(-1, |age| i64::try_from(age.as_secs()).unwrap_or(i64::MAX)),
        );
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
