//! Unit tests of the fake's embeddings and rerank endpoints, over HTTP: the vectors in both
//! encodings, `dimensions`, the OpenAI limits and refusals, Cohere's ranking, search units and
//! refusals, the probe's two bodies, and the shared machinery (scripts, in flight, the account's
//! refusals, usage windows).

use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

use super::{FakeUpstream, Scripted, Window, WindowBudgets, is_probe};

const SMALL: &str = "text-embedding-3-small";
const LARGE: &str = "text-embedding-3-large";
const ADA: &str = "text-embedding-ada-002";

struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: Value,
}

fn http() -> reqwest::Client {
    // reqwest is built without a bundled TLS provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

async fn post(fake: &FakeUpstream, path: &str, credential: &str, body: &Value) -> Answer {
    let response = http()
        .post(format!("{}{path}", fake.base_url))
        .bearer_auth(credential)
        .json(body)
        .send()
        .await
        .expect("the fake answers");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("a whole body");
    Answer {
        status,
        headers,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

async fn embed(fake: &FakeUpstream, body: &Value) -> Answer {
    post(fake, "/v1/embeddings", "k", body).await
}

/// The answer's embeddings, floats or base64 alike, as f32.
fn vectors(answer: &Answer) -> Vec<Vec<f32>> {
    let data = answer.body["data"].as_array().expect("data");
    data.iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["object"], "embedding");
            assert_eq!(item["index"], i);
            match &item["embedding"] {
                Value::Array(values) => values
                    .iter()
                    .map(|v| v.as_f64().expect("a number") as f32)
                    .collect(),
                Value::String(text) => base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .expect("base64")
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect(),
                other => panic!("an embedding, got {other}"),
            }
        })
        .collect()
}

fn norm(vector: &[f32]) -> f64 {
    vector
        .iter()
        .map(|v| f64::from(*v) * f64::from(*v))
        .sum::<f64>()
        .sqrt()
}

fn bits(vectors: &[Vec<f32>]) -> Vec<Vec<u32>> {
    vectors
        .iter()
        .map(|v| v.iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// An OpenAI 400 `invalid_request_error` naming `param`, in the four-field envelope.
fn assert_invalid(answer: &Answer, param: &str, case: &str) {
    assert_eq!(answer.status, 400, "{case}: {}", answer.body);
    let error = answer.body["error"].as_object().expect("an error object");
    let mut keys: Vec<&str> = error.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["code", "message", "param", "type"], "{case}");
    assert_eq!(error["type"], "invalid_request_error", "{case}");
    assert_eq!(error["param"], param, "{case}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{case}"
    );
}

#[tokio::test]
async fn float_and_base64_answers_decode_to_the_same_unit_vectors_of_the_models_size() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let input = json!(["hello world", "a second text"]);
    let mut small = Vec::new();
    for (model, size) in [
        (SMALL, 1536),
        (LARGE, 3072),
        (ADA, 1536),
        ("my-embedder", 1536),
    ] {
        let default = embed(&fake, &json!({"model": model, "input": input})).await;
        let float = embed(
            &fake,
            &json!({"model": model, "input": input, "encoding_format": "float"}),
        )
        .await;
        let base64 = embed(
            &fake,
            &json!({"model": model, "input": input, "encoding_format": "base64"}),
        )
        .await;
        for answer in [&default, &float, &base64] {
            assert_eq!(answer.status, 200, "{model}: {}", answer.body);
            assert_eq!(answer.body["object"], "list");
            assert_eq!(answer.body["model"], model, "the model as asked");
            // ceil(11 / 4) + ceil(13 / 4)
            assert_eq!(
                answer.body["usage"],
                json!({"prompt_tokens": 7, "total_tokens": 7})
            );
            let content_type = answer.headers.get("content-type").expect("a content type");
            assert_eq!(content_type, "application/json");
        }
        assert!(
            default.body["data"][0]["embedding"].is_array(),
            "float by default"
        );
        assert!(base64.body["data"][0]["embedding"].is_string());
        let vectors_float = vectors(&float);
        assert_eq!(bits(&vectors(&default)), bits(&vectors_float));
        assert_eq!(
            bits(&vectors(&base64)),
            bits(&vectors_float),
            "{model}: base64 is the same f32s"
        );
        assert_eq!(vectors_float.len(), 2);
        for vector in &vectors_float {
            assert_eq!(vector.len(), size, "{model}");
            assert!((norm(vector) - 1.0).abs() < 1e-5, "{model}: unit length");
        }
        assert_ne!(vectors_float[0], vectors_float[1], "two texts, two vectors");
        if model == SMALL {
            small = vectors_float;
        }
    }
    let again = embed(&fake, &json!({"model": SMALL, "input": "a second text"})).await;
    assert_eq!(
        bits(&vectors(&again)),
        bits(&small[1..]),
        "the same text, the same vector"
    );
}

#[tokio::test]
async fn dimensions_shorten_the_v3_models_and_are_refused_for_the_others() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let native = vectors(&embed(&fake, &json!({"model": SMALL, "input": "text"})).await);
    let short = embed(
        &fake,
        &json!({"model": SMALL, "input": "text", "dimensions": 256}),
    )
    .await;
    assert_eq!(short.status, 200);
    let short = vectors(&short);
    assert_eq!(short[0].len(), 256);
    assert!((norm(&short[0]) - 1.0).abs() < 1e-5);
    let prefix = &native[0][..256];
    let prefix_norm = norm(prefix);
    for (got, want) in short[0].iter().zip(prefix) {
        assert!((f64::from(*got) - f64::from(*want) / prefix_norm).abs() < 1e-6);
    }
    for (model, dimensions) in [(LARGE, 1024), (LARGE, 3072), (SMALL, 1)] {
        let answer = embed(
            &fake,
            &json!({"model": model, "input": "text", "dimensions": dimensions, "encoding_format": "base64"}),
        )
        .await;
        assert_eq!(answer.status, 200, "{model} {dimensions}");
        assert_eq!(vectors(&answer)[0].len(), dimensions);
    }
    for (model, dimensions) in [
        (ADA, json!(256)),
        ("my-embedder", json!(256)),
        (SMALL, json!(1537)),
        (LARGE, json!(3073)),
        (SMALL, json!(0)),
        (SMALL, json!(-5)),
        (SMALL, json!("256")),
        (SMALL, json!(2.5)),
    ] {
        let answer = embed(
            &fake,
            &json!({"model": model, "input": "text", "dimensions": dimensions}),
        )
        .await;
        assert_invalid(&answer, "dimensions", &format!("{model} {dimensions}"));
    }
}

#[tokio::test]
async fn malformed_inputs_are_refused_in_openais_envelope_and_every_input_form_is_served() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let too_many = vec!["x"; 2049];
    for (body, param) in [
        (json!({"model": SMALL, "input": ""}), "input"),
        (json!({"model": SMALL, "input": []}), "input"),
        (json!({"model": SMALL, "input": too_many}), "input"),
        (json!({"model": SMALL, "input": ["ok", ""]}), "input"),
        (json!({"model": SMALL, "input": ["ok", 1]}), "input"),
        (json!({"model": SMALL, "input": [[1, 2], []]}), "input"),
        (json!({"model": SMALL, "input": [[1, 2], ["a"]]}), "input"),
        (json!({"model": SMALL, "input": {"text": "a"}}), "input"),
        (json!({"model": SMALL}), "input"),
        (json!({"input": "text"}), "model"),
        (json!({"model": 5, "input": "text"}), "model"),
        (
            json!({"model": SMALL, "input": "text", "encoding_format": "hex"}),
            "encoding_format",
        ),
    ] {
        assert_invalid(&embed(&fake, &body).await, param, &body.to_string());
    }
    let most = vec!["x"; 2048];
    let served = embed(
        &fake,
        &json!({"model": SMALL, "input": most, "dimensions": 1, "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(served.status, 200, "2048 inputs are allowed");
    assert_eq!(vectors(&served).len(), 2048);
    assert_eq!(served.body["usage"]["total_tokens"], 2048);
    let arrays = embed(&fake, &json!({"model": SMALL, "input": [[1, 2, 3], [4]]})).await;
    assert_eq!(arrays.status, 200);
    assert_eq!(vectors(&arrays).len(), 2);
    assert_eq!(
        arrays.body["usage"]["prompt_tokens"], 4,
        "a token array's length"
    );
    let one = embed(&fake, &json!({"model": SMALL, "input": [1, 2, 3]})).await;
    assert_eq!(one.status, 200);
    assert_eq!(vectors(&one).len(), 1, "an array of ints is one input");
    assert_eq!(one.body["usage"]["prompt_tokens"], 3);
    assert_eq!(bits(&vectors(&one)), bits(&vectors(&arrays)[..1]));
}

#[tokio::test]
async fn the_token_limits_are_refused_as_openai_words_them() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    // 32 000 characters: 8 000 tokens each.
    let long = "a".repeat(32_000);
    let over = embed(
        &fake,
        &json!({"model": SMALL, "input": vec![long.as_str(); 40]}),
    )
    .await;
    assert_eq!(over.status, 400);
    assert_eq!(
        over.body,
        json!({"error": {"message": "Requested 320000 tokens, max 300000 tokens per request", "type": "max_tokens_per_request", "param": null, "code": "max_tokens_per_request"}})
    );
    let half = "a".repeat(16_000);
    let mut at_cap = vec![long.as_str(); 37];
    at_cap.push(&half);
    let served = embed(
        &fake,
        &json!({"model": SMALL, "input": at_cap, "dimensions": 1}),
    )
    .await;
    assert_eq!(served.status, 200, "300 000 tokens are allowed");
    assert_eq!(served.body["usage"]["prompt_tokens"], 300_000);
    let too_long = embed(&fake, &json!({"model": SMALL, "input": "a".repeat(32_772)})).await;
    assert_eq!(too_long.status, 400);
    assert_eq!(
        too_long.body,
        json!({"error": {"message": "This model's maximum context length is 8192 tokens, however you requested 8193 tokens (8193 in your prompt; 0 for the completion). Please reduce your prompt; or completion length.", "type": "invalid_request_error", "param": null, "code": null}})
    );
    let longest = embed(&fake, &json!({"model": SMALL, "input": "a".repeat(32_768)})).await;
    assert_eq!(longest.status, 200, "8192 tokens are allowed");
}

async fn rerank(fake: &FakeUpstream, version: u8, body: &Value) -> Answer {
    post(fake, &format!("/v{version}/rerank"), "k", body).await
}

fn indices(answer: &Answer) -> Vec<u64> {
    answer.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["index"].as_u64().expect("an index"))
        .collect()
}

fn scores(answer: &Answer) -> Vec<f64> {
    answer.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["relevance_score"].as_f64().expect("a score"))
        .collect()
}

#[tokio::test]
async fn rerank_v2_sorts_by_relevance_and_keeps_top_n() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let documents = json!([
        "python web",
        "a rust async runtime: tokio",
        "async io",
        "rust",
        "RUST, Async!"
    ]);
    let body = |top_n: Option<u64>| {
        let mut body =
            json!({"model": "rerank-v3.5", "query": "Rust async runtime", "documents": documents});
        if let Some(n) = top_n {
            body["top_n"] = json!(n);
        }
        body
    };
    let all = rerank(&fake, 2, &body(None)).await;
    assert_eq!(all.status, 200, "{}", all.body);
    assert_eq!(indices(&all), [1, 4, 2, 3, 0]);
    let scores = scores(&all);
    assert!(scores.windows(2).all(|w| w[0] > w[1]), "{scores:?}");
    assert!(scores.iter().all(|s| (0.0..=1.0).contains(s)));
    assert!(scores[0] > 0.999 && scores[4] < 0.001, "{scores:?}");
    for result in all.body["results"].as_array().expect("results") {
        let mut keys: Vec<&str> = result
            .as_object()
            .expect("a result")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(keys, ["index", "relevance_score"], "no document in v2");
    }
    assert!(all.body["id"].as_str().is_some_and(|id| !id.is_empty()));
    assert_eq!(all.body["meta"]["api_version"]["version"], "2");
    assert_eq!(all.body["meta"]["billed_units"]["search_units"], 1);
    assert!(
        all.body.get("usage").is_none(),
        "a rerank answer has no usage"
    );
    let top = rerank(&fake, 2, &body(Some(3))).await;
    assert_eq!(indices(&top), [1, 4, 2]);
    let more = rerank(&fake, 2, &body(Some(50))).await;
    assert_eq!(
        indices(&more),
        [1, 4, 2, 3, 0],
        "more than the documents: all"
    );
    let again = rerank(&fake, 2, &body(None)).await;
    assert_eq!(again.body["results"], all.body["results"], "deterministic");
}

#[tokio::test]
async fn search_units_are_one_per_hundred_documents() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    for (count, units) in [(1, 1), (100, 1), (101, 2), (250, 3)] {
        let documents: Vec<String> = (0..count).map(|i| format!("document {i}")).collect();
        for version in [1, 2] {
            let answer = rerank(
                &fake,
                version,
                &json!({"model": "rerank-v3.5", "query": "document", "documents": documents, "top_n": 2}),
            )
            .await;
            assert_eq!(answer.status, 200);
            assert_eq!(
                answer.body["meta"]["billed_units"]["search_units"], units,
                "{count} documents, v{version}"
            );
            assert_eq!(indices(&answer).len(), count.min(2));
        }
    }
}

#[tokio::test]
async fn rerank_v1_ranks_object_documents_on_their_fields_and_returns_them_as_sent() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let first = json!({"title": "rust guide", "text": "a cooking book", "id": "a"});
    let second = json!({"title": "cooking", "text": "rust in depth"});
    let documents = json!([first, second, "plain rust"]);
    let on_text = rerank(
        &fake,
        1,
        &json!({"query": "rust guide", "documents": documents, "return_documents": true}),
    )
    .await;
    assert_eq!(on_text.status, 200, "no model: v1's default");
    assert_eq!(on_text.body["meta"]["api_version"]["version"], "1");
    assert_eq!(indices(&on_text), [1, 2, 0], "ties by index");
    let returned: Vec<&Value> = on_text.body["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| &r["document"])
        .collect();
    assert_eq!(
        returned,
        [&second, &json!({"text": "plain rust"}), &first],
        "objects as sent, strings as {{\"text\"}}"
    );
    let on_title = rerank(
        &fake,
        1,
        &json!({"model": "rerank-v3.5", "query": "rust guide", "documents": documents, "rank_fields": ["title"]}),
    )
    .await;
    assert_eq!(on_title.status, 200);
    assert_eq!(indices(&on_title), [0, 1, 2]);
    assert!(
        on_title.body["results"][0].get("document").is_none(),
        "no documents unless asked"
    );
    let untitled = rerank(
        &fake,
        1,
        &json!({"query": "rust", "documents": [{"title": "rust"}]}),
    )
    .await;
    assert_eq!(untitled.status, 400);
    assert_eq!(
        untitled.body,
        json!({"message": "invalid request: document at index 0 must have a text field"})
    );
}

#[tokio::test]
async fn rerank_refusals_are_in_cohere_shape() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let message = |answer: &Answer| {
        let fields = answer.body.as_object().expect("a JSON object");
        assert_eq!(fields.len(), 1, "only a message: {}", answer.body);
        fields["message"].as_str().expect("a message").to_owned()
    };
    for version in [1, 2] {
        for (body, want) in [
            (
                json!({"model": "rerank-v3.5", "query": "q", "documents": []}),
                "invalid request: list of documents must not be empty",
            ),
            (
                json!({"model": "rerank-v3.5", "query": "q"}),
                "invalid request: list of documents must not be empty",
            ),
            (
                json!({"model": "rerank-v3.5", "query": " \n\t", "documents": ["d"]}),
                "invalid request: query must not be empty or be only whitespace",
            ),
            (
                json!({"model": "rerank-v3.5", "query": "q", "documents": vec!["d"; 10_001]}),
                "invalid request: number of total max chunks (number of documents * max chunks per doc) must be less than 10000",
            ),
        ] {
            let answer = rerank(&fake, version, &body).await;
            assert_eq!(answer.status, 400, "v{version}: {want}");
            assert_eq!(message(&answer), want, "v{version}");
        }
        for body in [
            json!({"model": "rerank-v3.5", "query": "q", "documents": ["d"], "top_n": 0}),
            json!({"model": "rerank-v3.5", "query": 5, "documents": ["d"]}),
            json!({"model": "rerank-v3.5", "query": "q", "documents": "d"}),
        ] {
            let answer = rerank(&fake, version, &body).await;
            assert_eq!(answer.status, 400, "v{version}: {body}");
            assert!(message(&answer).starts_with("invalid request: "));
        }
        let most = rerank(
            &fake,
            version,
            &json!({"model": "rerank-v3.5", "query": "q", "documents": vec!["d"; 10_000], "top_n": 1}),
        )
        .await;
        assert_eq!(most.status, 200, "10 000 documents are allowed");
    }
    let unnamed = rerank(&fake, 2, &json!({"query": "q", "documents": ["d"]})).await;
    assert_eq!(unnamed.status, 400, "v2 needs a model");
    assert!(message(&unnamed).contains("model"));
    let objects = rerank(
        &fake,
        2,
        &json!({"model": "rerank-v3.5", "query": "q", "documents": [{"text": "d"}]}),
    )
    .await;
    assert_eq!(objects.status, 400, "v2 takes strings only");
    assert!(message(&objects).starts_with("invalid request: "));
    let chunked = |count: usize| json!({"query": "q", "documents": vec!["d"; count], "max_chunks_per_doc": 10, "top_n": 1});
    assert_eq!(rerank(&fake, 1, &chunked(1000)).await.status, 200);
    let over = rerank(&fake, 1, &chunked(1001)).await;
    assert_eq!(over.status, 400, "v1: documents × max_chunks_per_doc");
    assert!(message(&over).contains("max chunks"));
}

#[tokio::test]
async fn both_probe_bodies_are_recognised_and_near_misses_are_not() {
    let embeddings = json!({"model": SMALL, "input": "ping"});
    let rerank_probe = json!({"model": "rerank-v3.5", "query": "ping", "documents": ["ping"]});
    assert!(is_probe("/v1/embeddings", &embeddings));
    assert!(is_probe("/openai/v1/embeddings", &embeddings));
    assert!(is_probe("/v1/rerank", &rerank_probe));
    let with = |body: &Value, key: &str, value: Value| {
        let mut body = body.clone();
        body[key] = value;
        body
    };
    let without = |body: &Value, key: &str| {
        let mut body = body.clone();
        if let Some(fields) = body.as_object_mut() {
            fields.remove(key);
        }
        body
    };
    for (path, body) in [
        (
            "/v1/embeddings",
            with(&embeddings, "input", json!(["ping"])),
        ),
        ("/v1/embeddings", with(&embeddings, "input", json!("pong"))),
        (
            "/v1/embeddings",
            with(&embeddings, "encoding_format", json!("float")),
        ),
        ("/v1/embeddings", with(&embeddings, "model", json!(5))),
        ("/v1/embeddings", without(&embeddings, "model")),
        ("/v1/embeddings", rerank_probe.clone()),
        ("/v1/rerank", with(&rerank_probe, "top_n", json!(1))),
        (
            "/v1/rerank",
            with(&rerank_probe, "documents", json!(["ping", "ping"])),
        ),
        (
            "/v1/rerank",
            with(&rerank_probe, "documents", json!("ping")),
        ),
        ("/v1/rerank", with(&rerank_probe, "query", json!("Ping"))),
        ("/v1/rerank", without(&rerank_probe, "model")),
        ("/v1/rerank", embeddings.clone()),
        ("/v2/rerank", rerank_probe.clone()),
        ("/v1/chat/completions", embeddings.clone()),
    ] {
        assert!(!is_probe(path, &body), "{path} {body}");
    }
    // Over HTTP: the probe is counted, flagged, and skips the clients' queue.
    let fake = FakeUpstream::start().await.expect("fake starts");
    let fail = Scripted::Fail {
        status: 500,
        headers: vec![],
        body: "{}".into(),
    };
    fake.script_clients("k", [fail.clone(), fail]);
    assert_eq!(
        post(&fake, "/v1/embeddings", "k", &embeddings).await.status,
        200
    );
    assert_eq!(
        post(&fake, "/v1/rerank", "k", &rerank_probe).await.status,
        200
    );
    let near = with(&embeddings, "input", json!(["ping"]));
    assert_eq!(post(&fake, "/v1/embeddings", "k", &near).await.status, 500);
    assert_eq!(
        post(&fake, "/v2/rerank", "k", &rerank_probe).await.status,
        500
    );
    assert_eq!(fake.probe_count("k"), 2);
    let seen: Vec<(String, bool)> = fake
        .seen_requests()
        .into_iter()
        .map(|r| (r.path, r.probe))
        .collect();
    assert_eq!(
        seen,
        [
            ("/v1/embeddings".to_owned(), true),
            ("/v1/rerank".to_owned(), true),
            ("/v1/embeddings".to_owned(), false),
            ("/v2/rerank".to_owned(), false),
        ]
    );
}

#[tokio::test]
async fn a_scripted_429_is_answered_on_both_new_endpoints() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let openai = json!({"error": {"message": "Rate limit reached for text-embedding-3-small on tokens per min.", "type": "tokens", "param": null, "code": "rate_limit_exceeded"}});
    let cohere = json!({"message": "You are past the per minute request limit, please wait and try again later."});
    let limited = |body: &Value| Scripted::Fail {
        status: 429,
        headers: vec![("retry-after".into(), "7".into())],
        body: body.to_string(),
    };
    fake.script("k", [limited(&openai), limited(&cohere), limited(&cohere)]);
    let embeddings = json!({"model": SMALL, "input": "text"});
    let ranked = json!({"model": "rerank-v3.5", "query": "q", "documents": ["q"]});
    let first = post(&fake, "/v1/embeddings", "k", &embeddings).await;
    let second = post(&fake, "/v2/rerank", "k", &ranked).await;
    let third = post(&fake, "/v1/rerank", "k", &ranked).await;
    for (answer, body) in [(&first, &openai), (&second, &cohere), (&third, &cohere)] {
        assert_eq!(answer.status, 429);
        assert_eq!(&answer.body, body);
        assert_eq!(
            answer
                .headers
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
            Some("7")
        );
    }
    assert_eq!(
        post(&fake, "/v1/embeddings", "k", &embeddings).await.status,
        200
    );
    assert_eq!(post(&fake, "/v2/rerank", "k", &ranked).await.status, 200);
    let stats = fake.stats("k");
    assert_eq!((stats.total, stats.current), (5, 0));
}

#[tokio::test]
async fn the_accounts_refusals_follow_each_apis_evidence() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    let embeddings = json!({"model": SMALL, "input": "text"});
    let ranked = json!({"model": "rerank-v3.5", "query": "q", "documents": ["q"]});
    fake.revoke("gone");
    let revoked = post(&fake, "/v1/embeddings", "gone", &embeddings).await;
    assert_eq!(revoked.status, 401);
    assert_eq!(revoked.body["error"]["type"], "authentication_error");
    for path in ["/v1/rerank", "/v2/rerank"] {
        let revoked = post(&fake, path, "gone", &ranked).await;
        assert_eq!(revoked.status, 401, "{path}");
        assert_eq!(revoked.body, json!({"message": "invalid api token"}));
    }
    fake.set_out_of_credit("broke", true);
    let broke = post(&fake, "/v1/embeddings", "broke", &embeddings).await;
    assert_eq!(broke.status, 429);
    assert_eq!(broke.body["error"]["code"], "insufficient_quota");
    let served = post(&fake, "/v2/rerank", "broke", &ranked).await;
    assert_eq!(served.status, 200, "no evidenced credit answer on rerank");
    fake.set_known_models(&[SMALL]);
    let unknown = post(
        &fake,
        "/v1/embeddings",
        "k",
        &json!({"model": ADA, "input": "text"}),
    )
    .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.body["error"]["code"], "model_not_found");
    assert!(
        unknown.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains(ADA))
    );
    assert_eq!(
        post(&fake, "/v1/embeddings", "k", &embeddings).await.status,
        200
    );
    assert_eq!(
        post(&fake, "/v2/rerank", "k", &ranked).await.status,
        200,
        "no evidenced unknown-model answer on rerank"
    );
}

#[tokio::test]
async fn usage_windows_stamp_and_refuse_embeddings_as_chat_and_leave_rerank_alone() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.set_windows(
        "w",
        WindowBudgets {
            per_minute: Some(Window::new(Duration::from_secs(60), 1)),
            ..WindowBudgets::default()
        },
    );
    let embeddings = json!({"model": SMALL, "input": "text"});
    let first = post(&fake, "/v1/embeddings", "w", &embeddings).await;
    assert_eq!(first.status, 200);
    assert_eq!(
        first
            .headers
            .get("x-ratelimit-limit-requests")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let second = post(&fake, "/v1/embeddings", "w", &embeddings).await;
    assert_eq!(second.status, 429);
    assert_eq!(second.body["error"]["code"], "rate_limit_exceeded");
    let ranked = json!({"model": "rerank-v3.5", "query": "q", "documents": ["q"]});
    let rerank = post(&fake, "/v2/rerank", "w", &ranked).await;
    assert_eq!(rerank.status, 200);
    assert!(
        !rerank
            .headers
            .keys()
            .any(|k| k.as_str().starts_with("x-ratelimit") || k.as_str().starts_with("x-codex")),
        "Cohere sends none of these"
    );
}

#[tokio::test]
async fn delays_and_broken_answers_hold_the_request_in_flight_until_they_end() {
    let fake = FakeUpstream::start().await.expect("fake starts");
    fake.script("k", [Scripted::Delay(Duration::from_millis(400))]);
    let pending = {
        let fake = fake.clone();
        tokio::spawn(async move {
            post(
                &fake,
                "/v1/embeddings",
                "k",
                &json!({"model": SMALL, "input": "text"}),
            )
            .await
        })
    };
    let mut seen_in_flight = false;
    for _ in 0..200 {
        if fake.stats("k").current == 1 {
            seen_in_flight = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(seen_in_flight, "counted while it waits");
    let answer = pending.await.expect("the request ends");
    assert_eq!(answer.status, 200);
    assert_eq!(vectors(&answer).len(), 1);
    fake.script(
        "k",
        [
            Scripted::EarlyClose,
            Scripted::Oversized(50_000),
            Scripted::BrokenStream,
        ],
    );
    let ranked = json!({"model": "rerank-v3.5", "query": "q", "documents": ["q"]});
    let early = http()
        .post(format!("{}/v2/rerank", fake.base_url))
        .bearer_auth("k")
        .json(&ranked)
        .send()
        .await
        .expect("a head");
    assert_eq!(early.status().as_u16(), 200);
    assert!(early.bytes().await.is_err(), "cut short");
    let big = http()
        .post(format!("{}/v1/embeddings", fake.base_url))
        .bearer_auth("k")
        .json(&json!({"model": SMALL, "input": "text"}))
        .send()
        .await
        .expect("a head");
    assert_eq!(big.bytes().await.expect("a whole body").len(), 50_000);
    let normal = post(&fake, "/v1/rerank", "k", &ranked).await;
    assert_eq!(normal.status, 200, "a stream-only answer: the normal one");
    assert_eq!(indices(&normal), [0]);
    let mut done = false;
    for _ in 0..200 {
        if fake.stats("k").current == 0 {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(done, "nothing left in flight");
    assert_eq!(fake.stats("k").peak, 1);
}
