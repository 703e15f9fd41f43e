//! A Codex-shaped session of 20 turns, over HTTP and over the Responses WebSocket, through a
//! standalone relay in front of the fake upstream (all in this process), and over HTTP straight
//! to the upstream: per turn, the latency to `response.completed` and the bytes the client sent
//! (docs/DESIGN.md §6, "Codex over WebSocket"). Over HTTP every turn carries the whole
//! conversation; on the socket a turn carries only its new input, and the relay passes it on the
//! upstream's own socket (the fake serves one), also measured direct. Prints each mode's median
//! and p90 turn latency, the relay's added latency over the direct call of the same transport,
//! and the mean bytes per turn, per run.
//!
//! ```text
//! cargo run --release -p poolgate-bench --bin socket-turns -- [--sessions 20] [--turns 20] [--runs 2]
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::{SinkExt, StreamExt};
use poolgate_stack as stack;
use poolgate_testkit::fake_upstream::FakeUpstream;
use relay_svc::proxy::RelaySettings;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

#[global_allocator]
static ALLOCATOR: poolgate_runtime::Allocator = poolgate_runtime::Allocator;

const KEY: &str = "pgk-socket-bench-0001";

#[derive(Debug, Parser)]
struct Args {
    /// Sessions per mode per run.
    #[arg(long, default_value_t = 20)]
    sessions: usize,
    /// Turns per session.
    #[arg(long, default_value_t = 20)]
    turns: usize,
    #[arg(long, default_value_t = 2)]
    runs: usize,
}

/// A turn's user input: Codex's turns carry a prompt and tool output, a few KiB.
fn user(turn: usize) -> Value {
    let text = format!(
        "turn {turn}: {}",
        "context line of tool output. ".repeat(60)
    );
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// The fixed part of Codex's request: instructions and tools (about 12 KiB).
fn base(session: usize) -> serde_json::Map<String, Value> {
    let tools: Vec<Value> = (0..12)
        .map(|n| {
            json!({"type": "function", "name": format!("tool_{n}"), "description": "d".repeat(400),
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}}})
        })
        .collect();
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!("gpt-x"));
    body.insert(
        "instructions".into(),
        json!("You are a coding agent. ".repeat(150)),
    );
    body.insert("tools".into(), json!(tools));
    body.insert("store".into(), json!(false));
    body.insert("stream".into(), json!(true));
    body.insert(
        "prompt_cache_key".into(),
        json!(format!("session-{session}")),
    );
    body
}

struct Turn {
    latency: Duration,
    sent: usize,
}

impl Turn {
    fn copy(&self) -> Turn {
        Turn {
            latency: self.latency,
            sent: self.sent,
        }
    }
}

/// The output items of a streamed response, from its `response.output_item.done` events, and
/// whether it completed.
fn read_events(text: &str, output: &mut Vec<Value>) -> bool {
    let Ok(event) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    match event["type"].as_str() {
        Some("response.output_item.done") => {
            output.push(event["item"].clone());
            false
        }
        Some("response.completed") => true,
        _ => false,
    }
}

/// One session over HTTP at `url` (the relay's or the upstream's): every turn the whole input.
async fn http_session(
    client: &reqwest::Client,
    url: &str,
    session: usize,
    turns: usize,
) -> Option<Vec<Turn>> {
    let mut input: Vec<Value> = Vec::new();
    let mut out = Vec::with_capacity(turns);
    for turn in 0..turns {
        input.push(user(turn));
        let mut body = base(session);
        body.insert("input".into(), Value::Array(input.clone()));
        let bytes = serde_json::to_vec(&body).ok()?;
        let started = Instant::now();
        let response = client
            .post(url)
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(bytes.clone())
            .send()
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        let mut stream = response.bytes_stream();
        let mut pending = String::new();
        let mut output = Vec::new();
        let mut completed = false;
        while let Some(chunk) = stream.next().await {
            pending.push_str(&String::from_utf8_lossy(&chunk.ok()?));
            while let Some(end) = pending.find("\n\n") {
                let event: String = pending.drain(..end + 2).collect();
                for line in event.lines() {
                    if let Some(data) = line.strip_prefix("data: ") {
                        completed |= read_events(data, &mut output);
                    }
                }
            }
        }
        if !completed {
            return None;
        }
        out.push(Turn {
            latency: started.elapsed(),
            sent: bytes.len(),
        });
        input.extend(output);
    }
    Some(out)
}

/// One session on one socket (`url`, with `bearer`): the first turn whole, each later one its
/// new input only.
async fn socket_session(
    url: &str,
    bearer: &str,
    session: usize,
    turns: usize,
) -> Option<Vec<Turn>> {
    let mut request = url.into_client_request().ok()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {bearer}").parse().ok()?);
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.ok()?;
    let mut previous: Option<String> = None;
    let mut out = Vec::with_capacity(turns);
    for turn in 0..turns {
        let mut body = base(session);
        body.insert("type".into(), json!("response.create"));
        body.insert("input".into(), json!([user(turn)]));
        if let Some(id) = &previous {
            body.insert("previous_response_id".into(), json!(id));
        }
        let text = serde_json::to_string(&body).ok()?;
        let sent = text.len();
        let started = Instant::now();
        socket.send(Message::Text(text.into())).await.ok()?;
        loop {
            let Message::Text(text) = socket.next().await?.ok()? else {
                continue;
            };
            let event: Value = serde_json::from_str(text.as_str()).ok()?;
            match event["type"].as_str() {
                Some("response.completed") => {
                    previous = event["response"]["id"].as_str().map(str::to_owned);
                    break;
                }
                Some("error" | "response.failed" | "response.incomplete") => {
                    eprintln!("turn {turn}: {event}");
                    return None;
                }
                _ => {}
            }
        }
        out.push(Turn {
            latency: started.elapsed(),
            sent,
        });
    }
    Some(out)
}

fn summary(name: &str, turns: &[Turn]) -> (f64, f64) {
    let mut latencies: Vec<f64> = turns
        .iter()
        .map(|t| t.latency.as_secs_f64() * 1000.0)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    let bytes = turns.iter().map(|t| t.sent).sum::<usize>() as f64 / turns.len().max(1) as f64;
    println!(
        "{name:<26} turns {:>5}  p50 {:>7.3} ms  p90 {:>7.3} ms  sent per turn {:>9.0} B",
        turns.len(),
        at(0.5),
        at(0.9),
        bytes
    );
    (at(0.5), bytes)
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Ok(upstream) = FakeUpstream::start().await else {
        eprintln!("the fake upstream did not start");
        return ExitCode::FAILURE;
    };
    let yaml = format!(
        "api_keys:\n  - {{key: {KEY}, user: bench, group: default}}\naccounts:\n  - {{name: o, platform: openai, base_url: \"{}\", credential: sk-up, concurrency: 10000}}\nprices:\n  gpt-x: {{input: 2, output: 8}}\n",
        upstream.base_url
    );
    let Ok((_relay, addr)) =
        stack::standalone(&yaml, RelaySettings::default(), Default::default()).await
    else {
        eprintln!("the relay did not start");
        return ExitCode::FAILURE;
    };
    let client = reqwest::Client::new();
    let direct = format!("{}/v1/responses", upstream.base_url);
    let relayed = format!("http://{addr}/v1/responses");
    let direct_socket = format!(
        "{}/v1/responses",
        upstream.base_url.replacen("http", "ws", 1)
    );
    let relayed_socket = format!("ws://{addr}/v1/responses");
    println!(
        "socket-turns: {} sessions of {} turns per mode per run, one at a time; standalone relay and fake upstream in this process",
        args.sessions, args.turns
    );
    for run in 1..=args.runs {
        let (mut direct_turns, mut http_turns, mut socket_turns) = (vec![], vec![], vec![]);
        let mut direct_socket_turns = vec![];
        for session in 0..args.sessions {
            let id = run * 10_000 + session;
            let (d, h, s) = (
                http_session(&client, &direct, id, args.turns).await,
                http_session(&client, &relayed, id + 1000, args.turns).await,
                socket_session(&relayed_socket, KEY, id + 2000, args.turns).await,
            );
            let ds = socket_session(&direct_socket, "sk-up", id + 3000, args.turns).await;
            let (Some(d), Some(h), Some(s), Some(ds)) =
                (d.as_ref(), h.as_ref(), s.as_ref(), ds.as_ref())
            else {
                eprintln!(
                    "session {session} failed: direct {}, relay HTTP {}, relay WebSocket {}, direct WebSocket {}",
                    d.is_some(),
                    h.is_some(),
                    s.is_some(),
                    ds.is_some()
                );
                return ExitCode::FAILURE;
            };
            direct_socket_turns.extend(ds.iter().map(Turn::copy));
            let (d, h, s) = (
                d.iter().map(Turn::copy).collect::<Vec<_>>(),
                h.iter().map(Turn::copy).collect::<Vec<_>>(),
                s.iter().map(Turn::copy).collect::<Vec<_>>(),
            );
            direct_turns.extend(d);
            http_turns.extend(h);
            socket_turns.extend(s);
        }
        println!("run {run}:");
        let (direct_p50, _) = summary("direct HTTP (upstream)", &direct_turns);
        let (http_p50, http_bytes) = summary("relay, HTTP", &http_turns);
        let (direct_socket_p50, _) = summary("direct WebSocket (upstream)", &direct_socket_turns);
        let (socket_p50, socket_bytes) = summary("relay, WebSocket", &socket_turns);
        println!(
            "  added p50 per turn: HTTP {:+.3} ms over direct HTTP; WebSocket {:+.3} ms over direct WebSocket ({:+.3} ms over direct HTTP); bytes the client sends per turn, WebSocket / HTTP: {:.3}",
            http_p50 - direct_p50,
            socket_p50 - direct_socket_p50,
            socket_p50 - direct_p50,
            socket_bytes / http_bytes.max(1.0)
        );
    }
    ExitCode::SUCCESS
}
