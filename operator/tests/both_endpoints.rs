//! One CLI for both modes: the same accounts, blocks, usage windows, usage and status behind a selector's admin gRPC API
//! and behind a standalone relay's admin HTTP endpoint print the same, verb by verb, in text and
//! in JSON; a refusal and an unknown account are the same error on both.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Parser;
use pb::selector_admin_server::{SelectorAdmin as AdminService, SelectorAdminServer};
use poolgate_core::account::ApiKeyRecord;
use poolgate_core::account::Platform;
use poolgate_core::health::LiveStatus;
use poolgate_core::keys::{Endpoint, KeyAccess, PeriodUsage, UsagePeriod};
use poolgate_core::lease::KeyLimits;
use poolgate_core::status::{
    AccountStanding, AdmissionPolicy, AdmissionReport, AdmissionState, BlockKind, BlockNote,
    ReplicaReport, StatusReport,
};
use poolgate_core::windows::{MinuteLimit, Scope, WindowKind, WindowReading, WindowStatus};
use poolgate_operator::grpc::SelectorAdmin;
use poolgate_operator::http::HttpAdmin;
use poolgate_operator::view::{
    AccountList, BlockList, Cleared, ErrorBody, KeyChanged, KeyList, Restored, StatusAnswer,
    UsageReport, WindowList, key_row, status_view, window_rows,
};
use poolgate_operator::{AccountRow, AdminEndpoint, BlockRow, OperatorError, UsageRow, Verb};
use poolgate_proto::convert;
use poolgate_proto::convert::keys::api_key_view;
use poolgate_proto::selector::v1 as pb;
use tonic::{Request, Status};

const ADMIN_TOKEN: &str = "admin-token";
const SERVICE_TOKEN: &str = "service-token";

fn accounts() -> Vec<AccountRow> {
    let row = |id: i64, name: &str, group: &str, status: &str, reason: &str| AccountRow {
        id,
        name: name.into(),
        group: group.into(),
        platform: "anthropic".into(),
        credential_kind: "oauth".into(),
        credential_masked: "sk-a…wxyz".into(),
        status: status.into(),
        status_reason: reason.into(),
        priority: id as i32 - 1,
        weight: 2,
        concurrency_limit: 3,
        rpm_limit: 60,
        session_window_limit_usd: 12.5,
        upstream_id: String::new(),
        email: String::new(),
        plan: String::new(),
        token_expires_at_ms: 0,
        refreshable: false,
        serves: Vec::new(),
    };
    vec![
        row(1, "a", "g", "active", ""),
        row(2, "b", "h", "retired", "credit balance too low"),
    ]
}

fn blocks() -> Vec<BlockRow> {
    vec![BlockRow {
        account_id: 1,
        account_name: "a".into(),
        kind: "hard".into(),
        class: "unauthorized".into(),
        status: 401,
        reason: "invalid x-api-key".into(),
        remaining_ms: 61_500,
    }]
}

/// The clock both fakes read the usage windows at, so both answers are the same to the byte.
const NOW_MS: i64 = 1_700_000_000_000;

/// Each account's stored readings, out of order (the rows are ordered by account, kind, scope).
fn windows() -> Vec<(i64, Vec<WindowReading>)> {
    let reading = |kind, scope, utilization, reset_in_ms: i64, status, age_ms: i64| WindowReading {
        kind,
        scope,
        utilization,
        reset_at_ms: NOW_MS + reset_in_ms,
        length_ms: None,
        status,
        observed_at_ms: NOW_MS - age_ms,
    };
    vec![
        (
            2,
            vec![reading(
                WindowKind::PerMinute(MinuteLimit::Requests),
                Scope::Account,
                Some(0.5),
                30_000,
                WindowStatus::Unknown,
                1_000,
            )],
        ),
        (
            1,
            vec![
                // Its reset passed an hour ago: it reads as empty, and shows as `passed`.
                reading(
                    WindowKind::SevenDayModel,
                    Scope::Models("opus".into()),
                    None,
                    -3_600_000,
                    WindowStatus::Rejected,
                    2 * 3_600_000,
                ),
                reading(
                    WindowKind::FiveHour,
                    Scope::Account,
                    Some(0.42),
                    (3 * 60 + 12) * 60_000,
                    WindowStatus::Allowed,
                    42_000,
                ),
            ],
        ),
    ]
}

/// The fixture's readings of the accounts a `windows` call asks for (`None`: an unknown account).
fn windows_of(
    account_id: Option<i64>,
    group: Option<&str>,
) -> Option<Vec<(AccountRow, Vec<WindowReading>)>> {
    if let Some(id) = account_id
        && !accounts().iter().any(|a| a.id == id)
    {
        return None;
    }
    Some(
        windows()
            .into_iter()
            .filter_map(|(id, readings)| {
                let account = accounts().into_iter().find(|a| a.id == id)?;
                let asked = account_id.is_none_or(|asked| asked == id)
                    && group.is_none_or(|group| group == account.group);
                asked.then_some((account, readings))
            })
            .collect(),
    )
}

fn usage() -> Vec<UsageRow> {
    vec![
        UsageRow {
            api_key_id: 1,
            user: "alice".into(),
            requests: 3,
            input_tokens: 30,
            output_tokens: 300,
            cost_usd: 0.25,
            models: Vec::new(),
        },
        UsageRow {
            api_key_id: 2,
            user: "bob".into(),
            requests: 0,
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: 0.0,
            models: Vec::new(),
        },
    ]
}

/// The client keys behind both fakes: one with every limit, one disabled without limits (the
/// same ids and users as the usage rows).
fn keys() -> Vec<ApiKeyRecord> {
    vec![
        ApiKeyRecord {
            id: 1,
            name: "ci".into(),
            prefix: "pg-aaaa".into(),
            user: "alice".into(),
            group: "g".into(),
            user_rpm_limit: 30,
            limits: KeyLimits {
                api_key_id: 1,
                concurrency_limit: 2,
                tpm_limit: 50_000,
                budget_total_micros: 100_000_000,
                budget_day_micros: 0,
                budget_week_micros: 0,
                budget_month_micros: 20_500_000,
            },
            active: true,
            access: KeyAccess {
                expires_at_ms: Some(4_102_444_800_000),
                disabled: false,
                allowed_models: vec!["claude-*".into()],
                allowed_endpoints: vec![Endpoint::Messages, Endpoint::Models],
            },
        },
        ApiKeyRecord {
            id: 2,
            name: String::new(),
            prefix: "pg-bbbb".into(),
            user: "bob".into(),
            group: "h".into(),
            user_rpm_limit: 0,
            limits: KeyLimits {
                api_key_id: 2,
                ..KeyLimits::default()
            },
            active: true,
            access: KeyAccess {
                disabled: true,
                ..KeyAccess::default()
            },
        },
    ]
}

/// A fixture key with its disable set, as both fakes answer a disable or an enable.
/// Each key's usage per budget period (as `Selector::key_usage` answers it): key 1 has spent
/// 14.50 of its month's 20.5 and 40.25 of its total 100; key 2 has no budget.
fn key_usage(id: i64) -> Vec<(UsagePeriod, i64, PeriodUsage)> {
    let cost = |cost_usd: f64| PeriodUsage {
        requests: 7,
        input_tokens: 700,
        output_tokens: 70,
        cost_usd,
    };
    let spent = match id {
        1 => [1.2, 3.5, 14.5, 40.25],
        _ => [0.0, 0.0, 0.0, 0.5],
    };
    let from = [
        NOW_MS - 3_600_000,
        NOW_MS - 86_400_000,
        NOW_MS - 864_000_000,
        0,
    ];
    UsagePeriod::ALL
        .into_iter()
        .zip(from)
        .zip(spent)
        .map(|((period, from_ms), usd)| (period, from_ms, cost(usd)))
        .collect()
}

fn key_disabled(id: i64, disabled: bool) -> Option<ApiKeyRecord> {
    let mut key = keys().into_iter().find(|k| k.id == id)?;
    key.access.disabled = disabled;
    Some(key)
}

/// The status report both sides answer from: an active account with its load and a window, a
/// hard-blocked one, a retired one; admission degraded on one of two replicas.
fn status_report() -> StatusReport {
    let account = |id: i64, name: &str, status: LiveStatus| AccountStanding {
        id,
        name: name.into(),
        group: "g".into(),
        platform: Platform::Anthropic,
        credential_masked: "…wxyz".into(),
        status,
        status_reason: String::new(),
        leases: Some(2),
        concurrency_limit: 3,
        rpm_used: Some(17),
        rpm_limit: 60,
        session_spend_usd: Some(4.5),
        session_window_limit_usd: 12.5,
        windows: Vec::new(),
        block: None,
        kind: Some(poolgate_core::account::CredentialKind::OAuth),
        email: format!("{name}@example.com"),
        plan: "max".into(),
        token_expires_at_ms: 1_900_000_000_000,
        refreshable: true,
        serves: vec![poolgate_core::account::Service::Chat],
    };
    let mut active = account(1, "a", LiveStatus::Active);
    active.windows = windows()
        .into_iter()
        .find(|(id, _)| *id == 1)
        .map(|(_, readings)| readings)
        .unwrap_or_default();
    let mut blocked = account(2, "b", LiveStatus::HardBlocked);
    (blocked.leases, blocked.rpm_used, blocked.session_spend_usd) = (None, None, None);
    blocked.block = Some(BlockNote {
        kind: BlockKind::Hard,
        class: "quota_gone".into(),
        status: 402,
        reason: "credit balance too low".into(),
        remaining_ms: 61_500,
    });
    let mut retired = account(3, "c", LiveStatus::Retired);
    retired.status_reason = "refused by the probe".into();
    let replica = |id: &str, state| ReplicaReport {
        id: id.into(),
        fresh: true,
        state,
        policy: Some(AdmissionPolicy::Divided),
        report_age_ms: Some(400),
    };
    StatusReport {
        now_ms: NOW_MS,
        admission: AdmissionReport::from_replicas(vec![
            replica("r1", AdmissionState::Ok),
            replica("r2", AdmissionState::Degraded),
        ]),
        accounts: vec![active, blocked, retired],
    }
}

/// The relay's side: the admin endpoint's routes over the fixture, in the shared envelopes.
async fn http_endpoint() -> SocketAddr {
    async fn authorized(request: axum::extract::Request, next: Next) -> Response {
        let bearer = format!("Bearer {ADMIN_TOKEN}");
        let given = request
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        if given != Some(bearer.as_str()) {
            let refusal = ErrorBody::new("authentication_error", "send the admin token");
            return (StatusCode::UNAUTHORIZED, axum::Json(refusal)).into_response();
        }
        next.run(request).await
    }
    fn not_found(id: i64) -> Response {
        (
            StatusCode::NOT_FOUND,
            axum::Json(ErrorBody::new("not_found", format!("no account {id}"))),
        )
            .into_response()
    }
    let router = axum::Router::new()
        .route(
            "/admin/accounts",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let mut accounts = accounts();
                    if let Some(group) = q.get("group") {
                        accounts.retain(|a| &a.group == group);
                    }
                    axum::Json(AccountList { accounts }).into_response()
                },
            ),
        )
        .route(
            "/admin/blocks",
            get(|| async move { axum::Json(BlockList { blocks: blocks() }).into_response() }),
        )
        .route(
            "/admin/status",
            get(|| async move {
                axum::Json(StatusAnswer {
                    status: status_view(&status_report()),
                })
                .into_response()
            }),
        )
        .route(
            "/admin/windows",
            get(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    let asked = q.get("account_id").map(|id| id.parse().unwrap_or(-1));
                    let Some(listed) = windows_of(asked, q.get("group").map(String::as_str)) else {
                        return Err(not_found(asked.unwrap_or_default()));
                    };
                    let windows = window_rows(
                        NOW_MS,
                        listed
                            .iter()
                            .map(|(a, readings)| (a.id, a.name.as_str(), readings.as_slice())),
                    );
                    Ok(axum::Json(WindowList { windows }).into_response())
                },
            ),
        )
        .route(
            "/admin/accounts/{id}/restore",
            post(|Path(id): Path<i64>| async move {
                let Some(mut account) = accounts().into_iter().find(|a| a.id == id) else {
                    return Err(not_found(id));
                };
                account.status = "active".into();
                account.status_reason.clear();
                Ok(axum::Json(Restored { account }).into_response())
            }),
        )
        .route(
            "/admin/accounts/{id}/clear-block",
            post(|Path(id): Path<i64>| async move {
                if !accounts().iter().any(|a| a.id == id) {
                    return Err(not_found(id));
                }
                Ok(axum::Json(Cleared { cleared: id }).into_response())
            }),
        )
        .route(
            "/admin/usage",
            get(
                |Query(q): Query<std::collections::HashMap<String, i64>>| async move {
                    let mut keys = usage();
                    if let Some(id) = q.get("api_key_id") {
                        keys.retain(|k| k.api_key_id == *id);
                        if keys.is_empty() {
                            return Err(not_found(*id));
                        }
                    }
                    Ok::<_, Response>(
                        axum::Json(UsageReport {
                            from_ms: q.get("from_ms").copied().unwrap_or_default(),
                            to_ms: q.get("to_ms").copied().unwrap_or_default(),
                            keys,
                        })
                        .into_response(),
                    )
                },
            ),
        )
        .route(
            "/admin/keys",
            get(|| async move {
                let keys = keys()
                    .iter()
                    .map(|k| key_row(k, &key_usage(k.id)))
                    .collect();
                axum::Json(KeyList { keys }).into_response()
            }),
        )
        .route(
            "/admin/keys/{id}/{action}",
            post(|Path((id, action)): Path<(i64, String)>| async move {
                let Some(key) = key_disabled(id, action == "disable") else {
                    return Err(not_found(id));
                };
                let key = key_row(&key, &key_usage(key.id));
                Ok(axum::Json(KeyChanged { key }).into_response())
            }),
        )
        .layer(axum::middleware::from_fn(authorized));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    addr
}

/// The selector's side: the admin API over the same fixture, as the selector's proto says it.
struct FakeSelector;

fn view(row: &AccountRow) -> pb::AccountView {
    pb::AccountView {
        id: row.id,
        name: row.name.clone(),
        group: row.group.clone(),
        platform: pb::Platform::Anthropic as i32,
        kind: pb::CredentialKind::Oauth as i32,
        credential_masked: row.credential_masked.clone(),
        status: row.status.clone(),
        status_reason: row.status_reason.clone(),
        priority: row.priority,
        weight: row.weight,
        concurrency_limit: row.concurrency_limit,
        rpm_limit: row.rpm_limit,
        session_window_limit_usd: row.session_window_limit_usd,
        ..Default::default()
    }
}

fn check<T>(request: &Request<T>) -> Result<(), Status> {
    let metadata = request.metadata();
    let bearer = format!("Bearer {ADMIN_TOKEN}");
    let admin = metadata.get("authorization").and_then(|v| v.to_str().ok());
    let service = metadata
        .get("x-poolgate-service-token")
        .and_then(|v| v.to_str().ok());
    if admin != Some(bearer.as_str()) || service != Some(SERVICE_TOKEN) {
        return Err(Status::unauthenticated("admin token required"));
    }
    Ok(())
}

fn unused<T>() -> Result<tonic::Response<T>, Status> {
    Err(Status::unimplemented("not used by the shared verbs"))
}

#[tonic::async_trait]
impl AdminService for FakeSelector {
    async fn sign_in_account(
        &self,
        _: Request<pb::SignInAccountRequest>,
    ) -> Result<tonic::Response<pb::SignInAccountResponse>, Status> {
        unused()
    }
    async fn upsert_account(
        &self,
        _: Request<pb::UpsertAccountRequest>,
    ) -> Result<tonic::Response<pb::AccountView>, Status> {
        unused()
    }
    async fn list_accounts(
        &self,
        request: Request<pb::ListAccountsRequest>,
    ) -> Result<tonic::Response<pb::ListAccountsResponse>, Status> {
        check(&request)?;
        let group = request.into_inner().group;
        let accounts = accounts()
            .iter()
            .filter(|a| group.is_empty() || a.group == group)
            .map(view)
            .collect();
        Ok(tonic::Response::new(pb::ListAccountsResponse { accounts }))
    }
    async fn set_account_status(
        &self,
        _: Request<pb::SetAccountStatusRequest>,
    ) -> Result<tonic::Response<pb::AccountView>, Status> {
        unused()
    }
    async fn restore_account(
        &self,
        request: Request<pb::RestoreAccountRequest>,
    ) -> Result<tonic::Response<pb::AccountView>, Status> {
        check(&request)?;
        let id = request.into_inner().account_id;
        let Some(mut account) = accounts().into_iter().find(|a| a.id == id) else {
            return Err(Status::not_found(format!("no account {id}")));
        };
        account.status = "active".into();
        account.status_reason.clear();
        Ok(tonic::Response::new(view(&account)))
    }
    async fn create_api_key(
        &self,
        _: Request<pb::CreateApiKeyRequest>,
    ) -> Result<tonic::Response<pb::CreateApiKeyResponse>, Status> {
        unused()
    }
    async fn list_api_keys(
        &self,
        request: Request<pb::ListApiKeysRequest>,
    ) -> Result<tonic::Response<pb::ListApiKeysResponse>, Status> {
        check(&request)?;
        // Listed out of order: the CLI sorts.
        let keys = keys()
            .iter()
            .rev()
            .map(|k| api_key_view(k, &key_usage(k.id)))
            .collect();
        Ok(tonic::Response::new(pb::ListApiKeysResponse { keys }))
    }
    async fn update_api_key(
        &self,
        request: Request<pb::UpdateApiKeyRequest>,
    ) -> Result<tonic::Response<pb::ApiKeyView>, Status> {
        check(&request)?;
        let request = request.into_inner();
        let Some(disabled) = request.disabled else {
            return Err(Status::invalid_argument("the shared verbs only disable"));
        };
        let Some(key) = key_disabled(request.id, disabled) else {
            return Err(Status::not_found(format!("api key {}", request.id)));
        };
        Ok(tonic::Response::new(api_key_view(&key, &key_usage(key.id))))
    }
    async fn revoke_api_key(
        &self,
        _: Request<pb::RevokeApiKeyRequest>,
    ) -> Result<tonic::Response<pb::RevokeApiKeyResponse>, Status> {
        unused()
    }
    async fn list_blocks(
        &self,
        request: Request<pb::ListBlocksRequest>,
    ) -> Result<tonic::Response<pb::ListBlocksResponse>, Status> {
        check(&request)?;
        let blocks = blocks()
            .into_iter()
            .map(|b| pb::BlockView {
                account_id: b.account_id,
                account_name: b.account_name,
                kind: b.kind,
                class: b.class,
                status: u32::from(b.status),
                reason: b.reason,
                remaining_ms: b.remaining_ms,
            })
            .collect();
        Ok(tonic::Response::new(pb::ListBlocksResponse { blocks }))
    }
    async fn list_windows(
        &self,
        request: Request<pb::ListWindowsRequest>,
    ) -> Result<tonic::Response<pb::ListWindowsResponse>, Status> {
        check(&request)?;
        let (account_id, group) = convert::read_windows_query(request.into_inner())?;
        let Some(listed) = windows_of(account_id, group.as_deref()) else {
            return Err(Status::not_found("no account"));
        };
        Ok(tonic::Response::new(convert::windows_answer(
            convert::WindowsAnswer {
                now_ms: NOW_MS,
                accounts: listed
                    .into_iter()
                    .map(|(account, readings)| convert::AccountReadings {
                        account_id: account.id,
                        account_name: account.name,
                        readings,
                    })
                    .collect(),
            },
        )))
    }
    async fn clear_block(
        &self,
        request: Request<pb::ClearBlockRequest>,
    ) -> Result<tonic::Response<pb::ClearBlockResponse>, Status> {
        check(&request)?;
        let id = request.into_inner().account_id;
        if !accounts().iter().any(|a| a.id == id) {
            return Err(Status::not_found(format!("no account {id}")));
        }
        Ok(tonic::Response::new(pb::ClearBlockResponse {}))
    }
    async fn drop_binding(
        &self,
        _: Request<pb::DropBindingRequest>,
    ) -> Result<tonic::Response<pb::DropBindingResponse>, Status> {
        unused()
    }
    async fn read_load(
        &self,
        _: Request<pb::ReadLoadRequest>,
    ) -> Result<tonic::Response<pb::ReadLoadResponse>, Status> {
        unused()
    }
    async fn read_status(
        &self,
        request: Request<pb::ReadStatusRequest>,
    ) -> Result<tonic::Response<pb::ReadStatusResponse>, Status> {
        check(&request)?;
        Ok(tonic::Response::new(convert::status_answer(
            &status_report(),
        )))
    }
    async fn read_usage(
        &self,
        request: Request<pb::ReadUsageRequest>,
    ) -> Result<tonic::Response<pb::ReadUsageResponse>, Status> {
        check(&request)?;
        let asked = request.into_inner();
        if asked.from_ms == 0 || asked.to_ms <= asked.from_ms {
            return Err(Status::invalid_argument("the CLI always sends its window"));
        }
        let Some(key) = usage()
            .into_iter()
            .find(|k| k.api_key_id == asked.api_key_id)
        else {
            return Err(Status::not_found("no key"));
        };
        Ok(tonic::Response::new(pb::ReadUsageResponse {
            requests: key.requests,
            input_tokens: key.input_tokens,
            output_tokens: key.output_tokens,
            cost_usd: key.cost_usd,
            models: Vec::new(),
        }))
    }
    // The price verbs run against the real engines in both modes instead
    // (`selector-svc/tests/prices.rs`, `relay-svc/tests/prices.rs`).
    async fn list_prices(
        &self,
        _: Request<pb::ListPricesRequest>,
    ) -> Result<tonic::Response<pb::ListPricesResponse>, Status> {
        unused()
    }
    async fn set_price(
        &self,
        _: Request<pb::SetPriceRequest>,
    ) -> Result<tonic::Response<pb::PriceView>, Status> {
        unused()
    }
    async fn remove_price(
        &self,
        _: Request<pb::RemovePriceRequest>,
    ) -> Result<tonic::Response<pb::PriceView>, Status> {
        unused()
    }
}

async fn grpc_endpoint() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(SelectorAdminServer::new(FakeSelector))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
    });
    addr
}

#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

fn verb(args: &[&str]) -> Verb {
    Cli::try_parse_from(std::iter::once("admin").chain(args.iter().copied()))
        .expect("a verb")
        .verb
}

/// The usage window is the clock's at each call: compare what does not depend on it.
fn without_window(json: &str) -> serde_json::Value {
    let mut value: serde_json::Value = serde_json::from_str(json).expect("json");
    if let Some(object) = value.as_object_mut() {
        object.remove("from_ms");
        object.remove("to_ms");
    }
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_prints_the_same_against_a_selector_and_a_standalone_relay() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let relay = HttpAdmin::new(&format!("http://{}", http_endpoint().await), ADMIN_TOKEN)
        .expect("http client");
    let selector = SelectorAdmin::connect(
        &format!("http://{}", grpc_endpoint().await),
        ADMIN_TOKEN,
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("grpc client");
    let endpoints: [&dyn AdminEndpoint; 2] = [&relay, &selector];
    for args in [
        &["accounts"][..],
        &["accounts", "--group", "h"],
        &["blocks"],
        &["windows"],
        &["windows", "--account", "2"],
        &["windows", "--group", "g"],
        &["restore", "2"],
        &["clear-block", "1"],
        &["usage"],
        &["usage", "1", "--hours", "2"],
        &["keys"],
        &["disable-key", "1"],
        &["enable-key", "2"],
        &["status"],
    ] {
        let mut printed = Vec::new();
        for endpoint in endpoints {
            let text = poolgate_operator::execute(endpoint, &verb(args))
                .await
                .unwrap_or_else(|error| panic!("{args:?}: {error}"));
            let mut json_args = args.to_vec();
            json_args.extend(["--output", "json"]);
            let json = poolgate_operator::execute(endpoint, &verb(&json_args))
                .await
                .unwrap_or_else(|error| panic!("{json_args:?}: {error}"));
            printed.push((text, without_window(&json)));
        }
        assert_eq!(printed[0], printed[1], "{args:?}: relay, then selector");
        assert!(!printed[0].0.is_empty(), "{args:?} printed something");
    }
    // What the rows say, once (the loop above holds that both say the same).
    let text = poolgate_operator::execute(&selector, &verb(&["accounts"]))
        .await
        .expect("accounts");
    assert_eq!(
        text,
        "1\ta\tgroup=g\tplatform=anthropic\tkind=oauth\tstatus=active\tpriority=0\tweight=2\t\
         concurrency=3\trpm=60\tsession_window_usd=12.5\tcredential=sk-a…wxyz\n\
         2\tb\tgroup=h\tplatform=anthropic\tkind=oauth\tstatus=retired (credit balance too low)\t\
         priority=1\tweight=2\tconcurrency=3\trpm=60\tsession_window_usd=12.5\t\
         credential=sk-a…wxyz"
    );
    let text = poolgate_operator::execute(&selector, &verb(&["status"]))
        .await
        .expect("status");
    assert_eq!(
        text,
        "admission=degraded\tfailure_policy=divided\treplicas=r1:ok,r2:degraded\n\
         1\ta\tgroup=g\tplatform=anthropic\tstatus=active\tleases=2/3\trpm=17/60\t\
         session_usd=4.50/12.5\twindows=5h=42%,7d_model:opus=-\tblock=-\n\
         2\tb\tgroup=g\tplatform=anthropic\tstatus=hard_blocked\tleases=?/3\trpm=?/60\t\
         session_usd=?/12.5\twindows=-\tblock=hard quota_gone 402: credit balance too low (1m2s)\n\
         3\tc\tgroup=g\tplatform=anthropic\tstatus=retired (refused by the probe)\tleases=2/3\t\
         rpm=17/60\tsession_usd=4.50/12.5\twindows=-\tblock=-"
    );
    let json = poolgate_operator::execute(&relay, &verb(&["status", "-o", "json"]))
        .await
        .expect("status");
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(json["status"]["generated_at_ms"], NOW_MS);
    assert_eq!(json["status"]["accounts"][1]["block_left_ms"], 61_500);
    assert_eq!(
        json["status"]["accounts"][0]["windows"][0]["age_ms"], 42_000,
        "the windows' rows as `windows` shows them"
    );
    let text = poolgate_operator::execute(&selector, &verb(&["blocks"]))
        .await
        .expect("blocks");
    assert_eq!(
        text,
        "1\ta\thard\tclass=unauthorized\tstatus=401\tleft=61s\tinvalid x-api-key"
    );
    let text = poolgate_operator::execute(&selector, &verb(&["windows"]))
        .await
        .expect("windows");
    assert_eq!(
        text,
        "1\ta\t5h\tscope=account\tused=42.0%\tstatus=allowed\treset=3h12m\tobserved=42s ago\n\
         1\ta\t7d_model\tscope=opus\tused=-\tstatus=rejected\treset=passed\tobserved=2h0m ago\n\
         2\tb\tper_minute_requests\tscope=account\tused=50.0%\tstatus=unknown\treset=30s\t\
         observed=1s ago"
    );
    let json = poolgate_operator::execute(&relay, &verb(&["windows", "-o", "json"]))
        .await
        .expect("windows");
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(
        json["windows"][0],
        serde_json::json!({
            "account_id": 1, "account_name": "a", "kind": "5h", "scope": "account",
            "utilization": 0.42, "status": "allowed",
            "reset_at_ms": NOW_MS + (3 * 60 + 12) * 60_000, "remaining_ms": (3 * 60 + 12) * 60_000,
            "length_ms": null, "observed_at_ms": NOW_MS - 42_000, "age_ms": 42_000
        })
    );
    assert_eq!(
        (
            &json["windows"][1]["utilization"],
            &json["windows"][1]["remaining_ms"]
        ),
        (&serde_json::Value::Null, &serde_json::json!(0)),
        "a status-only reading past its reset: no share, nothing left"
    );
    let text = poolgate_operator::execute(&selector, &verb(&["usage"]))
        .await
        .expect("usage");
    assert!(
        text.starts_with("1\talice\trequests=3\t") && text.contains("\n2\tbob\t"),
        "{text}"
    );

    let text = poolgate_operator::execute(&relay, &verb(&["keys"]))
        .await
        .expect("keys");
    assert_eq!(
        text,
        "1\tpg-aaaa…\tname=ci\tuser=alice\tgroup=g\tuser_rpm=30\tstatus=active\t\
         expires=2100-01-01T00:00:00Z\tmodels=claude-*\tendpoints=messages,models\t\
         concurrency=2\ttpm=50000\tbudgets_usd=total:40.25/100,month:14.50/20.5\n\
         2\tpg-bbbb…\tname=\tuser=bob\tgroup=h\tuser_rpm=0\tstatus=disabled\texpires=never\t\
         models=*\tendpoints=*\tconcurrency=*\ttpm=*\tbudgets_usd=*"
    );
    // The JSON envelope has the numbers: each period's spend, and what is left of its budget.
    let json = poolgate_operator::execute(&selector, &verb(&["keys", "-o", "json"]))
        .await
        .expect("keys");
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(
        json["keys"][0]["usage"],
        serde_json::json!([
            {"period": "day", "from_ms": NOW_MS - 3_600_000, "requests": 7, "input_tokens": 700,
             "output_tokens": 70, "cost_usd": 1.2, "remaining_usd": null},
            {"period": "week", "from_ms": NOW_MS - 86_400_000, "requests": 7, "input_tokens": 700,
             "output_tokens": 70, "cost_usd": 3.5, "remaining_usd": null},
            {"period": "month", "from_ms": NOW_MS - 864_000_000, "requests": 7,
             "input_tokens": 700, "output_tokens": 70, "cost_usd": 14.5, "remaining_usd": 6.0},
            {"period": "total", "from_ms": 0, "requests": 7, "input_tokens": 700,
             "output_tokens": 70, "cost_usd": 40.25, "remaining_usd": 59.75},
        ])
    );
    let text = poolgate_operator::execute(&selector, &verb(&["disable-key", "1"]))
        .await
        .expect("disable");
    assert!(
        text.starts_with("1\tpg-aaaa…\t")
            && text.contains("\tstatus=disabled\t")
            && text.ends_with("\tbudgets_usd=total:40.25/100,month:14.50/20.5"),
        "{text}"
    );

    // An unknown account is "not found" on both; an unknown key too.
    for endpoint in endpoints {
        for args in [
            &["restore", "99"][..],
            &["clear-block", "99"],
            &["windows", "--account", "99"],
            &["usage", "9"],
            &["disable-key", "9"],
            &["enable-key", "9"],
        ] {
            let error = poolgate_operator::execute(endpoint, &verb(args))
                .await
                .expect_err("unknown");
            assert!(
                matches!(error, OperatorError::NotFound(_)),
                "{args:?}: {error}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_admin_token_is_refused_the_same_way_by_both() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let relay =
        HttpAdmin::new(&format!("http://{}", http_endpoint().await), "wrong").expect("http client");
    let selector = SelectorAdmin::connect(
        &format!("http://{}", grpc_endpoint().await),
        "wrong",
        Some(SERVICE_TOKEN),
    )
    .await
    .expect("grpc client");
    let endpoints: [Arc<dyn AdminEndpoint>; 2] = [Arc::new(relay), Arc::new(selector)];
    for endpoint in endpoints {
        let error = poolgate_operator::execute(endpoint.as_ref(), &verb(&["accounts"]))
            .await
            .expect_err("refused");
        assert!(
            matches!(error, OperatorError::Unauthenticated(_)),
            "{error}"
        );
        assert!(
            !error.to_string().contains("wrong"),
            "the token is never printed: {error}"
        );
    }
}
