use super::*;

#[test]
fn sse_events_become_frames_and_done_reads_as_completed() {
    assert_eq!(
        sse_data("event: x\ndata: {\"a\":1}\n\n").as_deref(),
        Some("{\"a\":1}")
    );
    assert_eq!(sse_data(": ping\n\n"), None);
    let mut turn = Turn::default();
    let item = turn
        .take(r#"{"type":"response.output_item.done","item":{"type":"message","id":"m1"}}"#.into());
    assert!(item.contains("output_item.done"));
    let done = turn.take(r#"{"type":"response.done","response":{"id":"resp_1"}}"#.into());
    assert!(done.contains("\"response.completed\""), "{done}");
    assert_eq!(turn.completed.as_deref(), Some("resp_1"));
    assert_eq!(turn.output.len(), 1);
}

#[test]
fn the_turns_headers_drop_the_upgrade_and_the_socket_beta_only() {
    let mut headers = HeaderMap::new();
    headers.insert("upgrade", HeaderValue::from_static("websocket"));
    headers.insert("sec-websocket-key", HeaderValue::from_static("k"));
    headers.insert(
        "openai-beta",
        HeaderValue::from_static("responses_websockets=2026-02-06, other=1"),
    );
    headers.insert("session_id", HeaderValue::from_static("s"));
    let turn = turn_headers(&headers);
    assert!(turn.get("upgrade").is_none() && turn.get("sec-websocket-key").is_none());
    assert_eq!(
        turn.get("openai-beta").map(|v| v.as_bytes()),
        Some(&b"other=1"[..])
    );
    assert_eq!(
        turn.get("session_id").map(|v| v.as_bytes()),
        Some(&b"s"[..])
    );
}

#[test]
fn a_keys_sockets_are_bounded_and_given_back() {
    let open = OpenSockets::default();
    let first = open.open(7, 2).expect("first");
    assert_eq!(open.open_count(), 1);
    let _second = open.open(7, 2).expect("second");
    assert!(open.open(7, 2).is_none(), "the third is refused");
    assert!(open.open(8, 2).is_some(), "another key's are its own");
    drop(first);
    assert!(
        open.open(7, 2).is_some(),
        "a closed socket's slot comes back"
    );
}
