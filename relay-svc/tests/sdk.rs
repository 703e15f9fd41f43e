//! The official Python SDKs (`anthropic`, `openai`), unchanged, against the standalone relay:
//! streaming and non-streaming calls succeed. `bash scripts/test.sh` installs them into `.venv`
//! (or set `POOLGATE_SDK_PYTHON` to a Python that has them).

use crate::common;

use std::path::PathBuf;

use poolgate_testkit::fake_upstream::FakeUpstream;

fn sdk_python() -> PathBuf {
    if let Some(python) = std::env::var_os("POOLGATE_SDK_PYTHON") {
        return PathBuf::from(python);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(
        venv.exists(),
        "the SDK test needs the official SDKs: run `bash scripts/test.sh` (it makes .venv), or set POOLGATE_SDK_PYTHON"
    );
    venv
}

/// Runs `tests/sdk/sdk_check.py` against the relay at `addr`; all its checks must pass.
async fn run_sdk_checks(python: &std::path::Path, addr: std::net::SocketAddr) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/sdk_check.py");
    let output = tokio::process::Command::new(python)
        .arg(&script)
        .arg(format!("http://{addr}"))
        .arg("sk-sdk-test")
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("7 checks passed, 0 failed"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdks_work_unchanged() {
    let python = sdk_python();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: sk-sdk-test, group: default, user: sdk}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{0}\", api_key: k-a, concurrency: 2}}\n  - {{name: o, platform: openai, base_url: \"{0}\", api_key: k-o, concurrency: 2}}\n",
        upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, Default::default(), Default::default())
        .await
        .expect("standalone relay starts");
    run_sdk_checks(&python, addr).await;
}

/// The Anthropic SDK in a group whose first account is a Claude subscription (OAuth) and whose
/// second is an API key: Anthropic serves a subscription token on a non-Haiku model only for
/// Claude Code's own requests (docs/SUBSCRIPTIONS.md), and the relay never presents the SDK as
/// Claude Code. So each SDK request reaches the subscription as the SDK sent it, is refused as
/// third-party traffic, and is served by the API key; the refusal damages nothing (no refresh;
/// that no block follows is `standalone.rs`'s
/// `another_clients_request_on_a_subscription_is_not_dressed_up_and_the_groups_api_key_serves_it`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_on_a_claude_subscription_is_served_by_the_groups_api_key_undisguised() {
    let python = sdk_python();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    upstream.set_claude_code_only("sk-ant-oat01-subscription");
    let yaml = format!(
        "api_keys:\n  - {{key: sk-sdk-test, group: default, user: sdk}}\naccounts:\n  - {{name: sub, platform: anthropic, base_url: \"{0}\", oauth: {{access_token: sk-ant-oat01-subscription}}, concurrency: 2, priority: 0}}\n  - {{name: a, platform: anthropic, base_url: \"{0}\", api_key: k-a, concurrency: 2, priority: 1}}\n  - {{name: o, platform: openai, base_url: \"{0}\", api_key: k-o, concurrency: 2}}\n",
        upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, Default::default(), Default::default())
        .await
        .expect("standalone relay starts");
    run_sdk_checks(&python, addr).await;
    let messages = |credential: &str| -> Vec<_> {
        upstream
            .seen_requests()
            .into_iter()
            .filter(|r| r.path == "/v1/messages" && r.credential() == credential)
            .collect()
    };
    let refused = messages("sk-ant-oat01-subscription");
    let served = messages("k-a");
    assert!(!refused.is_empty(), "the subscription was tried");
    // (The SDK's two requests open the same conversation: the second goes to the account the
    // first was bound to, the API key, without trying the subscription again.)
    assert!(!served.is_empty(), "the API key served the SDK");
    for tried in &refused {
        assert!(
            served.iter().any(|answered| answered.raw == tried.raw),
            "the same bytes reached the API key: nothing was added for the subscription"
        );
        assert!(
            !String::from_utf8_lossy(&tried.raw).contains("Claude Code"),
            "no Claude Code identity"
        );
        let betas: Vec<_> = tried
            .headers
            .get_all("anthropic-beta")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        assert_eq!(betas, ["oauth-2025-04-20"], "only the OAuth beta, once");
    }
    assert!(upstream.token_requests().is_empty(), "no refresh");
}

/// The official SDKs' embeddings and rerank calls (`openai`'s `embeddings.create`, Cohere's
/// `rerank` v1 and v2), unchanged, through the standalone relay (`tests/sdk/pool_paths_check.py`):
/// served by the group's accounts; and on a group whose only rerank account is down and which
/// asked for the passthrough, the not-reranked answer (no score) read by Cohere's SDK, and its
/// refusal, when a request asks for the error, typed by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_reach_embeddings_and_rerank_unchanged() {
    let python = sdk_python();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    // Nothing listens on port 1: the degraded group's rerank account refuses every connection.
    let yaml = format!(
        "api_keys:\n  - {{key: sk-sdk-test, group: default, user: sdk}}\n  - {{key: sk-sdk-degraded, group: search, user: sdk}}\ngroups:\n  search: {{rerank_fallback: passthrough}}\naccounts:\n  - {{name: o, platform: openai, base_url: \"{0}\", api_key: k-o, concurrency: 2}}\n  - {{name: r, platform: rerank, base_url: \"{0}\", api_key: k-r, concurrency: 2}}\n  - {{name: down, group: search, platform: rerank, base_url: \"http://127.0.0.1:1\", api_key: k-down}}\n",
        upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, Default::default(), Default::default())
        .await
        .expect("standalone relay starts");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/pool_paths_check.py");
    let output = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(format!("http://{addr}"))
        .arg("sk-sdk-test")
        .arg("sk-sdk-degraded")
        .output()
        .await
        .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "SDK checks failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("6 checks passed, 0 failed"), "{stdout}");
    let embedded = upstream
        .seen_requests()
        .iter()
        .filter(|r| r.path == "/v1/embeddings")
        .count();
    assert_eq!(embedded, 2, "both embeddings calls reached the upstream");
}
