//! The engines' two APIs, `SelectionApi` and `LeaseApi` (`select/src/api.rs`,
//! `lease/src/api.rs`), held to one contract: every case is written once and runs on both
//! implementations, the engines in this process (built as the standalone relay builds them,
//! memory stores) and the gRPC clients (`poolgate-client`) against a real selector and
//! admission over private Postgres and Redis. The relay's behaviour rests on these
//! answers being the same whichever way it is deployed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use poolgate_core::account::{CredentialKind, Platform};
use poolgate_core::classify::{Classified, classify};
use poolgate_core::keys::KeyAccess;
use poolgate_core::lease::{DenyReason, LeaseTerms, Settings};
use poolgate_core::now_ms;
use poolgate_core::outcome::Outcome;
use poolgate_core::select::NoneReason;
use poolgate_select::engine::SelectorSettings;
use poolgate_select::source::{AccountSource, UsageTotals};
use poolgate_stack::{self as stack, SERVICE_TOKEN};
use poolgate_testkit::eventually;
use relay_svc::metrics::Metrics;
use relay_svc::ports::{
    Acquired, Caller, KeyCheck, Lease, LeaseApi, Plan, PlanRequest, RefusedFor, SelectionApi,
    UsageRecord,
};
use relay_svc::remote::{GrpcClient, remote_backends};
use relay_svc::standalone::{Standalone, StandaloneFile};

/// Nothing listens there: no case here calls an upstream (none reports what the probe would
/// confirm).
const NOWHERE: &str = "http://127.0.0.1:9";

/// The client key of the in-process pool (the gRPC one has the selector make its own).
const IN_PROCESS_KEY: &str = "pgk-ports-key-0001";

/// A second key of the pool, expired since long ago (1970-01-01T00:16:40Z): both
/// implementations refuse it as a whole, naming when.
const EXPIRED_KEY: &str = "pgk-ports-expired-0001";
const EXPIRED_AT_MS: i64 = 1_000_000;

/// The user and per-user limit of the one client key.
const USER: &str = "alice";
const USER_RPM: i32 = 7;

/// Admission's settings in both modes: a lease whose stream ends without a release stays
/// resumable this long, well past any wait below, so only a real release frees a slot in time.
fn admission_settings() -> Settings {
    Settings {
        orphan_grace: Duration::from_secs(30),
        ..Settings::default()
    }
}

/// One account of a test pool: credential `cred-<name>`, platform Anthropic.
#[derive(Clone, Copy)]
struct Spec {
    name: &'static str,
    group: &'static str,
    priority: i32,
    concurrency: i32,
    mapping: Option<(&'static str, &'static str)>,
    /// Allowed models (empty: any).
    models: &'static [&'static str],
}

fn spec(name: &'static str, priority: i32) -> Spec {
    Spec {
        name,
        group: "default",
        priority,
        concurrency: 4,
        mapping: None,
        models: &[],
    }
}

/// What keeps a deployment running, and where its usage ledger is read.
enum Running {
    InProcess(Standalone),
    Grpc(Box<GrpcStack>),
}

/// The selector and admission servers, and the Postgres and Redis behind them.
struct GrpcStack {
    backends: stack::Backends,
    _selector: selector_svc::server::Built,
    _admission: Arc<poolgate_lease::LeaseEngine>,
}

/// The two ports of one deployment, over a pool of `Spec`s.
struct Ports {
    selection: Arc<dyn SelectionApi>,
    leases: Arc<dyn LeaseApi>,
    /// The client key.
    key: String,
    /// A key of the pool that expired long ago.
    expired_key: String,
    /// Account names and ids.
    accounts: Vec<(&'static str, i64)>,
    running: Running,
}

async fn in_process(specs: &[Spec]) -> Ports {
    let mut yaml = format!(
        "api_keys:\n  - {{key: {IN_PROCESS_KEY}, user: {USER}, group: default, user_rpm: {USER_RPM}}}\n  - {{key: {EXPIRED_KEY}, user: {USER}, group: default, expires_at: {}}}\naccounts:\n",
        EXPIRED_AT_MS / 1000
    );
    for spec in specs {
        let mut extra = spec
            .mapping
            .map(|(from, to)| format!(", model_mapping: {{{from}: {to}}}"))
            .unwrap_or_default();
        if !spec.models.is_empty() {
            extra.push_str(&format!(", models: [{}]", spec.models.join(", ")));
        }
        yaml.push_str(&format!(
            "  - {{name: {}, group: {}, platform: anthropic, base_url: \"{NOWHERE}\", credential: cred-{}, priority: {}, concurrency: {}{extra}}}\n",
            spec.name, spec.group, spec.name, spec.priority, spec.concurrency,
        ));
    }
    let file = StandaloneFile::parse(&yaml).expect("the pool's file parses");
    let engines = relay_svc::standalone::build(
        &file,
        None,
        SelectorSettings::default(),
        admission_settings(),
        &Metrics::new(),
    )
    .expect("the engines start");
    // Standalone ids are the accounts' positions in the file, from 1.
    let accounts = specs
        .iter()
        .zip(1..)
        .map(|(spec, id)| (spec.name, id))
        .collect();
    Ports {
        selection: engines.selection.clone(),
        leases: engines.leases.clone(),
        key: IN_PROCESS_KEY.into(),
        expired_key: EXPIRED_KEY.into(),
        accounts,
        running: Running::InProcess(engines),
    }
}

async fn grpc(specs: &[Spec]) -> Ports {
    grpc_with(specs, false).await
}

/// The gRPC stack with the relay selecting at the edge (`EdgeSelection`), once its view came.
async fn edge(specs: &[Spec]) -> Ports {
    grpc_with(specs, true).await
}

async fn grpc_with(specs: &[Spec], at_edge: bool) -> Ports {
    let backends = stack::backends().await.expect("postgres and redis start");
    let mut accounts = Vec::new();
    for spec in specs {
        let mut input = stack::account(spec.name, NOWHERE, spec.concurrency, spec.priority);
        input.group = spec.group.into();
        if let Some((from, to)) = spec.mapping {
            input.model_mapping.insert(from.into(), to.into());
        }
        input.allowed_models = spec.models.iter().map(|m| m.to_string()).collect();
        let id = backends
            .store
            .upsert_account(&input)
            .await
            .expect("account stored");
        accounts.push((spec.name, id));
    }
    let (_, key) = backends
        .store
        .create_api_key("ports", USER, "default", USER_RPM)
        .await
        .expect("client key stored");
    let (_, expired) = backends
        .store
        .create_api_key_with_access(
            "ports-expired",
            USER,
            "default",
            0,
            &KeyAccess {
                expires_at_ms: Some(EXPIRED_AT_MS),
                ..KeyAccess::default()
            },
        )
        .await
        .expect("expired key stored");
    // The accounts are in Postgres before the selector starts: its first snapshot has them.
    let (selector, selector_addr) = stack::selector(&backends).await.expect("selector starts");
    let (admission, admission_addr) = stack::admission(&backends.redis.url(), admission_settings())
        .await
        .expect("admission starts");
    let metrics = relay_svc::remote::metrics::Metrics::new();
    let (selection, leases) = remote_backends(
        &[format!("http://{selector_addr}")],
        &[format!("http://{admission_addr}")],
        &GrpcClient {
            service_token: Some(SERVICE_TOKEN.into()),
            ..Default::default()
        },
        metrics.clone(),
        at_edge.then(|| {
            (
                Default::default(),
                relay_svc::server::edge_engine_settings(&Default::default()),
            )
        }),
    )
    .expect("the clients are configured");
    if at_edge {
        poolgate_testkit::eventually(Duration::from_secs(10), || async {
            metrics
                .registry
                .gather()
                .iter()
                .any(|family| {
                    family.name() == "relay_view_updates_total"
                        && family
                            .get_metric()
                            .iter()
                            .any(|m| m.get_counter().get_value() > 0.0)
                })
                .then_some(())
        })
        .await
        .expect("the relay's view arrives");
    }
    Ports {
        selection,
        leases,
        key: key.expose().to_owned(),
        expired_key: expired.expose().to_owned(),
        accounts,
        running: Running::Grpc(Box::new(GrpcStack {
            backends,
            _selector: selector,
            _admission: admission,
        })),
    }
}

impl Ports {
    fn id(&self, name: &str) -> i64 {
        self.accounts
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, id)| *id)
            .unwrap_or_else(|| panic!("no account {name}"))
    }

    fn name(&self, id: i64) -> &'static str {
        self.accounts
            .iter()
            .find(|(_, i)| *i == id)
            .map(|(n, _)| *n)
            .unwrap_or_else(|| panic!("no account #{id}"))
    }

    async fn caller(&self) -> Caller {
        self.selection
            .check_key(&self.key)
            .await
            .expect("the selection answers")
            .caller()
            .expect("the pool's key is known")
    }

    /// The plan for `request`, as account names.
    async fn plan(&self, request: &PlanRequest) -> (Plan, Vec<&'static str>) {
        let plan = self
            .selection
            .plan(request)
            .await
            .expect("the selection answers");
        let names = plan.accounts.iter().map(|a| self.name(a.id)).collect();
        (plan, names)
    }

    /// One client key's usage totals over the last and the next hour, from the ledger the
    /// records end in (the memory source's, or Postgres).
    async fn usage(&self, api_key_id: i64) -> UsageTotals {
        let (from, to) = (now_ms() - 3_600_000, now_ms() + 3_600_000);
        match &self.running {
            Running::InProcess(engines) => engines.source.read_usage(api_key_id, from, to).await,
            Running::Grpc(stack) => stack.backends.store.read_usage(api_key_id, from, to).await,
        }
        .expect("the ledger reads")
    }
}

fn request(caller: &Caller, group: &str, model: &str) -> PlanRequest {
    PlanRequest {
        service: Default::default(),
        api_key_id: caller.api_key_id,
        group: group.into(),
        platform: Platform::Anthropic,
        model: model.into(),
        session_hash: None,
        previous_response_id: None,
        exclude: Vec::new(),
        opens_conversation: false,
    }
}

/// A lease on account `account_id` with only a concurrency limit.
fn terms(account_id: i64, concurrency_limit: i32) -> LeaseTerms {
    LeaseTerms {
        account_id,
        concurrency_limit,
        rpm_limit: 0,
        user: None,
        session_hash: None,
        session_window_limit_micros: 0,
        session_bound: false,
        ignore_cooldown: false,
        key: None,
    }
}

fn granted(answer: Acquired, what: &str) -> Box<dyn Lease> {
    match answer {
        Acquired::Granted(lease) => lease,
        Acquired::Denied(denial) => panic!("{what}: denied ({denial:?})"),
    }
}

fn tiered() -> Vec<Spec> {
    vec![
        Spec {
            mapping: Some(("claude-x", "claude-upstream-x")),
            ..spec("first", 0)
        },
        Spec {
            concurrency: 3,
            ..spec("second", 1)
        },
        Spec {
            models: &["claude-x", "claude-z"],
            ..spec("third", 2)
        },
        Spec {
            group: "other",
            models: &["claude-x"],
            ..spec("elsewhere", 0)
        },
    ]
}

fn one_tier() -> Vec<Spec> {
    vec![spec("first", 0), spec("second", 0)]
}

async fn a_known_key_authenticates_as_its_user_and_an_unknown_one_is_none(ports: Ports) {
    let caller = ports.caller().await;
    assert_eq!(
        (
            caller.user.as_str(),
            caller.group.as_str(),
            caller.user_rpm_limit
        ),
        (USER, "default", USER_RPM)
    );
    assert!(caller.api_key_id > 0, "{caller:?}");
    assert_eq!(
        ports.caller().await,
        caller,
        "the same key, the same caller"
    );
    for unknown in ["pgk-nobody-0001", "", "not a key at all"] {
        let answer = ports
            .selection
            .check_key(unknown)
            .await
            .expect("an unknown key is an answer, not an error");
        assert_eq!(answer, KeyCheck::Unknown, "{unknown:?}");
    }
}

async fn an_expired_key_is_refused_as_a_whole_naming_when_and_still_described(ports: Ports) {
    let answer = ports
        .selection
        .check_key(&ports.expired_key)
        .await
        .expect("a refused key is an answer, not an error");
    let KeyCheck::Refused(refused) = answer else {
        panic!("refused: {answer:?}");
    };
    assert_eq!(refused.reason, RefusedFor::Expired);
    assert!(
        refused.message.contains("1970-01-01T00:16:40Z"),
        "names when: {}",
        refused.message
    );
    let described = ports
        .selection
        .describe_key(&ports.expired_key)
        .await
        .expect("the selection answers")
        .expect("its holder may still read it");
    assert_eq!(described.record.access.expires_at_ms, Some(EXPIRED_AT_MS));
}

async fn select_orders_the_groups_accounts_by_tier_with_what_calling_them_needs(ports: Ports) {
    let caller = ports.caller().await;
    let (plan, names) = ports.plan(&request(&caller, "default", "claude-x")).await;
    assert_eq!(
        names,
        ["first", "second", "third"],
        "tiers in order, the other group's account left out"
    );
    assert_eq!((plan.none_reason, plan.sticky), (None, false));
    let first = &plan.accounts[0];
    assert_eq!(first.credential.expose(), "cred-first");
    assert_eq!(first.credential_kind, CredentialKind::ApiKey);
    assert_eq!(first.base_url, NOWHERE);
    assert_eq!(
        first.mapped_model, "claude-upstream-x",
        "the account's mapping"
    );
    assert_eq!(plan.accounts[1].mapped_model, "claude-x", "no mapping");
    assert_eq!(plan.accounts[1].concurrency_limit, 3);
    assert!(plan.accounts.iter().all(|a| !a.soft_blocked));
    // A model only some accounts allow, and an account already tried.
    let (_, names) = ports.plan(&request(&caller, "default", "claude-z")).await;
    assert_eq!(
        names,
        ["first", "second", "third"],
        "no allow-list: any model"
    );
    let mut excluding = request(&caller, "default", "claude-x");
    excluding.exclude = vec![ports.id("first")];
    let (_, names) = ports.plan(&excluding).await;
    assert_eq!(names, ["second", "third"]);
    // The group's model list: allow-lists and mapping keys.
    assert_eq!(
        ports
            .selection
            .models("default", Platform::Anthropic)
            .await
            .expect("the selection answers"),
        ["claude-x", "claude-z"]
    );
    assert_eq!(
        ports
            .selection
            .models("default", Platform::OpenAi)
            .await
            .expect("the selection answers"),
        Vec::<String>::new()
    );
}

async fn an_unknown_group_and_an_unserved_model_are_empty_plans_with_their_reason(ports: Ports) {
    let caller = ports.caller().await;
    for (group, model, reason) in [
        ("no-such-group", "claude-x", NoneReason::NoAccounts),
        ("other", "claude-z", NoneReason::ModelNotAllowed),
    ] {
        let (plan, names) = ports.plan(&request(&caller, group, model)).await;
        assert!(names.is_empty(), "{group}/{model}: {names:?}");
        assert_eq!(plan.none_reason, Some(reason), "{group}/{model}");
        assert!(!plan.sticky && !plan.previous_response_other_key);
    }
    let mut openai = request(&caller, "default", "gpt-x");
    openai.platform = Platform::OpenAi;
    let (plan, _) = ports.plan(&openai).await;
    assert_eq!(
        (plan.accounts.len(), plan.none_reason),
        (0, Some(NoneReason::NoAccounts)),
        "no account of the group serves that platform"
    );
}

async fn a_busy_report_soft_blocks_the_account_last_in_its_tier(ports: Ports) {
    let caller = ports.caller().await;
    let plan_request = request(&caller, "default", "claude-x");
    let (plan, _) = ports.plan(&plan_request).await;
    assert!(plan.accounts.iter().all(|a| !a.soft_blocked));
    let body = br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#;
    let busy: Classified = classify(429, &http::HeaderMap::new(), body, now_ms(), 60_000);
    assert_eq!(busy.class, poolgate_core::outcome::OutcomeClass::Busy);
    ports
        .selection
        .report(Outcome::observed(
            ports.id("first"),
            &busy,
            429,
            "rate_limit_error",
            None,
        ))
        .await
        .expect("the selection applies it");
    eventually(Duration::from_secs(5), || async {
        let (plan, names) = ports.plan(&plan_request).await;
        (names == ["second", "first"] && plan.accounts[1].soft_blocked).then_some(())
    })
    .await
    .expect("the busy account is soft-blocked, last");
    // Within a tier the order is a weighted draw: every draw must put it last.
    for _ in 0..20 {
        let (plan, names) = ports.plan(&plan_request).await;
        assert_eq!(
            names,
            ["second", "first"],
            "busy, not broken: still planned, last"
        );
        assert_eq!(
            plan.accounts
                .iter()
                .map(|a| a.soft_blocked)
                .collect::<Vec<_>>(),
            [false, true]
        );
    }
}

async fn a_bound_session_puts_its_account_first_for_its_own_key_only(ports: Ports) {
    let caller = ports.caller().await;
    let mut in_session = request(&caller, "default", "claude-x");
    in_session.session_hash = Some("session-ports-1".into());
    let (plan, names) = ports.plan(&in_session).await;
    assert_eq!(
        (names.as_slice(), plan.sticky),
        (["first", "second", "third"].as_slice(), false),
        "nothing bound yet"
    );
    ports
        .selection
        .bind_session(
            caller.api_key_id,
            "default",
            "session-ports-1",
            ports.id("second"),
        )
        .await
        .expect("the binding is written");
    for _ in 0..5 {
        let (plan, names) = ports.plan(&in_session).await;
        assert_eq!(
            names,
            ["second", "first", "third"],
            "the bound account first"
        );
        assert!(plan.sticky);
    }
    // The same session id from another client key is another session.
    let mut other_key = in_session.clone();
    other_key.api_key_id = caller.api_key_id + 1000;
    let (plan, names) = ports.plan(&other_key).await;
    assert_eq!(
        (names.as_slice(), plan.sticky),
        (["first", "second", "third"].as_slice(), false)
    );
}

async fn leases_stop_at_the_limit_and_a_waiter_is_granted_after_a_release(ports: Ports) {
    let account = ports.id("first");
    let mut held = Vec::new();
    for n in 1..=2 {
        let answer = ports
            .leases
            .acquire(terms(account, 2), Duration::ZERO)
            .await
            .expect("admission answers");
        held.push(granted(answer, &format!("lease {n} of 2")));
    }
    match ports
        .leases
        .acquire(terms(account, 2), Duration::ZERO)
        .await
        .expect("admission answers")
    {
        Acquired::Denied(denial) => assert_eq!(denial.reason, DenyReason::Concurrency),
        Acquired::Granted(_) => panic!("a third lease over a limit of 2"),
    }
    // Another account's limit is its own.
    let elsewhere = ports
        .leases
        .acquire(terms(ports.id("second"), 2), Duration::ZERO)
        .await
        .expect("admission answers");
    let elsewhere = granted(elsewhere, "another account");
    // A waiter waits while the account is full (any answer now, a denial or a grant, fails)...
    let mut waiter = {
        let leases = ports.leases.clone();
        tokio::spawn(async move {
            let answer = leases
                .acquire(terms(account, 2), Duration::from_secs(10))
                .await;
            (answer, Instant::now())
        })
    };
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut waiter)
            .await
            .is_err(),
        "a waiter on a full account is answered only when a slot frees or its wait ends"
    );
    // ...and is granted once a slot frees, not before.
    let releasing = Instant::now();
    held.pop().expect("a held lease").release(0.0, 0).await;
    let (answer, answered) = waiter.await.expect("the waiter's task");
    let waited = granted(
        answer.expect("admission answers"),
        "the waiter, after a release",
    );
    assert!(answered >= releasing, "granted before a slot was free");
    match ports
        .leases
        .acquire(terms(account, 2), Duration::ZERO)
        .await
        .expect("admission answers")
    {
        Acquired::Denied(denial) => assert_eq!(denial.reason, DenyReason::Concurrency),
        Acquired::Granted(_) => panic!("the waiter's lease is a slot too"),
    }
    for lease in held.into_iter().chain([waited, elsewhere]) {
        lease.release(0.0, 0).await;
    }
}

async fn a_dropped_lease_frees_its_slot(ports: Ports) {
    let account = ports.id("first");
    let answer = ports
        .leases
        .acquire(terms(account, 1), Duration::ZERO)
        .await
        .expect("admission answers");
    let lease = granted(answer, "the only slot");
    drop(lease);
    // Well within the lease ttl and the orphan grace: only the drop's release frees it.
    let answer = ports
        .leases
        .acquire(terms(account, 1), Duration::from_secs(3))
        .await
        .expect("admission answers");
    granted(answer, "the slot a dropped lease held")
        .release(0.0, 0)
        .await;
}

async fn usage_records_reach_the_ledger(ports: Ports) {
    let caller = ports.caller().await;
    assert_eq!(ports.usage(caller.api_key_id).await, UsageTotals::default());
    for (input, output) in [(11, 5), (20, 2)] {
        ports
            .selection
            .record_usage(vec![UsageRecord {
                api_key_id: caller.api_key_id,
                user: caller.user.clone(),
                account_id: ports.id("first"),
                model: "claude-x".into(),
                input_tokens: input,
                output_tokens: output,
                cost_usd: 0.25,
                status: 200,
                latency_ms: 40,
                at_ms: now_ms() as u64,
                ..UsageRecord::default()
            }])
            .await
            .expect("the ledger takes them");
    }
    let written = eventually(Duration::from_secs(10), || async {
        let totals = ports.usage(caller.api_key_id).await;
        (totals.requests == 2).then_some(totals)
    })
    .await;
    let Ok(totals) = written else {
        panic!(
            "both records written: {:?}",
            ports.usage(caller.api_key_id).await
        );
    };
    assert_eq!((totals.input_tokens, totals.output_tokens), (31, 7));
    assert!((totals.cost_usd - 0.5).abs() < 1e-9, "{totals:?}");
}

/// Each plan account's price says where it came from (docs/DESIGN.md §6, "Prices"), and a usage
/// record's price source reaches the ledger, the same from both implementations.
async fn a_plans_prices_say_where_they_came_from_and_usage_keeps_it(ports: Ports) {
    use poolgate_core::price::PriceSource;
    let caller = ports.caller().await;
    let (plan, _) = ports
        .plan(&request(&caller, "default", "claude-opus-5-5"))
        .await;
    let catalogue = &plan.accounts[0].price;
    assert_eq!(
        (catalogue.source, catalogue.price.output_per_mtok),
        (PriceSource::Catalogue, 20.0)
    );
    let (plan, _) = ports
        .plan(&request(&caller, "default", "claude-opus-6"))
        .await;
    let fallback = &plan.accounts[0].price;
    assert_eq!(
        (
            fallback.source,
            fallback.fallback_from.as_str(),
            fallback.price.output_per_mtok
        ),
        (PriceSource::Fallback, "claude-opus-*", 25.0)
    );
    // The first account maps `claude-x` to a model with no family: its platform's highest.
    let (plan, _) = ports.plan(&request(&caller, "default", "claude-x")).await;
    assert_eq!(plan.accounts[0].price.fallback_from, "anthropic:*");
    assert_eq!(plan.accounts[1].price.fallback_from, "anthropic:*");
    ports
        .selection
        .record_usage(vec![UsageRecord {
            api_key_id: caller.api_key_id,
            user: caller.user.clone(),
            model: "claude-opus-6".into(),
            input_tokens: 10,
            cost_usd: 0.25,
            price_source: Some(PriceSource::Fallback),
            status: 200,
            at_ms: now_ms() as u64,
            ..UsageRecord::default()
        }])
        .await
        .expect("the ledger takes it");
    let (from, to) = (now_ms() - 3_600_000, now_ms() + 3_600_000);
    let models = match &ports.running {
        Running::InProcess(engines) => {
            engines
                .source
                .read_model_usage(caller.api_key_id, from, to)
                .await
        }
        Running::Grpc(stack) => {
            stack
                .backends
                .store
                .read_model_usage(caller.api_key_id, from, to)
                .await
        }
    }
    .expect("the ledger reads");
    assert_eq!(
        models
            .iter()
            .map(|m| (m.model.as_str(), m.price_source))
            .collect::<Vec<_>>(),
        [("claude-opus-6", Some(PriceSource::Fallback))]
    );
}

macro_rules! ports_suite {
    ($mode:ident) => {
        mod $mode {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_known_key_authenticates_as_its_user_and_an_unknown_one_is_none() {
                super::a_known_key_authenticates_as_its_user_and_an_unknown_one_is_none(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_expired_key_is_refused_as_a_whole_naming_when_and_still_described() {
                super::an_expired_key_is_refused_as_a_whole_naming_when_and_still_described(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn select_orders_the_groups_accounts_by_tier_with_what_calling_them_needs() {
                super::select_orders_the_groups_accounts_by_tier_with_what_calling_them_needs(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn an_unknown_group_and_an_unserved_model_are_empty_plans_with_their_reason() {
                super::an_unknown_group_and_an_unserved_model_are_empty_plans_with_their_reason(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_busy_report_soft_blocks_the_account_last_in_its_tier() {
                super::a_busy_report_soft_blocks_the_account_last_in_its_tier(
                    super::$mode(&one_tier()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_bound_session_puts_its_account_first_for_its_own_key_only() {
                super::a_bound_session_puts_its_account_first_for_its_own_key_only(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn leases_stop_at_the_limit_and_a_waiter_is_granted_after_a_release() {
                super::leases_stop_at_the_limit_and_a_waiter_is_granted_after_a_release(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_dropped_lease_frees_its_slot() {
                super::a_dropped_lease_frees_its_slot(super::$mode(&tiered()).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_plans_prices_say_where_they_came_from_and_usage_keeps_it() {
                super::a_plans_prices_say_where_they_came_from_and_usage_keeps_it(
                    super::$mode(&tiered()).await,
                )
                .await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn usage_records_reach_the_ledger() {
                super::usage_records_reach_the_ledger(super::$mode(&tiered()).await).await;
            }
        }
    };
}

ports_suite!(in_process);
ports_suite!(grpc);
ports_suite!(edge);
