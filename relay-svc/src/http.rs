//! The HTTP front (axum): routes, client authentication, request parsing, and turning an answer
//! into a response — with SSE keep-alive comments for a streaming client that waits, after which
//! a refusal is an SSE error event instead of a status.

use std::sync::Arc;

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use poolgate_core::account::Service;
use poolgate_core::keys::Endpoint;

use crate::client_api::{Api, ErrorKind, RelayError};
use crate::edge::{BodyError, BufferBudget, read_body};
use crate::proxy::{Answer, BodyJsonError, Inbound, Relay, TopLevel, key_view};
use crate::session::{opens_conversation, session_hash};

mod respond;
pub mod socket;

use respond::{AbortOnDrop, pinged_stream, respond};

/// Shared state of the HTTP front.
#[derive(Clone)]
pub struct Front {
    pub relay: Arc<Relay>,
    pub ready: Arc<std::sync::atomic::AtomicBool>,
    /// Request body bytes held across every connection (`--max-buffered-bytes`).
    pub buffers: BufferBudget,
    /// Responses WebSockets open per client key (`socket.rs`).
    pub sockets: socket::OpenSockets,
}

impl Front {
    pub fn new(relay: Arc<Relay>, ready: Arc<std::sync::atomic::AtomicBool>) -> Self {
        let buffers = BufferBudget::new(relay.settings.edge.max_buffered_bytes);
        Front {
            relay,
            ready,
            buffers,
            sockets: socket::OpenSockets::default(),
        }
    }
}

/// Marks a response as the connection's last: hyper closes it after the response instead of
/// reading on (the unread rest of a body is never read).
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The answer to a body that was not read whole, in the client's format.
fn body_refusal(api: Api, error: BodyError, limit: usize) -> Response {
    let (status, kind, message) = match error {
        BodyError::TooLarge => (
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::InvalidRequest,
            format!("the request body is larger than {limit} bytes"),
        ),
        BodyError::Saturated => (
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Overloaded,
            "the relay is holding as many request bodies as it will; try again shortly".into(),
        ),
        BodyError::TooSlow => (
            StatusCode::REQUEST_TIMEOUT,
            ErrorKind::InvalidRequest,
            "the request body arrived too slowly".into(),
        ),
        BodyError::Broken => (
            StatusCode::BAD_REQUEST,
            ErrorKind::InvalidRequest,
            "the request body broke off".into(),
        ),
    };
    let mut error = RelayError::new(api, kind, message);
    if status == StatusCode::SERVICE_UNAVAILABLE {
        error = error.retry_after_ms(1000);
    }
    let mut response = error.into_response();
    *response.status_mut() = status;
    closing(response)
}

pub fn router(front: Front) -> Router {
    use Service::{Chat, Embeddings, Rerank};
    Router::new()
        .route(
            "/v1/messages",
            endpoint(Api::Anthropic, "/v1/messages", Endpoint::Messages, Chat)
                .fallback(wrong_method),
        )
        .route(
            "/v1/messages/count_tokens",
            post(count_tokens).fallback(wrong_method),
        )
        .route(
            "/v1/chat/completions",
            endpoint(
                Api::OpenAi,
                "/v1/chat/completions",
                Endpoint::ChatCompletions,
                Chat,
            )
            .fallback(wrong_method),
        )
        .route(
            "/v1/responses",
            endpoint(Api::OpenAi, "/v1/responses", Endpoint::Responses, Chat)
                .get(responses_over_websocket)
                .fallback(wrong_method),
        )
        .route(
            "/v1/embeddings",
            endpoint(
                Api::OpenAi,
                "/v1/embeddings",
                Endpoint::Embeddings,
                Embeddings,
            )
            .fallback(wrong_method),
        )
        .route(
            "/v1/rerank",
            endpoint(Api::Cohere, "/v1/rerank", Endpoint::Rerank, Rerank).fallback(wrong_method),
        )
        .route(
            "/v2/rerank",
            endpoint(Api::Cohere, "/v2/rerank", Endpoint::Rerank, Rerank).fallback(wrong_method),
        )
        .route("/v1/models", get(models))
        .route("/v1/poolgate/key", get(own_key))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(front)
}

/// The POST route of a governed endpoint: its `Route`, then `handle`.
fn endpoint(
    api: Api,
    path: &'static str,
    endpoint: Endpoint,
    service: Service,
) -> axum::routing::MethodRouter<Front> {
    post(
        move |State(front): State<Front>, uri: Uri, headers: HeaderMap, body: AxumBody| async move {
            let route = Route {
                service,
                ..Route::new(api, path, endpoint, &uri)
            };
            handle(front, route, headers, body).await
        },
    )
}

async fn count_tokens(
    State(front): State<Front>,
    uri: Uri,
    headers: HeaderMap,
    body: AxumBody,
) -> Response {
    let route = Route {
        ungoverned: true,
        ..Route::new(
            Api::Anthropic,
            "/v1/messages/count_tokens",
            Endpoint::CountTokens,
            &uri,
        )
    };
    handle(front, route, headers, body).await
}

/// Which endpoint a request came in on, and its query string (passed upstream as it came:
/// Claude Code sends `/v1/messages?beta=true`).
struct Route {
    api: Api,
    path: &'static str,
    /// What a key's endpoint list names it.
    endpoint: Endpoint,
    query: Option<String>,
    /// Requests that cost nothing and take no lease (count_tokens).
    ungoverned: bool,
    /// A turn from a client's Responses socket (`socket.rs`).
    socket: Option<crate::proxy::upstream_socket::SocketTurn>,
    /// What the request asks of an account (chat unless embeddings or rerank).
    service: Service,
}

impl Route {
    fn new(api: Api, path: &'static str, endpoint: Endpoint, uri: &Uri) -> Self {
        Route {
            api,
            path,
            endpoint,
            query: uri.query().filter(|q| !q.is_empty()).map(str::to_owned),
            ungoverned: false,
            socket: None,
            service: Service::Chat,
        }
    }
}

/// Longest query string passed upstream.
const MAX_QUERY_BYTES: usize = 2048;

/// Which API family a `GET` speaks: Anthropic's clients send `anthropic-version` or `x-api-key`.
fn get_api(headers: &HeaderMap) -> Api {
    if headers.contains_key("anthropic-version") || headers.contains_key("x-api-key") {
        Api::Anthropic
    } else {
        Api::OpenAi
    }
}

/// The group's models of the client's API family, only those the key's model list allows.
async fn models(State(front): State<Front>, headers: HeaderMap) -> Response {
    let api = get_api(&headers);
    let caller = match front
        .relay
        .authenticate(api, client_key(&headers).as_deref())
        .await
        .and_then(|caller| {
            front
                .relay
                .check_access(api, &caller, Endpoint::Models, None)
                .map(|()| caller)
        }) {
        Ok(caller) => caller,
        Err(error) => return with_request_id(error.into_response()),
    };
    let mut models = front
        .relay
        .selection
        .models(&caller.group, api.platform())
        .await
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "model list unavailable");
            Vec::new()
        });
    models.retain(|model| caller.access.allows_model(model));
    let body = match api {
        Api::Anthropic => {
            let data: Vec<serde_json::Value> = models
                .iter()
                .map(|id| serde_json::json!({"type": "model", "id": id, "display_name": id, "created_at": "1970-01-01T00:00:00Z"}))
                .collect();
            serde_json::json!({"data": data, "has_more": false, "first_id": models.first(), "last_id": models.last()})
        }
        // (`get_api` names Anthropic or OpenAI: Cohere's clients list no models here.)
        Api::OpenAi | Api::Cohere => {
            let data: Vec<serde_json::Value> = models
                .iter()
                .map(|id| serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": "poolgate"}))
                .collect();
            serde_json::json!({"object": "list", "data": data})
        }
    };
    with_request_id(axum::Json(body).into_response())
}

/// The caller's own key and usage (`GET /v1/poolgate/key`, docs/DESIGN.md §6): answered to a
/// disabled or expired key too, so its holder learns why it is refused; never another key's.
async fn own_key(State(front): State<Front>, headers: HeaderMap) -> Response {
    let api = get_api(&headers);
    let response = match front
        .relay
        .describe_key(api, client_key(&headers).as_deref())
        .await
    {
        Ok(description) => {
            axum::Json(key_view(&description, front.relay.clock.wall_ms())).into_response()
        }
        Err(error) => error.into_response(),
    };
    with_request_id(response)
}

async fn readyz(State(front): State<Front>) -> Response {
    if front.ready.load(std::sync::atomic::Ordering::Relaxed) {
        "ready".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "shutting down").into_response()
    }
}

/// A WebSocket upgrade on `/v1/responses` (Codex with `supports_websockets`): the Responses API
/// on a socket (`socket.rs`). Where the operator turned the socket off, `426 Upgrade Required`,
/// the answer on which Codex falls back to HTTP at once (any other refusal it retries up to its
/// `stream_max_retries` first, seconds lost). A GET that asks for no upgrade is a wrong method,
/// as on any other endpoint.
async fn responses_over_websocket(
    State(front): State<Front>,
    method: http::Method,
    uri: http::Uri,
    headers: HeaderMap,
    upgrade: Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Response {
    if !socket::asks_websocket(&headers) {
        return wrong_method(method, uri).await;
    }
    if !front.relay.settings.sockets.enabled {
        let error = RelayError::new(
            Api::OpenAi,
            ErrorKind::InvalidRequest,
            "the Responses API is served over HTTP here, not WebSocket; use POST /v1/responses",
        );
        let mut response = error.into_response();
        *response.status_mut() = StatusCode::UPGRADE_REQUIRED;
        return with_request_id(response);
    }
    let upgrade = match upgrade {
        Ok(upgrade) => upgrade,
        Err(rejection) => {
            let error = RelayError::new(
                Api::OpenAi,
                ErrorKind::InvalidRequest,
                format!("not a WebSocket upgrade this relay can take: {rejection}"),
            );
            return with_request_id(closing(error.into_response()));
        }
    };
    with_request_id(socket::upgrade(front, uri, headers, upgrade).await)
}

async fn wrong_method(method: http::Method, uri: http::Uri) -> Response {
    let api = if uri.path().starts_with("/v1/messages") {
        Api::Anthropic
    } else if uri.path().ends_with("/rerank") {
        Api::Cohere
    } else {
        Api::OpenAi
    };
    let error = RelayError::new(
        api,
        ErrorKind::InvalidRequest,
        format!("{method} is not allowed on {}; use POST", uri.path()),
    );
    let mut response = error.into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
        .headers_mut()
        .insert(http::header::ALLOW, HeaderValue::from_static("POST"));
    with_request_id(response)
}

async fn not_found(uri: Uri, headers: HeaderMap) -> Response {
    let api = if headers.contains_key("anthropic-version") {
        Api::Anthropic
    } else if uri.path().ends_with("/rerank") {
        Api::Cohere
    } else {
        Api::OpenAi
    };
    with_request_id(RelayError::new(api, ErrorKind::NotFound, "no such endpoint").into_response())
}

/// The client's poolgate key: `x-api-key`, else `Authorization: Bearer`.
fn client_key(headers: &HeaderMap) -> Option<String> {
    if let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(key.trim().to_owned());
    }
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(|k| k.trim().to_owned())
}

/// `x-request-id` of every response.
fn request_id_header() -> (HeaderName, HeaderValue) {
    let id = format!("req_{:016x}{:08x}", fastrand::u64(..), fastrand::u32(..));
    (
        HeaderName::from_static("x-request-id"),
        HeaderValue::from_str(&id).unwrap_or_else(|_| HeaderValue::from_static("req_unknown")),
    )
}

fn with_request_id(mut response: Response) -> Response {
    let (name, value) = request_id_header();
    response.headers_mut().insert(name, value);
    response
}

/// Every log line of one request carries its request id (the one returned in `x-request-id`).
async fn handle(front: Front, route: Route, headers: HeaderMap, body: AxumBody) -> Response {
    use tracing::Instrument;
    let (name, id) = request_id_header();
    let span = tracing::info_span!("request", request_id = %id.to_str().unwrap_or(""), endpoint = route.path);
    let mut response = handle_inner(front, route, headers, body)
        .instrument(span)
        .await;
    response.headers_mut().insert(name, id);
    response
}

async fn handle_inner(front: Front, route: Route, headers: HeaderMap, body: AxumBody) -> Response {
    let Route {
        api,
        path,
        endpoint,
        query,
        ungoverned,
        socket,
        service,
    } = route;
    let relay = front.relay.clone();
    relay.metrics.requests.with_label_values(&[path]).inc();
    // The key first, from the headers alone: a request without a good one, or whose key may not
    // use this endpoint, is answered and its connection closed before a byte of its body is read.
    let caller = match relay
        .authenticate(api, client_key(&headers).as_deref())
        .await
        .and_then(|caller| {
            relay
                .check_access(api, &caller, endpoint, None)
                .map(|()| caller)
        }) {
        Ok(caller) => caller,
        Err(error) => return closing(error.into_response()),
    };
    let limit = relay.settings.max_body_bytes;
    let announced = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let (body, buffered) =
        match read_body(body, announced, limit, &front.buffers, &relay.settings.edge).await {
            Ok(read) => read,
            Err(error) => return body_refusal(api, error, limit),
        };
    if query.as_ref().is_some_and(|q| q.len() > MAX_QUERY_BYTES) {
        return RelayError::new(
            api,
            ErrorKind::InvalidRequest,
            format!("the query string is longer than {MAX_QUERY_BYTES} bytes"),
        )
        .into_response();
    }
    // The top level only, raw: no DOM of the client's payload (`proxy/body.rs`).
    let top = match TopLevel::parse(&body) {
        Ok(top) => top,
        Err(BodyJsonError::NotAnObject) => {
            return RelayError::new(
                api,
                ErrorKind::InvalidRequest,
                "the request body must be a JSON object",
            )
            .into_response();
        }
        Err(BodyJsonError::TooDeep) => {
            return RelayError::new(
                api,
                ErrorKind::InvalidRequest,
                format!(
                    "the request body nests arrays and objects deeper than {}",
                    crate::proxy::MAX_JSON_DEPTH
                ),
            )
            .into_response();
        }
        Err(BodyJsonError::Invalid(error)) => {
            return RelayError::new(
                api,
                ErrorKind::InvalidRequest,
                format!("the request body is not valid JSON: {error}"),
            )
            .into_response();
        }
    };
    let model = match top.raw("model").map(|_| top.str("model")) {
        Some(Some(model)) if !model.is_empty() && model.len() <= 256 => model,
        Some(_) => {
            return RelayError::new(
                api,
                ErrorKind::InvalidRequest,
                "model: must be a non-empty string of at most 256 bytes",
            )
            .into_response();
        }
        None => {
            return RelayError::new(api, ErrorKind::InvalidRequest, "model: field required")
                .into_response();
        }
    };
    // The model the client asked for (before any account's mapping) against the key's list.
    if let Err(error) = relay.check_access(api, &caller, endpoint, Some(&model)) {
        return error.into_response();
    }
    let chat = service == Service::Chat;
    // Embeddings and rerank answer whole, never as a stream, and bind no session: each batch or
    // query stands alone (docs/DESIGN.md §6, "Embeddings and rerank").
    let stream = chat && top.bool("stream").unwrap_or(false);
    let previous_response_id = top
        .str("previous_response_id")
        .filter(|id| chat && !id.is_empty() && id.len() <= 128);
    let rerank = if service == Service::Rerank {
        match crate::proxy::rerank::Rerank::read(path, &headers, &top) {
            Ok(rerank) => Some(rerank),
            Err(error) => return error.into_response(),
        }
    } else {
        None
    };
    let basis = top.session_basis();
    let (session, opens) = if chat {
        (
            session_hash(api, &headers, &basis),
            opens_conversation(api, &headers, &basis),
        )
    } else {
        (None, false)
    };
    let inbound = Inbound {
        api,
        path,
        query,
        session_hash: session,
        opens_conversation: opens,
        service,
        rerank,
        headers,
        body,
        top,
        model,
        stream,
        caller,
        previous_response_id,
        ungoverned,
        buffered,
        socket,
    };
    if !stream {
        return respond(relay.run(inbound).await);
    }
    // A streaming request: answer with the real status when it comes in time; otherwise start
    // the SSE stream with keep-alive comments while the request waits for capacity.
    let ping_after = relay.settings.ping_after;
    let ping_every = relay.settings.ping_every;
    let mut run = AbortOnDrop(Some(tokio::spawn(tracing::Instrument::in_current_span(
        relay.run(inbound),
    ))));
    tokio::select! {
        answer = run.join() => respond(answer.unwrap_or_else(|| Answer::Error(RelayError::new(api, ErrorKind::Upstream, "internal error")))),
        _ = tokio::time::sleep(ping_after) => pinged_stream(api, run, ping_every),
    }
}
