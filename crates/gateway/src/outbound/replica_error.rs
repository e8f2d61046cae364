//! A replica's error answer in the OpenAI shape. Engines answer some
//! errors in their web framework's shape (`{"detail": "Not Found"}`, plain
//! text), which the OpenAI SDKs cannot read: they print only the status.
//! Such a body is wrapped, keeping the replica's status and its message.
//!
//! A prompt too long for the replica's context is the one error engines
//! word differently from OpenAI and that clients act on (they trim the
//! conversation): it is given OpenAI's `context_length_exceeded` code, and
//! the limit in its message is what the replica takes.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

/// Largest error body read whole to check its shape; a longer one passes
/// through as it is.
pub const LIMIT: usize = 64 * 1024;

/// A replica's error as the client gets it.
#[derive(Debug, Default)]
pub struct Translated {
    /// The body in the OpenAI shape; `None` when the replica's is already.
    pub body: Option<Bytes>,
    /// The replica's context length, when the error says the prompt
    /// exceeds it.
    pub context_limit: Option<u64>,
}

pub fn translate(status: StatusCode, body: &[u8]) -> Translated {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let openai_message = parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str);
    let message = openai_message
        .map(str::to_owned)
        .or_else(|| parsed.as_ref().and_then(message_of))
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    let context_limit = (status == StatusCode::BAD_REQUEST)
        .then(|| context_limit(&message))
        .flatten();
    if let Some(limit) = context_limit {
        let error = json!({"error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }});
        return Translated {
            body: Some(Bytes::from(error.to_string())),
            context_limit: Some(limit),
        };
    }
    if openai_message.is_some() {
        return Translated::default();
    }
    let message = if message.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("The replica failed")
            .to_owned()
    } else {
        message
    };
    let error = json!({"error": {
        "message": message,
        "type": kind(status),
        "param": null,
        "code": null,
    }});
    Translated {
        body: Some(Bytes::from(error.to_string())),
        context_limit: None,
    }
}

/// The context length in an engine's "prompt too long" message: vLLM's
/// "This model's maximum context length is 4096 tokens. However, …" (also
/// OpenAI's own wording) or its engine-level "… longer than the maximum
/// model length of 4096".
fn context_limit(message: &str) -> Option<u64> {
    ["maximum context length is ", "maximum model length of "]
        .iter()
        .find_map(|phrase| {
            let at = message.find(phrase)? + phrase.len();
            let digits: &str = &message[at..];
            let end = digits
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(digits.len());
            digits[..end].parse().ok().filter(|&n| n > 0)
        })
}

/// The message in the shapes engines use: FastAPI's `detail` (a string or
/// a list of validation errors), `message`, or `error` as a string.
fn message_of(v: &Value) -> Option<String> {
    for key in ["detail", "message", "error"] {
        match v.get(key) {
            Some(Value::String(s)) => return Some(s.clone()),
            Some(other @ (Value::Array(_) | Value::Object(_))) => return Some(other.to_string()),
            _ => {}
        }
    }
    None
}

/// The OpenAI error type for a status.
fn kind(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "upstream_error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shaped(status: u16, body: &str) -> Option<Value> {
        translate(StatusCode::from_u16(status).unwrap(), body.as_bytes())
            .body
            .map(|b| serde_json::from_slice(&b).unwrap())
    }

    #[test]
    fn a_prompt_too_long_is_context_length_exceeded_with_the_limit_learned() {
        for (body, limit) in [
            // vLLM, OpenAI-shaped with its own type and an integer code.
            (
                r#"{"error": {"message": "This model's maximum context length is 4096 tokens. However, you requested 4203 tokens (3703 in the messages, 500 in the completion). Please reduce the length of the messages or completion.", "type": "BadRequestError", "param": null, "code": 400}}"#,
                4096,
            ),
            // Older vLLM, flat.
            (
                r#"{"object": "error", "message": "The decoder prompt (length 9000) is longer than the maximum model length of 8192.", "type": "BadRequestError", "code": 400}"#,
                8192,
            ),
        ] {
            let t = translate(StatusCode::BAD_REQUEST, body.as_bytes());
            assert_eq!(t.context_limit, Some(limit), "{body}");
            let e: Value = serde_json::from_slice(&t.body.unwrap()).unwrap();
            assert_eq!(e["error"]["code"], "context_length_exceeded");
            assert_eq!(e["error"]["type"], "invalid_request_error");
            assert_eq!(e["error"]["param"], "messages");
            assert!(
                e["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(&limit.to_string())
            );
        }
        // The same words under another status are not a context refusal.
        let t = translate(
            StatusCode::INTERNAL_SERVER_ERROR,
            br#"{"error": {"message": "maximum context length is 4096"}}"#,
        );
        assert_eq!((t.body, t.context_limit), (None, None));
    }

    #[test]
    fn an_openai_error_passes_unchanged() {
        let body = r#"{"error": {"message": "bad", "type": "invalid_request_error", "param": null, "code": null}}"#;
        assert_eq!(shaped(400, body), None);
    }

    #[test]
    fn fastapi_detail_keeps_its_message_and_gets_a_type_from_the_status() {
        let e = shaped(404, r#"{"detail":"Not Found"}"#).unwrap();
        assert_eq!(e["error"]["message"], "Not Found");
        assert_eq!(e["error"]["type"], "invalid_request_error");
        assert!(e["error"].get("param").is_some() && e["error"].get("code").is_some());
        let e = shaped(
            422,
            r#"{"detail":[{"loc":["body","input"],"msg":"field required"}]}"#,
        )
        .unwrap();
        assert!(
            e["error"]["message"]
                .as_str()
                .unwrap()
                .contains("field required")
        );
    }

    #[test]
    fn plain_text_and_empty_bodies_become_messages() {
        let e = shaped(500, "engine exploded\n").unwrap();
        assert_eq!(e["error"]["message"], "engine exploded");
        assert_eq!(e["error"]["type"], "upstream_error");
        let e = shaped(503, "").unwrap();
        assert_eq!(e["error"]["message"], "Service Unavailable");
        let e = shaped(429, r#"{"error": "slow down"}"#).unwrap();
        assert_eq!(e["error"]["message"], "slow down");
        assert_eq!(e["error"]["type"], "rate_limit_error");
    }
}
