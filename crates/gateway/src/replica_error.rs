//! A replica's error answer in the OpenAI shape. Engines answer some
//! errors in their web framework's shape (`{"detail": "Not Found"}`, plain
//! text), which the OpenAI SDKs cannot read: they print only the status.
//! Such a body is wrapped, keeping the replica's status and its message.

use bytes::Bytes;
use http::StatusCode;
use serde_json::{Value, json};

/// Largest error body read whole to check its shape; a longer one passes
/// through as it is.
pub const LIMIT: usize = 64 * 1024;

/// `None` when `body` already is an OpenAI error (`{"error": {"message":
/// …}}`), else the same error in that shape.
pub fn openai_shaped(status: StatusCode, body: &[u8]) -> Option<Bytes> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    if parsed
        .as_ref()
        .and_then(|v| v.get("error"))
        .and_then(|e| e.get("message"))
        .is_some_and(Value::is_string)
    {
        return None;
    }
    let message = parsed
        .as_ref()
        .and_then(message_of)
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
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
    Some(Bytes::from(error.to_string()))
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
        openai_shaped(StatusCode::from_u16(status).unwrap(), body.as_bytes())
            .map(|b| serde_json::from_slice(&b).unwrap())
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
