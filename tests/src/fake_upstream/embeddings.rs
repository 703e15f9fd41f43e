//! OpenAI's `POST /v1/embeddings`: what the fake checks in a request, and the answer it builds
//! (each rule's source: docs/SUBSCRIPTIONS.md, "Embeddings and rerank: the fake's rules and their
//! sources").
//!
//! The fake's own inventions, for determinism:
//! - **Tokens.** A string counts `ceil(chars / 4)` tokens (Unicode scalar values, at least 1); a
//!   token array counts its length. No tokenizer is run.
//! - **Vectors.** Seeded from the input alone (SHA-256 of the text, or of the token ids), so the
//!   same input gets the same vector from any model and in any request: a splitmix64 stream of
//!   uniform values in [-1, 1), normalised to unit length as f32. A vector of `dimensions` values
//!   is the native one's prefix, normalised again.

use base64::Engine;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// At most this many inputs (items of the `input` array).
const MAX_INPUTS: usize = 2048;
/// At most this many tokens in one input.
const MAX_INPUT_TOKENS: u64 = 8192;
/// At most this many tokens summed over a request's inputs.
const MAX_REQUEST_TOKENS: u64 = 300_000;

/// One input to embed.
#[derive(Debug, Clone, PartialEq)]
enum Input {
    Text(String),
    Tokens(Vec<i64>),
}

impl Input {
    /// The fake's token count (the module's documentation).
    fn tokens(&self) -> u64 {
        match self {
            Input::Text(text) => (text.chars().count() as u64).div_ceil(4).max(1),
            Input::Tokens(ids) => ids.len() as u64,
        }
    }

    fn seed(&self) -> u64 {
        let mut hash = Sha256::new();
        match self {
            Input::Text(text) => {
                hash.update(b"text\0");
                hash.update(text.as_bytes());
            }
            Input::Tokens(ids) => {
                hash.update(b"tokens\0");
                for id in ids {
                    hash.update(id.to_le_bytes());
                }
            }
        }
        let digest = hash.finalize();
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        u64::from_le_bytes(first)
    }
}

/// A request that passed the checks.
#[derive(Debug)]
pub(super) struct Embeddings {
    model: String,
    inputs: Vec<Input>,
    base64: bool,
    size: usize,
    tokens: u64,
}

/// A 400 in OpenAI's envelope, naming the parameter (`""`: none, `param: null`).
fn invalid(param: &str, message: impl Into<String>) -> (u16, Value) {
    let param = if param.is_empty() {
        Value::Null
    } else {
        Value::from(param)
    };
    (
        400,
        json!({"error": {"message": message.into(), "type": "invalid_request_error", "param": param, "code": null}}),
    )
}

/// The vector size a model answers with when not asked for fewer.
fn native_size(model: &str) -> usize {
    if model == "text-embedding-3-large" {
        3072
    } else {
        1536
    }
}

/// A field, `null` read as absent.
fn field<'a>(request: &'a Value, name: &str) -> Option<&'a Value> {
    request.get(name).filter(|v| !v.is_null())
}

/// The inputs of `input`, or the 400 that names what is wrong with it.
fn inputs(input: Option<&Value>) -> Result<Vec<Input>, (u16, Value)> {
    let items = match input {
        None => return Err(invalid("input", "'input' is a required parameter.")),
        Some(Value::String(text)) if text.is_empty() => {
            return Err(invalid("input", "'input' cannot be an empty string."));
        }
        Some(Value::String(text)) => return Ok(vec![Input::Text(text.clone())]),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(invalid(
                "input",
                "'input' must be a string, an array of strings, an array of integers or an array of arrays of integers.",
            ));
        }
    };
    if items.is_empty() {
        return Err(invalid("input", "'input' cannot be an empty array."));
    }
    if items.len() > MAX_INPUTS {
        return Err(invalid(
            "input",
            format!(
                "'input' has {} items, at most {MAX_INPUTS} are allowed.",
                items.len()
            ),
        ));
    }
    let ids = |items: &[Value]| -> Option<Vec<i64>> { items.iter().map(Value::as_i64).collect() };
    if items.iter().all(Value::is_string) {
        return items
            .iter()
            .enumerate()
            .map(|(index, item)| match item.as_str() {
                Some(text) if !text.is_empty() => Ok(Input::Text(text.to_owned())),
                _ => Err(invalid(
                    "input",
                    format!("'input[{index}]' cannot be an empty string."),
                )),
            })
            .collect();
    }
    if let Some(tokens) = ids(items) {
        return Ok(vec![Input::Tokens(tokens)]);
    }
    if items.iter().all(Value::is_array) {
        return items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let tokens = item
                    .as_array()
                    .filter(|list| !list.is_empty())
                    .and_then(|list| ids(list));
                match tokens {
                    Some(tokens) => Ok(Input::Tokens(tokens)),
                    None => Err(invalid(
                        "input",
                        format!("'input[{index}]' must be a non-empty array of integers."),
                    )),
                }
            })
            .collect();
    }
    Err(invalid(
        "input",
        "'input' must be a string, an array of strings, an array of integers or an array of arrays of integers, not a mix.",
    ))
}

/// Checks a request as the real endpoint is shown to: `model`, `input`, `encoding_format`,
/// `dimensions`, then the per-request and per-input token limits. The error, when there is one,
/// is the whole answer (status, body).
pub(super) fn check(request: &Value) -> Result<Embeddings, (u16, Value)> {
    if !request.is_object() {
        return Err(invalid("", "The request body must be a JSON object."));
    }
    let model = match field(request, "model") {
        Some(Value::String(model)) => model.clone(),
        Some(_) => return Err(invalid("model", "'model' must be a string.")),
        None => return Err(invalid("model", "'model' is a required parameter.")),
    };
    let inputs = inputs(field(request, "input"))?;
    let base64 = match field(request, "encoding_format") {
        None => false,
        Some(format) if format == "float" => false,
        Some(format) if format == "base64" => true,
        Some(other) => {
            return Err(invalid(
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', not {other}."),
            ));
        }
    };
    let native = native_size(&model);
    let size = match field(request, "dimensions") {
        None => native,
        Some(dimensions) => {
            let Some(asked) = dimensions.as_u64().filter(|d| *d >= 1) else {
                return Err(invalid(
                    "dimensions",
                    format!("'dimensions' must be a positive integer, not {dimensions}."),
                ));
            };
            if !model.starts_with("text-embedding-3") {
                return Err(invalid(
                    "dimensions",
                    format!(
                        "'dimensions' is only supported in text-embedding-3 and later models, not {model}."
                    ),
                ));
            }
            match usize::try_from(asked) {
                Ok(asked) if asked <= native => asked,
                _ => {
                    return Err(invalid(
                        "dimensions",
                        format!("'dimensions' of {model} is at most {native}, not {asked}."),
                    ));
                }
            }
        }
    };
    let tokens: u64 = inputs.iter().map(Input::tokens).sum();
    if tokens > MAX_REQUEST_TOKENS {
        return Err((
            400,
            json!({"error": {"message": format!("Requested {tokens} tokens, max {MAX_REQUEST_TOKENS} tokens per request"), "type": "max_tokens_per_request", "param": null, "code": "max_tokens_per_request"}}),
        ));
    }
    if let Some(long) = inputs
        .iter()
        .map(Input::tokens)
        .find(|t| *t > MAX_INPUT_TOKENS)
    {
        return Err((
            400,
            json!({"error": {"message": format!("This model's maximum context length is {MAX_INPUT_TOKENS} tokens, however you requested {long} tokens ({long} in your prompt; 0 for the completion). Please reduce your prompt; or completion length."), "type": "invalid_request_error", "param": null, "code": null}}),
        ));
    }
    Ok(Embeddings {
        model,
        inputs,
        base64,
        size,
        tokens,
    })
}

/// The unit vector of `size` values the fake gives `input` (the module's documentation).
fn vector(input: &Input, size: usize) -> Vec<f32> {
    let mut state = input.seed();
    let values: Vec<f64> = (0..size)
        .map(|_| {
            // splitmix64
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    let norm = values.iter().map(|v| v * v).sum::<f64>().sqrt();
    if norm == 0.0 {
        // Never seen; a unit vector all the same.
        return (0..size).map(|i| if i == 0 { 1.0 } else { 0.0 }).collect();
    }
    values.iter().map(|v| (v / norm) as f32).collect()
}

impl Embeddings {
    /// The normal answer: one embedding per input, in order, as floats or as base64 of their
    /// little-endian f32 bytes.
    pub(super) fn body(&self) -> Value {
        let data: Vec<Value> = self
            .inputs
            .iter()
            .enumerate()
            .map(|(index, input)| {
                let vector = vector(input, self.size);
                let embedding = if self.base64 {
                    let bytes: Vec<u8> = vector.iter().flat_map(|v| v.to_le_bytes()).collect();
                    Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
                } else {
                    Value::Array(vector.into_iter().map(Value::from).collect())
                };
                json!({"object": "embedding", "index": index, "embedding": embedding})
            })
            .collect();
        json!({
            "object": "list",
            "data": data,
            "model": self.model,
            "usage": {"prompt_tokens": self.tokens, "total_tokens": self.tokens},
        })
    }
}
