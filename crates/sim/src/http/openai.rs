//! The OpenAI wire format as vLLM speaks it: the request fields the simulator
//! reads, and the response, chunk and usage objects it writes.
//!
//! A chat's prompt follows vLLM's template flags: `add_generation_prompt`
//! (true unless false) closes the conversation with the assistant header
//! that asks for a reply; `continue_final_message: true` instead leaves the
//! final message open (no end of turn, no new header) for the model to go
//! on with it, and both set true is vLLM's 400. Without the flag, vLLM (and
//! SGLang, TGI) answers a conversation that ends with an assistant message
//! with a new assistant turn; llama.cpp's server continues that message by
//! itself (its assistant prefill), so a replica speaking the `llamacpp`
//! dialect continues it unless `continue_final_message` is false. A
//! continued assistant message that is the beginning of the answer the
//! conversation before it gets is resumed exactly (see `output`).
//!
//! `return_token_ids: true` (vLLM) adds the ids: a chat's response (and its
//! stream's first chunk) carries `prompt_token_ids`, each choice (and each
//! chunk's choice) the `token_ids` it generated; completions carry both per
//! choice, `prompt_token_ids` on the first chunk only.

use bytes::Bytes;
use kv_events::tokenizer::{self, ChatTurn, special};
use serde::{Deserialize, Serialize};

use super::output::{self, Resume};

/// `POST /v1/chat/completions`. Fields the simulator does not model
/// (temperature, tools, ...) are accepted and ignored.
#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    /// vLLM's scheduling priority (lower first); 0 when absent.
    #[serde(default)]
    pub priority: i64,
    /// vLLM's chat template flags (see the module comment).
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// vLLM's: report the prompt's and the answer's token ids.
    #[serde(default)]
    pub return_token_ids: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
}

/// A message's content: a string, or a list of parts of which the text
/// parts count.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(default)]
    pub text: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// As in chat completions.
    #[serde(default)]
    pub priority: i64,
    /// As in chat completions.
    #[serde(default)]
    pub return_token_ids: Option<bool>,
}

/// A completion prompt: text, or token ids; batches of one are accepted.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    TextBatch(Vec<String>),
    TokenBatch(Vec<Vec<u32>>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
    #[serde(default)]
    pub continuous_usage_stats: Option<bool>,
}

/// `POST /tokenize`, vLLM's two shapes in one: `messages` (with
/// `add_generation_prompt`, true unless false) tokenizes a chat, else
/// `prompt` a completion prompt. Other fields (`add_special_tokens`, ...)
/// are accepted and ignored, as the generating endpoints ignore them, so
/// the ids are always the ones a generation of the same body would use.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<ChatMessage>>,
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    #[serde(default)]
    pub prompt: Option<Prompt>,
}

/// A prompt as the engine gets it, and the answer it continues, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTokens {
    pub tokens: Vec<u32>,
    pub resume: Option<Resume>,
}

impl ChatCompletionRequest {
    /// The prompt's token ids after the chat template, and whether it
    /// resumes an answer; `continue_by_default` is llama.cpp's continuing
    /// of a final assistant message. `Err` for contradicting flags.
    pub fn prompt(&self, seed: u64, continue_by_default: bool) -> Result<PromptTokens, String> {
        chat_prompt(
            &self.messages,
            self.add_generation_prompt,
            self.continue_final_message,
            seed,
            continue_by_default,
        )
    }

    /// The prompt's token ids after the chat template (as vLLM renders it).
    #[cfg(test)]
    pub fn prompt_tokens(&self) -> Vec<u32> {
        self.prompt(0, false)
            .map(|prompt| prompt.tokens)
            .unwrap_or_default()
    }

    /// `max_completion_tokens`, else the deprecated `max_tokens`.
    pub fn requested_max_tokens(&self) -> Option<i64> {
        self.max_completion_tokens.or(self.max_tokens)
    }
}

impl MessageContent {
    /// The text the model reads: the string, or the text parts joined by
    /// newlines.
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(text) => text.clone(),
            MessageContent::Parts(parts) => parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// A conversation's token ids after the chat template: what the engine
/// gets for a chat (with the generation prompt), and what `/tokenize`
/// answers.
pub fn chat_tokens(messages: &[ChatMessage], add_generation_prompt: bool) -> Vec<u32> {
    let texts: Vec<(&str, String)> = messages
        .iter()
        .map(|m| (m.role.as_str(), m.text()))
        .collect();
    tokenizer::encode_chat_template(
        texts
            .iter()
            .map(|(role, content)| ChatTurn { role, content }),
        add_generation_prompt,
    )
}

/// A chat's prompt under vLLM's template flags (see the module comment),
/// and the answer it resumes when it continues an assistant message that
/// is the beginning of the answer to the conversation before it.
pub fn chat_prompt(
    messages: &[ChatMessage],
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    seed: u64,
    continue_by_default: bool,
) -> Result<PromptTokens, String> {
    if continue_final_message == Some(true) && add_generation_prompt == Some(true) {
        return Err(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
                .to_owned(),
        );
    }
    let last = messages.last();
    let ends_with_assistant = last.is_some_and(|m| m.role == "assistant");
    let continues = continue_final_message
        .unwrap_or(continue_by_default && ends_with_assistant && add_generation_prompt.is_none());
    let Some(last) = last.filter(|_| continues) else {
        return Ok(PromptTokens {
            tokens: chat_tokens(messages, add_generation_prompt.unwrap_or(true)),
            resume: None,
        });
    };
    let partial = last.text();
    if ends_with_assistant {
        // The conversation before the message, asking for it, then the
        // message so far: the head's prompt followed by the answer's start.
        let head = chat_tokens(&messages[..messages.len() - 1], true);
        let resume = output::resume_chat(seed, &head, &partial);
        let mut tokens = head;
        tokenizer::encode_into(&partial, &mut tokens);
        return Ok(PromptTokens { tokens, resume });
    }
    // Any other message is left open too: the template without its end of turn.
    let mut tokens = chat_tokens(messages, false);
    if tokens.last() == Some(&special::END_OF_TURN) {
        tokens.pop();
    }
    Ok(PromptTokens {
        tokens,
        resume: None,
    })
}

impl ChatMessage {
    /// The text the model reads (none for a message without content).
    pub fn text(&self) -> String {
        self.content
            .as_ref()
            .map(MessageContent::text)
            .unwrap_or_default()
    }
}

impl CompletionRequest {
    /// The prompt's token ids; `Err` for batches of more than one prompt.
    #[cfg(test)]
    pub fn prompt_tokens(&self) -> Result<Vec<u32>, String> {
        self.prompt.tokens()
    }
}

impl Prompt {
    /// The token ids the engine gets and the answer they resume, if any;
    /// `Err` for batches of more than one prompt.
    pub fn resolve(&self, seed: u64) -> Result<PromptTokens, String> {
        let tokens = self.tokens()?;
        let resume = match self {
            Prompt::Text(text) => output::resume_text(seed, text),
            Prompt::TextBatch(texts) => output::resume_text(seed, &texts[0]),
            Prompt::Tokens(_) | Prompt::TokenBatch(_) => output::resume_ids(seed, &tokens),
        };
        Ok(PromptTokens { tokens, resume })
    }

    /// The token ids the engine gets; `Err` for batches of more than one
    /// prompt.
    pub fn tokens(&self) -> Result<Vec<u32>, String> {
        match self {
            Prompt::Text(text) => Ok(tokenizer::encode_prompt(text)),
            Prompt::Tokens(ids) => Ok(ids.clone()),
            Prompt::TextBatch(texts) if texts.len() == 1 => Ok(tokenizer::encode_prompt(&texts[0])),
            Prompt::TokenBatch(batch) if batch.len() == 1 => Ok(batch[0].clone()),
            _ => Err(
                "the simulator serves one prompt per request; send batches as separate requests"
                    .to_owned(),
            ),
        }
    }
}

impl StreamOptions {
    pub fn include_usage(options: Option<&StreamOptions>) -> bool {
        options.and_then(|o| o.include_usage).unwrap_or(false)
    }

    pub fn continuous_usage(options: Option<&StreamOptions>) -> bool {
        options
            .and_then(|o| o.continuous_usage_stats)
            .unwrap_or(false)
    }
}

/// `usage` of responses and of the final stream chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
    pub completion_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32, cached_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// Which endpoint's objects a response is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// What every chunk and response of one request repeats.
#[derive(Debug, Clone)]
pub struct ResponseHeader {
    pub endpoint: Endpoint,
    pub id: String,
    pub created: u64,
    pub model: String,
}

impl ResponseHeader {
    pub fn new(endpoint: Endpoint, model: String) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completions => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{:032x}", rand::random::<u128>()),
            created: unix_now(),
            model,
        }
    }

    /// One SSE event: `data: {chunk}\n\n`. For chat, `role` marks the opening
    /// chunk; `finish_reason` closes the choice; `usage` rides along when
    /// continuous usage stats are on.
    pub fn chunk(
        &self,
        role: Option<&str>,
        text: &str,
        finish_reason: Option<&str>,
        usage: Option<Usage>,
    ) -> Bytes {
        self.chunk_with_ids(role, text, finish_reason, usage, ChunkIds::default())
    }

    /// [`chunk`](Self::chunk) with `return_token_ids`' fields.
    pub fn chunk_with_ids(
        &self,
        role: Option<&str>,
        text: &str,
        finish_reason: Option<&str>,
        usage: Option<Usage>,
        ids: ChunkIds<'_>,
    ) -> Bytes {
        let (top_prompt_ids, choice_prompt_ids) = match self.endpoint {
            Endpoint::Chat => (ids.prompt, None),
            Endpoint::Completions => (None, ids.prompt),
        };
        let choice = StreamChoice {
            index: 0,
            delta: match self.endpoint {
                Endpoint::Chat => Some(Delta {
                    role,
                    content: text,
                }),
                Endpoint::Completions => None,
            },
            text: match self.endpoint {
                Endpoint::Chat => None,
                Endpoint::Completions => Some(text),
            },
            logprobs: None,
            finish_reason,
            stop_reason: finish_reason.map(|_| None),
            prompt_token_ids: choice_prompt_ids,
            token_ids: ids.tokens,
        };
        self.event(&StreamChunk {
            id: &self.id,
            object: self.chunk_object(),
            created: self.created,
            model: &self.model,
            choices: std::slice::from_ref(&choice),
            usage,
            prompt_token_ids: top_prompt_ids,
        })
    }

    /// The `include_usage` chunk: empty `choices` and the final usage.
    pub fn usage_chunk(&self, usage: Usage) -> Bytes {
        self.event(&StreamChunk {
            id: &self.id,
            object: self.chunk_object(),
            created: self.created,
            model: &self.model,
            choices: &[],
            usage: Some(usage),
            prompt_token_ids: None,
        })
    }

    /// The whole (non-streaming) response, with `return_token_ids`' fields
    /// when `ids` has the prompt's and the answer's.
    pub fn response_with_ids(
        &self,
        text: &str,
        finish_reason: &str,
        usage: Usage,
        ids: Option<(&[u32], &[u32])>,
    ) -> serde_json::Value {
        let mut response = self.response(text, finish_reason, usage);
        if let Some((prompt, tokens)) = ids {
            let choice = &mut response["choices"][0];
            choice["token_ids"] = serde_json::json!(tokens);
            match self.endpoint {
                Endpoint::Chat => response["prompt_token_ids"] = serde_json::json!(prompt),
                Endpoint::Completions => choice["prompt_token_ids"] = serde_json::json!(prompt),
            }
        }
        response
    }

    /// The whole (non-streaming) response.
    pub fn response(&self, text: &str, finish_reason: &str, usage: Usage) -> serde_json::Value {
        match self.endpoint {
            Endpoint::Chat => serde_json::json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "tool_calls": []},
                    "logprobs": null,
                    "finish_reason": finish_reason,
                    "stop_reason": null,
                }],
                "usage": usage,
                "prompt_logprobs": null,
            }),
            Endpoint::Completions => serde_json::json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "choices": [{
                    "index": 0,
                    "text": text,
                    "logprobs": null,
                    "finish_reason": finish_reason,
                    "stop_reason": null,
                    "prompt_logprobs": null,
                }],
                "usage": usage,
            }),
        }
    }

    fn chunk_object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completions => "text_completion",
        }
    }

    fn event(&self, chunk: &StreamChunk<'_>) -> Bytes {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"data: ");
        serde_json::to_writer(&mut out, chunk).expect("chunks serialize");
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }
}

/// The SSE terminator.
pub const DONE_EVENT: &[u8] = b"data: [DONE]\n\n";

/// An error inside an already started stream, as vLLM sends it.
pub fn error_event(error: &serde_json::Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, error).expect("errors serialize");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The token ids one chunk reports (`return_token_ids`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ChunkIds<'a> {
    /// The prompt's, on the first chunk.
    pub prompt: Option<&'a [u32]>,
    /// The ones generated in this chunk.
    pub tokens: Option<&'a [u32]>,
}

#[derive(Serialize)]
struct StreamChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [StreamChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
    /// Chat: the prompt's ids, on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
}

#[derive(Serialize)]
struct StreamChoice<'a> {
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<Delta<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    logprobs: Option<()>,
    finish_reason: Option<&'a str>,
    /// Present (as null) on the closing chunk, as vLLM writes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Option<()>>,
    /// Completions: the prompt's ids, on the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_token_ids: Option<&'a [u32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token_ids: Option<&'a [u32]>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'a str>,
    content: &'a str,
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_event(bytes: &Bytes) -> serde_json::Value {
        let text = std::str::from_utf8(bytes).unwrap();
        let json = text
            .strip_prefix("data: ")
            .unwrap()
            .strip_suffix("\n\n")
            .unwrap();
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn chat_chunks_have_the_openai_shape() {
        let header = ResponseHeader::new(Endpoint::Chat, "m".into());
        assert!(header.id.starts_with("chatcmpl-"));
        let opening = parse_event(&header.chunk(Some("assistant"), "", None, None));
        assert_eq!(opening["object"], "chat.completion.chunk");
        assert_eq!(opening["model"], "m");
        assert_eq!(
            opening["choices"][0]["delta"],
            serde_json::json!({"role": "assistant", "content": ""})
        );
        assert_eq!(
            opening["choices"][0]["finish_reason"],
            serde_json::Value::Null
        );
        assert!(opening.get("usage").is_none());

        let last = parse_event(&header.chunk(None, " end", Some("length"), None));
        assert_eq!(
            last["choices"][0]["delta"],
            serde_json::json!({"content": " end"})
        );
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert!(
            last["choices"][0]
                .as_object()
                .unwrap()
                .contains_key("stop_reason")
        );

        let usage = parse_event(&header.usage_chunk(Usage::new(10, 5, 4)));
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(
            usage["usage"],
            serde_json::json!({"prompt_tokens": 10, "total_tokens": 15, "completion_tokens": 5,
                               "prompt_tokens_details": {"cached_tokens": 4}})
        );
    }

    #[test]
    fn completion_chunks_carry_text() {
        let header = ResponseHeader::new(Endpoint::Completions, "m".into());
        let chunk = parse_event(&header.chunk(None, " word", None, Some(Usage::new(3, 1, 0))));
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["choices"][0]["text"], " word");
        assert!(chunk["choices"][0].get("delta").is_none());
        assert_eq!(chunk["usage"]["completion_tokens"], 1);
        let response = header.response("a b", "stop", Usage::new(3, 2, 0));
        assert_eq!(response["choices"][0]["text"], "a b");
        assert_eq!(response["usage"]["total_tokens"], 5);
    }

    #[test]
    fn requests_parse_content_parts_and_batches() {
        let chat: ChatCompletionRequest = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi there"}]}],
                "max_completion_tokens":5,"max_tokens":9,"temperature":0.2}"#,
        )
        .unwrap();
        assert_eq!(chat.requested_max_tokens(), Some(5));
        let plain: ChatCompletionRequest =
            serde_json::from_str(r#"{"messages":[{"role":"user","content":"hi there"}]}"#).unwrap();
        assert_eq!(chat.prompt_tokens(), plain.prompt_tokens());
        assert_eq!(plain.model, None);

        let one: CompletionRequest =
            serde_json::from_str(r#"{"model":"m","prompt":["hello"]}"#).unwrap();
        let text: CompletionRequest =
            serde_json::from_str(r#"{"model":"m","prompt":"hello"}"#).unwrap();
        assert_eq!(one.prompt_tokens().unwrap(), text.prompt_tokens().unwrap());
        let ids: CompletionRequest = serde_json::from_str(r#"{"prompt":[1,2,3]}"#).unwrap();
        assert_eq!(ids.prompt_tokens().unwrap(), [1, 2, 3]);
        let batch: CompletionRequest = serde_json::from_str(r#"{"prompt":["a","b"]}"#).unwrap();
        assert!(batch.prompt_tokens().is_err());
        assert!(serde_json::from_str::<ChatCompletionRequest>(r#"{"model":"m"}"#).is_err());
    }

    fn messages(json: serde_json::Value) -> Vec<ChatMessage> {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_final_assistant_message_is_continued_only_when_asked() {
        let question = messages(serde_json::json!([{"role": "user", "content": "hi"}]));
        let head = chat_tokens(&question, true);
        let answer = output::Filler::new(output::content_seed(3, &head)).text(4);
        let partial = messages(serde_json::json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": answer},
        ]));

        let continued = chat_prompt(&partial, Some(false), Some(true), 3, false).unwrap();
        let mut expected = head.clone();
        expected.extend(tokenizer::encode(&answer));
        assert_eq!(
            continued.tokens, expected,
            "the head, then the message so far"
        );
        assert_eq!(continued.resume.unwrap().generated, 4);
        assert_eq!(
            continued.tokens,
            chat_prompt(&partial, None, Some(true), 3, false)
                .unwrap()
                .tokens
        );

        // vLLM: without the flag, a new assistant turn.
        let new_turn = chat_prompt(&partial, None, None, 3, false).unwrap();
        assert_eq!(new_turn.tokens, chat_tokens(&partial, true));
        assert_eq!(new_turn.resume, None);
        // llama.cpp continues by itself, unless told not to.
        assert_eq!(
            chat_prompt(&partial, None, None, 3, true).unwrap(),
            continued
        );
        assert_eq!(
            chat_prompt(&partial, None, Some(false), 3, true).unwrap(),
            new_turn
        );
        // A user message is never continued by default.
        assert_eq!(
            chat_prompt(&question, None, None, 3, true).unwrap().tokens,
            head
        );
        let open_user = chat_prompt(&question, None, Some(true), 3, false).unwrap();
        assert_eq!(open_user.tokens.last(), tokenizer::encode("hi").last());
        assert_eq!(open_user.resume, None);

        let both = chat_prompt(&partial, Some(true), Some(true), 3, false).unwrap_err();
        assert!(both.contains("Cannot set both"), "{both}");
        assert_eq!(
            chat_prompt(&question, Some(false), None, 3, false)
                .unwrap()
                .tokens,
            chat_tokens(&question, false)
        );
    }

    #[test]
    fn token_ids_ride_on_chunks_and_responses() {
        let chat = ResponseHeader::new(Endpoint::Chat, "m".into());
        let ids = ChunkIds {
            prompt: Some(&[1, 2]),
            tokens: None,
        };
        let opening = parse_event(&chat.chunk_with_ids(Some("assistant"), "", None, None, ids));
        assert_eq!(opening["prompt_token_ids"], serde_json::json!([1, 2]));
        assert!(opening["choices"][0].get("token_ids").is_none());
        let ids = ChunkIds {
            prompt: None,
            tokens: Some(&[7]),
        };
        let token = parse_event(&chat.chunk_with_ids(None, " a", None, None, ids));
        assert_eq!(token["choices"][0]["token_ids"], serde_json::json!([7]));
        assert!(token.get("prompt_token_ids").is_none());
        let response =
            chat.response_with_ids("a", "stop", Usage::new(2, 1, 0), Some((&[1, 2], &[7])));
        assert_eq!(response["prompt_token_ids"], serde_json::json!([1, 2]));
        assert_eq!(response["choices"][0]["token_ids"], serde_json::json!([7]));

        let completion = ResponseHeader::new(Endpoint::Completions, "m".into());
        let ids = ChunkIds {
            prompt: Some(&[1, 2]),
            tokens: Some(&[7]),
        };
        let first = parse_event(&completion.chunk_with_ids(None, "a", None, None, ids));
        assert_eq!(
            first["choices"][0]["prompt_token_ids"],
            serde_json::json!([1, 2])
        );
        assert_eq!(first["choices"][0]["token_ids"], serde_json::json!([7]));
        assert!(first.get("prompt_token_ids").is_none());
        let response =
            completion.response_with_ids("a", "stop", Usage::new(2, 1, 0), Some((&[1, 2], &[7])));
        assert_eq!(
            response["choices"][0]["prompt_token_ids"],
            serde_json::json!([1, 2])
        );
        assert!(
            completion.response("a", "stop", Usage::new(2, 1, 0))["choices"][0]
                .get("token_ids")
                .is_none()
        );
    }
}
