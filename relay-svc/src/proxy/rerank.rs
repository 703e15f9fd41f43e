//! Rerank's degradation (docs/DESIGN.md §6, "Embeddings and rerank"): rerank is an optimisation
//! of a retrieval, so a client may ask that, when no account can rerank now (every one busy,
//! broken or out), it gets its documents back in the order it sent them — the recall order —
//! marked as not reranked, instead of an error. It asks per request
//! (`x-poolgate-rerank-fallback: passthrough`, or `error` to refuse its group's default) or its
//! group does (`rerank_fallback: passthrough`). A degraded answer carries no score (a made-up
//! one passes or fails a client's threshold for no reason), says why in the body and in
//! `x-poolgate-reranked: false`, is counted in `relay_rerank_degraded_total`, and is never
//! charged: no account served it.
//!
//! The request is read here once, before any account is asked, in Cohere's format (which Jina
//! and vLLM also serve): a query, a non-empty list of documents, an optional `top_n`, and for
//! `/v1/rerank` an optional `return_documents`. A request that is not one is refused in Cohere's
//! error shape (`{"message": …}`), naming the field, so a passthrough can always be built.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};

use super::body::TopLevel;
use super::{Answer, Body};
use crate::client_api::{Api, ErrorKind, RelayError};

/// The request header a client asks for the passthrough with.
pub const FALLBACK_HEADER: &str = "x-poolgate-rerank-fallback";
/// The response header that says whether the answer was reranked.
pub const RERANKED_HEADER: &str = "x-poolgate-reranked";

/// Most documents one rerank request may carry (Cohere's documented maximum).
pub const MAX_DOCUMENTS: usize = 10_000;

/// What a rerank request needs for its passthrough.
#[derive(Debug, Clone)]
pub struct Rerank {
    /// The client's own word (`x-poolgate-rerank-fallback`): `Some(true)` passthrough,
    /// `Some(false)` an error; `None`: its group's setting.
    pub asked: Option<bool>,
    /// Documents in the client's order: for `return_documents`, each as the answer shows it
    /// (`{"text": …}` for a string); otherwise only their number matters.
    documents: Vec<Value>,
    top_n: Option<usize>,
    return_documents: bool,
    /// `1` for `/v1/rerank`, `2` for `/v2/rerank` (the answer's `meta.api_version`).
    version: &'static str,
}

fn invalid(message: impl Into<String>) -> RelayError {
    RelayError::new(Api::Cohere, ErrorKind::InvalidRequest, message)
}

impl Rerank {
    /// Reads a rerank request (`path` says which version), or the client's error.
    pub fn read(path: &str, headers: &HeaderMap, top: &TopLevel) -> Result<Rerank, RelayError> {
        let asked = match headers.get(FALLBACK_HEADER).map(HeaderValue::to_str) {
            None => None,
            Some(Ok(value)) if value.trim().eq_ignore_ascii_case("passthrough") => Some(true),
            Some(Ok(value)) if value.trim().eq_ignore_ascii_case("error") => Some(false),
            Some(_) => {
                return Err(invalid(format!(
                    "invalid request: the {FALLBACK_HEADER} header must be passthrough or error"
                )));
            }
        };
        match top.value("query") {
            Some(Value::String(query)) if !query.trim().is_empty() => {}
            Some(Value::String(_)) | None => {
                return Err(invalid(
                    "invalid request: query must not be empty or be only whitespace",
                ));
            }
            Some(_) => return Err(invalid("invalid request: query must be a string")),
        }
        let documents = match top.value("documents") {
            Some(Value::Array(documents)) if documents.is_empty() => {
                return Err(invalid(
                    "invalid request: list of documents must not be empty",
                ));
            }
            Some(Value::Array(documents)) if documents.len() > MAX_DOCUMENTS => {
                return Err(invalid(format!(
                    "invalid request: at most {MAX_DOCUMENTS} documents, got {}",
                    documents.len()
                )));
            }
            Some(Value::Array(documents)) => documents,
            None => {
                return Err(invalid(
                    "invalid request: list of documents must not be empty",
                ));
            }
            Some(_) => return Err(invalid("invalid request: documents must be a list")),
        };
        let top_n = match top.value("top_n") {
            None | Some(Value::Null) => None,
            Some(value) => match value.as_u64() {
                Some(n) if n > 0 => Some(usize::try_from(n).unwrap_or(usize::MAX)),
                _ => {
                    return Err(invalid("invalid request: top_n must be a positive integer"));
                }
            },
        };
        let version = if path.starts_with("/v2/") { "2" } else { "1" };
        let return_documents = version == "1" && top.bool("return_documents") == Some(true);
        let documents = documents
            .into_iter()
            .map(|document| match document {
                Value::String(text) => json!({ "text": text }),
                other => other,
            })
            .collect();
        Ok(Rerank {
            asked,
            documents,
            top_n,
            return_documents,
            version,
        })
    }

    /// Whether a request that no account can rerank gets the recall order: the client's word,
    /// else its group's.
    pub fn passthrough(&self, group_default: bool) -> bool {
        self.asked.unwrap_or(group_default)
    }

    /// The not-reranked answer: the first `top_n` documents in the client's order, each with
    /// its index and a `null` score; `reason` says why (`busy`, `all_blocked`, …).
    pub fn passthrough_answer(&self, reason: &str) -> Answer {
        let count = self
            .top_n
            .map_or(self.documents.len(), |n| n.min(self.documents.len()));
        let results: Vec<Value> = self
            .documents
            .iter()
            .take(count)
            .enumerate()
            .map(|(index, document)| {
                let mut result = json!({ "index": index, "relevance_score": Value::Null });
                if self.return_documents
                    && let Some(object) = result.as_object_mut()
                {
                    object.insert("document".into(), document.clone());
                }
                result
            })
            .collect();
        let body = json!({
            "id": format!("poolgate-{:016x}", fastrand::u64(..)),
            "results": results,
            "meta": {
                "api_version": {"version": self.version},
                "billed_units": {"search_units": 0},
                "warnings": [format!(
                    "not reranked: no account could rerank now ({reason}); the documents are in \
                     the order they were sent and have no relevance score"
                )],
            },
            "poolgate": {"reranked": false, "reason": reason},
        });
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            HeaderName::from_static(RERANKED_HEADER),
            HeaderValue::from_static("false"),
        );
        Answer::Upstream {
            status: StatusCode::OK,
            headers,
            body: Body::Full(Bytes::from(body.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str, headers: &[(&str, &str)], path: &str) -> Result<Rerank, RelayError> {
        let top = TopLevel::parse(body.as_bytes()).map_err(|_| invalid("json"))?;
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid("name"))?,
                HeaderValue::from_str(value).map_err(|_| invalid("value"))?,
            );
        }
        Rerank::read(path, &map, &top)
    }

    fn body_of(answer: Answer) -> (HeaderMap, Value) {
        match answer {
            Answer::Upstream {
                headers,
                body: Body::Full(bytes),
                ..
            } => (
                headers,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            ),
            _ => (HeaderMap::new(), Value::Null),
        }
    }

    #[test]
    fn a_passthrough_keeps_the_order_and_invents_no_score() {
        let rerank = read(
            r#"{"model":"rerank-v3.5","query":"q","documents":["a","b","c","d"],"top_n":3}"#,
            &[(FALLBACK_HEADER, "passthrough")],
            "/v2/rerank",
        )
        .map_err(|e| e.message)
        .unwrap_or_else(|message| panic!("{message}"));
        assert!(rerank.passthrough(false));
        let (headers, body) = body_of(rerank.passthrough_answer("busy"));
        assert_eq!(
            headers.get(RERANKED_HEADER).map(|v| v.as_bytes()),
            Some(&b"false"[..])
        );
        let results = body["results"].as_array().cloned().unwrap_or_default();
        assert_eq!(results.len(), 3, "top_n applies: {body}");
        for (position, result) in results.iter().enumerate() {
            assert_eq!(result["index"], json!(position));
            assert!(
                result["relevance_score"].is_null(),
                "no invented score: {result}"
            );
            assert!(result.get("document").is_none(), "v2 returns no documents");
        }
        assert_eq!(
            body["poolgate"],
            json!({"reranked": false, "reason": "busy"})
        );
        assert_eq!(body["meta"]["billed_units"]["search_units"], json!(0));
        assert_eq!(body["meta"]["api_version"]["version"], json!("2"));
    }

    #[test]
    fn v1_returns_the_documents_when_asked() {
        let rerank = read(
            r#"{"query":"q","documents":["a",{"text":"b","id":7}],"return_documents":true}"#,
            &[],
            "/v1/rerank",
        )
        .map_err(|e| e.message)
        .unwrap_or_else(|message| panic!("{message}"));
        let (_, body) = body_of(rerank.passthrough_answer("all_blocked"));
        assert_eq!(body["results"][0]["document"], json!({"text": "a"}));
        assert_eq!(
            body["results"][1]["document"],
            json!({"text": "b", "id": 7})
        );
        assert_eq!(body["meta"]["api_version"]["version"], json!("1"));
    }

    #[test]
    fn the_header_decides_over_the_group_and_is_checked() {
        let body = r#"{"query":"q","documents":["a"]}"#;
        let no = read(body, &[(FALLBACK_HEADER, "error")], "/v2/rerank")
            .map_err(|e| e.message)
            .unwrap_or_else(|message| panic!("{message}"));
        assert!(!no.passthrough(true));
        let group = read(body, &[], "/v2/rerank")
            .map_err(|e| e.message)
            .unwrap_or_else(|message| panic!("{message}"));
        assert!(group.passthrough(true) && !group.passthrough(false));
        let bad = read(body, &[(FALLBACK_HEADER, "maybe")], "/v2/rerank");
        assert!(bad.is_err_and(|e| e.message.contains(FALLBACK_HEADER)));
    }

    #[test]
    fn a_request_a_passthrough_could_not_answer_is_refused_in_cohere_shape() {
        for (body, says) in [
            (
                r#"{"query":" ","documents":["a"]}"#,
                "query must not be empty",
            ),
            (r#"{"documents":["a"]}"#, "query must not be empty"),
            (
                r#"{"query":"q","documents":[]}"#,
                "documents must not be empty",
            ),
            (r#"{"query":"q"}"#, "documents must not be empty"),
            (
                r#"{"query":"q","documents":"a"}"#,
                "documents must be a list",
            ),
            (r#"{"query":"q","documents":["a"],"top_n":0}"#, "top_n"),
            (r#"{"query":"q","documents":["a"],"top_n":"3"}"#, "top_n"),
        ] {
            match read(body, &[], "/v2/rerank") {
                Ok(_) => panic!("{body} was taken"),
                Err(error) => {
                    assert!(error.message.contains(says), "{body}: {}", error.message);
                    assert_eq!(error.body(), json!({"message": error.message}));
                    assert_eq!(error.kind.status(), StatusCode::BAD_REQUEST);
                }
            }
        }
        let many = format!(
            r#"{{"query":"q","documents":[{}]}}"#,
            vec!["\"d\""; MAX_DOCUMENTS + 1].join(",")
        );
        assert!(read(&many, &[], "/v2/rerank").is_err_and(|e| e.message.contains("at most")));
    }
}
