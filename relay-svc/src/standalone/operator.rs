//! The admin endpoint's verbs over the in-process selector engine: the same engine calls the
//! selector's gRPC admin API makes in distributed mode, mapped into the operator CLI's rows
//! (`poolgate_operator::view`), so both modes show the same.

use std::sync::Arc;

use async_trait::async_trait;
use poolgate_core::account::Account;
use poolgate_core::keys::{PeriodUsage, UsagePeriod};
use poolgate_select::engine::{Selector, SelectorError};
use poolgate_select::source::{AccountSource, MemorySource};

use poolgate_operator::view::{
    AccountRow, BlockRow, KeyRow, StatusView, UsageRow, WindowRow, key_row, status_view,
    window_rows,
};
use poolgate_select::source::StoreError;

use crate::admin::{AdminError, Operator};

pub struct EngineOperator {
    selector: Arc<Selector>,
    source: Arc<MemorySource>,
}

impl EngineOperator {
    pub fn new(selector: Arc<Selector>, source: Arc<MemorySource>) -> Self {
        EngineOperator { selector, source }
    }
}

fn view(account: &Account) -> AccountRow {
    AccountRow {
        id: account.id,
        name: account.name.clone(),
        group: account.group.clone(),
        platform: account.platform.as_str().to_owned(),
        credential_kind: account.credential_kind.as_str().to_owned(),
        credential_masked: account.credential.masked(),
        status: account.status.as_str().to_owned(),
        status_reason: account.status_reason.clone(),
        priority: account.priority,
        weight: account.weight,
        concurrency_limit: account.concurrency_limit,
        rpm_limit: account.rpm_limit,
        session_window_limit_usd: account.session_window_limit_usd,
    }
}

fn admin_error(account_id: i64, error: SelectorError) -> AdminError {
    match error {
        SelectorError::NotFound(_) => AdminError::UnknownAccount(account_id),
        other => AdminError::Unavailable(other.to_string()),
    }
}

#[async_trait]
impl Operator for EngineOperator {
    async fn accounts(&self) -> Vec<AccountRow> {
        let snapshot = self.selector.snapshot().get();
        let mut accounts: Vec<AccountRow> = snapshot.accounts().map(|a| view(a)).collect();
        accounts.sort_by_key(|a| a.id);
        accounts
    }

    async fn blocks(&self) -> Result<Vec<BlockRow>, AdminError> {
        let blocks = self
            .selector
            .blocks()
            .await
            .map_err(|e| AdminError::Unavailable(e.to_string()))?;
        let snapshot = self.selector.snapshot().get();
        Ok(blocks
            .into_iter()
            .map(|block| BlockRow {
                account_name: snapshot
                    .account(block.account_id)
                    .map(|a| a.name.clone())
                    .unwrap_or_default(),
                account_id: block.account_id,
                kind: block.kind.to_owned(),
                class: block.class,
                status: block.status,
                reason: block.reason,
                remaining_ms: block.remaining_ms,
            })
            .collect())
    }

    async fn windows(
        &self,
        account_id: Option<i64>,
        group: Option<&str>,
    ) -> Result<Vec<WindowRow>, AdminError> {
        // Only an account asked for can be unknown: `NotFound` names it.
        let accounts = self
            .selector
            .windows(account_id, group)
            .await
            .map_err(|e| admin_error(account_id.unwrap_or_default(), e))?;
        // The clock the selector's gRPC answer carries, taken after the read as it is there.
        let now = poolgate_core::now_ms();
        Ok(window_rows(
            now,
            accounts.iter().map(|(account, readings)| {
                (account.id, account.name.as_str(), readings.as_slice())
            }),
        ))
    }

    async fn restore(&self, account_id: i64) -> Result<AccountRow, AdminError> {
        let account = self
            .selector
            .restore(account_id)
            .await
            .map_err(|e| admin_error(account_id, e))?;
        Ok(view(&account))
    }

    async fn clear_block(&self, account_id: i64) -> Result<(), AdminError> {
        if self.selector.snapshot().get().account(account_id).is_none() {
            return Err(AdminError::UnknownAccount(account_id));
        }
        self.selector
            .clear_blocks(account_id)
            .await
            .map_err(|e| admin_error(account_id, e))
    }

    async fn usage(&self, from_ms: i64, to_ms: i64) -> Result<Vec<UsageRow>, AdminError> {
        let snapshot = self.selector.snapshot().get();
        let mut keys: Vec<_> = snapshot.api_keys().cloned().collect();
        keys.sort_by_key(|k| k.id);
        let mut usage = Vec::with_capacity(keys.len());
        for key in keys {
            let totals = self
                .source
                .read_usage(key.id, from_ms, to_ms)
                .await
                .map_err(|e| AdminError::Unavailable(e.to_string()))?;
            usage.push(UsageRow {
                api_key_id: key.id,
                user: key.user,
                requests: totals.requests.max(0) as u64,
                input_tokens: totals.input_tokens.max(0) as u64,
                output_tokens: totals.output_tokens.max(0) as u64,
                cost_usd: totals.cost_usd,
            });
        }
        Ok(usage)
    }

    async fn keys(&self) -> Result<Vec<KeyRow>, AdminError> {
        let snapshot = self.selector.snapshot().get();
        let mut records: Vec<_> = snapshot.api_keys().collect();
        records.sort_by_key(|k| k.id);
        // Each key with its usage against its limits, in the budget calendar admission counts in.
        let mut keys = Vec::with_capacity(records.len());
        for record in records {
            keys.push(key_row(record, &self.key_usage(record.id).await?));
        }
        Ok(keys)
    }

    async fn set_key_disabled(
        &self,
        api_key_id: i64,
        disabled: bool,
    ) -> Result<KeyRow, AdminError> {
        let record = self
            .source
            .set_key_disabled(api_key_id, disabled)
            .await
            .map_err(|error| match error {
                StoreError::NotFound(_) => AdminError::UnknownKey(api_key_id),
                other => AdminError::Unavailable(other.to_string()),
            })?;
        // Served from now on: the next request with the key is refused (or served) already.
        self.selector
            .reload()
            .await
            .map_err(|e| AdminError::Unavailable(e.to_string()))?;
        Ok(key_row(&record, &self.key_usage(record.id).await?))
    }

    async fn status(&self) -> Result<StatusView, AdminError> {
        let report = self
            .selector
            .status()
            .await
            .map_err(|e| AdminError::Unavailable(e.to_string()))?;
        Ok(status_view(&report))
    }
}

impl EngineOperator {
    async fn key_usage(
        &self,
        api_key_id: i64,
    ) -> Result<Vec<(UsagePeriod, i64, PeriodUsage)>, AdminError> {
        self.selector
            .key_usage(api_key_id)
            .await
            .map_err(|e| AdminError::Unavailable(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use axum::body::Body;
    use http::{Request, StatusCode};
    use poolgate_select::crypto::api_key_hash;
    use poolgate_select::engine::SelectorSettings;
    use tower::ServiceExt;

    use crate::ports::SelectionApi;
    use crate::standalone::{Standalone, StandaloneFile};

    use poolgate_core::account::{AccountStatus, CredentialKind, Platform, Secret};

    use super::*;

    #[test]
    fn the_row_carries_the_accounts_limits_and_masks_its_credential() {
        let account = Account {
            id: 4,
            name: "a".into(),
            group: "g".into(),
            platform: Platform::Anthropic,
            base_url: "http://127.0.0.1".into(),
            credential_kind: CredentialKind::ApiKey,
            credential: Secret::new("sk-ant-0123456789abcdef"),
            oauth: None,
            status: AccountStatus::Active,
            status_reason: String::new(),
            priority: 1,
            weight: 2,
            concurrency_limit: 3,
            rpm_limit: 60,
            session_window_limit_usd: 12.5,
            allowed_models: vec![],
            model_mapping: HashMap::new(),
            proxy_url: None,
            probe_model: None,
            stream_usage: true,
        };
        let row = view(&account);
        assert_eq!(
            (
                row.priority,
                row.weight,
                row.concurrency_limit,
                row.rpm_limit,
                row.session_window_limit_usd
            ),
            (1, 2, 3, 60, 12.5)
        );
        assert_eq!(row.credential_masked, account.credential.masked());
        assert!(!row.credential_masked.contains("0123456789"));
    }

    const TOKEN: &str = "operator-test-token";

    /// A relay's engines over `yaml` and the state file at `state`.
    fn engines(yaml: &str, state: &Path) -> Standalone {
        engines_in(yaml, state, Default::default())
    }

    fn engines_in(
        yaml: &str,
        state: &Path,
        admission: poolgate_core::lease::Settings,
    ) -> Standalone {
        let file = StandaloneFile::parse(yaml).expect("the file parses");
        crate::standalone::build(
            &file,
            Some(state),
            SelectorSettings::default(),
            admission,
            &crate::metrics::Metrics::new(),
        )
        .expect("the engines start")
    }

    /// One admin call: status and JSON answer.
    async fn call(
        engines: &Standalone,
        method: &str,
        path: &str,
        token: &str,
    ) -> (StatusCode, serde_json::Value) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .expect("request");
        let response = crate::admin::router(engines.operator.clone(), TOKEN)
            .oneshot(request)
            .await
            .expect("answered");
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (status, serde_json::from_slice(&body).unwrap_or_default())
    }

    fn disabled(engines: &Standalone, key: &str) -> bool {
        engines
            .source
            .snapshot()
            .api_key(&api_key_hash(key))
            .expect("the key is configured")
            .access
            .disabled
    }

    #[tokio::test]
    async fn a_disable_through_the_admin_endpoint_is_served_at_once_and_survives_a_restart() {
        let scratch = poolgate_testkit::Scratch::new("key-disable").expect("scratch");
        let state = scratch.path().join("state.json");
        let yaml = |first: &str| {
            format!(
                "api_keys:\n{first}  - {{key: key-a, user: alice}}\n  - {{key: key-b, user: bob, disabled: true}}\n\
                 accounts:\n  - {{name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}}\n"
            )
        };
        let relay = engines(&yaml(""), &state);
        let (status, _) = call(&relay, "POST", "/admin/keys/1/disable", "wrong").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(
            !disabled(&relay, "key-a"),
            "nothing changes without the token"
        );
        let (status, answer) = call(&relay, "POST", "/admin/keys/1/disable", TOKEN).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["key"]["status"], "disabled");
        assert_eq!(answer["key"]["user"], "alice");
        assert!(disabled(&relay, "key-a"), "served disabled at once");
        let caller = |key: &'static str| {
            let selection: Arc<dyn SelectionApi> = relay.selection.clone();
            async move { selection.check_key(key).await.expect("answers").caller() }
        };
        assert!(
            caller("key-a").await.is_none(),
            "the engine refuses it at once"
        );
        assert!(caller("key-b").await.is_none(), "the YAML disables key-b");
        // The YAML's disable is lifted by an enable, which the file keeps too.
        let (status, answer) = call(&relay, "POST", "/admin/keys/2/enable", TOKEN).await;
        assert_eq!(
            (status, &answer["key"]["status"]),
            (StatusCode::OK, &"active".into())
        );
        assert!(caller("key-b").await.is_some(), "key-b is served again");
        let (status, _) = call(&relay, "POST", "/admin/keys/9/disable", TOKEN).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _) = call(&relay, "POST", "/admin/keys/x/disable", TOKEN).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (_, listed) = call(&relay, "GET", "/admin/keys", TOKEN).await;
        let statuses: Vec<_> = listed["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .map(|k| (k["id"].as_i64(), k["status"].as_str()))
            .collect();
        assert_eq!(
            statuses,
            [(Some(1), Some("disabled")), (Some(2), Some("active"))]
        );
        drop(relay);

        // Restarted from the same YAML: the operator's changes hold over it.
        let restarted = engines(&yaml(""), &state);
        assert!(disabled(&restarted, "key-a"), "key-a stays disabled");
        assert!(!disabled(&restarted, "key-b"), "key-b stays enabled");
        drop(restarted);
        // By the key, not its place: a new key first moves every id, and the disable follows key-a.
        let moved = engines(&yaml("  - {key: key-new}\n"), &state);
        assert!(disabled(&moved, "key-a"));
        assert!(!disabled(&moved, "key-new"));
        assert!(!disabled(&moved, "key-b"));
        // Enabled again: back to what the YAML says, and that holds after a restart too.
        let (status, _) = call(&moved, "POST", "/admin/keys/2/enable", TOKEN).await;
        assert_eq!(status, StatusCode::OK);
        drop(moved);
        let again = engines(&yaml(""), &state);
        assert!(!disabled(&again, "key-a"));
    }

    /// `GET /admin/status` over the in-process engines: the lease the lease engine holds and the
    /// request it admitted this minute, the block the selection engine applied with its reason
    /// and time left, admission as the in-process engine it is; nothing without the token.
    #[tokio::test]
    async fn the_status_shows_the_in_process_engines_leases_and_blocks() {
        let scratch = poolgate_testkit::Scratch::new("admin-status").expect("scratch");
        let state = scratch.path().join("state.json");
        let relay = engines(
            "accounts:\n  - {name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", \
             api_key: sk-ant-a-0123456789wxyz, concurrency: 3, rpm: 60, session_window_usd: 5}\n  \
             - {name: b, platform: anthropic, base_url: \"http://127.0.0.1:9\", \
             api_key: sk-ant-b-0123456789vxyz}\n",
            &state,
        );
        let terms = poolgate_core::lease::LeaseTerms {
            account_id: 1,
            concurrency_limit: 3,
            rpm_limit: 60,
            user: None,
            session_hash: None,
            session_window_limit_micros: 5_000_000,
            session_bound: false,
            ignore_cooldown: false,
            key: None,
        };
        let cancel = tokio_util::sync::CancellationToken::new();
        let held = relay
            .admission
            .acquire(&terms, std::time::Duration::from_secs(1), &cancel, |_| {})
            .await
            .expect("the engine answers");
        assert!(matches!(held, poolgate_lease::AcquireOutcome::Granted(_)));
        let exhausted = poolgate_core::classify::Classified {
            class: poolgate_core::outcome::OutcomeClass::WindowExhausted,
            reset_at_ms: Some(poolgate_core::now_ms() + 60_000),
            label: "429",
        };
        SelectionApi::report(
            &*relay.selection,
            poolgate_core::outcome::Outcome::observed(
                2,
                &exhausted,
                429,
                "usage window used up",
                None,
            ),
        )
        .await
        .expect("applied");

        let (status, _) = call(&relay, "GET", "/admin/status", "wrong").await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        let (status, answer) = call(&relay, "GET", "/admin/status", TOKEN).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let view = &answer["status"];
        assert_eq!(
            (&view["failure_policy"], &view["admission"]),
            (&"memory".into(), &"ok".into())
        );
        let a = &view["accounts"][0];
        assert_eq!(
            (&a["name"], &a["status"], &a["leases"], &a["rpm_used"]),
            (&"a".into(), &"active".into(), &1.into(), &1.into())
        );
        assert_eq!(a["session_spend_usd"], 0.0);
        assert_eq!(a["credential_masked"], "…wxyz");
        let b = &view["accounts"][1];
        assert_eq!(b["status"], "hard_blocked");
        assert_eq!(
            b["block_reason"],
            "hard window_exhausted 429: usage window used up"
        );
        let left = b["block_left_ms"].as_u64().expect("time left");
        assert!(left > 0 && left <= 60_000, "{left}");
        assert_eq!(
            b["rpm_used"],
            serde_json::Value::Null,
            "no RPM limit: not counted"
        );
    }

    /// `--budget-time-zone Asia/Tokyo`: the key's usage per period (the admin list, the
    /// holder's view) is summed over Tokyo's day, the one admission counts the budget in. Tokyo's
    /// day and UTC's differ by nine hours whenever this runs, so in a UTC calendar one of the
    /// two records below would be counted wrong.
    #[tokio::test]
    async fn the_key_list_shows_each_budgets_spend_in_the_deployments_calendar() {
        let scratch = poolgate_testkit::Scratch::new("key-usage").expect("scratch");
        let state = scratch.path().join("state.json");
        let yaml = "api_keys:\n  - {key: key-a, user: alice, budget_usd: {day: 5, month: 60}}\n\
                    accounts:\n  - {name: a, platform: anthropic, base_url: \"http://127.0.0.1:9\", api_key: sk-x}\n";
        let relay = engines_in(
            yaml,
            &state,
            poolgate_core::lease::Settings {
                budget_time_zone: "Asia/Tokyo".into(),
                ..Default::default()
            },
        );
        let calendar = poolgate_lease::calendar::Calendar::new("Asia/Tokyo", Default::default())
            .expect("zone");
        let now = poolgate_core::now_ms();
        let day_start = calendar.periods(now).day.ends_ms - 24 * 3_600_000;
        let record = |cost_usd: f64, at_ms: i64| poolgate_select::source::UsageInput {
            api_key_id: Some(1),
            user: "alice".into(),
            account_id: None,
            model: "claude-sonnet-4-5".into(),
            input_tokens: 10,
            output_tokens: 5,
            cache_write_tokens: 0,
            cache_read_tokens: 0,
            cost_usd,
            status: 200,
            latency_ms: 1,
            at_ms: Some(at_ms),
        };
        relay
            .source
            .insert_usage(&[
                record(1.25, day_start + 1_000),
                record(2.0, day_start - 60_000),
            ])
            .await
            .expect("recorded");

        let (status, listed) = call(&relay, "GET", "/admin/keys", TOKEN).await;
        assert_eq!(status, StatusCode::OK, "{listed}");
        let day = &listed["keys"][0]["usage"][0];
        assert_eq!(day["period"], "day");
        assert_eq!(day["from_ms"], day_start, "Tokyo's midnight");
        assert_eq!(
            (&day["requests"], &day["cost_usd"], &day["remaining_usd"]),
            (&1.into(), &1.25.into(), &3.75.into())
        );
        let total = &listed["keys"][0]["usage"][3];
        assert_eq!(
            (&total["period"], &total["cost_usd"]),
            (&"total".into(), &3.25.into())
        );
        let row: KeyRow = serde_json::from_value(listed["keys"][0].clone()).expect("a row");
        assert!(
            poolgate_operator::verb::key_line(&row, now)
                .contains("\tbudgets_usd=day:1.25/5,month:"),
            "{}",
            poolgate_operator::verb::key_line(&row, now)
        );

        // The holder's own view sums the same day.
        let described = SelectionApi::describe_key(&*relay.selection, "key-a")
            .await
            .expect("answers")
            .expect("a known key");
        assert_eq!(
            described.usage[0].1, day_start,
            "the view's day is Tokyo's too"
        );
        assert_eq!(described.usage[0].2.cost_usd, 1.25);
    }
}
