//! What the client of a streamed answer has received, event by event: the
//! text to continue from, how many tokens it was, and what the answer's
//! events are stamped with (`id`, `created`, `model`), which every event
//! of a continuation is stamped with in turn, so the client sees one
//! answer.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::Value;

use super::not_continued::NotContinued;
use crate::outbound::sse;

/// One streamed answer, across the replicas that generated it.
#[derive(Debug)]
pub struct Transcript {
    /// The most text kept; a longer answer is not continued.
    max_text: usize,
    stamp: Option<Stamp>,
    text: String,
    /// Tokens the client received.
    tokens: u64,
    /// The ids of those tokens, while every event with text carried them
    /// (vLLM's `return_token_ids`).
    token_ids: Option<Vec<u32>>,
    prompt_token_ids: Option<Vec<u32>>,
    /// The prompt's tokens, when a usage was reported mid-stream
    /// (`continuous_usage_stats`).
    prompt_tokens: Option<u64>,
    /// Tokens received before the current replica's part began.
    tokens_before_part: u64,
    /// Which replica's part this is: 0 the first replica's.
    part: u32,
    finished: bool,
    done: bool,
    /// What makes the answer impossible to continue faithfully, once seen.
    blocked: Option<NotContinued>,
    /// The replica reported an error in the stream: it ends there.
    errored: bool,
}

/// The fields that make events one answer.
#[derive(Debug, Clone)]
struct Stamp {
    id: Option<String>,
    created: Option<u64>,
    model: Option<String>,
}

/// The fields of a chunk the transcript reads; the rest is passed on.
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    created: Option<u64>,
    #[serde(borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    choices: Vec<Choice<'a>>,
    usage: Option<ChunkUsage>,
    error: Option<IgnoredAny>,
    prompt_token_ids: Option<Vec<u32>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: u32,
    #[serde(borrow)]
    delta: Option<Delta<'a>>,
    /// A completion's text.
    #[serde(borrow)]
    text: Option<Cow<'a, str>>,
    finish_reason: Option<IgnoredAny>,
    token_ids: Option<Vec<u32>>,
    prompt_token_ids: Option<Vec<u32>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    tool_calls: Option<Value>,
    function_call: Option<Value>,
    #[serde(borrow)]
    reasoning_content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    reasoning: Option<Cow<'a, str>>,
}

#[derive(Deserialize, Clone, Copy)]
struct ChunkUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
}

fn non_empty(s: &Option<Cow<'_, str>>) -> bool {
    s.as_deref().is_some_and(|s| !s.is_empty())
}

fn present(v: &Option<Value>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_null())
}

impl Transcript {
    pub fn new(max_text: usize) -> Self {
        Self {
            max_text,
            stamp: None,
            text: String::new(),
            tokens: 0,
            token_ids: Some(Vec::new()),
            prompt_token_ids: None,
            prompt_tokens: None,
            tokens_before_part: 0,
            part: 0,
            finished: false,
            done: false,
            blocked: None,
            errored: false,
        }
    }

    /// The complete events of the current part, as the client gets them:
    /// the first replica's unchanged, a continuation's stamped as the
    /// first's, without the opening that repeats the assistant's role,
    /// and with the usage of the whole answer.
    pub fn relay(&mut self, events: Bytes) -> Bytes {
        if self.part == 0 {
            for event in sse::events(&events) {
                self.observe(event);
            }
            return events;
        }
        let mut out = BytesMut::with_capacity(events.len());
        for event in sse::events(&events) {
            self.observe(event);
            if let Some(event) = self.restamp(event) {
                out.extend_from_slice(&event);
            }
        }
        out.freeze()
    }

    /// Read one event of what the client gets.
    fn observe(&mut self, event: &[u8]) {
        let Some(data) = sse::data(event) else {
            return;
        };
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Chunk<'_>>(&data) else {
            // Not a chunk the transcript can read: the client has text it
            // does not know of.
            self.block(NotContinued::Unreadable);
            return;
        };
        if chunk.error.is_some() {
            self.errored = true;
            return;
        }
        if self.stamp.is_none() {
            self.stamp = Some(Stamp {
                id: chunk.id.map(Cow::into_owned),
                created: chunk.created,
                model: chunk.model.map(Cow::into_owned),
            });
        }
        if chunk.prompt_token_ids.is_some() {
            self.prompt_token_ids = chunk.prompt_token_ids;
        }
        for choice in chunk.choices {
            self.observe_choice(choice);
        }
        if let Some(usage) = chunk.usage {
            if self.part == 0 {
                self.prompt_tokens = usage.prompt_tokens.or(self.prompt_tokens);
            }
            // A usage reported mid-stream counts the part's tokens exactly
            // (an event may carry several).
            if let Some(generated) = usage.completion_tokens {
                self.tokens = self.tokens_before_part + generated;
            }
        }
    }

    fn observe_choice(&mut self, choice: Choice<'_>) {
        if choice.index != 0 {
            self.block(NotContinued::SeveralChoices);
        }
        if choice.prompt_token_ids.is_some() {
            self.prompt_token_ids = choice.prompt_token_ids;
        }
        let text = match choice.delta {
            Some(delta) => {
                if present(&delta.tool_calls) || present(&delta.function_call) {
                    self.block(NotContinued::ToolCall);
                }
                if non_empty(&delta.reasoning_content) || non_empty(&delta.reasoning) {
                    self.block(NotContinued::Reasoning);
                }
                delta.content
            }
            None => choice.text,
        };
        if let Some(text) = text.filter(|t| !t.is_empty()) {
            if self.text.len() + text.len() > self.max_text {
                self.block(NotContinued::TooLong);
            } else {
                self.text.push_str(&text);
            }
            match (&mut self.token_ids, choice.token_ids) {
                (Some(ids), Some(new)) => {
                    self.tokens += new.len().max(1) as u64;
                    ids.extend(new);
                }
                (ids, _) => {
                    // One token an event, as engines stream unless they
                    // say otherwise.
                    *ids = None;
                    self.tokens += 1;
                }
            }
        }
        if choice.finish_reason.is_some() {
            self.finished = true;
        }
    }

    fn block(&mut self, why: NotContinued) {
        self.blocked.get_or_insert(why);
    }

    /// A continuation's event as the client gets it, or `None` for one it
    /// must not see.
    fn restamp(&self, event: &[u8]) -> Option<Bytes> {
        let Some(data) = sse::data(event) else {
            return Some(Bytes::copy_from_slice(event));
        };
        let Ok(mut json) = serde_json::from_str::<Value>(&data) else {
            return Some(Bytes::copy_from_slice(event));
        };
        let Some(object) = json.as_object_mut() else {
            return Some(Bytes::copy_from_slice(event));
        };
        if let Some(stamp) = &self.stamp {
            if let Some(id) = &stamp.id {
                object.insert("id".into(), Value::from(id.as_str()));
            }
            if let Some(created) = stamp.created {
                object.insert("created".into(), Value::from(created));
            }
            if let Some(model) = &stamp.model {
                object.insert("model".into(), Value::from(model.as_str()));
            }
        }
        object.remove("prompt_token_ids");
        let mut says_something = object.get("usage").is_some_and(Value::is_object);
        if let Some(choices) = object.get_mut("choices").and_then(Value::as_array_mut) {
            for choice in choices.iter_mut().filter_map(Value::as_object_mut) {
                choice.remove("prompt_token_ids");
                if let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut) {
                    // The client was told the role once, by the first part.
                    delta.remove("role");
                }
                let text = choice
                    .get("delta")
                    .and_then(|d| d.get("content"))
                    .or_else(|| choice.get("text"))
                    .and_then(Value::as_str);
                let finish = choice.get("finish_reason").is_some_and(|f| !f.is_null());
                let other = choice
                    .get("delta")
                    .and_then(Value::as_object)
                    .is_some_and(|d| d.iter().any(|(k, v)| k != "content" && !v.is_null()));
                says_something |= text.is_some_and(|t| !t.is_empty()) || finish || other;
            }
        }
        if !says_something {
            return None;
        }
        if let Some(usage) = object.get_mut("usage").and_then(Value::as_object_mut) {
            self.whole_answer_usage(usage);
        }
        Some(Bytes::from(format!("data: {json}\n\n")))
    }

    /// A continuation's usage made the whole answer's: the original
    /// prompt's tokens, and every token the client received.
    fn whole_answer_usage(&self, usage: &mut serde_json::Map<String, Value>) {
        let before = self.tokens_before_part;
        let completion = usage
            .get("completion_tokens")
            .and_then(Value::as_u64)
            .map(|c| before + c);
        // The continuation's prompt is the original one and the text so
        // far; without a count reported earlier, the original's is that
        // less the tokens generated before.
        let prompt = self.prompt_tokens.or_else(|| {
            usage
                .get("prompt_tokens")
                .and_then(Value::as_u64)
                .map(|p| p.saturating_sub(before))
        });
        if let Some(c) = completion {
            usage.insert("completion_tokens".into(), Value::from(c));
        }
        if let Some(p) = prompt {
            usage.insert("prompt_tokens".into(), Value::from(p));
            // Cached tokens were counted of the continuation's prompt.
            usage.remove("prompt_tokens_details");
        }
        if let (Some(p), Some(c)) = (prompt, completion) {
            usage.insert("total_tokens".into(), Value::from(p + c));
        }
    }

    /// The next part comes from another replica.
    pub fn next_part(&mut self) {
        self.part += 1;
        self.tokens_before_part = self.tokens;
    }

    /// Why the answer cannot be continued from what the client has, if
    /// it cannot; `Ok(false)` when it needs no continuation (it ended).
    pub fn needs_continuation(&self) -> Result<bool, NotContinued> {
        if self.done || self.finished || self.errored {
            return Ok(false);
        }
        match self.blocked {
            Some(why) => Err(why),
            None => Ok(true),
        }
    }

    /// The first event has reached the client.
    pub fn started(&self) -> bool {
        self.stamp.is_some()
    }

    /// What ends an answer that has every token but its end: the final
    /// chunk (`length`: it had every token asked for) of a chat or a
    /// completion unless it was sent, then `[DONE]`.
    pub fn ending(&self, chat: bool) -> Bytes {
        let mut out = String::new();
        if self.done {
            return Bytes::new();
        }
        if !self.finished {
            let (object, choice) = if chat {
                let choice =
                    serde_json::json!({"index": 0, "delta": {}, "finish_reason": "length"});
                ("chat.completion.chunk", choice)
            } else {
                let choice = serde_json::json!({"index": 0, "text": "", "finish_reason": "length"});
                ("text_completion", choice)
            };
            let stamp = self.stamp.clone().unwrap_or(Stamp {
                id: None,
                created: None,
                model: None,
            });
            let chunk = serde_json::json!({
                "id": stamp.id,
                "object": object,
                "created": stamp.created,
                "model": stamp.model,
                "choices": [choice],
            });
            out.push_str(&format!("data: {chunk}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        Bytes::from(out)
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The prompt's and the answer's token ids, when the engine reported
    /// both.
    pub fn token_ids(&self) -> Option<(&[u32], &[u32])> {
        Some((
            self.prompt_token_ids.as_deref()?,
            self.token_ids.as_deref().filter(|_| self.tokens > 0)?,
        ))
    }

    pub fn parts(&self) -> u32 {
        self.part + 1
    }

    /// A finish reason was sent, or `[DONE]`.
    pub fn ended(&self) -> bool {
        self.done || self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(content: &str) -> String {
        format!(
            "data: {{\"id\":\"a\",\"created\":1,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{content:?}}},\"finish_reason\":null}}]}}\n\n"
        )
    }

    fn relay_all(t: &mut Transcript, events: &str) -> String {
        String::from_utf8(t.relay(Bytes::from(events.to_owned())).to_vec()).unwrap()
    }

    #[test]
    fn the_first_part_passes_unchanged_and_is_read() {
        let mut t = Transcript::new(1024);
        let events = format!("{}{}", chat("Hello"), chat(" world"));
        assert_eq!(relay_all(&mut t, &events), events);
        assert_eq!(t.text(), "Hello world");
        assert_eq!(t.tokens(), 2);
        assert_eq!(t.needs_continuation(), Ok(true));
        relay_all(
            &mut t,
            "data: {\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        );
        assert_eq!(t.needs_continuation(), Ok(false));
    }

    #[test]
    fn a_continuation_is_stamped_as_the_first_part_and_counts_the_whole_answer() {
        let mut t = Transcript::new(1024);
        relay_all(&mut t, &format!("{}{}", chat("Hello"), chat(" world")));
        t.next_part();
        let second = concat!(
            "data: {\"id\":\"b\",\"created\":9,\"model\":\"m2\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"b\",\"created\":9,\"model\":\"m2\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"id\":\"b\",\"created\":9,\"model\":\"m2\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":1,\"total_tokens\":13}}\n\n",
            "data: [DONE]\n\n",
        );
        let out = relay_all(&mut t, second);
        let events: Vec<_> = out.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 3, "the role-only opening is dropped: {out}");
        let text: Value = serde_json::from_str(events[0].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(text["id"], "a");
        assert_eq!(text["created"], 1);
        assert_eq!(text["model"], "m");
        assert_eq!(text["choices"][0]["delta"]["content"], "!");
        let usage: Value = serde_json::from_str(events[1].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(usage["usage"]["prompt_tokens"], 10);
        assert_eq!(usage["usage"]["completion_tokens"], 3);
        assert_eq!(usage["usage"]["total_tokens"], 13);
        assert_eq!(events[2], "data: [DONE]");
        assert_eq!(t.text(), "Hello world!");
        assert_eq!(t.needs_continuation(), Ok(false));
    }

    #[test]
    fn what_cannot_be_continued_is_named() {
        let cases = [
            (
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\"}}]}}]}\n\n",
                NotContinued::ToolCall,
            ),
            (
                "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"x\"}}]}\n\n",
                NotContinued::SeveralChoices,
            ),
            (
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n",
                NotContinued::Reasoning,
            ),
            ("data: {not json\n\n", NotContinued::Unreadable),
        ];
        for (event, why) in cases {
            let mut t = Transcript::new(1024);
            relay_all(&mut t, event);
            assert_eq!(t.needs_continuation(), Err(why), "{event}");
        }
        let mut t = Transcript::new(4);
        relay_all(&mut t, &chat("too long"));
        assert_eq!(t.needs_continuation(), Err(NotContinued::TooLong));
    }

    #[test]
    fn token_ids_are_kept_while_every_event_has_them() {
        let mut t = Transcript::new(1024);
        relay_all(
            &mut t,
            concat!(
                "data: {\"choices\":[{\"index\":0,\"text\":\"a\",\"token_ids\":[5],\"prompt_token_ids\":[1,2]}]}\n\n",
                "data: {\"choices\":[{\"index\":0,\"text\":\" b\",\"token_ids\":[6,7]}]}\n\n",
            ),
        );
        let (prompt, answer) = t.token_ids().unwrap();
        assert_eq!((prompt, answer), (&[1, 2][..], &[5, 6, 7][..]));
        assert_eq!(t.tokens(), 3);
        relay_all(
            &mut t,
            "data: {\"choices\":[{\"index\":0,\"text\":\"c\"}]}\n\n",
        );
        assert!(t.token_ids().is_none());
        assert_eq!(t.tokens(), 4);
    }
}
