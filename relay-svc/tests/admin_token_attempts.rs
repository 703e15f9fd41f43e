//! The standalone relay's admin endpoint: a wrong admin token is answered 401 only after a fixed
//! delay, a flood of them past the cap is refused at once (the same 401), and the right token is
//! never locked out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use poolgate_operator::view::UsageReport;
use poolgate_operator::{
    AccountRow, AdminEndpoint, BlockRow, KeyRow, OperatorError, StatusView, WindowRow,
};
use poolgate_runtime::failed_auth::{MAX_DELAYED_REFUSALS, REFUSAL_DELAY};
use poolgate_testkit::delayed_per_flood;

const TOKEN: &str = "the-admin-token";

/// An engine with one account and nothing else.
struct OneAccount;

fn unknown_account(account_id: i64) -> OperatorError {
    OperatorError::NotFound(format!("no account {account_id}"))
}

fn not_served() -> OperatorError {
    OperatorError::Unavailable("not served here".into())
}

#[async_trait]
impl AdminEndpoint for OneAccount {
    async fn accounts(&self, _group: Option<&str>) -> Result<Vec<AccountRow>, OperatorError> {
        Ok(vec![AccountRow {
            id: 1,
            name: "acct-1".into(),
            group: "g".into(),
            platform: "anthropic".into(),
            credential_kind: "api_key".into(),
            credential_masked: "…wxyz".into(),
            status: "active".into(),
            status_reason: String::new(),
            priority: 0,
            weight: 1,
            concurrency_limit: 0,
            rpm_limit: 0,
            session_window_limit_usd: 0.0,
            upstream_id: String::new(),
            email: String::new(),
            plan: String::new(),
            token_expires_at_ms: 0,
            refreshable: false,
            serves: Vec::new(),
        }])
    }
    async fn blocks(&self) -> Result<Vec<BlockRow>, OperatorError> {
        Ok(vec![])
    }
    async fn windows(
        &self,
        _account_id: Option<i64>,
        _group: Option<&str>,
    ) -> Result<Vec<WindowRow>, OperatorError> {
        Ok(vec![])
    }
    async fn restore(&self, account_id: i64) -> Result<AccountRow, OperatorError> {
        Err(unknown_account(account_id))
    }
    async fn clear_block(&self, account_id: i64) -> Result<(), OperatorError> {
        Err(unknown_account(account_id))
    }
    async fn usage(
        &self,
        from_ms: i64,
        to_ms: i64,
        _api_key_id: Option<i64>,
    ) -> Result<UsageReport, OperatorError> {
        Ok(UsageReport {
            from_ms,
            to_ms,
            keys: vec![],
        })
    }
    async fn keys(&self) -> Result<Vec<KeyRow>, OperatorError> {
        Err(not_served())
    }
    async fn set_key_disabled(
        &self,
        _api_key_id: i64,
        _disabled: bool,
    ) -> Result<KeyRow, OperatorError> {
        Err(not_served())
    }
    async fn status(&self) -> Result<StatusView, OperatorError> {
        Err(not_served())
    }
    async fn sign_in(
        &self,
        _sign_in: &poolgate_core::account::SignIn,
    ) -> Result<poolgate_operator::SignedInRow, OperatorError> {
        Err(not_served())
    }
    async fn prices(&self) -> Result<poolgate_operator::PriceList, OperatorError> {
        Err(not_served())
    }
    async fn set_price(
        &self,
        _model: &str,
        _price: poolgate_core::account::Price,
    ) -> Result<poolgate_operator::PriceRow, OperatorError> {
        Err(not_served())
    }
    async fn remove_price(
        &self,
        _model: &str,
    ) -> Result<poolgate_operator::PriceRow, OperatorError> {
        Err(not_served())
    }
}

async fn serve() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let router = poolgate_operator::http::router(Arc::new(OneAccount), TOKEN);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}/admin/accounts")
}

/// One listing with `token`; its status and how long it took.
async fn accounts(client: reqwest::Client, url: String, token: &str) -> (u16, Duration) {
    let started = Instant::now();
    let response = client
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("answer");
    (response.status().as_u16(), started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_admin_token_costs_a_delay_and_a_flood_never_locks_the_right_one_out() {
    let url = serve().await;
    // reqwest is built without a bundled TLS provider; ring is the one in the tree.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();

    let (status, took) = accounts(client.clone(), url.clone(), "wrong-token").await;
    assert_eq!(status, 401);
    assert!(took >= REFUSAL_DELAY, "a wrong token answered in {took:?}");
    let (status, _) = accounts(client.clone(), url.clone(), TOKEN).await;
    assert_eq!(status, 200);

    // At most the cap of a flood's refusals wait out the delay, the rest are refused at once,
    // and the right token gets through meanwhile.
    let flood = 3 * MAX_DELAYED_REFUSALS;
    let counts = delayed_per_flood(
        flood,
        REFUSAL_DELAY,
        1..=MAX_DELAYED_REFUSALS,
        || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let (status, took) = accounts(client, url, "wrong-token").await;
                assert_eq!(status, 401);
                took
            }
        },
        || async {
            let (status, _) = accounts(client.clone(), url.clone(), TOKEN).await;
            assert_eq!(status, 200, "the right token during a flood");
        },
    )
    .await;
    assert!(
        counts
            .last()
            .is_some_and(|delayed| (1..=MAX_DELAYED_REFUSALS).contains(delayed)),
        "refusals that waited the delay, per flood of {flood}: {counts:?}"
    );
}
