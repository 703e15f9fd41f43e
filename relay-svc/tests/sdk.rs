//! The official Python SDKs (`anthropic`, `openai`), unchanged, against the standalone relay:
//! streaming and non-streaming calls succeed. `bash scripts/test.sh` installs them into `.venv`
//! (or set `POOLGATE_SDK_PYTHON` to a Python that has them).

mod common;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_anthropic_sdk_works_through_a_claude_subscription_account() {
    let python = sdk_python();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    // The fake refuses this token unless the request is Claude Code's (as Anthropic does).
    upstream.set_claude_code_only("sk-ant-oat01-subscription");
    let yaml = format!(
        "api_keys:\n  - {{key: sk-sdk-test, group: default, user: sdk}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{0}\", oauth: {{access_token: sk-ant-oat01-subscription}}, concurrency: 2}}\n  - {{name: o, platform: openai, base_url: \"{0}\", api_key: k-o, concurrency: 2}}\n",
        upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, Default::default(), Default::default())
        .await
        .expect("standalone relay starts");
    run_sdk_checks(&python, addr).await;
    let messages: Vec<_> = upstream
        .seen_requests()
        .into_iter()
        .filter(|r| r.path == "/v1/messages")
        .collect();
    assert!(!messages.is_empty());
    for request in messages {
        assert_eq!(
            request.body["system"][0]["text"],
            poolgate_core::upstream::CLAUDE_CODE_IDENTITY,
            "Claude Code's identity first"
        );
        let betas = request
            .headers
            .get("anthropic-beta")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(
            betas.contains("oauth-2025-04-20") && betas.contains("claude-code-20250219"),
            "{betas}"
        );
        assert_eq!(request.headers.get_all("anthropic-beta").iter().count(), 1);
    }
}
