use super::*;

#[test]
fn the_create_frame_is_the_body_with_its_type_first() {
    assert_eq!(
        create_frame(br#" {"model":"m","input":[]}"#).as_deref(),
        Some(r#"{"type":"response.create","model":"m","input":[]}"#)
    );
    assert_eq!(
        create_frame(b"{ }").as_deref(),
        Some(r#"{"type":"response.create"}"#)
    );
    assert_eq!(create_frame(b"[1]"), None);
    let frame = continuation_frame(
        br#"{"model":"m","input":[1,2,3],"store":false}"#,
        "resp_1",
        &[serde_json::json!(3)],
    )
    .unwrap_or_default();
    let frame: Value = serde_json::from_str(&frame).unwrap_or(Value::Null);
    assert_eq!(frame["type"], "response.create");
    assert_eq!(frame["input"], serde_json::json!([3]));
    assert_eq!(frame["previous_response_id"], "resp_1");
    assert_eq!(frame["store"], false);
}

#[test]
fn only_an_upgrade_refusal_about_the_account_is_classified_the_rest_is_http() {
    for status in [401, 402, 403, 429, 500, 503] {
        assert!(
            refuses_the_account(StatusCode::from_u16(status).unwrap_or_default()),
            "{status}"
        );
    }
    for status in [200, 204, 302, 400, 404, 405, 426] {
        assert!(
            !refuses_the_account(StatusCode::from_u16(status).unwrap_or_default()),
            "{status}"
        );
    }
}

#[test]
fn only_an_error_event_with_a_failing_status_stands_for_an_answer() {
    assert_eq!(
        error_status(r#"{"type":"error","status":429,"error":{"type":"usage_limit_reached"}}"#),
        Some(429)
    );
    assert_eq!(
        error_status(r#"{"type":"error","status_code":400,"error":{}}"#),
        Some(400)
    );
    assert_eq!(
        error_status(r#"{"type":"error","error":{"code":"x"}}"#),
        None
    );
    assert_eq!(
        error_status(r#"{"type":"response.output_text.delta","delta":"\"error\""}"#),
        None
    );
}

#[test]
fn an_error_head_carries_the_events_status_headers_and_error() {
    let event = serde_json::json!({"type": "error", "status": 429,
        "error": {"type": "usage_limit_reached", "resets_at": 1_900_000_000},
        "headers": {"x-codex-primary-used-percent": 100.0, "x-codex-primary-window-minutes": "300"}});
    let head = error_head(429, &event);
    assert_eq!(head.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(head.headers["x-codex-primary-used-percent"], "100.0");
    assert_eq!(head.headers["x-codex-primary-window-minutes"], "300");
}
