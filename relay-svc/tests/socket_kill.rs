//! A relay killed (`kill -9`) in the middle of a Responses WebSocket turn (docs/DESIGN.md §6,
//! "Codex over WebSocket"): every service a process, the turn's upstream answer streaming slowly;
//! the turn holds one lease while it runs, and once the relay is gone that lease is reaped within
//! admission's orphan grace, as an HTTP request's is.

use std::time::{Duration, Instant};

use crate::common;

use common::processes::Databases;
use futures_util::SinkExt;
use poolgate_runtime::redis_keys::AccountKeys;
use poolgate_testkit::fake_upstream::FakeUpstream;
use poolgate_testkit::{RedisServer, eventually, free_port};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

const ORPHAN_GRACE: Duration = Duration::from_secs(2);

async fn live_leases(redis: &RedisServer, account: i64) -> u32 {
    let Ok(mut conn) = redis.client().await else {
        return u32::MAX;
    };
    // Live: scored (their expiry, on the Redis clock) after now; an orphan's score is the end
    // of its grace.
    let Ok((seconds, micros)) = redis::cmd("TIME")
        .query_async::<(u64, u64)>(&mut conn)
        .await
    else {
        return u32::MAX;
    };
    redis::cmd("ZCOUNT")
        .arg(AccountKeys::new(account).leases)
        .arg(seconds * 1000 + micros / 1000)
        .arg("+inf")
        .query_async(&mut conn)
        .await
        .unwrap_or(u32::MAX)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_turn_cut_by_a_relays_kill_frees_its_slot_within_the_orphan_grace() {
    let Databases {
        postgres: _postgres,
        redis,
        store,
        env,
    } = Databases::start().await;
    let upstream = FakeUpstream::start().await.expect("upstream");
    // A long answer: the turn is still streaming when the relay dies.
    upstream.set_chunk_delay(Duration::from_millis(1500));
    let mut input = common::account("socket", &upstream.base_url, 1, 0);
    input.platform = poolgate_core::account::Platform::OpenAi;
    let account = store.upsert_account(&input).await.expect("account");
    let (_, key) = store
        .create_api_key("socket", "socket", "default", 0)
        .await
        .expect("api key");
    let (selector_port, admission_port, relay_port) = (
        free_port().expect("port"),
        free_port().expect("port"),
        free_port().expect("port"),
    );
    let _selector = env.spawn(
        "selector-svc",
        "selector",
        &[
            "--listen",
            &format!("127.0.0.1:{selector_port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{}", free_port().expect("port")),
        ],
    );
    let _admission = env.spawn(
        "admission-svc",
        "admission",
        &[
            "--listen",
            &format!("127.0.0.1:{admission_port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{}", free_port().expect("port")),
            "--orphan-grace-ms",
            &ORPHAN_GRACE.as_millis().to_string(),
        ],
    );
    let relay = env.spawn(
        "relay-svc",
        "relay",
        &[
            "--listen",
            &format!("127.0.0.1:{relay_port}"),
            "--metrics-listen",
            &format!("127.0.0.1:{}", free_port().expect("port")),
            "--selector-url",
            &format!("http://127.0.0.1:{selector_port}"),
            "--admission-url",
            &format!("http://127.0.0.1:{admission_port}"),
        ],
    );
    let mut request = format!("ws://127.0.0.1:{relay_port}/v1/responses")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", key.expose()).parse().expect("header"),
    );
    let mut socket = eventually(Duration::from_secs(30), || {
        let request = request.clone();
        async move {
            tokio_tungstenite::connect_async(request)
                .await
                .ok()
                .map(|(socket, _)| socket)
        }
    })
    .await
    .expect("the relay takes the upgrade");
    let create = json!({"type": "response.create", "model": "gpt-x", "store": false,
        "stream": true, "input": [{"role": "user", "content": "a long answer"}]});
    socket
        .send(Message::Text(create.to_string().into()))
        .await
        .expect("sent");
    eventually(Duration::from_secs(20), || async {
        (live_leases(&redis, account).await == 1).then_some(())
    })
    .await
    .expect("the turn holds the account's one slot while it streams");
    eventually(Duration::from_secs(10), || async {
        (upstream.stats("cred-socket").current == 1).then_some(())
    })
    .await
    .expect("the upstream call is running");
    assert_eq!(live_leases(&redis, account).await, 1, "still held mid-turn");
    let killed = Instant::now();
    relay.kill9();
    eventually(ORPHAN_GRACE + Duration::from_secs(3), || async {
        (live_leases(&redis, account).await == 0).then_some(())
    })
    .await
    .expect("the cut turn's lease is reaped within the orphan grace");
    eprintln!(
        "the cut turn's slot was free {:?} after the kill",
        killed.elapsed()
    );
}
