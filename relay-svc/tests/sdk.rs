//! The official Python SDKs (`anthropic`, `openai`), unchanged, against the standalone relay:
//! streaming and non-streaming calls succeed. `bash scripts/test.sh` installs them into `.venv`
//! (or set `POOLGATE_SDK_PYTHON` to a Python that has them).

mod common;

use std::path::PathBuf;

use relay_svc::fake_upstream::FakeUpstream;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_python_sdks_work_unchanged() {
    let python = sdk_python();
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: sk-sdk-test, group: default, user: sdk}}\naccounts:\n  - {{name: a, platform: anthropic, base_url: \"{0}\", api_key: k-a, concurrency: 2}}\n  - {{name: o, platform: openai, base_url: \"{0}\", api_key: k-o, concurrency: 2}}\n",
        upstream.base_url
    );
    let (_relay, addr) = common::standalone(&yaml, Default::default(), Default::default()).await;
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/sdk/sdk_check.py");
    let output = tokio::process::Command::new(&python)
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
