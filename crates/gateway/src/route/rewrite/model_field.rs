//! The changes the gateway ever makes to a request body: the value of its
//! top-level `model`, replaced in place, and, for engines that schedule by
//! priority, its top-level `priority`, replaced or added. Every other byte
//! is passed on as the client sent it (no re-serialization: number
//! formats, key order, whitespace and unknown fields all stay as they
//! were).
//!
//! A value is found by walking the top-level object's members, skipping
//! each value by its structure (strings with their escapes, nested
//! brackets, scalars). Written by hand because serde_json does not say
//! where a value lies (its `raw_value` feature would, at the price of
//! rebuilding everything that depends on serde_json); it only ever runs
//! on bodies the parse stage has already accepted as JSON, and refuses
//! (`None`) anything it does not understand rather than guess.

use std::ops::Range;

use bytes::Bytes;

/// `body` with every top-level `model` value replaced by `model` (a body
/// with the key twice has both replaced, so no reader can see the old
/// name). `None` when the body is not a JSON object with a `model`.
pub fn with_model(body: &[u8], model: &str) -> Option<Bytes> {
    let spans = value_spans(body, "model")?;
    if spans.is_empty() {
        return None;
    }
    let value = serde_json::to_string(model).ok()?;
    Some(replace_spans(body, &spans, &value))
}

/// `body` with its top-level `priority` set to `priority`: every such
/// value replaced (so no reader sees the client's), or the member added
/// first in the object when there is none. `None` when the body is not a
/// JSON object.
pub fn with_priority(body: &[u8], priority: i64) -> Option<Bytes> {
    let spans = value_spans(body, "priority")?;
    let value = priority.to_string();
    if !spans.is_empty() {
        return Some(replace_spans(body, &spans, &value));
    }
    // `value_spans` has checked the object: its `{` is the first byte
    // after any leading space.
    let open = skip_space(body, 0);
    let empty = body.get(skip_space(body, open + 1)) == Some(&b'}');
    let member = format!("\"priority\":{value}{}", if empty { "" } else { "," });
    let mut out = Vec::with_capacity(body.len() + member.len());
    out.extend_from_slice(&body[..=open]);
    out.extend_from_slice(member.as_bytes());
    out.extend_from_slice(&body[open + 1..]);
    Some(Bytes::from(out))
}

/// `body` with each of `spans` (in body order) replaced by `value`.
fn replace_spans(body: &[u8], spans: &[Range<usize>], value: &str) -> Bytes {
    let removed: usize = spans.iter().map(|s| s.len()).sum();
    let mut out = Vec::with_capacity(body.len() - removed + value.len() * spans.len());
    let mut at = 0;
    for span in spans {
        out.extend_from_slice(&body[at..span.start]);
        out.extend_from_slice(value.as_bytes());
        at = span.end;
    }
    out.extend_from_slice(&body[at..]);
    Bytes::from(out)
}

/// The byte ranges of the values of the top-level members named `name`,
/// in body order. `None` when the body is not a JSON object.
fn value_spans(body: &[u8], name: &str) -> Option<Vec<Range<usize>>> {
    let mut at = skip_space(body, 0);
    if body.get(at) != Some(&b'{') {
        return None;
    }
    at = skip_space(body, at + 1);
    let mut spans = Vec::with_capacity(1);
    if body.get(at) == Some(&b'}') {
        return Some(spans);
    }
    loop {
        let key = string_end(body, at)?;
        let is_named = is_key(&body[at..key], name)?;
        at = skip_space(body, key);
        if body.get(at) != Some(&b':') {
            return None;
        }
        let value_start = skip_space(body, at + 1);
        let value_end = value_end(body, value_start)?;
        if is_named {
            spans.push(value_start..value_end);
        }
        at = skip_space(body, value_end);
        match body.get(at) {
            Some(b',') => at = skip_space(body, at + 1),
            Some(b'}') => return Some(spans),
            _ => return None,
        }
    }
}

/// Whether the quoted key (quotes included) is `name`, escapes decoded.
fn is_key(quoted: &[u8], name: &str) -> Option<bool> {
    if !quoted.contains(&b'\\') {
        return Some(&quoted[1..quoted.len() - 1] == name.as_bytes());
    }
    let key: String = serde_json::from_slice(quoted).ok()?;
    Some(key == name)
}

fn skip_space(body: &[u8], mut at: usize) -> usize {
    while matches!(body.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// Where the string starting at `at` (its opening quote) ends: just past
/// its closing quote.
fn string_end(body: &[u8], at: usize) -> Option<usize> {
    if body.get(at) != Some(&b'"') {
        return None;
    }
    let mut i = at + 1;
    loop {
        match body.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

/// Where the value starting at `at` ends.
fn value_end(body: &[u8], at: usize) -> Option<usize> {
    match body.get(at)? {
        b'"' => string_end(body, at),
        b'{' | b'[' => {
            // Brackets nest; strings may hold brackets and quotes.
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match body.get(i)? {
                    b'"' => {
                        i = string_end(body, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        // A number, true, false or null: up to the next delimiter.
        _ => {
            let mut i = at;
            while !matches!(
                body.get(i),
                None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            ) {
                i += 1;
            }
            (i > at).then_some(i)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(body: &str, model: &str) -> String {
        String::from_utf8(with_model(body.as_bytes(), model).unwrap().to_vec()).unwrap()
    }

    #[test]
    fn only_the_model_value_changes() {
        let body = r#"{ "messages": [{"role":"user","content":"\"model\": x"}],
  "model" :  "llama-8b", "temperature": 1.0e0, "x": {"model": "inner"} }"#;
        assert_eq!(
            rewritten(body, "llama-8b-v2"),
            r#"{ "messages": [{"role":"user","content":"\"model\": x"}],
  "model" :  "llama-8b-v2", "temperature": 1.0e0, "x": {"model": "inner"} }"#
        );
    }

    #[test]
    fn escaped_and_repeated_keys_are_all_rewritten() {
        assert_eq!(
            rewritten(r#"{"model":"a","mod\u0065l":"b"}"#, "c\"d"),
            r#"{"model":"c\"d","mod\u0065l":"c\"d"}"#
        );
        assert_eq!(rewritten(r#"{"model":"\u0061"}"#, "b"), r#"{"model":"b"}"#);
    }

    #[test]
    fn bodies_without_a_model_are_left_alone() {
        assert!(with_model(br#"{"prompt":"hi"}"#, "m").is_none());
        assert!(with_model(br#"[1]"#, "m").is_none());
        assert!(with_model(br#"{"model":"a""#, "m").is_none());
        assert!(with_model(br#"{}"#, "m").is_none());
    }

    #[test]
    fn nested_values_and_scalars_are_skipped_whole() {
        let body =
            r#"{"a":[1,{"model":"x","s":"]}\"["}],"n":-1.5e3,"t":true,"z":null,"model":"m"}"#;
        assert_eq!(
            rewritten(body, "v2"),
            r#"{"a":[1,{"model":"x","s":"]}\"["}],"n":-1.5e3,"t":true,"z":null,"model":"v2"}"#
        );
        // Whatever the body holds, the result is the body with its model
        // changed, as a full parse sees it.
        let got: serde_json::Value = serde_json::from_str(&rewritten(body, "v2")).unwrap();
        let mut sent: serde_json::Value = serde_json::from_str(body).unwrap();
        sent["model"] = "v2".into();
        assert_eq!(got, sent);
    }

    fn prioritized(body: &str, priority: i64) -> String {
        String::from_utf8(with_priority(body.as_bytes(), priority).unwrap().to_vec()).unwrap()
    }

    #[test]
    fn a_client_priority_is_replaced_in_place() {
        let body = r#"{"model":"m", "priority" : -100,"x":{"priority":7},"s":"\"priority\": 1"}"#;
        assert_eq!(
            prioritized(body, 2),
            r#"{"model":"m", "priority" : 2,"x":{"priority":7},"s":"\"priority\": 1"}"#
        );
        // Whatever its type, and however often or however spelt.
        assert_eq!(
            prioritized(r#"{"priority":"high","model":"m","pri\u006frity":[0]}"#, 1),
            r#"{"priority":1,"model":"m","pri\u006frity":1}"#
        );
    }

    #[test]
    fn a_missing_priority_is_added_first() {
        assert_eq!(
            prioritized(r#" { "model": "m", "messages": [] }"#, 0),
            r#" {"priority":0, "model": "m", "messages": [] }"#
        );
        assert_eq!(prioritized("{ }", 1), r#"{"priority":1 }"#);
        // Nested `priority` members are the client's business.
        assert_eq!(
            prioritized(r#"{"x":{"priority":0}}"#, 2),
            r#"{"priority":2,"x":{"priority":0}}"#
        );
    }

    #[test]
    fn the_result_is_the_body_with_its_priority_set() {
        for body in [
            r#"{"model":"m","priority":5,"n":-1.5e3,"t":true,"z":null}"#,
            r#"{"model":"m","a":[1,{"priority":"x","s":"]}\"["}]}"#,
        ] {
            let got: serde_json::Value = serde_json::from_str(&prioritized(body, 1)).unwrap();
            let mut sent: serde_json::Value = serde_json::from_str(body).unwrap();
            sent["priority"] = 1.into();
            assert_eq!(got, sent, "{body}");
        }
    }

    #[test]
    fn only_objects_get_a_priority() {
        assert!(with_priority(br#"[1]"#, 0).is_none());
        assert!(with_priority(br#"{"model":"a""#, 0).is_none());
        assert!(with_priority(b"", 0).is_none());
    }
}
