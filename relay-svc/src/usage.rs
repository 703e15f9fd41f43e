//! Token usage read from responses as they pass (JSON bodies and SSE events, never by buffering a
//! stream), and its cost under a price.

use poolgate_core::account::Price;
use serde_json::Value;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub input: u64,
    pub output: u64,
    pub cache_write: u64,
    pub cache_read: u64,
    /// Rerank: the search units the upstream billed (Cohere's `meta.billed_units.search_units`,
    /// rounded up to whole units).
    pub search_units: u64,
}

fn field(object: &Value, path: &str) -> Option<u64> {
    object.pointer(path).and_then(Value::as_u64)
}

impl Usage {
    /// Folds one `usage` object (Anthropic, OpenAI chat or Responses shape) into this one; later
    /// non-zero values win (Anthropic's `message_delta` carries the final output count).
    pub fn absorb(&mut self, usage: &Value) {
        let cached = field(usage, "/cache_read_input_tokens")
            .or_else(|| field(usage, "/prompt_tokens_details/cached_tokens"))
            .or_else(|| field(usage, "/input_tokens_details/cached_tokens"));
        let input = match (
            field(usage, "/input_tokens"),
            field(usage, "/prompt_tokens"),
        ) {
            // Anthropic counts cache reads apart from input_tokens.
            (Some(input), _) if usage.get("cache_read_input_tokens").is_some() => Some(input),
            // OpenAI (chat and Responses) counts cached tokens inside the prompt tokens.
            (Some(input), _) | (None, Some(input)) => {
                Some(input.saturating_sub(cached.unwrap_or(0)))
            }
            // Only a total (Jina's and vLLM's rerank, `usage: {"total_tokens": …}`): all of
            // it is input (a rerank or an embedding writes no tokens).
            (None, None) => field(usage, "/total_tokens").filter(|_| {
                field(usage, "/output_tokens").is_none()
                    && field(usage, "/completion_tokens").is_none()
            }),
        };
        let output = field(usage, "/output_tokens").or_else(|| field(usage, "/completion_tokens"));
        let cache_write = field(usage, "/cache_creation_input_tokens");
        for (slot, value) in [
            (&mut self.input, input),
            (&mut self.output, output),
            (&mut self.cache_write, cache_write),
            (&mut self.cache_read, cached),
        ] {
            if let Some(value) = value.filter(|v| *v > 0) {
                *slot = value;
            }
        }
    }

    /// Finds the usage object in a response body or an event and absorbs it.
    pub fn absorb_message(&mut self, message: &Value) {
        for path in ["/usage", "/message/usage", "/response/usage"] {
            if let Some(usage) = message.pointer(path).filter(|u| u.is_object()) {
                self.absorb(usage);
            }
        }
    }

    /// The tokens a client key's TPM counts (docs/DESIGN.md §4): input + output, cache reads
    /// and writes counted as input (`input` holds neither: see `absorb`).
    pub fn tokens(&self) -> u64 {
        self.input
            .saturating_add(self.output)
            .saturating_add(self.cache_write)
            .saturating_add(self.cache_read)
    }

    pub fn cost_usd(&self, price: &Price) -> f64 {
        (self.input as f64 * price.input_per_mtok
            + self.output as f64 * price.output_per_mtok
            + self.cache_write as f64 * price.cache_write_per_mtok
            + self.cache_read as f64 * price.cache_read_per_mtok)
            / 1_000_000.0
            + self.search_units as f64 * price.per_search_unit
    }

    /// Folds a Cohere-format answer's `meta` (rerank): its billed search units, and its input
    /// tokens where it states them and no `usage` did.
    pub fn absorb_meta(&mut self, meta: &Value) {
        if let Some(units) = meta
            .pointer("/billed_units/search_units")
            .and_then(Value::as_f64)
            .filter(|units| units.is_finite() && *units > 0.0)
        {
            self.search_units = units.ceil().min(u64::MAX as f64) as u64;
        }
        if self.input == 0
            && let Some(input) = field(meta, "/billed_units/input_tokens")
                .or_else(|| field(meta, "/tokens/input_tokens"))
        {
            self.input = input;
        }
    }
}

/// Reads SSE events out of a byte stream in passing: usage and the Responses API response id.
#[derive(Debug, Default)]
pub struct SseScanner {
    line: Vec<u8>,
    data: String,
    pub usage: Usage,
    pub response_id: Option<String>,
    /// The first error event of the stream (Anthropic `error`, Responses `response.failed` or
    /// `error`, chat `{"error":…}`): a 200 that carries one is not a success.
    pub error: Option<Value>,
}

/// Longest SSE line kept for parsing; longer lines (huge deltas) are skipped, not buffered.
const MAX_LINE: usize = 1 << 20;

impl SseScanner {
    pub fn feed(&mut self, chunk: &[u8]) {
        for &byte in chunk {
            if byte == b'\n' {
                let line = std::mem::take(&mut self.line);
                self.line_done(&line);
            } else if self.line.len() < MAX_LINE {
                self.line.push(byte);
            }
        }
    }

    fn line_done(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            let data = std::mem::take(&mut self.data);
            self.event_done(&data);
        } else if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            if !self.data.is_empty() {
                self.data.push('\n');
            }
            self.data.push_str(&String::from_utf8_lossy(rest));
        }
    }

    fn event_done(&mut self, data: &str) {
        // Only events that can carry usage, ids or an error are parsed; text deltas are skipped
        // cheaply (an `"error"` inside a delta's text is escaped, so it does not match).
        if data.is_empty()
            || data == "[DONE]"
            || !(data.contains("usage")
                || data.contains("\"resp_")
                || data.contains("\"error\"")
                || data.contains("response.failed"))
        {
            return;
        }
        if let Ok(event) = serde_json::from_str::<Value>(data) {
            if self.error.is_none() && poolgate_core::classify::is_stream_error(&event) {
                self.error = Some(event.clone());
            }
            self.usage.absorb_message(&event);
            if self.response_id.is_none()
                && let Some(id) = event.pointer("/response/id").and_then(Value::as_str)
            {
                self.response_id = Some(id.to_owned());
            }
        }
    }
}

/// What the relay reads of a whole JSON answer: its usage and, for the Responses API, its
/// `resp_…` id. The parser skips every other member without building it.
pub fn whole_answer(body: &[u8]) -> (Usage, Option<String>) {
    #[derive(serde::Deserialize)]
    struct Head {
        #[serde(default)]
        id: Option<Value>,
        #[serde(default)]
        usage: Option<Value>,
        #[serde(default)]
        meta: Option<Value>,
    }
    let mut usage = Usage::default();
    let Ok(head) = serde_json::from_slice::<Head>(body) else {
        return (usage, None);
    };
    if let Some(found) = head.usage.filter(Value::is_object) {
        usage.absorb(&found);
    }
    if let Some(meta) = head.meta.filter(Value::is_object) {
        usage.absorb_meta(&meta);
    }
    let id = head
        .id
        .as_ref()
        .and_then(Value::as_str)
        .filter(|id| id.starts_with("resp_"))
        .map(str::to_owned);
    (usage, id)
}

/// A whole Responses API stream folded, as it arrives, into the one response a non-streaming
/// client expects: the `response` of its `response.completed` or `response.incomplete` event (an
/// answer cut short by `max_output_tokens` or a content filter is the upstream's answer, `status:
/// "incomplete"` with `incomplete_details`, as the API returns it without a stream).
///
/// Only the event being read and the folded response are held: deltas are dropped as their event
/// ends, and the response is cut out of its event's bytes in place, never parsed into a tree.
#[derive(Debug, Default)]
pub struct StreamFold {
    line: Vec<u8>,
    data: Vec<u8>,
    response: Option<Vec<u8>>,
    error: Option<Value>,
}

impl StreamFold {
    pub fn feed(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(end) = rest.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&rest[..end]);
            self.line_done();
            rest = &rest[end + 1..];
        }
        self.line.extend_from_slice(rest);
    }

    fn line_done(&mut self) {
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        if self.line.is_empty() {
            self.event_done();
        } else if self.line.starts_with(b"data:") {
            let skip = if self.line.get(5) == Some(&b' ') {
                6
            } else {
                5
            };
            if self.data.is_empty() {
                // The usual case, one data line: its bytes become the event's, shifted in place.
                self.data = std::mem::take(&mut self.line);
                self.data.drain(..skip);
            } else {
                self.data.push(b'\n');
                self.data.extend_from_slice(&self.line[skip..]);
            }
        }
        self.line.clear();
    }

    fn event_done(&mut self) {
        #[derive(serde::Deserialize)]
        struct Event<'a> {
            #[serde(rename = "type", borrow, default)]
            kind: Option<std::borrow::Cow<'a, str>>,
            #[serde(borrow, default)]
            response: Option<&'a serde_json::value::RawValue>,
        }
        let mut data = std::mem::take(&mut self.data);
        let Ok(event) = serde_json::from_slice::<Event>(&data) else {
            return;
        };
        match event.kind.as_deref() {
            Some("response.completed" | "response.incomplete") if self.response.is_none() => {
                let Some(response) = event.response else {
                    return;
                };
                // The raw response is a slice of `data`: keep those bytes, drop the envelope.
                let start = response.get().as_ptr() as usize - data.as_ptr() as usize;
                let end = start + response.get().len();
                data.truncate(end);
                data.drain(..start);
                self.response = Some(data);
            }
            Some("response.failed" | "error") if self.error.is_none() => {
                self.error = serde_json::from_slice(&data).ok();
            }
            _ => {}
        }
    }

    /// The folded response (raw JSON bytes). `Err(Some(event))`: the stream ended in an error
    /// event; `Err(None)`: it ended without either.
    pub fn finish(mut self) -> Result<Vec<u8>, Option<Value>> {
        if !self.line.is_empty() {
            self.line_done();
        }
        if !self.data.is_empty() {
            self.event_done();
        }
        self.response.ok_or(self.error)
    }
}

/// Takes out of an OpenAI chat stream what the relay added by asking for usage the client did not
/// ask for (`stream_options.include_usage`): the final usage-only chunk (`"choices": []`) and the
/// `"usage": null` field of every other chunk. The client gets the stream it asked for; the
/// scanner, fed the upstream bytes, still sees the usage.
#[derive(Debug, Default)]
pub struct ChatUsageStripper {
    pending: Vec<u8>,
}

impl ChatUsageStripper {
    /// The complete events of `chunk` (and of earlier chunks' tails), stripped.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<u8> {
        self.pending.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(end) = find(&self.pending, b"\n\n") {
            let event: Vec<u8> = self.pending.drain(..end + 2).collect();
            strip_event(&event, &mut out);
        }
        if self.pending.len() > MAX_LINE {
            // Not an SSE stream we understand: pass it on untouched.
            out.append(&mut self.pending);
        }
        out
    }

    /// Whatever is left when the stream ends.
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn strip_event(event: &[u8], out: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(event);
    let data = text
        .trim_end()
        .strip_prefix("data:")
        .map(str::trim_start)
        .filter(|d| d.contains("\"usage\""));
    let Some(Ok(Value::Object(mut chunk))) = data.map(serde_json::from_str::<Value>) else {
        out.extend_from_slice(event);
        return;
    };
    let usage_only = chunk
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
        && chunk.get("usage").is_some_and(Value::is_object);
    if usage_only {
        return;
    }
    if chunk.get("usage").is_some_and(Value::is_null) {
        chunk.remove("usage");
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(Value::Object(chunk).to_string().as_bytes());
        out.extend_from_slice(b"\n\n");
        return;
    }
    out.extend_from_slice(event);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// [`StreamFold`] over a whole stream at once.
    fn completed_response(stream: &[u8]) -> Result<Vec<u8>, Option<Value>> {
        let mut fold = StreamFold::default();
        fold.feed(stream);
        fold.finish()
    }

    #[test]
    fn anthropic_stream_usage_is_read_in_passing() {
        let mut scanner = SseScanner::default();
        let stream = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":100,\"output_tokens\":1}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n",
        );
        // Split at awkward places: the scanner keeps partial lines.
        for piece in stream.as_bytes().chunks(7) {
            scanner.feed(piece);
        }
        assert_eq!(
            scanner.usage,
            Usage {
                search_units: 0,
                input: 12,
                output: 42,
                cache_write: 3,
                cache_read: 100
            }
        );
    }

    #[test]
    fn openai_shapes() {
        let mut chat = Usage::default();
        chat.absorb_message(&json!({"usage": {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 20}}}));
        assert_eq!(
            chat,
            Usage {
                search_units: 0,
                input: 30,
                output: 7,
                cache_write: 0,
                cache_read: 20
            }
        );
        let mut scanner = SseScanner::default();
        scanner.feed(b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_123\"}}\n\n");
        scanner.feed(b"data: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_123\",\"usage\":{\"input_tokens\":9,\"output_tokens\":4,\"input_tokens_details\":{\"cached_tokens\":0}}}}\n\n");
        assert_eq!(scanner.response_id.as_deref(), Some("resp_123"));
        assert_eq!(
            scanner.usage,
            Usage {
                search_units: 0,
                input: 9,
                output: 4,
                cache_write: 0,
                cache_read: 0
            }
        );
    }

    #[test]
    fn a_keys_tokens_count_cache_reads_and_writes_as_input_once_in_every_shape() {
        let mut anthropic = Usage::default();
        anthropic.absorb_message(&json!({"usage": {"input_tokens": 12, "cache_creation_input_tokens": 3, "cache_read_input_tokens": 100, "output_tokens": 42}}));
        assert_eq!(anthropic.tokens(), 12 + 3 + 100 + 42);
        // OpenAI counts cached tokens inside the prompt tokens: counted once, not twice.
        let mut chat = Usage::default();
        chat.absorb_message(&json!({"usage": {"prompt_tokens": 50, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 20}}}));
        assert_eq!(chat.tokens(), 57);
        let mut responses = Usage::default();
        responses.absorb_message(&json!({"response": {"usage": {"input_tokens": 9, "output_tokens": 4, "input_tokens_details": {"cached_tokens": 5}}}}));
        assert_eq!(responses.tokens(), 13);
    }

    #[test]
    fn an_error_event_is_kept_and_text_about_errors_is_not() {
        let mut scanner = SseScanner::default();
        scanner.feed(b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"an \\\"error\\\": {} in code\"}}\n\n");
        assert_eq!(scanner.error, None, "a delta's text is not an error event");
        scanner.feed(b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n");
        let error = scanner.error.as_ref().expect("error event kept");
        assert_eq!(error["error"]["type"], "overloaded_error");
        let mut responses = SseScanner::default();
        responses.feed(b"data: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"error\":{\"code\":\"server_error\"}}}\n\n");
        assert!(responses.error.is_some());
    }

    #[test]
    fn the_usage_the_relay_asked_for_is_stripped_from_a_chat_stream() {
        let upstream = concat!(
            "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
            "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
            "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":7}}\n\n",
            "data: [DONE]\n\n",
        );
        let mut stripper = ChatUsageStripper::default();
        let mut scanner = SseScanner::default();
        let mut client = Vec::new();
        for piece in upstream.as_bytes().chunks(9) {
            scanner.feed(piece);
            client.extend(stripper.feed(piece));
        }
        client.extend(stripper.finish());
        let client = String::from_utf8(client).expect("utf-8");
        assert!(!client.contains("usage"), "{client}");
        assert!(client.contains("\"content\":\"Hi\""), "{client}");
        assert!(client.ends_with("data: [DONE]\n\n"), "{client}");
        assert_eq!(client.matches("data: ").count(), 3, "{client}");
        assert_eq!((scanner.usage.input, scanner.usage.output), (10, 7));
    }

    #[test]
    fn a_responses_stream_folds_into_its_completed_or_incomplete_response() {
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{\"input_tokens\":3}}}\n\n",
        );
        let response = completed_response(stream.as_bytes()).expect("completed");
        let response: Value = serde_json::from_slice(&response).expect("the response is JSON");
        assert_eq!(response["id"], "resp_1");
        assert_eq!(response["status"], "completed");
        let failed = "data: {\"type\":\"response.failed\",\"response\":{\"error\":{\"code\":\"server_error\"}}}\n\n";
        assert!(matches!(
            completed_response(failed.as_bytes()),
            Err(Some(_))
        ));
        let incomplete = concat!(
            "data: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\",\"status\":\"in_progress\"}}\n\n",
            "data: {\"type\":\"response.incomplete\",\"response\":{\"id\":\"resp_2\",\"status\":\"incomplete\",\"incomplete_details\":{\"reason\":\"max_output_tokens\"}}}\n\n",
        );
        let response = completed_response(incomplete.as_bytes()).expect("an answer, cut short");
        let response: Value = serde_json::from_slice(&response).expect("the response is JSON");
        assert_eq!(response["status"], "incomplete");
        assert_eq!(
            response["incomplete_details"]["reason"],
            "max_output_tokens"
        );
        assert_eq!(completed_response(b"data: [DONE]\n\n"), Err(None));
    }

    #[test]
    fn the_fold_reads_a_stream_in_pieces_and_keeps_only_the_response() {
        let stream = concat!(
            "event: response.created\r\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_9\"}}\r\n\r\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\n",
            "data: \"delta\":\"Hi\"}\n\n",
            "event: response.completed\ndata:{\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_9\",\"status\":\"completed\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\"}]}],\"usage\":{\"input_tokens\":5,\"output_tokens\":2}}}",
        );
        for size in [1, 3, 7, 64, stream.len()] {
            let mut fold = StreamFold::default();
            for piece in stream.as_bytes().chunks(size) {
                fold.feed(piece);
            }
            // The stream ends without its blank line: the last event still counts.
            let response = fold.finish().expect("completed");
            assert!(response.starts_with(b"{\"id\":\"resp_9\""), "{size}");
            assert!(response.ends_with(b"\"output_tokens\":2}}"), "{size}");
            let (usage, id) = whole_answer(&response);
            assert_eq!(id.as_deref(), Some("resp_9"));
            assert_eq!((usage.input, usage.output), (5, 2));
        }
    }

    #[test]
    fn a_whole_answer_gives_its_usage_and_only_a_responses_id() {
        let (usage, id) = whole_answer(br#"{"id":"msg_1","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":7,"cache_read_input_tokens":2,"output_tokens":3}}"#);
        assert_eq!(id, None);
        assert_eq!((usage.input, usage.cache_read, usage.output), (7, 2, 3));
        let (usage, id) =
            whole_answer(br#"{"id":"resp_2","usage":{"input_tokens":4,"output_tokens":1}}"#);
        assert_eq!(id.as_deref(), Some("resp_2"));
        assert_eq!(usage.output, 1);
        assert_eq!(whole_answer(b"not json"), (Usage::default(), None));
        assert_eq!(
            whole_answer(br#"{"id":7,"usage":"none"}"#),
            (Usage::default(), None)
        );
    }

    #[test]
    fn embeddings_and_rerank_answers_are_read() {
        // OpenAI embeddings: prompt tokens only.
        let (usage, _) = whole_answer(
            br#"{"object":"list","data":[],"model":"text-embedding-3-small","usage":{"prompt_tokens":8,"total_tokens":8}}"#,
        );
        assert_eq!((usage.input, usage.output, usage.search_units), (8, 0, 0));
        // Cohere rerank: the billed search units (fractions round up).
        let (usage, _) = whole_answer(
            br#"{"id":"x","results":[],"meta":{"billed_units":{"search_units":2.2}}}"#,
        );
        assert_eq!((usage.input, usage.search_units), (0, 3));
        // Jina's and vLLM's rerank: a total alone is input.
        let (usage, _) = whole_answer(br#"{"results":[],"usage":{"total_tokens":120}}"#);
        assert_eq!((usage.input, usage.search_units), (120, 0));
        // A total beside output tokens is not read as input.
        let mut chat = Usage::default();
        chat.absorb(&json!({"completion_tokens": 4, "total_tokens": 9}));
        assert_eq!((chat.input, chat.output), (0, 4));
        let price = Price {
            input_per_mtok: 1.0,
            per_search_unit: 0.002,
            ..Price::default()
        };
        let units = Usage {
            search_units: 3,
            input: 1_000_000,
            ..Usage::default()
        };
        assert!((units.cost_usd(&price) - 1.006).abs() < 1e-12);
    }

    #[test]
    fn cost_uses_every_token_kind() {
        let usage = Usage {
            search_units: 0,
            input: 1_000_000,
            output: 500_000,
            cache_write: 0,
            cache_read: 2_000_000,
        };
        let price = Price {
            per_search_unit: 0.0,
            input_per_mtok: 3.0,
            output_per_mtok: 15.0,
            cache_write_per_mtok: 3.75,
            cache_read_per_mtok: 0.3,
        };
        assert!((usage.cost_usd(&price) - (3.0 + 7.5 + 0.6)).abs() < 1e-9);
    }
}
