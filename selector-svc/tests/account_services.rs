//! What an account serves, set through the admin API (docs/DESIGN.md §6, "Embeddings and
//! rerank"): `UpsertAccount` takes a `serves` list its platform and credential can serve, stores
//! it (shown back in `AccountView.serves`), and refuses one they cannot, or a rerank account that
//! is not an API key, with `InvalidArgument` naming the field; the selector then plans an
//! embeddings request only on accounts that serve embeddings.

use crate::support;

use poolgate_proto::selector::v1 as pb;
use support::{Backends, Replica, admin, fast_settings};

fn upsert(name: &str, platform: pb::Platform, serves: &[pb::Service]) -> pb::UpsertAccountRequest {
    pb::UpsertAccountRequest {
        name: name.into(),
        group: "g".into(),
        platform: platform as i32,
        base_url: "http://127.0.0.1:9".into(),
        kind: pb::CredentialKind::ApiKey as i32,
        credential: format!("sk-{name}-secret"),
        serves: serves.iter().map(|s| *s as i32).collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_is_stored_checked_against_the_platform_and_planned_by() {
    let backends = Backends::start().await;
    let replica = Replica::start(backends.config(fast_settings())).await;
    let mut client = replica.admin.clone();

    let chat_only = client
        .upsert_account(admin(upsert(
            "chat",
            pb::Platform::Openai,
            &[pb::Service::Chat],
        )))
        .await
        .expect("a chat-only OpenAI-compatible account")
        .into_inner();
    assert_eq!(chat_only.serves, vec![pb::Service::Chat as i32]);
    let vectors = client
        .upsert_account(admin(upsert(
            "vectors",
            pb::Platform::Openai,
            &[pb::Service::Embeddings],
        )))
        .await
        .expect("an embeddings server")
        .into_inner();
    let ranks = client
        .upsert_account(admin(upsert("ranks", pb::Platform::Rerank, &[])))
        .await
        .expect("a rerank account")
        .into_inner();
    assert_eq!(ranks.platform, pb::Platform::Rerank as i32);

    for (request, says) in [
        (
            upsert("bad", pb::Platform::Anthropic, &[pb::Service::Embeddings]),
            "cannot serve embeddings",
        ),
        (
            upsert("bad", pb::Platform::Openai, &[pb::Service::Rerank]),
            "cannot serve rerank",
        ),
        (
            pb::UpsertAccountRequest {
                serves: vec![77],
                ..upsert("bad", pb::Platform::Openai, &[])
            },
            "unknown",
        ),
    ] {
        let status = client
            .upsert_account(admin(request))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("serves") && status.message().contains(says),
            "{status:?}"
        );
    }
    let oauth_reranker = pb::UpsertAccountRequest {
        kind: pb::CredentialKind::Oauth as i32,
        refresh_token: "rt".into(),
        ..upsert("bad", pb::Platform::Rerank, &[])
    };
    let status = client
        .upsert_account(admin(oauth_reranker))
        .await
        .expect_err("a rerank account is an API key");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("kind"), "{status:?}");

    // The status shows what each serves: its own list, or its platform's when it names none.
    let status = client
        .read_status(admin(pb::ReadStatusRequest {}))
        .await
        .expect("the status")
        .into_inner();
    let serves_of = |id: i64| -> Vec<i32> {
        status
            .accounts
            .iter()
            .find(|account| account.id == id)
            .map(|account| account.serves.clone())
            .unwrap_or_default()
    };
    assert_eq!(serves_of(chat_only.id), vec![pb::Service::Chat as i32]);
    assert_eq!(serves_of(vectors.id), vec![pb::Service::Embeddings as i32]);
    assert_eq!(serves_of(ranks.id), vec![pb::Service::Rerank as i32]);

    // The selector plans each request on the accounts that serve it.
    let mut selector = replica.client.clone();
    let plan = |service: pb::Service, platform: pb::Platform| pb::SelectRequest {
        group: "g".into(),
        platform: platform as i32,
        model: "m".into(),
        service: service as i32,
        reads_confirming: true,
        ..Default::default()
    };
    let planned = |response: pb::SelectResponse| -> Vec<i64> {
        response.accounts.iter().map(|a| a.account_id).collect()
    };
    let embeddings = selector
        .select(plan(pb::Service::Embeddings, pb::Platform::Openai))
        .await
        .expect("a plan")
        .into_inner();
    assert_eq!(planned(embeddings), vec![vectors.id]);
    let chat = selector
        .select(plan(pb::Service::Chat, pb::Platform::Openai))
        .await
        .expect("a plan")
        .into_inner();
    assert_eq!(planned(chat), vec![chat_only.id]);
    let unset = selector
        .select(plan(pb::Service::Unspecified, pb::Platform::Openai))
        .await
        .expect("a plan")
        .into_inner();
    assert_eq!(
        planned(unset),
        vec![chat_only.id],
        "unset is chat (a 0.1.0 relay)"
    );
    let rerank = selector
        .select(plan(pb::Service::Rerank, pb::Platform::Rerank))
        .await
        .expect("a plan")
        .into_inner();
    assert_eq!(planned(rerank), vec![ranks.id]);
    let status = selector
        .select(pb::SelectRequest {
            service: 99,
            ..plan(pb::Service::Chat, pb::Platform::Openai)
        })
        .await
        .expect_err("a newer service is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("service"), "{status:?}");
}
