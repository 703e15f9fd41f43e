//! Unit tests of the fake upstream: the probe's recognition, the answer queues, the standing
//! answer and the broken answers.

use std::time::Duration;

use serde_json::{Value, json};

use super::{FakeUpstream, Scripted, is_probe};

fn anthropic_probe() -> Value {
    json!({"model": "claude-haiku-4-5", "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})
}

#[test]
fn the_probes_fixed_bodies_are_recognised_and_nothing_else() {
    // The probe carries no client's identity: a body with any `system` is a client's.
    assert!(is_probe("/v1/messages", &anthropic_probe()));
    let mut with_identity = anthropic_probe();
    with_identity["system"] =
        json!([{"type": "text", "text": poolgate_core::upstream::CLAUDE_CODE_IDENTITY}]);
    assert!(!is_probe("/v1/messages", &with_identity));
    assert!(is_probe(
        "/v1/chat/completions",
        &json!({"model": "gpt-4o-mini", "max_completion_tokens": 1, "messages": [{"role": "user", "content": "ping"}]})
    ));
    assert!(is_probe(
        "/backend-api/codex/responses",
        &json!({"model": "gpt-5", "instructions": "Answer in one word.", "input": [{"role": "user", "content": "ping"}], "store": false, "stream": true})
    ));
    let mut longer = anthropic_probe();
    longer["max_tokens"] = json!(2);
    let mut streamed = anthropic_probe();
    streamed["stream"] = json!(true);
    let mut other_system = anthropic_probe();
    other_system["system"] = json!("You are Claude Code, Anthropic's official CLI for Claude.");
    for body in [longer, streamed, other_system] {
        assert!(!is_probe("/v1/messages", &body), "{body}");
    }
    assert!(!is_probe("/v1/chat/completions", &anthropic_probe()));
}

async fn post(base: &str, credential: &str, body: &Value) -> reqwest::Response {
    // reqwest is built without a bundled TLS provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", credential)
        .json(body)
        .send()
        .await
        .expect("the fake answers")
}

fn client(stream: bool) -> Value {
    json!({"model": "claude-x", "max_tokens": 8, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn client_only_answers_skip_the_probe_and_shared_ones_do_not() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let fail = |status| Scripted::Fail {
        status,
        headers: vec![],
        body: "{}".into(),
    };
    fake.script_clients("k", [fail(500)]);
    fake.script("k", [fail(503)]);
    let probe = post(&fake.base_url, "k", &anthropic_probe()).await;
    assert_eq!(
        probe.status().as_u16(),
        503,
        "the probe takes the shared queue only"
    );
    let probe = post(&fake.base_url, "k", &anthropic_probe()).await;
    assert_eq!(probe.status().as_u16(), 200);
    let answer = post(&fake.base_url, "k", &client(false)).await;
    assert_eq!(answer.status().as_u16(), 500, "the client's own answer");
    assert_eq!(fake.probe_count("k"), 2);
    let flags: Vec<bool> = fake.seen_requests().iter().map(|r| r.probe).collect();
    assert_eq!(flags, [true, true, false]);
}

#[tokio::test]
async fn a_standing_answer_serves_every_request_after_the_queue_until_cleared() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let fail = |status| Scripted::Fail {
        status,
        headers: vec![],
        body: "{}".into(),
    };
    fake.script("k", [fail(529)]);
    fake.set_standing_answer(Some(fail(500)));
    let mut statuses = Vec::new();
    for (credential, body) in [
        ("k", client(false)),
        ("k", anthropic_probe()),
        ("other", client(false)),
    ] {
        statuses.push(
            post(&fake.base_url, credential, &body)
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(
        statuses,
        [529, 500, 500],
        "the queue first, then every request"
    );
    fake.set_standing_answer(None);
    let answer = post(&fake.base_url, "k", &client(false)).await;
    assert_eq!(answer.status().as_u16(), 200);
    assert_eq!(fake.probe_count("k"), 1);
    assert_eq!(fake.count_tokens_calls("k"), 0);
}

#[tokio::test]
async fn broken_answers_break_where_they_say() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.script_clients(
        "k",
        [
            Scripted::EarlyClose,
            Scripted::EarlyClose,
            Scripted::Oversized(200_000),
            Scripted::IncompleteStream,
            Scripted::BrokenStream,
        ],
    );
    for stream in [false, true] {
        let early = post(&fake.base_url, "k", &client(stream)).await;
        assert_eq!(early.status().as_u16(), 200);
        assert!(
            early.bytes().await.is_err(),
            "an early close (stream {stream})"
        );
    }
    let big = post(&fake.base_url, "k", &client(false)).await;
    let body = big.bytes().await.expect("a whole body");
    assert_eq!(body.len(), 200_000);
    assert!(serde_json::from_slice::<Value>(&body).is_ok(), "still JSON");
    let incomplete = post(&fake.base_url, "k", &client(false)).await;
    let text = incomplete.text().await.expect("ends cleanly");
    assert!(text.contains("content_block_delta") && !text.contains("message_stop"));
    let broken = post(&fake.base_url, "k", &client(true)).await;
    assert!(broken.bytes().await.is_err(), "a stream broken mid-way");
    for _ in 0..100 {
        if fake.stats("k").current == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fake.stats("k").current, 0, "nothing left in flight");
}
