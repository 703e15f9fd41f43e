//! The Responses API over a WebSocket (Codex's transport; docs/DESIGN.md §6, "Codex over
//! WebSocket"), in standalone mode against the fake upstream, with a WebSocket client of its own:
//! the key checked before the upgrade; each `response.create` a turn run through the relay (one
//! upstream call, its events one per text frame); on the upstream's own socket (one per client
//! socket) a continuation goes on as sent, and a broken upstream socket is replaced on the next
//! turn; where the upstream has none, each turn over HTTP with the whole conversation; an
//! upstream refusal on the socket counted as over HTTP; a `store: false` continuation of anything else refused with the
//! platform's `previous_response_not_found` before any upstream call; a prewarm answered without
//! one; the socket bound per key; and the operator's switch back to 426.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use poolgate_select::engine::SelectorSettings;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::http::socket::SocketSettings;
use relay_svc::metrics::Metrics;
use relay_svc::proxy::{Relay, RelaySettings};
use relay_svc::standalone::StandaloneFile;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const KEY: &str = "pgk-socket-key-0001";

struct Harness {
    upstream: FakeUpstream,
    addr: std::net::SocketAddr,
}

async fn start(sockets: SocketSettings) -> Harness {
    start_until(sockets, std::future::pending()).await
}

/// [`start`], the relay shutting down when `shutdown` completes.
async fn start_until(
    sockets: SocketSettings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Harness {
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: alice, group: default}}\naccounts:\n  - {{name: o, platform: openai, base_url: \"{}\", credential: cred-o, concurrency: 2}}\nprices:\n  gpt-x: {{input: 2, output: 8}}\n",
        upstream.base_url
    );
    let file = StandaloneFile::parse(&yaml).expect("the pool's file parses");
    let metrics = Metrics::new();
    let engines = relay_svc::standalone::build(
        &file,
        None,
        SelectorSettings::default(),
        Default::default(),
        &metrics,
    )
    .expect("the engines start");
    let settings = RelaySettings {
        sockets,
        ..RelaySettings::default()
    };
    let relay = Arc::new(
        Relay::new(
            engines.selection.clone(),
            engines.leases.clone(),
            settings,
            metrics,
        )
        .expect("the relay builds"),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(relay_svc::server::serve(
        relay,
        listener,
        None,
        shutdown,
        Duration::from_secs(5),
    ));
    // The engines live as long as the relay serving over them.
    std::mem::forget(engines);
    Harness { upstream, addr }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the socket as Codex does; `Err` with the refusal's status and body.
async fn connect(addr: std::net::SocketAddr, key: &str) -> Result<Socket, (u16, String)> {
    connect_session(addr, key, "thread-1").await
}

/// [`connect`] for the Codex thread `session`.
async fn connect_session(
    addr: std::net::SocketAddr,
    key: &str,
    session: &str,
) -> Result<Socket, (u16, String)> {
    let mut request = format!("ws://{addr}/v1/responses")
        .into_client_request()
        .expect("a request");
    let headers = request.headers_mut();
    headers.insert(
        "authorization",
        format!("Bearer {key}").parse().expect("header"),
    );
    headers.insert(
        "openai-beta",
        "responses_websockets=2026-02-06".parse().expect("header"),
    );
    headers.insert("session_id", session.parse().expect("header"));
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(socket),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => Err((
            response.status().as_u16(),
            String::from_utf8_lossy(response.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(other) => Err((0, other.to_string())),
    }
}

/// Sends one `response.create` and reads events up to a terminal one.
async fn turn(socket: &mut Socket, create: Value) -> Vec<Value> {
    socket
        .send(Message::Text(create.to_string().into()))
        .await
        .expect("sent");
    let mut events = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), socket.next())
            .await
            .expect("an event in time")
            .expect("the socket stays open")
            .expect("a frame");
        let Message::Text(text) = message else {
            continue;
        };
        let event: Value = serde_json::from_str(text.as_str()).expect("a JSON event");
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        events.push(event);
        if matches!(
            kind.as_str(),
            "response.completed" | "response.failed" | "response.incomplete" | "error"
        ) {
            return events;
        }
    }
}

fn create(input: Value, previous: Option<&str>) -> Value {
    let mut create = json!({"type": "response.create", "model": "gpt-x", "input": input,
        "store": false, "stream": true, "instructions": "be brief"});
    if let Some(previous) = previous {
        create["previous_response_id"] = json!(previous);
    }
    create
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http_where_the_upstream_has_no_socket_each_turn_is_one_call_with_the_whole_input() {
    let h = start(SocketSettings::default()).await;
    // An upstream that answers the upgrade 405: every turn is bridged to HTTP.
    h.upstream.set_sockets(false);
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");

    let first = turn(&mut socket, create(json!([user("one")]), None)).await;
    let kinds: Vec<&str> = first.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"response.completed"), "{kinds:?}");
    assert!(kinds.contains(&"response.output_text.delta"));
    let id = first
        .last()
        .and_then(|e| e["response"]["id"].as_str())
        .expect("the response id")
        .to_owned();
    let seen = h.upstream.seen_requests();
    assert_eq!(seen.len(), 1, "one upstream call");
    assert_eq!(seen[0].path, "/v1/responses");
    assert_eq!(seen[0].socket, None, "over HTTP");
    assert_eq!(seen[0].body["stream"], true);
    assert!(
        seen[0].body.get("type").is_none(),
        "the socket's own field stays on the socket"
    );
    assert!(
        seen[0].headers.get("openai-beta").is_none_or(|v| !v
            .to_str()
            .unwrap_or_default()
            .contains("responses_websockets")),
        "the socket's beta flag is not the HTTP call's"
    );

    // The next turn names the first and carries only the new input: upstream gets the whole
    // conversation (first input, the output it produced, the new input), no previous id.
    let second = turn(&mut socket, create(json!([user("two")]), Some(&id))).await;
    assert_eq!(
        second.last().and_then(|e| e["type"].as_str()),
        Some("response.completed")
    );
    let seen = h.upstream.seen_requests();
    assert_eq!(seen.len(), 2);
    let body = &seen[1].body;
    assert!(body.get("previous_response_id").is_none(), "{body}");
    let input = body["input"].as_array().expect("input items");
    assert_eq!(
        input.len(),
        3,
        "first input, its output, the new input: {body}"
    );
    assert_eq!(input[0], user("one"));
    assert_eq!(input[1]["role"], "assistant");
    assert_eq!(input[2], user("two"));
    assert_eq!(
        seen[0].credential(),
        seen[1].credential(),
        "the same account"
    );
    assert_eq!(h.upstream.sockets_opened(), 0);
}

fn completed_id(events: &[Value]) -> String {
    let last = events.last().cloned().unwrap_or(Value::Null);
    assert_eq!(last["type"], "response.completed", "{events:?}");
    last["response"]["id"]
        .as_str()
        .expect("the response id")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_keeps_one_upstream_socket_and_a_broken_one_is_replaced_on_the_next_turn() {
    let h = start(SocketSettings::default()).await;
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");

    let first = completed_id(&turn(&mut socket, create(json!([user("one")]), None)).await);
    let seen = h.upstream.seen_requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].socket, Some(1), "on the upstream's socket");
    assert_eq!(seen[0].path, "/v1/responses");
    assert_eq!(seen[0].body["type"], "response.create");
    assert_eq!(seen[0].body["input"], json!([user("one")]));
    assert_eq!(
        seen[0].credential(),
        "cred-o",
        "the account's key, not the client's"
    );
    assert_eq!(
        seen[0]
            .headers
            .get("openai-beta")
            .and_then(|v| v.to_str().ok()),
        Some("responses_websockets=2026-02-06"),
        "the client's own socket flag, passed on"
    );

    // Each continuation goes on the socket that holds its response, as the client sent it.
    let second = completed_id(&turn(&mut socket, create(json!([user("two")]), Some(&first))).await);
    let third =
        completed_id(&turn(&mut socket, create(json!([user("three")]), Some(&second))).await);
    let seen = h.upstream.seen_requests();
    assert_eq!(seen.len(), 3);
    for (n, (request, previous, text)) in [(&seen[1], &first, "two"), (&seen[2], &second, "three")]
        .into_iter()
        .enumerate()
    {
        assert_eq!(
            request.socket,
            Some(1),
            "turn {n}: the same upstream socket"
        );
        assert_eq!(request.body["previous_response_id"], json!(previous));
        assert_eq!(
            request.body["input"],
            json!([user(text)]),
            "the new input alone"
        );
    }
    assert_eq!(h.upstream.sockets_opened(), 1);

    // The upstream socket breaks mid-answer: the turn ends in an error event, the client socket
    // stays open, and the next turn (Codex resends the whole conversation) opens a new one.
    h.upstream.script_clients(
        "cred-o",
        [poolgate_testkit::fake_upstream::Scripted::BrokenStream],
    );
    let broken = turn(&mut socket, create(json!([user("four")]), Some(&third))).await;
    assert_eq!(
        broken.last().and_then(|e| e["type"].as_str()),
        Some("error"),
        "{broken:?}"
    );
    let resent = turn(
        &mut socket,
        create(
            json!([user("one"), user("two"), user("three"), user("four")]),
            None,
        ),
    )
    .await;
    completed_id(&resent);
    assert_eq!(h.upstream.sockets_opened(), 2, "a new upstream socket");
    let seen = h.upstream.seen_requests();
    let last = seen.last().expect("the resent turn");
    assert_eq!(last.socket, Some(2));
    assert!(last.body.get("previous_response_id").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_refusal_on_the_socket_counts_as_it_would_over_http() {
    use poolgate_testkit::fake_upstream::{Window, WindowBudgets, WindowUnit};
    let h = start(SocketSettings::default()).await;
    // One request in its five-hour window: the second gets the usage-limit 429, here as the
    // socket's error event with the window headers.
    h.upstream.set_windows(
        "cred-o",
        WindowBudgets {
            unit: WindowUnit::Requests,
            five_hour: Some(Window::new(Duration::from_secs(3600), 1)),
            ..WindowBudgets::default()
        },
    );
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");
    completed_id(&turn(&mut socket, create(json!([user("one")]), None)).await);
    let refused = turn(&mut socket, create(json!([user("again")]), None)).await;
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["type"], "error");
    assert_eq!(refused[0]["status"], 429, "{refused:?}");
    assert_eq!(h.upstream.seen_requests().len(), 2);
    // The account is blocked until its window resets, as after the same 429 over HTTP: the next
    // turn reaches no upstream.
    let next = turn(&mut socket, create(json!([user("later")]), None)).await;
    assert_eq!(
        next.last().and_then(|e| e["type"].as_str()),
        Some("error"),
        "{next:?}"
    );
    assert_eq!(h.upstream.seen_requests().len(), 2, "no upstream call");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_sent_while_the_last_answer_is_ending_is_the_next_turn() {
    let h = start(SocketSettings::default()).await;
    // Over HTTP, whose stream ends half a second after its terminal event: Codex sends its next
    // turn as soon as it reads `response.completed`, while the relay still reads that stream.
    h.upstream.set_sockets(false);
    h.upstream.script_clients(
        "cred-o",
        [poolgate_testkit::fake_upstream::Scripted::TrailingPause(
            Duration::from_millis(500),
        )],
    );
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");
    let first = completed_id(&turn(&mut socket, create(json!([user("one")]), None)).await);
    let started = std::time::Instant::now();
    let next = turn(&mut socket, create(json!([user("two")]), Some(&first))).await;
    assert_eq!(
        next.last().and_then(|e| e["type"].as_str()),
        Some("response.completed"),
        "the early turn is served, not refused as one in progress: {next:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "it was sent while the first answer's stream was still open"
    );
    assert_eq!(h.upstream.seen_requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continuation_this_socket_did_not_make_gets_previous_response_not_found_before_any_call()
{
    let h = start(SocketSettings::default()).await;
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");
    let refused = turn(
        &mut socket,
        create(json!([user("two")]), Some("resp_elsewhere")),
    )
    .await;
    assert_eq!(refused.len(), 1, "nothing before the error: {refused:?}");
    assert_eq!(refused[0]["type"], "error");
    assert_eq!(refused[0]["status"], 400);
    assert_eq!(refused[0]["error"]["code"], "previous_response_not_found");
    assert!(h.upstream.seen_requests().is_empty(), "no upstream call");
    // Codex then resends the whole conversation on the socket: served.
    let resent = turn(&mut socket, create(json!([user("one"), user("two")]), None)).await;
    assert_eq!(
        resent.last().and_then(|e| e["type"].as_str()),
        Some("response.completed")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarm_is_answered_without_an_upstream_call_and_the_next_turn_continues_it() {
    let h = start(SocketSettings::default()).await;
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");
    let mut warm = create(json!([user("one")]), None);
    warm["generate"] = json!(false);
    let warmed = turn(&mut socket, warm).await;
    let kinds: Vec<&str> = warmed.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(kinds, vec!["response.created", "response.completed"]);
    assert!(h.upstream.seen_requests().is_empty());
    let id = warmed[1]["response"]["id"]
        .as_str()
        .expect("an id")
        .to_owned();
    let next = turn(&mut socket, create(json!([]), Some(&id))).await;
    assert_eq!(
        next.last().and_then(|e| e["type"].as_str()),
        Some("response.completed")
    );
    let seen = h.upstream.seen_requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body["input"], json!([user("one")]));
    assert!(seen[0].body.get("generate").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_checked_before_the_upgrade_and_its_sockets_are_bounded() {
    let h = start(SocketSettings {
        per_key: 1,
        ..SocketSettings::default()
    })
    .await;
    let (status, body) = connect(h.addr, "pgk-not-a-key")
        .await
        .map(|_| ())
        .expect_err("no upgrade for an unknown key");
    assert_eq!(status, 401, "{body}");
    let first = connect(h.addr, KEY).await.expect("the first socket");
    let (status, body) = connect(h.addr, KEY)
        .await
        .map(|_| ())
        .expect_err("one socket per key here");
    assert_eq!(status, 429, "{body}");
    drop(first);
    poolgate_testkit::eventually(Duration::from_secs(5), || async {
        connect(h.addr, KEY).await.ok()
    })
    .await
    .expect("a closed socket's place comes back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_that_sends_nothing_is_closed_and_an_operator_can_turn_the_socket_off() {
    let h = start(SocketSettings {
        first_message: Duration::from_millis(300),
        ..SocketSettings::default()
    })
    .await;
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");
    let closed = tokio::time::timeout(Duration::from_secs(5), socket.next())
        .await
        .expect("closed in time");
    assert!(
        matches!(closed, Some(Ok(Message::Close(_))) | None),
        "{closed:?}"
    );
    let off = start(SocketSettings {
        enabled: false,
        ..SocketSettings::default()
    })
    .await;
    let (status, _) = connect(off.addr, KEY)
        .await
        .map(|_| ())
        .expect_err("426 when turned off");
    assert_eq!(status, 426, "Codex falls back to HTTP at once on 426");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_shutting_down_closes_its_sockets_going_away_once_their_turn_is_answered() {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let h = start_until(SocketSettings::default(), async {
        let _ = stopped.await;
    })
    .await;
    let mut socket = connect(h.addr, KEY).await.expect("the upgrade");
    let answered = turn(&mut socket, create(json!([user("one")]), None)).await;
    assert_eq!(
        answered.last().and_then(|e| e["type"].as_str()),
        Some("response.completed")
    );
    let _ = stop.send(());
    let closed = tokio::time::timeout(Duration::from_secs(5), socket.next())
        .await
        .expect("closed within the grace");
    match closed {
        Some(Ok(Message::Close(Some(frame)))) => {
            assert_eq!(u16::from(frame.code), 1001, "going away: {frame:?}")
        }
        other => panic!("expected a close frame with 1001, got {other:?}"),
    }
}

/// Distributed: OpenAI API-key accounts named `accounts`, one selector, one admission, and two
/// relays (`a`, `b`) with `settings`; a client key.
struct TwoRelays {
    upstream: FakeUpstream,
    key: poolgate_core::account::Secret,
    a: std::net::SocketAddr,
    b: std::net::SocketAddr,
    /// The backends and services, alive as long as the stack.
    _services: Box<dyn std::any::Any + Send>,
}

async fn two_relays(accounts: &[&str], settings: RelaySettings) -> TwoRelays {
    let backends = poolgate_stack::backends().await.expect("backends start");
    let upstream = FakeUpstream::start().await.expect("fake upstream");
    for name in accounts {
        let mut account = poolgate_stack::account(name, &upstream.base_url, 4, 0);
        account.platform = poolgate_core::account::Platform::OpenAi;
        backends
            .store
            .upsert_account(&account)
            .await
            .expect("account");
    }
    let (_, key) = backends
        .store
        .create_api_key("socket", "socket", "default", 0)
        .await
        .expect("key");
    let (selector, selector_addr) = poolgate_stack::selector(&backends).await.expect("selector");
    let (admission, admission_addr) =
        poolgate_stack::admission(&backends.redis.url(), Default::default())
            .await
            .expect("admission");
    let relay = || {
        poolgate_stack::relay(
            vec![format!("http://{selector_addr}")],
            vec![format!("http://{admission_addr}")],
            settings.clone(),
        )
    };
    let (a, b) = (
        relay().await.expect("relay a"),
        relay().await.expect("relay b"),
    );
    TwoRelays {
        upstream,
        key,
        a,
        b,
        _services: Box::new((backends, selector, admission)),
    }
}

/// Distributed: two relays over one selector, two accounts. A conversation started on relay A's
/// socket continues on relay B (a new socket, as after a reconnect): B refuses the continuation
/// it cannot know with `previous_response_not_found`, the client resends the whole conversation,
/// and it reaches the account that served the first turn (the session's binding, asked of the
/// selector by relay B).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_moved_to_another_relay_reaches_the_account_that_holds_it() {
    let stack = two_relays(&["one", "two"], RelaySettings::default()).await;
    let (upstream, key, a, b) = (&stack.upstream, &stack.key, stack.a, stack.b);
    // Six conversations: each must come back to its own first account (by chance, 1 in 64).
    for n in 0..6 {
        let session = format!("thread-moved-{n}");
        let before = upstream.seen_requests().len();
        let mut on_a = connect_session(a, key.expose(), &session)
            .await
            .expect("relay A's socket");
        let first = turn(&mut on_a, create(json!([user("one")]), None)).await;
        let id = first
            .last()
            .and_then(|e| e["response"]["id"].as_str())
            .expect("completed")
            .to_owned();
        let served_first = upstream.seen_requests()[before].credential();
        // The session is bound after the first turn's success, written through to the selector.
        tokio::time::sleep(Duration::from_millis(300)).await;

        let mut on_b = connect_session(b, key.expose(), &session)
            .await
            .expect("relay B's socket");
        let refused = turn(&mut on_b, create(json!([user("two")]), Some(&id))).await;
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert_eq!(refused[0]["error"]["code"], "previous_response_not_found");
        assert_eq!(
            upstream.seen_requests().len(),
            before + 1,
            "no upstream call for it"
        );
        let mut whole = first
            .iter()
            .filter(|e| e["type"] == "response.output_item.done")
            .map(|e| e["item"].clone())
            .collect::<Vec<_>>();
        whole.insert(0, user("one"));
        whole.push(user("two"));
        let resent = turn(&mut on_b, create(Value::Array(whole), None)).await;
        assert_eq!(
            resent.last().and_then(|e| e["type"].as_str()),
            Some("response.completed")
        );
        let seen = upstream.seen_requests();
        assert_eq!(seen.len(), before + 2);
        assert_eq!(
            seen[before + 1].credential(),
            served_first,
            "conversation {n}: the resent conversation reaches the account of its first turn"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keys_sockets_are_bounded_across_relays() {
    let settings = RelaySettings {
        sockets: SocketSettings {
            per_key: 2,
            ..SocketSettings::default()
        },
        ..RelaySettings::default()
    };
    let stack = two_relays(&["one"], settings).await;
    let (key, a, b) = (&stack.key, stack.a, stack.b);
    // Two on relay A: the key's bound, though relay B holds none of them.
    let mut first = connect_session(a, key.expose(), "s-1")
        .await
        .expect("first");
    let _second = connect_session(a, key.expose(), "s-2")
        .await
        .expect("second");
    let Err((status, body)) = connect_session(b, key.expose(), "s-3").await else {
        panic!("a third socket on relay B is refused");
    };
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("WebSockets open"), "{body}");
    // The refusal cost no turn: the open sockets still serve.
    let served = turn(&mut first, create(json!([user("one")]), None)).await;
    assert_eq!(
        served.last().and_then(|e| e["type"].as_str()),
        Some("response.completed")
    );
    // One closes: its place is free on every relay.
    first.close(None).await.expect("closed");
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match connect_session(b, key.expose(), "s-3").await {
            Ok(_third) => break,
            Err((429, _)) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(other) => panic!("the freed place is not given on relay B: {other:?}"),
        }
    }
}
