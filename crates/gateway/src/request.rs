//! The parse stage: the body's JSON → what routing and picking need. The
//! body bytes themselves are forwarded untouched.

use serde_json::Value;

use crate::error::ApiError;

/// Characters per token for estimating load before the replica has counted
/// (a common rule of thumb for English text with BPE tokenizers).
const CHARS_PER_TOKEN: u64 = 4;
/// Output tokens assumed when a request does not bound its answer.
const DEFAULT_OUTPUT_TOKENS: u64 = 256;

#[derive(Debug)]
pub struct InferenceRequest {
    pub model: String,
    pub stream: bool,
    /// The parsed body, for stages that look inside the prompt.
    pub body: Value,
    /// Prompt plus expected output tokens, for in-flight load accounting.
    pub estimated_tokens: u64,
}

impl InferenceRequest {
    pub fn parse(body: &[u8]) -> Result<Self, ApiError> {
        let body: Value = serde_json::from_slice(body).map_err(|e| {
            ApiError::invalid_request(format!("The request body is not valid JSON: {e}"))
        })?;
        let Value::Object(fields) = &body else {
            return Err(ApiError::invalid_request(
                "The request body must be a JSON object.",
            ));
        };
        let model = match fields.get("model") {
            Some(Value::String(m)) => m.clone(),
            Some(_) => return Err(ApiError::missing_model("`model` must be a string.")),
            None => {
                return Err(ApiError::missing_model(
                    "The request body has no `model`; name the model to use.",
                ));
            }
        };
        let stream = matches!(fields.get("stream"), Some(Value::Bool(true)));
        let output = ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| fields.get(*k).and_then(Value::as_u64))
            .unwrap_or(DEFAULT_OUTPUT_TOKENS);
        let prompt_chars = ["messages", "prompt", "input"]
            .iter()
            .filter_map(|k| fields.get(*k))
            .map(text_len)
            .sum::<usize>() as u64;
        Ok(Self {
            model,
            stream,
            estimated_tokens: prompt_chars / CHARS_PER_TOKEN + output,
            body,
        })
    }
}

/// Characters of text in a prompt-like value (strings, arrays, message
/// objects), without building the text.
fn text_len(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(items) => items.iter().map(text_len).sum(),
        Value::Object(o) => o
            .get("content")
            .or_else(|| o.get("text"))
            .map(text_len)
            .unwrap_or(0),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_model_stream_and_estimate() {
        let r = InferenceRequest::parse(
            br#"{"model":"m","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"abcdefgh"}]}"#,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream);
        assert_eq!(r.estimated_tokens, 2 + 10);
    }

    #[test]
    fn errors_are_400_with_param_model() {
        for body in [
            &br#"{"model":3}"#[..],
            br#"{"prompt":"x"}"#,
            b"{oops",
            b"[1]",
        ] {
            let e = InferenceRequest::parse(body).unwrap_err();
            assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(body));
        }
        let e = InferenceRequest::parse(br#"{"model":null}"#).unwrap_err();
        assert_eq!(e.param, Some("model"));
    }
}
