//! The parse stage: the body's JSON → what routing and picking need. The
//! body bytes themselves are forwarded untouched.
//!
//! Only the fields the gateway reads are kept (`model`, `stream`, the output
//! bound and the prompt), borrowed from the body where the JSON has no
//! escapes; every other field is checked for syntax and skipped without
//! building anything. The JSON accepted and rejected is exactly what a full
//! parse into [`serde_json::Value`] accepts and rejects (every value goes
//! through the same `deserialize_any`), and a body that fails is parsed
//! again in full to word its error as before.

use std::borrow::Cow;
use std::fmt;

use picker::policy::PrefixConfig;
use picker::{PromptHasher, PromptValue};
use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::error::ApiError;

/// Characters per token for estimating load before the replica has counted
/// (a common rule of thumb for English text with BPE tokenizers).
const CHARS_PER_TOKEN: u64 = 4;
/// The largest estimate a request gets, far beyond any context window: the
/// picker sums the estimates of requests in flight per replica, and
/// estimates a client can make as large as it likes must not wrap that sum.
pub const MAX_ESTIMATED_TOKENS: u64 = 1 << 32;
/// Output tokens assumed when a request does not bound its answer.
const DEFAULT_OUTPUT_TOKENS: u64 = 256;

#[derive(Debug)]
pub struct InferenceRequest<'a> {
    pub model: Cow<'a, str>,
    pub stream: bool,
    /// Prompt plus expected output tokens, for in-flight load accounting.
    pub estimated_tokens: u64,
    /// The prompt's length in tokens, estimated from its characters.
    pub prompt_tokens: u64,
    /// `max_completion_tokens` or `max_tokens`, when the request bounds
    /// its answer.
    pub max_output: Option<u64>,
    /// OpenAI's `user`, when a string: a session key if `sessions.user`.
    pub user: Option<Cow<'a, str>>,
    /// The prompt fields, for the picker's prefix hashes.
    prompt: Prompt<'a>,
}

impl<'a> InferenceRequest<'a> {
    pub fn parse(body: &'a [u8]) -> Result<Self, ApiError> {
        let fields = match BodyFields::parse(body) {
            Ok(Some(fields)) => fields,
            // Not an object, or not JSON: the full parse words the error.
            Ok(None) | Err(_) => return Err(full_parse_error(body)),
        };
        let model = match fields.model {
            Some(Json::Str(m)) => m,
            Some(_) => return Err(ApiError::missing_model("`model` must be a string.")),
            None => {
                return Err(ApiError::missing_model(
                    "The request body has no `model`; name the model to use.",
                ));
            }
        };
        let max_output = [&fields.max_completion_tokens, &fields.max_tokens]
            .into_iter()
            .find_map(|v| match v {
                Some(Json::U64(n)) => Some(*n),
                _ => None,
            });
        let output = max_output.unwrap_or(DEFAULT_OUTPUT_TOKENS);
        let prompt = fields.prompt;
        let prompt_chars = [&prompt.messages, &prompt.prompt, &prompt.input]
            .into_iter()
            .flatten()
            .map(text_len)
            .sum::<usize>() as u64;
        let prompt_tokens = (prompt_chars / CHARS_PER_TOKEN).min(MAX_ESTIMATED_TOKENS);
        Ok(Self {
            model,
            stream: fields.stream,
            prompt_tokens,
            max_output,
            user: match fields.user {
                Some(Json::Str(user)) => Some(user),
                _ => None,
            },
            // Bounded: a client's `max_tokens` may be any u64, and a sum
            // that wrapped would make a huge request look nearly free.
            estimated_tokens: prompt_tokens
                .saturating_add(output)
                .min(MAX_ESTIMATED_TOKENS),
            prompt,
        })
    }

    /// The chained block hashes of the prompt, as
    /// [`picker::prompt_hashes`] makes them from the whole body.
    pub fn prompt_hashes(&self, adapter: Option<&str>, config: &PrefixConfig) -> Vec<u64> {
        let mut hasher = PromptHasher::new(&self.model, adapter, config);
        hasher.feed_prompt_fields(self.prompt.messages.as_ref(), self.prompt.prompt.as_ref());
        hasher.finish()
    }
}

/// The error a body that failed the fast parse gets: the one a parse into
/// [`Value`] gives.
fn full_parse_error(body: &[u8]) -> ApiError {
    match serde_json::from_slice::<Value>(body) {
        Err(e) => ApiError::invalid_request(format!("The request body is not valid JSON: {e}")),
        Ok(_) => ApiError::invalid_request("The request body must be a JSON object."),
    }
}

/// A JSON value as far as the gateway looks into one: text (borrowed from
/// the body unless it had escapes), unsigned integers, `true`/`false`, and
/// the structure of arrays and objects. Everything else is `Other`.
#[derive(Debug)]
enum Json<'a> {
    Str(Cow<'a, str>),
    /// A non-negative integer (what [`Value::as_u64`] accepts).
    U64(u64),
    Bool(bool),
    Array(Vec<Json<'a>>),
    /// Members in body order, duplicates included; see its `PromptValue::get`.
    Object(Vec<(Cow<'a, str>, Json<'a>)>),
    Other,
}

impl PromptValue for Json<'_> {
    /// With duplicates the last one, as in a parsed [`Value`].
    fn get(&self, key: &str) -> Option<&Self> {
        match self {
            Json::Object(members) => members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<&[Self]> {
        match self {
            Json::Array(items) => Some(items),
            _ => None,
        }
    }

    fn as_u64(&self) -> Option<u64> {
        match self {
            Json::U64(n) => Some(*n),
            _ => None,
        }
    }

    /// As a parsed [`Value`] holds them: in key order, the last of
    /// repeated keys.
    fn for_each_str_member(&self, mut f: impl FnMut(&str)) {
        let Json::Object(members) = self else {
            return;
        };
        let mut values: Vec<(&str, &Self)> = Vec::with_capacity(members.len());
        for (key, value) in members {
            match values.iter_mut().find(|(k, _)| *k == &**key) {
                Some(slot) => slot.1 = value,
                None => values.push((key, value)),
            }
        }
        values.sort_by(|a, b| a.0.cmp(b.0));
        values
            .into_iter()
            .filter_map(|(_, v)| v.as_str())
            .for_each(&mut f);
    }
}

/// Characters of text in a prompt-like value (strings, arrays, message
/// objects), without building the text.
fn text_len(v: &Json<'_>) -> usize {
    match v {
        Json::Str(s) => s.len(),
        Json::Array(items) => items.iter().map(text_len).sum(),
        Json::Object(_) => v
            .get("content")
            .or_else(|| v.get("text"))
            .map(text_len)
            .unwrap_or(0),
        _ => 0,
    }
}

/// The body's top-level fields the gateway reads. Later duplicates replace
/// earlier ones, as in a parsed [`Value`].
#[derive(Default)]
struct BodyFields<'a> {
    model: Option<Json<'a>>,
    stream: bool,
    max_completion_tokens: Option<Json<'a>>,
    max_tokens: Option<Json<'a>>,
    user: Option<Json<'a>>,
    prompt: Prompt<'a>,
}

#[derive(Debug, Default)]
struct Prompt<'a> {
    messages: Option<Json<'a>>,
    prompt: Option<Json<'a>>,
    input: Option<Json<'a>>,
}

impl<'a> BodyFields<'a> {
    /// `None` when the body is JSON but not an object.
    fn parse(body: &'a [u8]) -> serde_json::Result<Option<Self>> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let fields = de.deserialize_any(TopVisitor)?;
        de.end()?;
        Ok(fields)
    }
}

struct TopVisitor;

impl<'de> Visitor<'de> for TopVisitor {
    type Value = Option<BodyFields<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut fields = BodyFields::default();
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "model" => fields.model = Some(map.next_value()?),
                "stream" => fields.stream = matches!(map.next_value()?, Json::Bool(true)),
                "max_completion_tokens" => fields.max_completion_tokens = Some(map.next_value()?),
                "max_tokens" => fields.max_tokens = Some(map.next_value()?),
                "user" => fields.user = Some(map.next_value()?),
                "messages" => fields.prompt.messages = Some(map.next_value()?),
                "prompt" => fields.prompt.prompt = Some(map.next_value()?),
                "input" => fields.prompt.input = Some(map.next_value()?),
                _ => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(Some(fields))
    }

    // Any other JSON value: checked to its end like the rest, then refused.
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        SkipVisitor.visit_seq(seq).map(|()| None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// An object key, borrowed from the body unless it had escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(StrVisitor).map(Key)
    }
}

struct StrVisitor;

impl<'de> Visitor<'de> for StrVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(s))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(s))
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Json::Str(Cow::Borrowed(s)))
    }
    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Json::Str(Cow::Owned(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Json::Str(Cow::Owned(s)))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Json::U64(n))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(n).map_or(Json::Other, Json::U64))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Json::Other)
    }
    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Json::Bool(b))
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Json::Other)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Json::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(Key(key)) = map.next_key()? {
            members.push((key, map.next_value()?));
        }
        Ok(Json::Object(members))
    }
}

/// Any JSON value, checked and dropped without building anything.
struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `deserialize_any`, not `deserialize_ignored_any`: the same checks
        // (UTF-8, escapes, number range) as a parse into `Value`.
        d.deserialize_any(SkipVisitor).map(|()| Skip)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while map
            .next_entry_seed(SkipSeed(KeySkip), SkipSeed(Skip))?
            .is_some()
        {}
        Ok(())
    }
}

/// Keys of skipped objects: checked like any string, never copied.
struct KeySkip;

struct SkipSeed<T>(T);

impl<'de> DeserializeSeed<'de> for SkipSeed<KeySkip> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(SkipVisitor)
    }
}

impl<'de> DeserializeSeed<'de> for SkipSeed<Skip> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        Skip::deserialize(d).map(|Skip| ())
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
    fn a_huge_output_bound_saturates_the_estimate() {
        // Overflowed (a panic with overflow checks, a wrap to a tiny load
        // without): `max_tokens` is any u64 the client sends.
        let r = InferenceRequest::parse(
            br#"{"model":"m","max_tokens":18446744073709551615,"prompt":"abcdefgh"}"#,
        )
        .unwrap();
        assert_eq!(r.estimated_tokens, MAX_ESTIMATED_TOKENS);
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

    /// What the gateway answered when it parsed the whole body into a
    /// `Value`: the reference the parse must keep matching.
    #[allow(clippy::type_complexity)]
    fn full_parse(
        body: &[u8],
    ) -> Result<(String, bool, u64), (http::StatusCode, String, Option<&'static str>)> {
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
        let err = |e: ApiError| (e.status, e.message.clone(), e.param);
        let body: Value = serde_json::from_slice(body).map_err(|e| {
            err(ApiError::invalid_request(format!(
                "The request body is not valid JSON: {e}"
            )))
        })?;
        let Value::Object(fields) = &body else {
            return Err(err(ApiError::invalid_request(
                "The request body must be a JSON object.",
            )));
        };
        let model = match fields.get("model") {
            Some(Value::String(m)) => m.clone(),
            Some(_) => return Err(err(ApiError::missing_model("`model` must be a string."))),
            None => {
                return Err(err(ApiError::missing_model(
                    "The request body has no `model`; name the model to use.",
                )));
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
        Ok((
            model,
            stream,
            (prompt_chars / CHARS_PER_TOKEN)
                .saturating_add(output)
                .min(MAX_ESTIMATED_TOKENS),
        ))
    }

    fn config(block_bytes: usize) -> PrefixConfig {
        PrefixConfig {
            block_bytes,
            ..PrefixConfig::default()
        }
    }

    /// Same answer as the full parse, and the same prefix hashes as the
    /// picker makes from the parsed body.
    fn check(body: &str) {
        let ours = InferenceRequest::parse(body.as_bytes());
        match (full_parse(body.as_bytes()), &ours) {
            (Ok((model, stream, estimate)), Ok(r)) => {
                assert_eq!(r.model, model, "{body}");
                assert_eq!(r.stream, stream, "{body}");
                assert_eq!(r.estimated_tokens, estimate, "{body}");
                let value: Value = serde_json::from_slice(body.as_bytes()).unwrap();
                for (adapter, block) in [(None, 4), (Some("lora"), 1), (None, 64)] {
                    assert_eq!(
                        r.prompt_hashes(adapter, &config(block)),
                        picker::prompt_hashes(&model, adapter, &value, &config(block)),
                        "{body} (block {block})"
                    );
                }
            }
            (Err((status, message, param)), Err(e)) => {
                assert_eq!(e.status, status, "{body}");
                assert_eq!(e.message, message, "{body}");
                assert_eq!(e.param, param, "{body}");
            }
            (want, got) => panic!("{body}: want {want:?}, got {got:?}"),
        }
    }

    #[test]
    fn matches_a_full_parse_on_good_bodies() {
        for body in [
            r#"{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi, please, in a few words"}],"max_tokens":1}"#,
            r#"{"model":"m\u00e9\n","stream":false,"messages":[{"role":"us\"er","content":"tab\there \ud83d\ude00 and more text"}]}"#,
            r#"{"stream":true,"model":"m","max_completion_tokens":7,"max_tokens":9,"prompt":"once upon a time there was"}"#,
            r#"{"model":"m","max_completion_tokens":null,"max_tokens":9,"prompt":["first prompt", "second one", 17, [1,2,3,-4,5.5], null]}"#,
            r#"{"model":"m","max_tokens":-3,"prompt":[101, 202, 303, 404, 70000000000]}"#,
            r#"{"model":"m","max_completion_tokens":18446744073709551615,"prompt":"long enough to count"}"#,
            r#"{"model":"m","max_tokens":2.0,"input":["embed me", "and me"],"prompt":{"odd":"shape"}}"#,
            r#"{"model":"m","messages":"not an array","prompt":"fallback prompt text"}"#,
            r#"{"model":"a","model":"b","stream":true,"stream":1,"messages":[],"messages":[{"role":"user","content":"last wins"}]}"#,
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"describe"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA","detail":"low"}},{"type":"input_audio","input_audio":{"format":"wav","data":"UklGRg=="}},{"type":"file","file":"abc"},{"text":"no type"},{"type":"image_url","image_url":{"url":"x","url":"y","a":"z","n":3}}]}]}"#,
            r#"{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"lookup","arguments":"{\"q\":\"rust\"}"}},{"function":{"name":7}}]},{"role":"tool","tool_call_id":"c1","content":"result text"},"just a string",[1],{"content":"no role","text":"ignored","role":null}]}"#,
            r#"{"model":"m","messages":[{"role":"user","text":"text only","content":{"content":"nested"}}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}],"temperature":0.2,"n":1,"stop":["\n"],"logit_bias":{"50256":-100},"user":"\u0041"}"#,
            r#"  {"model":"m"}  "#,
            r#"{"model":"","messages":[{"role":"","content":""}]}"#,
        ] {
            check(body);
        }
        // Long enough to fill many blocks, and to hit `max_blocks`.
        let long = "the quick brown fox jumps over the lazy dog ".repeat(2_000);
        check(&format!(
            r#"{{"model":"m","messages":[{{"role":"system","content":"{long}"}},{{"role":"user","content":"{long}"}}]}}"#
        ));
        check(&format!(r#"{{"model":"m","prompt":["{long}","{long}"]}}"#));
    }

    #[test]
    fn matches_a_full_parse_on_bad_bodies() {
        let deep = format!(
            r#"{{"model":"m","x":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        for body in [
            "",
            " ",
            "{oops",
            "[1]",
            "[1,{\"model\":\"m\"}]",
            "\"text\"",
            "3",
            "null",
            "true",
            r#"{"model":3}"#,
            r#"{"model":null}"#,
            r#"{"model":{"name":"m"}}"#,
            r#"{"model":["m"]}"#,
            r#"{"prompt":"x"}"#,
            r#"{}"#,
            r#"{"model":"m"} trailing"#,
            r#"{"model":"m",}"#,
            r#"{"model":"m","x":1e999}"#,
            r#"{"model":"m","x":"\ud800"}"#,
            r#"{"model":"m","x":"bad \q escape"}"#,
            "{\"model\":\"m\",\"x\":\"raw \u{1} control\"}",
            r#"{"model":"m","messages":[{"role":"user","content":"unterminated}]}"#,
            r#"{"model":"m","x":{"k":1,}}"#,
            r#"{"model":"m","x":{1:2}}"#,
            &deep,
        ] {
            check(body);
        }
        // Not UTF-8, in a skipped field and in a kept one.
        for body in [
            &b"{\"model\":\"m\",\"x\":\"\xff\"}"[..],
            b"{\"model\":\"m\xfe\"}",
            b"{\"model\":\"m\",\"\xc3\":1}",
        ] {
            let want = full_parse(body).unwrap_err();
            let e = InferenceRequest::parse(body).unwrap_err();
            assert_eq!((e.status, e.message.clone(), e.param), want);
        }
    }
}
