//! A `probe_model` a Claude OAuth account may not probe on (any non-Haiku model:
//! Anthropic serves subscription tokens on those only to Claude Code's own requests) is refused
//! where it is set: gRPC `UpsertAccount` (`InvalidArgument` naming `probe_model`) and
//! `selector-svc admin upsert-account` (a clear error exit). The standalone file's refusal is
//! `relay-svc`'s `standalone::config` test.

use crate::support;

use poolgate_proto::selector::v1 as pb;
use support::{Backends, Replica, admin, fast_settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_haiku_probe_model_on_a_claude_oauth_account_is_refused_by_upsert_account() {
    let backends = Backends::start().await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.admin.clone();
    let upsert = |name: &str, kind: pb::CredentialKind, model: &str| pb::UpsertAccountRequest {
        name: name.into(),
        group: "g".into(),
        platform: pb::Platform::Anthropic as i32,
        base_url: "http://127.0.0.1:9".into(),
        kind: kind as i32,
        credential: format!("sk-ant-oat-{name}-secret"),
        refresh_token: "rt".into(),
        probe_model: model.into(),
        ..Default::default()
    };
    let status = client
        .upsert_account(admin(upsert(
            "sub",
            pb::CredentialKind::Oauth,
            "claude-sonnet-4-6",
        )))
        .await
        .expect_err("a Sonnet probe on an OAuth account is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("probe_model"), "{status:?}");
    // Haiku on OAuth, and any model on an API key, are taken.
    for (name, kind, model) in [
        ("sub", pb::CredentialKind::Oauth, "claude-haiku-4-5"),
        ("key", pb::CredentialKind::ApiKey, "claude-sonnet-4-6"),
    ] {
        client
            .upsert_account(admin(upsert(name, kind, model)))
            .await
            .unwrap_or_else(|status| panic!("{name}: {status:?}"));
    }
}

#[test]
fn admin_upsert_account_refuses_a_non_haiku_probe_model_on_a_claude_oauth_account() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_selector-svc"))
        .args([
            "admin",
            "--endpoint",
            "http://127.0.0.1:9",
            "--admin-token",
            "t",
            "--service-token",
            "s",
            "upsert-account",
            "--name",
            "sub",
            "--group",
            "g",
            "--platform",
            "anthropic",
            "--base-url",
            "https://api.anthropic.com",
            "--credential-kind",
            "oauth",
            "--credential",
            "sk-ant-oat-x",
            "--probe-model",
            "claude-opus-4-1",
        ])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("--probe-model"), "{stderr}");
    assert!(stderr.contains("Haiku"), "{stderr}");
}
