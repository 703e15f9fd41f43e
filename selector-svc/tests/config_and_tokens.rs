//! Config reloads through NOTIFY, weighted selection across replicas, OAuth token refresh under
//! the cluster-wide lock, credentials at rest, and bad input on every RPC.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use poolgate_core::account::{CredentialKind, Secret};
use poolgate_core::now_ms;
use poolgate_proto::selector::v1 as pb;
use poolgate_testkit::eventually;
use selector_svc::refresh::RefreshResult;
use sqlx::Row;
use support::{ADMIN_TOKEN, Backends, Replica, admin, fast_settings, oauth, select_request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_change_is_live_within_a_second_through_notify() {
    let backends = Backends::start().await;
    backends.account("first", "g", |_| {}).await;
    // The periodic reload is an hour away: only NOTIFY can make this pass.
    let replica = Replica::start(backends.config(fast_settings())).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let changed_at = Instant::now();
    let id = backends.account("second", "g", |a| a.priority = -1).await;
    eventually(Duration::from_secs(1), || async {
        let plan = replica
            .client
            .clone()
            .select(select_request("g", "claude"))
            .await
            .ok()?
            .into_inner();
        (plan.accounts.first()?.account_id == id).then_some(())
    })
    .await
    .expect("the new account is live within a second");
    assert!(changed_at.elapsed() < Duration::from_secs(1));
    // A status change too.
    backends
        .store
        .set_status(id, poolgate_core::account::AccountStatus::Disabled, "test")
        .await
        .expect("status");
    eventually(Duration::from_secs(1), || async {
        let plan = replica
            .client
            .clone()
            .select(select_request("g", "claude"))
            .await
            .ok()?
            .into_inner();
        (plan.accounts.iter().all(|a| a.account_id != id)).then_some(())
    })
    .await
    .expect("the disabled account left the plans within a second");
}

/// Picks of `replica` over `n` selects, by account.
async fn picks(replica: &Replica, n: usize) -> HashMap<i64, usize> {
    let mut counts = HashMap::new();
    let query = selector_svc::engine::SelectQuery {
        group: "g".into(),
        platform: Some(poolgate_core::account::Platform::Anthropic),
        model: "claude".into(),
        max_accounts: 1,
        ..Default::default()
    };
    for _ in 0..n {
        let plan = replica.built.selector.select(&query).await.expect("select");
        *counts.entry(plan.entries[0].account.id).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn picks_follow_the_weights_and_two_replicas_agree() {
    let backends = Backends::start().await;
    let weights = [1, 2, 5];
    let mut ids = Vec::new();
    for (n, weight) in weights.iter().enumerate() {
        ids.push(
            backends
                .account(&format!("w{n}"), "g", |a| a.weight = *weight)
                .await,
        );
    }
    let one = Replica::start(backends.config(fast_settings())).await;
    let two = Replica::start(backends.config(fast_settings())).await;
    let total: i32 = weights.iter().sum();
    // Tolerance: 10 000 draws; a share's standard error is below 0.005, so 0.02 is > 4 sigma.
    for replica in [&one, &two] {
        let counts = picks(replica, 10_000).await;
        for (id, weight) in ids.iter().zip(weights) {
            let share = counts.get(id).copied().unwrap_or(0) as f64 / 10_000.0;
            let expected = f64::from(weight) / f64::from(total);
            assert!(
                (share - expected).abs() < 0.02,
                "account weight {weight}: share {share:.3}, expected {expected:.3}"
            );
        }
    }
}

/// A token endpoint as Anthropic's answers: JSON in, the Claude Code client id required; slow,
/// and a refresh token used twice is refused.
#[derive(Clone, Default)]
struct TokenEndpoint {
    used: Arc<Mutex<HashSet<String>>>,
    calls: Arc<Mutex<u32>>,
}

async fn start_token_endpoint(endpoint: TokenEndpoint) -> String {
    use axum::extract::State;
    use axum::http::StatusCode;
    async fn token(
        State(endpoint): State<TokenEndpoint>,
        axum::Json(form): axum::Json<HashMap<String, String>>,
    ) -> Result<axum::Json<serde_json::Value>, StatusCode> {
        *endpoint.calls.lock().expect("lock") += 1;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let refresh = form.get("refresh_token").cloned().unwrap_or_default();
        if form.get("grant_type").map(String::as_str) != Some("refresh_token") {
            return Err(StatusCode::BAD_REQUEST);
        }
        if form.get("client_id").map(String::as_str)
            != Some(poolgate_core::account::default_oauth_client_id(
                poolgate_core::account::Platform::Anthropic,
            ))
        {
            return Err(StatusCode::UNAUTHORIZED);
        }
        if !endpoint.used.lock().expect("lock").insert(refresh.clone()) {
            return Err(StatusCode::BAD_REQUEST);
        }
        Ok(axum::Json(serde_json::json!({
            "access_token": format!("access-after-{refresh}"),
            "refresh_token": format!("{refresh}-next"),
            "expires_in": 3600,
        })))
    }
    let router = axum::Router::new()
        .route("/oauth/token", axum::routing::post(token))
        .with_state(endpoint);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}/oauth/token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_refreshed_whatever_its_expiry_and_only_once() {
    let backends = Backends::start().await;
    let endpoint = TokenEndpoint::default();
    let url = start_token_endpoint(endpoint.clone()).await;
    let far = now_ms() + 10 * 3600 * 1000;
    let id = backends
        .account("subscription", "g", |a| {
            a.credential_kind = CredentialKind::OAuth;
            a.credential = Some(Secret::new("revoked-access-token"));
            a.oauth = Some(oauth("refresh-1", far, &url));
        })
        .await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let refused = Secret::new("revoked-access-token");
    // Not near expiry, yet refused upstream: refreshed.
    let first = replica
        .built
        .refresher
        .refresh_refused(id, &refused)
        .await
        .expect("refreshed");
    assert_eq!(first, RefreshResult::Refreshed);
    let account = backends.store.load_account(id).await.expect("account");
    assert_eq!(account.credential.expose(), "access-after-refresh-1");
    // The same refusal reported again (another relay, a late report): nothing to do.
    let again = replica
        .built
        .refresher
        .refresh_refused(id, &refused)
        .await
        .expect("no error");
    assert_eq!(again, RefreshResult::Waited);
    assert_eq!(*endpoint.calls.lock().expect("lock"), 1, "one refresh");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_an_expired_token_refresh_exactly_once_and_both_get_the_new_token() {
    let backends = Backends::start().await;
    let endpoint = TokenEndpoint::default();
    let url = start_token_endpoint(endpoint.clone()).await;
    let id = backends
        .account("subscription", "g", |a| {
            a.credential_kind = CredentialKind::OAuth;
            a.credential = Some(Secret::new("expired-access-token"));
            a.oauth = Some(oauth("refresh-1", 1_000, &url));
        })
        .await;
    // Both replicas start with the expired token; each one's refresh loop runs at start-up, and
    // an explicit refresh races them too.
    let (one, two) = tokio::join!(
        Replica::start(backends.config(fast_settings())),
        Replica::start(backends.config(fast_settings()))
    );
    let (a, b) = tokio::join!(
        one.built.refresher.refresh(id, false),
        two.built.refresher.refresh(id, false)
    );
    for result in [a, b] {
        let result = result.expect("no refresh fails");
        assert!(matches!(
            result,
            RefreshResult::Refreshed | RefreshResult::Waited | RefreshResult::NotNeeded
        ));
    }
    // A replica that waited sees the new token as soon as it is stored, a moment before the
    // refreshing replica counts it: read the counters until they settle.
    let counts = |label: &'static str| {
        [&one, &two]
            .iter()
            .map(|r| {
                r.built
                    .selector
                    .metrics()
                    .token_refreshes
                    .with_label_values(&[label])
                    .get()
            })
            .sum::<u64>()
    };
    let settled = eventually(Duration::from_secs(2), || async {
        let (refreshed, failed) = (counts("refreshed"), counts("failed"));
        (refreshed > 0 || failed > 0).then_some((refreshed, failed))
    })
    .await;
    assert_eq!(settled, Ok((1, 0)), "one replica refreshed, none failed");
    assert_eq!(
        *endpoint.calls.lock().expect("lock"),
        1,
        "exactly one call to the token endpoint"
    );
    for replica in [&one, &two] {
        eventually(Duration::from_secs(2), || async {
            let plan = replica
                .client
                .clone()
                .select(select_request("g", "claude"))
                .await
                .ok()?
                .into_inner();
            (plan.accounts.first()?.credential == "access-after-refresh-1").then_some(())
        })
        .await
        .expect("both replicas serve the new token");
    }
    let stored = backends.store.load_account(id).await.expect("account");
    assert_eq!(
        stored.oauth.expect("oauth").refresh_token.expose(),
        "refresh-1-next",
        "the rotated refresh token is stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_never_stored_or_listed_in_clear_text() {
    let backends = Backends::start().await;
    backends.account("secret", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let rows = sqlx::query("SELECT * FROM accounts")
        .fetch_all(backends.store.pool())
        .await
        .expect("rows");
    for row in &rows {
        let blob: Vec<u8> = row.try_get("credential_ciphertext").expect("column");
        assert!(
            !String::from_utf8_lossy(&blob).contains("secret-credential"),
            "ciphertext only"
        );
    }
    let dump: String = sqlx::query_scalar("SELECT string_agg(a::text, '') FROM accounts a")
        .fetch_one(backends.store.pool())
        .await
        .expect("dump");
    assert!(
        !dump.contains("secret-credential"),
        "no clear text anywhere in the row"
    );
    let listed = replica
        .admin
        .clone()
        .list_accounts(admin(pb::ListAccountsRequest::default()))
        .await
        .expect("list")
        .into_inner();
    assert_eq!(listed.accounts.len(), 1);
    assert!(
        !listed.accounts[0]
            .credential_masked
            .contains("secret-credential")
    );
    assert!(listed.accounts[0].credential_masked.contains('…'));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_authenticate_and_a_revoked_key_is_refused_within_a_second() {
    let backends = Backends::start().await;
    backends.account("a", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut admin_client = replica.admin.clone();
    let created = admin_client
        .create_api_key(admin(pb::CreateApiKeyRequest {
            user: "alice".into(),
            group: "g".into(),
            user_rpm_limit: 30,
            name: "laptop".into(),
        }))
        .await
        .expect("create")
        .into_inner();
    let mut client = replica.client.clone();
    let auth = client
        .authenticate(pb::AuthenticateRequest {
            api_key: created.api_key.clone(),
        })
        .await
        .expect("authenticates")
        .into_inner();
    assert_eq!(
        (auth.user.as_str(), auth.group.as_str(), auth.user_rpm_limit),
        ("alice", "g", 30)
    );
    let wrong = client
        .authenticate(pb::AuthenticateRequest {
            api_key: "pgk-wrong".into(),
        })
        .await
        .expect_err("unknown key");
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    // Revoked from another selector's point of view: straight in Postgres.
    sqlx::query("UPDATE api_keys SET status = 'revoked' WHERE id = $1")
        .bind(created.id)
        .execute(backends.store.pool())
        .await
        .expect("revoke");
    eventually(Duration::from_secs(1), || async {
        let status = replica
            .client
            .clone()
            .authenticate(pb::AuthenticateRequest {
                api_key: created.api_key.clone(),
            })
            .await
            .err()?;
        (status.code() == tonic::Code::Unauthenticated).then_some(())
    })
    .await
    .expect("refused within a second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_invalid_argument_naming_the_field_and_admin_needs_the_token() {
    let backends = Backends::start().await;
    let id = backends.account("a", "g", |_| {}).await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.client.clone();
    let huge = "x".repeat(1 << 20);
    let selects: Vec<(pb::SelectRequest, &str)> = vec![
        (
            pb::SelectRequest {
                group: String::new(),
                ..select_request("g", "m")
            },
            "group",
        ),
        (
            pb::SelectRequest {
                group: huge.clone(),
                ..select_request("g", "m")
            },
            "group",
        ),
        (
            pb::SelectRequest {
                platform: 0,
                ..select_request("g", "m")
            },
            "platform",
        ),
        (
            pb::SelectRequest {
                platform: 99,
                ..select_request("g", "m")
            },
            "platform",
        ),
        (
            pb::SelectRequest {
                model: String::new(),
                ..select_request("g", "m")
            },
            "model",
        ),
        (
            pb::SelectRequest {
                session_hash: huge.clone(),
                ..select_request("g", "m")
            },
            "session_hash",
        ),
        (
            pb::SelectRequest {
                exclude_account_ids: vec![-1],
                ..select_request("g", "m")
            },
            "exclude_account_ids",
        ),
    ];
    for (request, field) in selects {
        let status = client.select(request).await.expect_err("bad select");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{field}");
        assert!(
            status.message().contains(field),
            "{} should name {field}",
            status.message()
        );
    }
    let unknown = client
        .select(select_request("nope", "m"))
        .await
        .expect_err("unknown group");
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    for (request, field) in [
        (
            pb::ReportOutcomeRequest {
                account_id: 0,
                class: 1,
                ..Default::default()
            },
            "account_id",
        ),
        (
            pb::ReportOutcomeRequest {
                account_id: -5,
                class: 1,
                ..Default::default()
            },
            "account_id",
        ),
        (
            pb::ReportOutcomeRequest {
                account_id: id,
                class: 0,
                ..Default::default()
            },
            "class",
        ),
        (
            pb::ReportOutcomeRequest {
                account_id: id,
                class: 1,
                reason: huge.clone(),
                ..Default::default()
            },
            "reason",
        ),
    ] {
        let status = client
            .report_outcome(request)
            .await
            .expect_err("bad report");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(field), "{}", status.message());
    }
    let status = client
        .report_outcome(pb::ReportOutcomeRequest {
            account_id: 999_999,
            class: 1,
            ..Default::default()
        })
        .await
        .expect_err("unknown account");
    assert_eq!(status.code(), tonic::Code::NotFound);
    let status = client
        .bind_session(pb::BindSessionRequest {
            group: "g".into(),
            session_hash: String::new(),
            account_id: id,
        })
        .await
        .expect_err("empty session");
    assert!(status.message().contains("session_hash"));
    let status = client
        .authenticate(pb::AuthenticateRequest {
            api_key: huge.clone(),
        })
        .await
        .expect_err("huge key");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // Admin without a token, with a wrong one, and with the right one.
    let mut admin_client = replica.admin.clone();
    let status = admin_client
        .list_accounts(pb::ListAccountsRequest::default())
        .await
        .expect_err("no token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let mut wrong = tonic::Request::new(pb::ListBlocksRequest {});
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer not-it".parse().expect("header"));
    assert_eq!(
        admin_client
            .list_blocks(wrong)
            .await
            .expect_err("wrong token")
            .code(),
        tonic::Code::Unauthenticated
    );
    assert!(!ADMIN_TOKEN.is_empty());
    admin_client
        .list_blocks(admin(pb::ListBlocksRequest {}))
        .await
        .expect("right token");
    let status = admin_client
        .set_account_status(admin(pb::SetAccountStatusRequest {
            account_id: id,
            status: "retired".into(),
            reason: String::new(),
        }))
        .await
        .expect_err("retired is not settable");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    // Still serving.
    let plan = client
        .select(select_request("g", "m"))
        .await
        .expect("select")
        .into_inner();
    assert_eq!(plan.accounts.len(), 1);
}
