//! Response bindings when Redis is wiped (docs/DESIGN.md §3, "When Redis is wiped"): a binding
//! lost with Redis cannot say whose response an id is, so for the bindings' ttl after the wipe a
//! `previous_response_id` bound to no one is refused (`previous_response_other_key`: the relay's
//! 404 `previous_response_not_found`, on which the client resends the conversation) for every key,
//! its maker's included, instead of going to an upstream that would serve it to anyone; once the
//! bindings are older than the ttl, an id bound to no one passes as before.

use crate::support;

use std::time::Duration;

use poolgate_proto::selector::v1 as pb;
use support::{Backends, Replica, fast_settings};

fn continuation(api_key_id: i64, response_id: &str) -> pb::SelectRequest {
    pb::SelectRequest {
        group: "g".into(),
        platform: pb::Platform::Openai as i32,
        model: "gpt-x".into(),
        previous_response_id: response_id.into(),
        api_key_id,
        reads_confirming: true,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_wipe_a_continuation_is_refused_until_the_bindings_ttl_has_passed() {
    let backends = Backends::start().await;
    let account = backends
        .account("o", "g", |a| {
            a.platform = poolgate_core::account::Platform::OpenAi;
        })
        .await;
    let ttl = Duration::from_secs(2);
    let mut settings = fast_settings();
    settings.response_ttl = ttl;
    let replica = Replica::start(backends.config(settings)).await;
    let mut client = replica.client.clone();
    let refused = |response: &pb::SelectResponse| response.previous_response_other_key;

    // Bound for key 1: key 1 continues it, key 2 is refused.
    client
        .bind_response(pb::BindResponseRequest {
            response_id: "resp_a".into(),
            account_id: account,
            api_key_id: 1,
        })
        .await
        .expect("bound");
    let own = client
        .select(continuation(1, "resp_a"))
        .await
        .expect("a plan")
        .into_inner();
    assert!(!refused(&own) && own.sticky, "{own:?}");
    let other = client
        .select(continuation(2, "resp_a"))
        .await
        .expect("a plan")
        .into_inner();
    assert!(refused(&other), "{other:?}");

    // Redis wiped: whose `resp_a` is cannot be checked, so neither key continues it.
    backends.redis.flush().await.expect("flushed");
    for key in [1, 2] {
        let plan = client
            .select(continuation(key, "resp_a"))
            .await
            .expect("a plan")
            .into_inner();
        assert!(refused(&plan), "key {key} after the wipe: {plan:?}");
        assert!(plan.accounts.is_empty());
    }
    // A response made after the wipe is bound, and its key continues it.
    client
        .bind_response(pb::BindResponseRequest {
            response_id: "resp_b".into(),
            account_id: account,
            api_key_id: 1,
        })
        .await
        .expect("bound");
    let own = client
        .select(continuation(1, "resp_b"))
        .await
        .expect("a plan")
        .into_inner();
    assert!(!refused(&own) && own.sticky, "{own:?}");

    // Once the bindings are older than their ttl, an id bound to no one passes (it expired, as
    // any binding does: the upstream decides).
    tokio::time::sleep(ttl + Duration::from_millis(300)).await;
    let later = client
        .select(continuation(2, "resp_a"))
        .await
        .expect("a plan")
        .into_inner();
    assert!(!refused(&later) && !later.accounts.is_empty(), "{later:?}");
}
