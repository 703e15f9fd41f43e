//! Cohere's rerank, `POST /v2/rerank` and the legacy `POST /v1/rerank` (the path Jina and vLLM
//! serve too): what the fake checks in a request, and the answer it builds (each rule's source:
//! docs/SUBSCRIPTIONS.md, "Embeddings and rerank: the fake's rules and their sources").
//!
//! The fake's own invention, for determinism: a document's **relevance** is the share of the
//! query's distinct words (lowercased, split at anything not alphanumeric) found among the
//! document's words, scaled into [0, 1 − 10⁻⁶], plus 10⁻⁶ · (n − index) / n, which keeps the
//! scores of equally relevant documents distinct (the earlier one higher) and in [0, 1]. Results
//! come sorted by score, highest first, then by index.

use serde_json::{Map, Value, json};

/// More documents than this (v1: documents × `max_chunks_per_doc`) are refused.
const MAX_CHUNKS: u64 = 10_000;
/// One search unit is one query over up to this many documents.
const DOCUMENTS_PER_SEARCH_UNIT: usize = 100;
/// How much of a score the tie-breaker takes.
const TIE_BREAK: f64 = 1e-6;

/// Which of Cohere's rerank APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    /// `/v1/rerank`: `model` optional, documents strings or objects with `text`.
    V1,
    /// `/v2/rerank`: `model` required, documents strings only.
    V2,
}

/// One document: the text it is ranked on, and what `return_documents` gives back.
#[derive(Debug)]
struct Document {
    ranked_on: String,
    returned: Value,
}

/// A request that passed the checks.
#[derive(Debug)]
pub(super) struct Rerank {
    version: Version,
    query: String,
    documents: Vec<Document>,
    top_n: usize,
    return_documents: bool,
}

/// A refusal in Cohere's shape, `{"message": …}`.
pub(super) fn refusal(status: u16, message: impl Into<String>) -> (u16, Value) {
    (status, json!({"message": message.into()}))
}

fn invalid(message: impl Into<String>) -> (u16, Value) {
    refusal(400, format!("invalid request: {}", message.into()))
}

/// A field, `null` read as absent.
fn field<'a>(request: &'a Value, name: &str) -> Option<&'a Value> {
    request.get(name).filter(|v| !v.is_null())
}

/// A positive integer field, or the 400 naming it.
fn positive(request: &Value, name: &str) -> Result<Option<u64>, (u16, Value)> {
    match field(request, name) {
        None => Ok(None),
        Some(value) => match value.as_u64().filter(|n| *n >= 1) {
            Some(n) => Ok(Some(n)),
            None => Err(invalid(format!("{name} must be a positive integer"))),
        },
    }
}

/// A v1 document: a string, or an object with a string `text` (ranked on `rank_fields` when
/// given, else on `text`); given back as sent, a string as `{"text": …}`.
fn v1_document(
    index: usize,
    document: &Value,
    rank_fields: Option<&[String]>,
) -> Result<Document, (u16, Value)> {
    let fields: Map<String, Value> = match document {
        Value::String(text) => Map::from_iter([("text".to_owned(), Value::from(text.as_str()))]),
        Value::Object(fields) => fields.clone(),
        _ => {
            return Err(invalid(format!(
                "document at index {index} must be a string or an object"
            )));
        }
    };
    let Some(text) = fields.get("text").and_then(Value::as_str) else {
        return Err(invalid(format!(
            "document at index {index} must have a text field"
        )));
    };
    let ranked_on = match rank_fields {
        None => text.to_owned(),
        Some(names) => names
            .iter()
            .filter_map(|name| fields.get(name))
            .map(|value| match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" "),
    };
    Ok(Document {
        ranked_on,
        returned: Value::Object(fields),
    })
}

/// Checks a request as Cohere is shown to: `model` (v2), `query`, `documents` (not empty, at
/// most 10 000 chunks, strings in v2), `top_n`, and v1's `rank_fields`, `return_documents` and
/// `max_chunks_per_doc`. The error, when there is one, is the whole answer (status, body).
pub(super) fn check(version: Version, request: &Value) -> Result<Rerank, (u16, Value)> {
    if !request.is_object() {
        return Err(invalid("body must be a JSON object"));
    }
    match field(request, "model") {
        Some(Value::String(_)) => {}
        Some(_) => return Err(invalid("model must be a string")),
        None if version == Version::V2 => return Err(invalid("model is required")),
        // v1: the API's default model (`rerank-v3.5`), which changes nothing in the answer.
        None => {}
    }
    let query = match field(request, "query") {
        Some(Value::String(query)) => query.clone(),
        Some(_) => return Err(invalid("query must be a string")),
        None => String::new(),
    };
    if query.trim().is_empty() {
        return Err(invalid("query must not be empty or be only whitespace"));
    }
    let documents = match field(request, "documents") {
        Some(Value::Array(documents)) => documents.as_slice(),
        Some(_) => return Err(invalid("documents must be a list")),
        None => &[],
    };
    if documents.is_empty() {
        return Err(invalid("list of documents must not be empty"));
    }
    let chunks_per_doc = match version {
        // Cohere's current default is one chunk per document.
        Version::V1 => positive(request, "max_chunks_per_doc")?.unwrap_or(1),
        Version::V2 => 1,
    };
    if (documents.len() as u64).saturating_mul(chunks_per_doc) > MAX_CHUNKS {
        return Err(invalid(
            "number of total max chunks (number of documents * max chunks per doc) must be less than 10000",
        ));
    }
    let top_n = positive(request, "top_n")?
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(documents.len())
        .min(documents.len());
    let (documents, return_documents) = match version {
        Version::V2 => {
            let documents = documents
                .iter()
                .map(|document| match document {
                    Value::String(text) => Ok(Document {
                        ranked_on: text.clone(),
                        returned: json!({"text": text}),
                    }),
                    _ => Err(invalid("documents must be a list of strings")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            (documents, false)
        }
        Version::V1 => {
            let rank_fields: Option<Vec<String>> = match field(request, "rank_fields") {
                None => None,
                Some(Value::Array(names)) => Some(
                    names
                        .iter()
                        .map(|name| name.as_str().map(str::to_owned))
                        .collect::<Option<_>>()
                        .ok_or_else(|| invalid("rank_fields must be a list of strings"))?,
                ),
                Some(_) => return Err(invalid("rank_fields must be a list of strings")),
            };
            let return_documents = match field(request, "return_documents") {
                None => false,
                Some(Value::Bool(flag)) => *flag,
                Some(_) => return Err(invalid("return_documents must be a boolean")),
            };
            let documents = documents
                .iter()
                .enumerate()
                .map(|(index, document)| v1_document(index, document, rank_fields.as_deref()))
                .collect::<Result<Vec<_>, _>>()?;
            (documents, return_documents)
        }
    };
    Ok(Rerank {
        version,
        query,
        documents,
        top_n,
        return_documents,
    })
}

/// The lowercase words of `text`.
fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
        .map(str::to_lowercase)
}

/// The search units a query over `documents` documents bills.
fn search_units(documents: usize) -> usize {
    documents.div_ceil(DOCUMENTS_PER_SEARCH_UNIT)
}

impl Rerank {
    /// Each document's score (the module's documentation), in the documents' order.
    fn scores(&self) -> Vec<f64> {
        let query: std::collections::HashSet<String> = words(&self.query).collect();
        let n = self.documents.len() as f64;
        self.documents
            .iter()
            .enumerate()
            .map(|(index, document)| {
                let found: std::collections::HashSet<String> = words(&document.ranked_on).collect();
                let share = if query.is_empty() {
                    0.0
                } else {
                    query.intersection(&found).count() as f64 / query.len() as f64
                };
                share * (1.0 - TIE_BREAK) + TIE_BREAK * (n - index as f64) / n
            })
            .collect()
    }

    /// The normal answer: the `top_n` most relevant documents' indices and scores (with the
    /// documents when v1's `return_documents` asked), the API version and the search units
    /// billed. Never a `usage`.
    pub(super) fn body(&self, id: &str) -> Value {
        let scores = self.scores();
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b)));
        let results: Vec<Value> = order
            .into_iter()
            .take(self.top_n)
            .map(|index| {
                let mut result = json!({"index": index, "relevance_score": scores[index]});
                if self.return_documents {
                    result["document"] = self.documents[index].returned.clone();
                }
                result
            })
            .collect();
        let version = match self.version {
            Version::V1 => "1",
            Version::V2 => "2",
        };
        json!({
            "id": id,
            "results": results,
            "meta": {
                "api_version": {"version": version},
                "billed_units": {"search_units": search_units(self.documents.len())},
            },
        })
    }
}

/// An id shaped like Cohere's (a UUID's hex groups; random, not a real UUID version).
pub(super) fn uuid_like() -> String {
    let hex = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}
