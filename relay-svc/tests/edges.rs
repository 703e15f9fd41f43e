//! The relay's edges under hostile traffic, end to end against the fake upstream:
//! headers by allow-list both ways and per platform (docs/DESIGN.md §6, "Headers, both ways"),
//! session and response bindings scoped to the client key, and `count_tokens` at its own rates.
//! Standalone, and the response and session scoping once more over gRPC with Redis.

use crate::common;

use std::time::Duration;

use poolgate_core::account::{Platform, Price};
use poolgate_testkit::eventually;
use poolgate_testkit::fake_upstream::{FakeUpstream, Scripted, SeenRequest};
use relay_svc::proxy::RelaySettings;
use reqwest::header::HeaderMap;
use serde_json::{Value, json};

const KEY: &str = "pgk-edge-key-alice";
const OTHER_KEY: &str = "pgk-edge-key-mallory";
const LIMITED_KEY: &str = "pgk-edge-key-bob";
const CODEX_KEY: &str = "pgk-edge-key-codex";

struct Harness {
    upstream: FakeUpstream,
    base: String,
    http: reqwest::Client,
}

/// A standalone relay: keys of alice and mallory (group `default`), bob (`user_rpm: 2`) and a
/// Codex user (group `chatgpt`, declared: not every test has an account in it); `accounts`:
/// (name, platform, extra yaml), in group `default` unless the extra yaml says otherwise.
async fn start(accounts: &[(&str, &str, &str)]) -> Harness {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let mut yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\n  - {{key: {OTHER_KEY}, user: mallory, group: default}}\n  - {{key: {LIMITED_KEY}, user: bob, group: default, user_rpm: 2}}\n  - {{key: {CODEX_KEY}, user: codex, group: chatgpt}}\ngroups:\n  chatgpt: {{}}\naccounts:\n"
    );
    for (name, platform, extra) in accounts {
        yaml.push_str(&format!(
            "  - {{name: {name}, platform: {platform}, base_url: \"{}\", concurrency: 8{extra}}}\n",
            upstream.base_url
        ));
    }
    let settings = RelaySettings {
        max_wait: Duration::from_secs(2),
        ..RelaySettings::default()
    };
    let blocks = poolgate_core::outcome::RuntimeBlockSettings {
        busy_529: Duration::from_millis(300),
        ..Default::default()
    };
    let (_relay, addr) = common::standalone(&yaml, settings, blocks)
        .await
        .expect("standalone relay starts");
    Harness {
        upstream,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
    }
}

impl Harness {
    fn post(&self, path: &str, key: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.base))
            .header("x-api-key", key)
            .header("authorization", format!("Bearer {key}"))
    }

    /// The credential of the last request the upstream received.
    fn last_served(&self) -> String {
        self.upstream
            .seen_requests()
            .last()
            .map(SeenRequest::credential)
            .unwrap_or_default()
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn message(content: &str) -> Value {
    json!({"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": content}]})
}

/// What a hostile or careless client adds to an official client's headers.
fn with_extras(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    request
        .header("cookie", "session=client")
        .header("x-forwarded-for", "203.0.113.9")
        .header("openai-organization", "org-client")
        .header("openai-project", "proj_client")
        .header("anthropic-workspace-id", "wrk_client")
        .header("x-stainless-not-an-sdk-header", "1")
        .header("x-unknown", "1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_upstream_gets_its_own_platforms_headers_and_known_query_parameters_only() {
    let token = poolgate_testkit::fake_upstream::fake_chatgpt_token("acct-edge");
    let chatgpt = format!(", group: chatgpt, chatgpt_oauth: {{access_token: \"{token}\"}}");
    let h = start(&[
        ("a", "anthropic", ", api_key: cred-a"),
        ("o", "openai", ", api_key: cred-o"),
        ("c", "openai", &chatgpt),
    ])
    .await;
    // Claude Code's headers, some of Codex's, and the extras, to Anthropic.
    let response = with_extras(h.post("/v1/messages?beta=true&x-debug=1&api-version=2", KEY))
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "interleaved-thinking-2025-05-14")
        .header("anthropic-dangerous-direct-browser-access", "true")
        .header("x-app", "cli")
        .header("x-claude-code-session-id", "cc-session")
        .header("x-stainless-lang", "js")
        .header("x-stainless-retry-count", "0")
        .header("x-codex-turn-metadata", "{}")
        .header("originator", "codex_exec")
        .header("openai-beta", "responses=v1")
        .json(&message("hi"))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    let seen = h.upstream.seen_requests();
    let anthropic = seen.last().expect("the request reached the upstream");
    assert_eq!(anthropic.path, "/v1/messages");
    assert_eq!(
        anthropic.query.as_deref(),
        Some("beta=true"),
        "only the parameters Anthropic takes"
    );
    for name in [
        "anthropic-version",
        "anthropic-beta",
        "anthropic-dangerous-direct-browser-access",
        "x-app",
        "x-claude-code-session-id",
        "x-stainless-lang",
        "x-stainless-retry-count",
    ] {
        assert!(anthropic.headers.contains_key(name), "{name} to Anthropic");
    }
    for name in [
        "x-codex-turn-metadata",
        "originator",
        "openai-beta",
        "cookie",
        "x-forwarded-for",
        "openai-organization",
        "openai-project",
        "anthropic-workspace-id",
        "x-stainless-not-an-sdk-header",
        "x-unknown",
        "authorization",
    ] {
        assert!(
            !anthropic.headers.contains_key(name),
            "{name} never reaches Anthropic"
        );
    }
    assert_eq!(anthropic.credential(), "cred-a");

    // Codex's headers, some of Claude Code's, and the extras, to the OpenAI API.
    let response = with_extras(h.post("/v1/responses?beta=true", KEY))
        .header("originator", "codex_exec")
        .header("session-id", "codex-session")
        .header("thread-id", "codex-thread")
        .header("x-client-request-id", "codex-request")
        .header("x-codex-window-id", "w:0")
        .header("x-stainless-lang", "python")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "interleaved-thinking-2025-05-14")
        .header("x-app", "cli")
        .header("x-claude-code-session-id", "cc-session")
        .json(&json!({"model": "gpt-x", "input": "hi"}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    let seen = h.upstream.seen_requests();
    let openai = seen.last().expect("the request reached the upstream");
    assert_eq!(openai.path, "/v1/responses");
    assert_eq!(
        openai.query, None,
        "the OpenAI API takes no query parameter"
    );
    for name in [
        "originator",
        "session-id",
        "thread-id",
        "x-client-request-id",
        "x-codex-window-id",
        "x-stainless-lang",
    ] {
        assert!(openai.headers.contains_key(name), "{name} to OpenAI");
    }
    for name in [
        "anthropic-version",
        "anthropic-beta",
        "x-app",
        "x-claude-code-session-id",
        "cookie",
        "x-forwarded-for",
        "openai-organization",
        "openai-project",
        "x-stainless-not-an-sdk-header",
        "x-unknown",
        "x-api-key",
    ] {
        assert!(
            !openai.headers.contains_key(name),
            "{name} never reaches OpenAI"
        );
    }
    assert_eq!(openai.credential(), "cred-o");

    // The ChatGPT backend: what Codex sends it, as sent; the account from the token.
    let response = with_extras(h.post("/v1/responses", CODEX_KEY))
        .header("originator", "codex_exec")
        .header("session-id", "codex-session")
        .header("x-codex-window-id", "w:0")
        .header("x-stainless-lang", "python")
        .header("openai-beta", "client-beta")
        .header("x-claude-code-session-id", "cc-session")
        .json(&json!({"model": "gpt-5", "input": "hi"}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    let seen = h.upstream.seen_requests();
    let backend = seen.last().expect("the request reached the upstream");
    assert!(
        backend.path.ends_with("/codex/responses"),
        "{}",
        backend.path
    );
    let sent = |name: &str| header(&backend.headers, name);
    assert_eq!(sent("originator"), Some("codex_exec"));
    assert_eq!(sent("x-codex-window-id"), Some("w:0"));
    assert_eq!(sent("session-id"), Some("codex-session"));
    assert_eq!(sent("chatgpt-account-id"), Some("acct-edge"));
    for name in [
        "x-stainless-lang",
        "x-claude-code-session-id",
        "session_id",
        "openai-beta",
        "cookie",
        "openai-organization",
        "x-unknown",
    ] {
        assert!(
            !backend.headers.contains_key(name),
            "{name} never reaches the ChatGPT backend"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_the_connection_header_names_never_go_upstream() {
    let h = start(&[("a", "anthropic", ", api_key: cred-a")]).await;
    let response = h
        .post("/v1/messages?beta=true", KEY)
        .header("connection", "keep-alive, x-app, anthropic-beta")
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "interleaved-thinking-2025-05-14")
        .header("x-app", "cli")
        .header("x-stainless-lang", "js")
        .json(&message("hi"))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    let seen = h.upstream.seen_requests();
    let request = seen.last().expect("the request reached the upstream");
    assert!(request.headers.contains_key("anthropic-version"));
    assert!(request.headers.contains_key("x-stainless-lang"));
    assert!(
        !request.headers.contains_key("x-app"),
        "named by Connection"
    );
    assert!(
        !request.headers.contains_key("anthropic-beta"),
        "named by Connection (and an API-key account adds no beta of its own)"
    );
}

/// The headers an upstream answers with that no client may see, and those SDKs read.
fn upstream_answer_headers() -> Vec<(String, String)> {
    [
        ("request-id", "req_upstream_1"),
        ("x-request-id", "upstream-x-request-id"),
        ("retry-after-ms", "1500"),
        ("x-should-retry", "false"),
        ("anthropic-organization-id", "org-of-the-account"),
        ("openai-organization", "org-of-the-account"),
        ("openai-project", "proj_of_the_account"),
        ("set-cookie", "__cf_bm=upstream; Path=/; HttpOnly"),
        ("access-control-allow-origin", "*"),
        ("access-control-expose-headers", "request-id"),
        ("anthropic-ratelimit-unified-status", "allowed"),
        ("anthropic-ratelimit-unified-5h-utilization", "0.93"),
        ("anthropic-ratelimit-requests-remaining", "3"),
        ("x-ratelimit-remaining-requests", "3"),
        ("x-codex-primary-used-percent", "93"),
        ("cf-ray", "8f0000000000-LHR"),
        ("server", "cloudflare"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value.to_owned()))
    .collect()
}

/// The client got what SDKs read, and nothing of the account or the upstream's own.
fn check_client_headers(headers: &HeaderMap, status: u16) {
    assert!(
        header(headers, "content-type").is_some_and(|ct| ct.contains("json")),
        "{status}"
    );
    assert_eq!(header(headers, "request-id"), Some("req_upstream_1"));
    assert_eq!(header(headers, "retry-after-ms"), Some("1500"));
    assert_eq!(header(headers, "x-should-retry"), Some("false"));
    assert!(
        header(headers, "x-request-id").is_some_and(|id| id.starts_with("req_")),
        "the relay's own request id: {headers:?}"
    );
    for name in [
        "anthropic-organization-id",
        "openai-organization",
        "openai-project",
        "set-cookie",
        "access-control-allow-origin",
        "access-control-expose-headers",
        "anthropic-ratelimit-unified-status",
        "anthropic-ratelimit-unified-5h-utilization",
        "anthropic-ratelimit-requests-remaining",
        "x-ratelimit-remaining-requests",
        "x-codex-primary-used-percent",
        "cf-ray",
        "server",
    ] {
        assert!(
            !headers.contains_key(name),
            "{name} never reaches a client ({status})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gets_the_headers_sdks_read_and_nothing_of_the_pooled_account() {
    let h = start(&[
        ("a", "anthropic", ", api_key: cred-a"),
        ("o", "openai", ", api_key: cred-o"),
    ])
    .await;
    let scripted = |status: u16, body: &str| Scripted::Fail {
        status,
        headers: upstream_answer_headers(),
        body: body.to_owned(),
    };
    h.upstream.script(
        "cred-a",
        [
            scripted(
                200,
                r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}"#,
            ),
            // A client error comes back as it came, but with the same headers only.
            scripted(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#,
            ),
        ],
    );
    for expected in [200, 400] {
        let response = h
            .post("/v1/messages", KEY)
            .json(&message("hi"))
            .send()
            .await
            .expect("relay answers");
        assert_eq!(response.status().as_u16(), expected);
        check_client_headers(response.headers(), expected);
    }
    h.upstream.script(
        "cred-o",
        [scripted(
            200,
            r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#,
        )],
    );
    let response = h
        .post("/v1/chat/completions", KEY)
        .json(&json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    check_client_headers(response.headers(), 200);
}

/// A Responses API call of `key`; the answer's status and body.
async fn respond(h: &Harness, key: &str, body: Value) -> (u16, Value) {
    let response = h
        .http
        .post(format!("{}/v1/responses", h.base))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("relay answers");
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The refusal of another key's response id: what OpenAI answers for an id it does not know.
fn check_not_found(body: &Value, id: &str) {
    assert_eq!(
        *body,
        json!({"error": {
            "message": format!("Previous response with id '{id}' not found."),
            "type": "invalid_request_error",
            "param": "previous_response_id",
            "code": "previous_response_not_found",
        }})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_keys_previous_response_id_is_refused_and_never_reaches_an_account() {
    let h = start(&[
        ("o1", "openai", ", api_key: cred-o1"),
        ("o2", "openai", ", api_key: cred-o2"),
    ])
    .await;
    let (status, first) = respond(&h, KEY, json!({"model": "gpt-x", "input": "secret"})).await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().expect("a response id").to_owned();
    let reached = h.upstream.seen_requests().len();
    for stream in [false, true] {
        let (status, body) = respond(
            &h,
            OTHER_KEY,
            json!({"model": "gpt-x", "input": "go on", "previous_response_id": id, "stream": stream}),
        )
        .await;
        assert_eq!(status, 404, "stream: {stream}");
        check_not_found(&body, &id);
    }
    assert_eq!(
        h.upstream.seen_requests().len(),
        reached,
        "the refused requests never reached an account"
    );
    // The key that made it continues it, on the account that produced it.
    let producer = h.upstream.seen_requests()[reached - 1].credential();
    let (status, body) = respond(
        &h,
        KEY,
        json!({"model": "gpt-x", "input": "go on", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(h.last_served(), producer);
    // An id bound to no one, while the pool's bindings are younger than their ttl (this one
    // started just now), cannot be told from one whose binding was lost: refused too, never sent
    // on a guess (docs/DESIGN.md §3, "When Redis is wiped"; once the bindings are older than the
    // ttl it passes: selector-svc/tests/response_bindings.rs).
    let (status, body) = respond(
        &h,
        OTHER_KEY,
        json!({"model": "gpt-x", "input": "go on", "previous_response_id": "resp_never_bound_here"}),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    check_not_found(&body, "resp_never_bound_here");
    assert_eq!(h.upstream.seen_requests().len(), reached + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_key_with_the_same_session_does_not_share_its_binding() {
    // `b` serves only what is bound to it: `a` comes first otherwise.
    let h = start(&[
        ("a", "anthropic", ", api_key: cred-a, priority: 0"),
        ("b", "anthropic", ", api_key: cred-b, priority: 1"),
    ])
    .await;
    let with_session = |key: &str| {
        h.post("/v1/messages", key)
            .header("x-claude-code-session-id", "shared-session")
            .json(&message("hi"))
            .send()
    };
    // The same system prompt and first turn, no session id: a derived session.
    let derived = json!({"model": "claude-x", "max_tokens": 16, "system": "the same prompt", "messages": [{"role": "user", "content": "the same first turn"}]});
    let with_derived = |key: &str| h.post("/v1/messages", key).json(&derived).send();
    // Alice's two sessions are bound to `b`: `a` is busy when they start.
    let busy = || Scripted::Fail {
        status: 529,
        headers: vec![],
        body: r#"{"type":"error","error":{"type":"overloaded_error","message":"busy"}}"#.into(),
    };
    h.upstream.script("cred-a", [busy(), busy()]);
    for response in [with_session(KEY).await, with_derived(KEY).await] {
        let response = response.expect("relay answers");
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(h.last_served(), "cred-b");
    }
    // Once `a` is no longer busy, a new conversation goes to `a` again.
    let mut n = 0;
    eventually(Duration::from_secs(10), || {
        n += 1;
        let request = h
            .post("/v1/messages", KEY)
            .json(&message(&format!("fresh {n}")));
        let h = &h;
        async move {
            let served = request.send().await.is_ok_and(|r| r.status() == 200);
            (served && h.last_served() == "cred-a").then_some(())
        }
    })
    .await
    .expect("a serves again");
    for (key, expected) in [(KEY, "cred-b"), (OTHER_KEY, "cred-a"), (KEY, "cred-b")] {
        let response = with_session(key).await.expect("relay answers");
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(h.last_served(), expected, "session id, key {key}");
        let response = with_derived(key).await.expect("relay answers");
        assert_eq!(response.status().as_u16(), 200);
        assert_eq!(h.last_served(), expected, "derived session, key {key}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_refused_past_its_own_rate_and_never_spends_the_message_rate() {
    let h = start(&[("a", "anthropic", ", api_key: cred-a")]).await;
    let count = || {
        h.post("/v1/messages/count_tokens", LIMITED_KEY)
            .json(&message("hi"))
            .send()
    };
    let messages = || {
        h.post("/v1/messages", LIMITED_KEY)
            .json(&message("hi"))
            .send()
    };
    for _ in 0..2 {
        let response = count().await.expect("relay answers");
        assert_eq!(response.status().as_u16(), 200);
    }
    // Bob's two messages a minute are untouched by his two count_tokens.
    for _ in 0..2 {
        let response = messages().await.expect("relay answers");
        assert_eq!(response.status().as_u16(), 200);
    }
    let refused = count().await.expect("relay answers");
    assert_eq!(refused.status().as_u16(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["type"], "error", "Anthropic's format: {body}");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let refused = messages().await.expect("relay answers");
    assert_eq!(
        refused.status().as_u16(),
        429,
        "the messages rate is his too"
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("count_tokens")),
        "the relay's refusal, not an upstream's: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_stops_at_the_accounts_cap_whoever_sends_it() {
    let h = start(&[("a", "anthropic", ", api_key: cred-a")]).await;
    // The account's answers are numbered (any path takes the next one): the answer a request
    // gets tells how many calls reached the account before it.
    h.upstream.script(
        "cred-a",
        (0..62).map(|n| Scripted::Fail {
            status: 200,
            headers: vec![],
            body: format!(r#"{{"input_tokens": {n}}}"#),
        }),
    );
    // Alice has no limit of her own: the account's cap (60 a minute) is what stops her.
    let mut answers = Vec::new();
    for _ in 0..61 {
        let response = h
            .post("/v1/messages/count_tokens", KEY)
            .json(&message("hi"))
            .send()
            .await
            .expect("relay answers");
        let status = response.status().as_u16();
        answers.push((
            status,
            response.json::<Value>().await.unwrap_or(Value::Null),
        ));
    }
    for (n, (status, body)) in answers[..60].iter().enumerate() {
        assert_eq!((*status, &body["input_tokens"]), (200, &json!(n)), "{n}");
    }
    assert_eq!(
        answers[60].0, 503,
        "every account is at its count_tokens cap: {:?}",
        answers[60]
    );
    // Messages are not count_tokens: they still pass, and get the account's 61st answer (the
    // refused count_tokens never reached it).
    let response = h
        .post("/v1/messages", KEY)
        .json(&message("hi"))
        .send()
        .await
        .expect("relay answers");
    assert_eq!(response.status().as_u16(), 200);
    let body: Value = response.json().await.expect("json");
    assert_eq!(body["input_tokens"], 60);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_grpc_response_and_session_bindings_are_the_keys_own() {
    let backends = common::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("upstream");
    for name in ["o1", "o2"] {
        let account = selector_svc::store::AccountInput {
            platform: Platform::OpenAi,
            ..common::account(name, &upstream.base_url, 4, 0)
        };
        backends
            .store
            .upsert_account(&account)
            .await
            .expect("account");
    }
    backends
        .store
        .set_price("gpt-x", Price::default())
        .await
        .expect("price");
    let (alice_id, alice) = backends
        .store
        .create_api_key("alice", "alice", "default", 0)
        .await
        .expect("key");
    let (_, mallory) = backends
        .store
        .create_api_key("mallory", "mallory", "default", 0)
        .await
        .expect("key");
    let (_selector, selector_addr) = common::selector(&backends).await.expect("selector");
    let (_admission, admission_addr) = common::admission(&backends.redis.url(), Default::default())
        .await
        .expect("admission");
    let addr = common::relay(
        vec![format!("http://{selector_addr}")],
        vec![format!("http://{admission_addr}")],
        RelaySettings::default(),
    )
    .await
    .expect("relay");
    let h = Harness {
        upstream,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
    };
    let (alice, mallory) = (alice.expose().to_owned(), mallory.expose().to_owned());
    let (status, first) = respond(
        &h,
        &alice,
        json!({"model": "gpt-x", "input": "secret", "prompt_cache_key": "alice-session"}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().expect("a response id").to_owned();
    let reached = h.upstream.seen_requests().len();
    let (status, body) = respond(
        &h,
        &mallory,
        json!({"model": "gpt-x", "input": "go on", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, 404);
    check_not_found(&body, &id);
    assert_eq!(h.upstream.seen_requests().len(), reached, "never sent");
    let (status, body) = respond(
        &h,
        &alice,
        json!({"model": "gpt-x", "input": "go on", "previous_response_id": id}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    // Alice's session is bound under her key, not under the bare session id.
    let mut redis = backends.redis.client().await.expect("redis");
    let scoped: Option<i64> = redis::cmd("GET")
        .arg(poolgate_runtime::redis_keys::sticky_binding(
            "default",
            &format!("k{alice_id}:alice-session"),
        ))
        .query_async(&mut redis)
        .await
        .expect("get");
    assert!(scoped.is_some(), "alice's session is bound under her key");
    let bare: Option<i64> = redis::cmd("GET")
        .arg(poolgate_runtime::redis_keys::sticky_binding(
            "default",
            "alice-session",
        ))
        .query_async(&mut redis)
        .await
        .expect("get");
    assert_eq!(bare, None, "no binding another key could find");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_group_that_opts_in_passes_the_usage_window_headers_on() {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: solo}}\n  - {{key: {OTHER_KEY}, user: bob, group: shared}}\n\
         groups:\n  solo: {{usage_headers_to_clients: true}}\n\
         accounts:\n  - {{name: mine, group: solo, platform: anthropic, base_url: \"{0}\", api_key: cred-solo}}\n  \
         - {{name: pooled, group: shared, platform: anthropic, base_url: \"{0}\", api_key: cred-shared}}\n",
        upstream.base_url
    );
    let (_relay, addr) = common::standalone(
        &yaml,
        RelaySettings::default(),
        poolgate_core::outcome::RuntimeBlockSettings::default(),
    )
    .await
    .expect("standalone relay starts");
    let answer = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}"#;
    let http = reqwest::Client::new();
    for (key, credential, passes) in [(KEY, "cred-solo", true), (OTHER_KEY, "cred-shared", false)] {
        upstream.script(
            credential,
            [Scripted::Fail {
                status: 200,
                headers: upstream_answer_headers(),
                body: answer.to_owned(),
            }],
        );
        let response = http
            .post(format!("http://{addr}/v1/messages"))
            .header("x-api-key", key)
            .json(&message("hi"))
            .send()
            .await
            .expect("relay answers");
        assert_eq!(response.status().as_u16(), 200);
        let headers = response.headers();
        for name in [
            "anthropic-ratelimit-unified-status",
            "anthropic-ratelimit-unified-5h-utilization",
            "x-codex-primary-used-percent",
        ] {
            assert_eq!(
                headers.contains_key(name),
                passes,
                "{name} for {credential}"
            );
        }
        // Opting in passes the usage windows only, never the account's organisation or cookies.
        for name in [
            "anthropic-organization-id",
            "set-cookie",
            "access-control-allow-origin",
        ] {
            assert!(!headers.contains_key(name), "{name} for {credential}");
        }
    }
}
