//! Token limits settle a request to the `usage` its replica reports. A
//! stream reports it only when asked (`stream_options.include_usage`), in
//! one last event with no choices. When a stream is charged against a
//! token limit and its client did not ask, the gateway asks in its place
//! and takes that event out of what the client sees, so the client gets
//! exactly the stream it asked for and the tenant is charged what it used.

use bytes::{Bytes, BytesMut};
use serde_json::Value;

use super::sse::{self, EventBuffer};

/// The body with `stream_options.include_usage: true`, or `None` when the
/// request is not a stream or already asks for usage.
pub fn ask_for_usage(body: &[u8]) -> Option<Bytes> {
    let mut json: Value = serde_json::from_slice(body).ok()?;
    let object = json.as_object_mut()?;
    if object.get("stream") != Some(&Value::Bool(true)) {
        return None;
    }
    let options = object
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Default::default()));
    let options = options.as_object_mut()?;
    if options.get("include_usage") == Some(&Value::Bool(true)) {
        return None;
    }
    options.insert("include_usage".to_owned(), Value::Bool(true));
    serde_json::to_vec(&json).ok().map(Bytes::from)
}

/// Removes the usage-only event from a stream of server-sent events,
/// whatever frames its bytes arrive in. Everything else passes unchanged.
#[derive(Default)]
pub struct UsageStripper {
    events: EventBuffer,
}

impl UsageStripper {
    /// What of `data` the client gets now: the complete events in it,
    /// less the usage-only one. An event cut by the frame's end waits for
    /// the rest.
    pub fn filter(&mut self, data: &[u8]) -> Bytes {
        let Some(complete) = self.events.push(data) else {
            return Bytes::new();
        };
        if memchr::memmem::find(&complete, b"\"usage\"").is_none() {
            return complete;
        }
        let mut kept = BytesMut::with_capacity(complete.len());
        for event in sse::events(&complete) {
            if !is_usage_only(event) {
                kept.extend_from_slice(event);
            }
        }
        kept.freeze()
    }

    /// Nothing waits for the rest of an event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The bytes of an event the stream ended in the middle of.
    pub fn finish(&mut self) -> Option<Bytes> {
        self.events.take_rest()
    }
}

/// A `data:` event whose JSON has `usage` and no choices.
fn is_usage_only(event: &[u8]) -> bool {
    let Some(data) = sse::data(event) else {
        return false;
    };
    let Ok(json) = serde_json::from_str::<Value>(&data) else {
        return false;
    };
    json.get("usage").is_some_and(Value::is_object)
        && json
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
    const USAGE: &str =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    #[test]
    fn asks_only_streams_that_did_not_ask() {
        let asked = ask_for_usage(br#"{"model":"m","stream":true,"messages":[]}"#).unwrap();
        let json: Value = serde_json::from_slice(&asked).unwrap();
        assert_eq!(json["stream_options"]["include_usage"], true);
        assert_eq!(json["model"], "m");
        let kept = ask_for_usage(br#"{"stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}"#).unwrap();
        let json: Value = serde_json::from_slice(&kept).unwrap();
        assert_eq!(json["stream_options"]["continuous_usage_stats"], true);
        assert_eq!(json["stream_options"]["include_usage"], true);
        assert!(
            ask_for_usage(br#"{"stream":true,"stream_options":{"include_usage":true}}"#).is_none()
        );
        assert!(ask_for_usage(br#"{"stream":false}"#).is_none());
        assert!(ask_for_usage(br#"{"model":"m"}"#).is_none());
    }

    #[test]
    fn strips_the_usage_event_however_the_frames_cut_it() {
        let whole = format!("{TOKEN}{TOKEN}{USAGE}{DONE}");
        let expected = format!("{TOKEN}{TOKEN}{DONE}");
        for cut in 1..whole.len() {
            let mut s = UsageStripper::default();
            let (a, b) = whole.as_bytes().split_at(cut);
            let mut out = s.filter(a).to_vec();
            out.extend_from_slice(&s.filter(b));
            assert!(s.finish().is_none());
            assert_eq!(String::from_utf8(out).unwrap(), expected, "cut at {cut}");
        }
    }

    #[test]
    fn crlf_events_and_a_cut_last_event_pass() {
        let mut s = UsageStripper::default();
        let usage_crlf = USAGE.replace("\n\n", "\r\n\r\n");
        let out = s.filter(format!("{TOKEN}{usage_crlf}data: [DO").as_bytes());
        assert_eq!(&out[..], TOKEN.as_bytes());
        assert_eq!(&s.finish().unwrap()[..], b"data: [DO");
    }
}
