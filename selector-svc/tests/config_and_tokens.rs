//! Config reloads through NOTIFY, weighted selection across replicas, OAuth token refresh under
//! the cluster-wide lock, credentials at rest, and bad input on every RPC.

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use poolgate_core::account::{CredentialKind, Secret};
use poolgate_core::now_ms;
use poolgate_proto::selector::v1 as pb;
use poolgate_select::refresh::RefreshResult;
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::FakeUpstream;
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
    let query = poolgate_select::engine::SelectQuery {
        group: "g".into(),
        platform: Some(poolgate_core::account::Platform::Anthropic),
        model: "claude".into(),
        max_accounts: 1,
        ..Default::default()
    };
    for _ in 0..n {
        let plan = replica.built.selector.select(&query).await.expect("select");
        *counts.entry(plan.accounts[0].id).or_insert(0) += 1;
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

/// The fake upstream's token endpoint, answering after 400 ms (so concurrent refusals pile up
/// behind one refresh): a refresh token is good once; `refresh-1` becomes access token
/// `refresh-1-access` and refresh token `refresh-1-next`.
fn token_endpoint(upstream: &FakeUpstream) -> String {
    upstream.set_token_delay(Duration::from_millis(400));
    format!("{}/oauth/token", upstream.base_url)
}

/// Each refresh request carried Claude Code's client id (the one Anthropic's endpoint takes).
fn assert_claude_code_client(upstream: &FakeUpstream) {
    let expected = poolgate_core::account::default_oauth_client_id(
        poolgate_core::account::Platform::Anthropic,
    );
    for request in upstream.token_requests() {
        assert_eq!(request["client_id"], expected, "{request}");
        assert_eq!(request["grant_type"], "refresh_token", "{request}");
    }
}

fn refusal(account_id: i64, token: &str) -> pb::ReportOutcomeRequest {
    pb::ReportOutcomeRequest {
        account_id,
        class: pb::OutcomeClass::Unauthorized as i32,
        status: 401,
        reason: "authentication_error".into(),
        refused_credential_fingerprint: poolgate_core::short_hash(token),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_token_is_refreshed_only_when_the_usage_endpoint_refuses_it_too_and_only_once() {
    let backends = Backends::start().await;
    let upstream = FakeUpstream::start().await.expect("fake upstream starts");
    let url = token_endpoint(&upstream);
    // The revoked account's token is refused, and so is the one its refresh brings.
    upstream.revoke("revoked-access-token");
    upstream.revoke("refresh-1-access");
    // An OAuth credential refusal is confirmed by the usage endpoint the CLI reads,
    // not by an inference probe (none is sent at all).
    let refused_reads =
        || upstream.usage_calls("revoked-access-token") + upstream.usage_calls("refresh-1-access");
    let probes = || {
        [
            "revoked-access-token",
            "refresh-1-access",
            "good-access-token",
        ]
        .iter()
        .map(|c| upstream.probe_count(c))
        .sum::<u64>()
    };
    let far = now_ms() + 10 * 3600 * 1000;
    let revoked = backends
        .account("revoked", "g", |a| {
            a.base_url = upstream.base_url.clone();
            a.credential_kind = CredentialKind::OAuth;
            a.credential = Some(Secret::new("revoked-access-token"));
            a.oauth = Some(oauth("refresh-1", far, &url));
        })
        .await;
    let fine = backends
        .account("fine", "g", |a| {
            a.base_url = upstream.base_url.clone();
            a.credential_kind = CredentialKind::OAuth;
            a.credential = Some(Secret::new("good-access-token"));
            a.oauth = Some(oauth("refresh-2", far, &url));
        })
        .await;
    // No periodic usage reads: every read counted below is a confirmation's.
    let replica = Replica::start(backends.config(poolgate_select::engine::SelectorSettings {
        usage_reads: poolgate_select::engine::UsageReadSettings {
            every: Duration::ZERO,
            ..Default::default()
        },
        ..fast_settings()
    }))
    .await;
    // A 401 the client shaped (a scope, a model): the usage endpoint accepts the stored token.
    // Nothing is refreshed, nothing counts.
    let answer = replica
        .client
        .clone()
        .report_outcome(refusal(fine, "good-access-token"))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&answer), "none", "{answer:?}");
    assert_eq!(upstream.usage_calls("good-access-token"), 1, "read once");
    // Not near expiry, and refused by the probe too: refreshed once, for all five concurrent
    // refusals, each handed the new token.
    let reports = (0..5).map(|_| {
        let mut client = replica.client.clone();
        async move {
            client
                .report_outcome(refusal(revoked, "revoked-access-token"))
                .await
        }
    });
    for answer in futures_util::future::join_all(reports).await {
        let answer = answer.expect("report").into_inner();
        assert_eq!(
            (
                support::effect(&answer),
                answer.refreshed_credential.as_str()
            ),
            ("refreshed", "refresh-1-access")
        );
    }
    assert_eq!(refused_reads(), 1, "one usage read for five refusals");
    // A late refusal of the old token: handed the new one, nothing refreshed.
    let late = replica
        .client
        .clone()
        .report_outcome(refusal(revoked, "revoked-access-token"))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(late.refreshed_credential, "refresh-1-access");
    assert_eq!(upstream.token_requests().len(), 1, "one refresh");
    assert_claude_code_client(&upstream);
    // The fresh token refused too (within the floor): probed, then blocked and counted, no
    // second refresh.
    let fresh = replica
        .client
        .clone()
        .report_outcome(refusal(revoked, "refresh-1-access"))
        .await
        .expect("report")
        .into_inner();
    assert_eq!(support::effect(&fresh), "hard_block", "{fresh:?}");
    assert_eq!(refused_reads(), 2);
    assert_eq!(
        probes(),
        0,
        "no inference probe confirms a credential with a usage endpoint"
    );
    assert_eq!(upstream.token_requests().len(), 1, "floored");
    let metrics = replica.built.selector.metrics().render();
    assert!(
        metrics.contains("selector_token_refreshes_total{result=\"floored\"} 1"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_an_expired_token_refresh_exactly_once_and_both_get_the_new_token() {
    let backends = Backends::start().await;
    let upstream = FakeUpstream::start().await.expect("fake upstream starts");
    let url = token_endpoint(&upstream);
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
        upstream.token_requests().len(),
        1,
        "exactly one call to the token endpoint"
    );
    assert_claude_code_client(&upstream);
    for replica in [&one, &two] {
        eventually(Duration::from_secs(2), || async {
            let plan = replica
                .client
                .clone()
                .select(select_request("g", "claude"))
                .await
                .ok()?
                .into_inner();
            (plan.accounts.first()?.credential == "refresh-1-access").then_some(())
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
            ..Default::default()
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

/// The deprecated string fields stay one release: servers fill them next to the enums, and a
/// caller that sends only the string (an older one) is served as before.
#[allow(deprecated)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_kind_and_none_reason_travel_as_enums_and_as_the_deprecated_strings() {
    let backends = Backends::start().await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut admin_client = replica.admin.clone();
    let upsert = |name: &str, kind: pb::CredentialKind, legacy: &str| pb::UpsertAccountRequest {
        name: name.into(),
        group: "g".into(),
        platform: pb::Platform::Anthropic as i32,
        base_url: "http://127.0.0.1:9".into(),
        kind: kind as i32,
        credential_kind: legacy.into(),
        credential: format!("sk-ant-{name}-secret-credential"),
        ..Default::default()
    };
    // The enum alone; the string alone (an older caller); both, alike.
    for (name, kind, legacy, expected) in [
        ("by-enum", pb::CredentialKind::ApiKey, "", "api_key"),
        (
            "by-string",
            pb::CredentialKind::Unspecified,
            "api_key",
            "api_key",
        ),
        ("by-both", pb::CredentialKind::ApiKey, "api_key", "api_key"),
    ] {
        let view = admin_client
            .upsert_account(admin(upsert(name, kind, legacy)))
            .await
            .unwrap_or_else(|status| panic!("{name}: {status:?}"))
            .into_inner();
        assert_eq!(view.kind, pb::CredentialKind::ApiKey as i32, "{name}");
        assert_eq!(view.credential_kind, expected, "{name}");
    }
    // Both set and naming different kinds, neither set, or an unknown value: refused, naming
    // the field.
    for (request, field) in [
        (upsert("x", pb::CredentialKind::Oauth, "api_key"), "kind"),
        (
            upsert("x", pb::CredentialKind::Unspecified, ""),
            "credential_kind",
        ),
        (
            upsert("x", pb::CredentialKind::Unspecified, "apikey"),
            "credential_kind",
        ),
        (
            pb::UpsertAccountRequest {
                kind: 42,
                ..upsert("x", pb::CredentialKind::Unspecified, "")
            },
            "kind",
        ),
    ] {
        let status = admin_client
            .upsert_account(admin(request))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains(field), "{status:?} names {field}");
    }
    // A plan carries the kind both ways; an empty plan its reason both ways.
    let mut client = replica.client.clone();
    let plan = client
        .select(select_request("g", "m"))
        .await
        .expect("select")
        .into_inner();
    assert!(!plan.accounts.is_empty());
    for account in &plan.accounts {
        assert_eq!(account.kind, pb::CredentialKind::ApiKey as i32);
        assert_eq!(account.credential_kind, "api_key");
    }
    assert_eq!(plan.reason, pb::NoneReason::Unspecified as i32);
    assert_eq!(plan.none_reason, "");
    let empty = client
        .select(pb::SelectRequest {
            platform: pb::Platform::Openai as i32,
            ..select_request("g", "m")
        })
        .await
        .expect("select")
        .into_inner();
    assert!(empty.accounts.is_empty());
    assert_eq!(empty.reason, pb::NoneReason::NoAccounts as i32);
    assert_eq!(empty.none_reason, "no_accounts");
}
