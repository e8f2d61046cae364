//! The parse stage on any request body: `InferenceRequest::parse`, then the
//! prompt's prefix hashes.
//!
//! The parser is a fast path that skips what the gateway does not read, and
//! promises the same answers as parsing the whole body into a
//! `serde_json::Value`: same model, stream flag and token estimate, same
//! error (status, message, param), same prefix hashes as
//! `picker::prompt_hashes` makes from the `Value`. Every input checks that
//! promise against the `Value` parse, done here the plain way.

#![no_main]

use gateway::fuzzing::InferenceRequest;
use libfuzzer_sys::fuzz_target;
use picker::policy::PrefixConfig;
use serde_json::Value;

/// What `InferenceRequest::parse` reads, from a full parse.
struct Expected {
    model: String,
    stream: bool,
    estimated_tokens: u64,
    body: Value,
}

/// Status, message and param of the error the gateway answers with.
type ExpectedError = (u16, String, Option<&'static str>);

fuzz_target!(|body: &[u8]| {
    let got = InferenceRequest::parse(body);
    match (got, expected(body)) {
        (Ok(got), Ok(want)) => {
            assert_eq!(got.model, want.model);
            assert_eq!(got.stream, want.stream);
            assert_eq!(got.estimated_tokens, want.estimated_tokens);
            // The default blocks, and small ones so that short prompts
            // still make several blocks and chain them.
            for (adapter, block_bytes) in
                [(None, PrefixConfig::DEFAULT_BLOCK_BYTES), (Some("lora"), 3)]
            {
                let config = PrefixConfig {
                    block_bytes,
                    ..PrefixConfig::default()
                };
                assert_eq!(
                    got.prompt_hashes(adapter, &config),
                    picker::prompt_hashes(&want.model, adapter, &want.body, &config),
                    "prefix hashes, {block_bytes}-byte blocks"
                );
            }
        }
        (Err(got), Err(want)) => {
            assert_eq!((got.status.as_u16(), got.message, got.param), want);
        }
        (Ok(got), Err(want)) => panic!("parsed as {got:?}, but a full parse refuses it: {want:?}"),
        (Err(got), Ok(_)) => panic!("refused ({got:?}), but a full parse accepts it"),
    }
});

/// The gateway's answer when it parsed the whole body into a `Value`.
fn expected(body: &[u8]) -> Result<Expected, ExpectedError> {
    const CHARS_PER_TOKEN: u64 = 4;
    const DEFAULT_OUTPUT_TOKENS: u64 = 256;
    let bad_request = |message: String, param| Err((400, message, param));

    let value: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(e) => return bad_request(format!("The request body is not valid JSON: {e}"), None),
    };
    let Value::Object(fields) = &value else {
        return bad_request("The request body must be a JSON object.".into(), None);
    };
    let model = match fields.get("model") {
        Some(Value::String(model)) => model.clone(),
        Some(_) => return bad_request("`model` must be a string.".into(), Some("model")),
        None => {
            return bad_request(
                "The request body has no `model`; name the model to use.".into(),
                Some("model"),
            );
        }
    };
    let stream = matches!(fields.get("stream"), Some(Value::Bool(true)));
    let output = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|key| fields.get(*key).and_then(Value::as_u64))
        .unwrap_or(DEFAULT_OUTPUT_TOKENS);
    let prompt_chars: usize = ["messages", "prompt", "input"]
        .iter()
        .filter_map(|key| fields.get(*key))
        .map(text_len)
        .sum();
    Ok(Expected {
        model,
        stream,
        // A huge `max_tokens` must not wrap the estimate around to a small
        // load: it saturates.
        estimated_tokens: (prompt_chars as u64 / CHARS_PER_TOKEN)
            .saturating_add(output)
            .min(gateway::fuzzing::MAX_ESTIMATED_TOKENS),
        body: value,
    })
}

/// Bytes of prompt text: strings, arrays of them, and the `content` (or
/// else `text`) of message-like objects.
fn text_len(value: &Value) -> usize {
    match value {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(text_len).sum(),
        Value::Object(o) => o
            .get("content")
            .or_else(|| o.get("text"))
            .map_or(0, text_len),
        _ => 0,
    }
}
