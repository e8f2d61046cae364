//! The OpenAI wire format as vLLM speaks it: the request fields the simulator
//! reads, and the response, chunk and usage objects it writes.

use bytes::Bytes;
use kv_events::tokenizer::{self, ChatTurn};
use serde::{Deserialize, Serialize};

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
    pub prompt: Option<Prompt>,
}

impl ChatCompletionRequest {
    /// The prompt's token ids after the chat template.
    pub fn prompt_tokens(&self) -> Vec<u32> {
        chat_tokens(&self.messages, true)
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
        .map(|m| {
            let content = m.content.as_ref().map(MessageContent::text);
            (m.role.as_str(), content.unwrap_or_default())
        })
        .collect();
    tokenizer::encode_chat_template(
        texts
            .iter()
            .map(|(role, content)| ChatTurn { role, content }),
        add_generation_prompt,
    )
}

impl CompletionRequest {
    /// The prompt's token ids; `Err` for batches of more than one prompt.
    pub fn prompt_tokens(&self) -> Result<Vec<u32>, String> {
        self.prompt.tokens()
    }
}

impl Prompt {
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
        };
        self.event(&StreamChunk {
            id: &self.id,
            object: self.chunk_object(),
            created: self.created,
            model: &self.model,
            choices: std::slice::from_ref(&choice),
            usage,
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
        })
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

#[derive(Serialize)]
struct StreamChunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: &'a [StreamChoice<'a>],
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
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
}
