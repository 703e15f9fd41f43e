//! Answers that are not the happy path but not the account's fault either: a ChatGPT (Codex)
//! stream cut short by `response.incomplete` (max output tokens, a content filter) is the
//! upstream's answer, folded or streamed, and a success; what the relay answers itself when
//! the upstream gives nothing usable (unreachable, a folded stream that failed or just ended) is
//! JSON in the client's API format.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted, fake_chatgpt_token};
use relay_svc::proxy::{Relay, RelaySettings};
use serde_json::{Value, json};

const KEY: &str = "pgk-incomplete-key-0001";

fn settings() -> RelaySettings {
    RelaySettings {
        max_wait: Duration::from_secs(3),
        conflict_delay: Duration::from_millis(20),
        ..RelaySettings::default()
    }
}

struct ChatGpt {
    upstream: FakeUpstream,
    /// The account's access token: the fake upstream's script key for it.
    token: String,
    base: String,
    relay: Arc<Relay>,
    http: reqwest::Client,
}

/// A standalone relay with one ChatGPT subscription account on the fake Codex backend.
async fn chatgpt() -> ChatGpt {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let token = fake_chatgpt_token("acct-incomplete");
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\naccounts:\n  - {{name: chatgpt, platform: openai, base_url: \"{}/backend-api\", chatgpt_oauth: {{access_token: \"{token}\"}}, concurrency: 4}}\n",
        upstream.base_url
    );
    let (relay, addr) = common::standalone(&yaml, settings(), Default::default())
        .await
        .expect("standalone relay starts");
    ChatGpt {
        upstream,
        token,
        base: format!("http://{addr}"),
        relay,
        http: reqwest::Client::new(),
    }
}

impl ChatGpt {
    /// The next answer of the backend: a 200 stream with exactly these bytes.
    fn script_stream(&self, stream: &str) {
        self.upstream.script(
            &self.token,
            [Scripted::Fail {
                status: 200,
                headers: vec![("content-type".into(), "text/event-stream".into())],
                body: stream.to_owned(),
            }],
        );
    }

    async fn responses(&self, stream: bool) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/responses", self.base))
            .bearer_auth(KEY)
            .json(&json!({"model": "gpt-5", "input": "write a long story", "max_output_tokens": 16, "stream": stream}))
            .send()
            .await
            .expect("relay answers")
    }

    /// `selector_outcomes_total` of one class, summed over what was applied.
    fn outcomes(&self, class: &str) -> f64 {
        let label = format!("class=\"{class}\"");
        self.relay
            .metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("selector_outcomes_total{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// Waits for the success report that follows the answer's last byte, then checks it was
    /// the only outcome reported.
    async fn assert_only_a_success_was_reported(&self) {
        eventually(Duration::from_secs(5), || async {
            (self.outcomes("success") >= 1.0).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("a success reported: {e}\n{}", self.relay.metrics.render()));
        for class in [
            "broken",
            "client_error",
            "busy",
            "quota_gone",
            "unauthorized",
        ] {
            assert_eq!(self.outcomes(class), 0.0, "no {class} outcome reported");
        }
    }
}

/// A Codex stream whose answer hit `max_output_tokens`.
fn incomplete_stream() -> String {
    let response = |status: &str, extra: Value| {
        let mut response = json!({
            "id": "resp_incomplete1",
            "object": "response",
            "model": "gpt-5",
            "status": status,
            "error": null,
            "incomplete_details": null,
            "output": [],
        });
        if let (Some(response), Some(extra)) = (response.as_object_mut(), extra.as_object()) {
            response.extend(extra.clone());
        }
        response
    };
    let events = [
        json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress", json!({}))}),
        json!({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "Once upon a"}),
        json!({"type": "response.incomplete", "sequence_number": 2, "response": response("incomplete", json!({
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"id": "msg_1", "type": "message", "role": "assistant", "status": "incomplete",
                        "content": [{"type": "output_text", "text": "Once upon a", "annotations": []}]}],
            "usage": {"input_tokens": 12, "output_tokens": 16, "total_tokens": 28},
        }))}),
    ];
    events
        .iter()
        .map(|event| {
            format!(
                "event: {}\ndata: {event}\n\n",
                event["type"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folded_stream_that_ends_incomplete_is_the_incomplete_response_and_a_success() {
    let h = chatgpt().await;
    h.script_stream(&incomplete_stream());
    let response = h.responses(false).await;
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.expect("body");
    assert_eq!(status, 200, "{text}");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    let body: Value = serde_json::from_str(&text).expect("a JSON response object");
    assert_eq!(body["id"], "resp_incomplete1", "{body}");
    assert_eq!(body["status"], "incomplete", "{body}");
    assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(body["output"][0]["content"][0]["text"], "Once upon a");
    assert_eq!(
        h.upstream.seen_requests().len(),
        1,
        "answered by the one call, not failed over or retried"
    );
    h.assert_only_a_success_was_reported().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_response_incomplete_reaches_the_client_as_it_came_and_is_a_success() {
    let h = chatgpt().await;
    let stream = incomplete_stream();
    h.script_stream(&stream);
    let response = h.responses(true).await;
    assert_eq!(response.status().as_u16(), 200);
    let text = response.text().await.expect("stream");
    assert_eq!(
        text, stream,
        "the stream passes as it came, no error event added"
    );
    h.assert_only_a_success_was_reported().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_folded_stream_that_fails_or_just_ends_is_a_json_error_in_the_openai_format() {
    let h = chatgpt().await;
    // The backend's own failure: its code and message reach the client, in OpenAI's shape.
    h.script_stream(concat!(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_f\",\"status\":\"in_progress\"}}\n\n",
        "event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_f\",\"status\":\"failed\",\"error\":{\"code\":\"server_error\",\"message\":\"The model failed.\"}}}\n\n",
    ));
    let response = h.responses(false).await;
    assert_eq!(response.status().as_u16(), 502);
    assert_json(&response);
    let body: Value = serde_json::from_str(&response.text().await.expect("body"))
        .expect("the error body is JSON");
    assert_eq!(body["error"]["code"], "server_error", "{body}");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert_eq!(body["error"]["message"], "The model failed.", "{body}");
    // A stream that ends with no terminal event at all.
    let h = chatgpt().await;
    h.script_stream("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_e\",\"status\":\"in_progress\"}}\n\n");
    let response = h.responses(false).await;
    assert_eq!(response.status().as_u16(), 502);
    assert_json(&response);
    let body: Value = serde_json::from_str(&response.text().await.expect("body"))
        .expect("the error body is JSON");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
}

fn assert_json(response: &reqwest::Response) {
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok());
    assert!(
        content_type.is_some_and(|ct| ct.starts_with("application/json")),
        "{content_type:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_answered_with_a_json_error_in_the_clients_format() {
    // A port nothing listens on: the connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let base = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\naccounts:\n  - {{name: claude, platform: anthropic, base_url: \"{base}\", credential: cred-claude, concurrency: 4}}\n  - {{name: openai, platform: openai, base_url: \"{base}\", credential: cred-openai, concurrency: 4}}\n"
    );
    let (relay, addr) = common::standalone(&yaml, settings(), Default::default())
        .await
        .expect("standalone relay starts");
    let http = reqwest::Client::new();
    let anthropic = http
        .post(format!("http://{addr}/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(&json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(anthropic.status().as_u16(), 502);
    assert_json(&anthropic);
    let body: Value = serde_json::from_str(&anthropic.text().await.expect("body"))
        .expect("the error body is JSON");
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    let openai = http
        .post(format!("http://{addr}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(openai.status().as_u16(), 502);
    assert_json(&openai);
    let body: Value =
        serde_json::from_str(&openai.text().await.expect("body")).expect("the error body is JSON");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    // Nothing of either request left the relay: connect failures, not network failures.
    assert!(
        failovers(&relay, "connect") >= 2.0,
        "{}",
        relay.metrics.render()
    );
    assert_eq!(failovers(&relay, "network"), 0.0);
}

/// `relay_failovers_total` of one reason, summed over outcomes.
fn failovers(relay: &Relay, reason: &str) -> f64 {
    let label = format!("reason=\"{reason}\"");
    relay
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("relay_failovers_total{") && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_hangs_up_after_the_request_is_a_network_failure_not_a_connect_failure() {
    // Accepts, reads the request, and closes without a word: the request did go out.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a free port");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buffer = [0u8; 4096];
            let _ = socket.read(&mut buffer).await;
        }
    });
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\naccounts:\n  - {{name: openai, platform: openai, base_url: \"{base}\", credential: cred-openai, concurrency: 4}}\n"
    );
    let (relay, addr) = common::standalone(&yaml, settings(), Default::default())
        .await
        .expect("standalone relay starts");
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 502);
    assert_json(&response);
    let body: Value = serde_json::from_str(&response.text().await.expect("body"))
        .expect("the error body is JSON");
    assert_eq!(body["error"]["type"], "server_error", "{body}");
    assert!(
        failovers(&relay, "network") >= 1.0,
        "{}",
        relay.metrics.render()
    );
    assert_eq!(failovers(&relay, "connect"), 0.0);
}
