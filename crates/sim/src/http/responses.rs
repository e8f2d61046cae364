//! `POST /v1/responses`: OpenAI's Responses API on the same machinery as
//! chat completions. `input` is a string (one user message) or a list of
//! messages; `instructions` goes first as a system message; the prompt then
//! goes through the chat template. Streaming sends the Responses event
//! sequence (`response.created`, `response.in_progress`, the output item and
//! content part events, one `response.output_text.delta` per token, then
//! `response.completed`, or `response.incomplete` when `max_output_tokens`
//! cut the answer), each as `event: TYPE` + `data: {...}`, with no
//! `[DONE]` at the end.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use hyper::body::Incoming;
use kv_events::tokenizer::{self, ChatTurn};
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::{ApiError, ResponseBody, json as json_response, read_body};
use super::connection::Kill;
use super::generate::{self, EventStream, Prompt, StreamWriter};
use super::openai::{MessageContent, unix_now};
use super::output::Filler;
use super::state::AppState;
use crate::metrics::{FinishKind, FinishedTokens};
use crate::replica::RequestEvent;

/// The request fields the simulator reads; the rest (tools, reasoning,
/// text format, ...) are accepted and ignored.
#[derive(Debug, Deserialize)]
struct ResponsesRequest {
    #[serde(default)]
    model: Option<String>,
    input: Input,
    #[serde(default)]
    instructions: Option<String>,
    #[serde(default)]
    max_output_tokens: Option<i64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    metadata: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

/// One input item. Messages (`{"role", "content"}`, with or without
/// `"type": "message"`) and tool results (`function_call_output`) count;
/// other items (reasoning, function calls) add nothing to the prompt.
#[derive(Debug, Deserialize)]
struct InputItem {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<MessageContent>,
    #[serde(default)]
    output: Option<Value>,
}

impl ResponsesRequest {
    /// The conversation as chat turns: instructions, then the input.
    fn turns(&self) -> Vec<(String, String)> {
        let mut turns = Vec::new();
        if let Some(instructions) = &self.instructions {
            turns.push(("system".to_owned(), instructions.clone()));
        }
        match &self.input {
            Input::Text(text) => turns.push(("user".to_owned(), text.clone())),
            Input::Items(items) => {
                for item in items {
                    if let Some(content) = &item.content {
                        let role = item.role.clone().unwrap_or_else(|| "user".to_owned());
                        turns.push((role, content.text()));
                    } else if item.kind.as_deref() == Some("function_call_output") {
                        let output = match &item.output {
                            Some(Value::String(text)) => text.clone(),
                            Some(other) => other.to_string(),
                            None => String::new(),
                        };
                        turns.push(("tool".to_owned(), output));
                    }
                }
            }
        }
        turns
    }

    fn prompt_tokens(&self) -> Vec<u32> {
        let turns = self.turns();
        tokenizer::encode_chat(
            turns
                .iter()
                .map(|(role, content)| ChatTurn { role, content }),
        )
    }
}

pub(super) async fn handle(
    state: Arc<AppState>,
    body: Incoming,
    kill: Arc<Kill>,
) -> Response<ResponseBody> {
    match respond(state, body, kill).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn respond(
    state: Arc<AppState>,
    body: Incoming,
    kill: Arc<Kill>,
) -> Result<Response<ResponseBody>, ApiError> {
    generate::faults(&state).await?;
    let bytes = read_body(body).await?;
    let request: ResponsesRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    if request.previous_response_id.is_some() {
        return Err(ApiError::bad_request(
            "The simulator stores no responses; send the whole conversation in `input`.",
        )
        .with_param("previous_response_id"));
    }
    if let Some(n) = request.max_output_tokens.filter(|n| *n < 1) {
        return Err(ApiError::bad_request(format!(
            "max_output_tokens must be at least 1, got {n}."
        ))
        .with_param("max_output_tokens"));
    }
    let prompt = Prompt {
        tokens: request.prompt_tokens(),
        max_tokens: request.max_output_tokens,
        priority: 0,
        model: request.model.clone(),
        resume: None,
    };
    let mut started = generate::start(&state, prompt, kill)?;
    let object = ResponseObject::new(&request, started.model.clone());

    if request.stream.unwrap_or(false) {
        let mut writer = ResponseWriter {
            object,
            filler: started.plan.filler(),
            text: String::new(),
            opened: false,
            sequence: 0,
        };
        let opening = writer.opening();
        return Ok(
            EventStream::new(started.request, writer, opening, started.strike).into_response(),
        );
    }
    let (finished, text) = generate::answer(&mut started).await?;
    Ok(json_response(
        StatusCode::OK,
        &object.finished(&text, finished.finish, finished.tokens),
    ))
}

/// What the response object repeats in every event of one request.
struct ResponseObject {
    id: String,
    message_id: String,
    created_at: u64,
    model: String,
    instructions: Option<String>,
    max_output_tokens: Option<i64>,
    temperature: f64,
    top_p: f64,
    metadata: Value,
}

impl ResponseObject {
    fn new(request: &ResponsesRequest, model: String) -> Self {
        Self {
            id: format!("resp_{:032x}", rand::random::<u128>()),
            message_id: format!("msg_{:032x}", rand::random::<u128>()),
            created_at: unix_now(),
            model,
            instructions: request.instructions.clone(),
            max_output_tokens: request.max_output_tokens,
            temperature: request.temperature.unwrap_or(1.0),
            top_p: request.top_p.unwrap_or(1.0),
            metadata: request.metadata.clone().unwrap_or_else(|| json!({})),
        }
    }

    /// The response object with `status`, its output and usage.
    fn value(&self, status: &str, output: Vec<Value>, usage: Option<Value>) -> Value {
        let incomplete = (status == "incomplete").then(|| json!({"reason": "max_output_tokens"}));
        json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": null,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": true,
            "previous_response_id": null,
            "temperature": self.temperature,
            "text": {"format": {"type": "text"}},
            "tool_choice": "auto",
            "tools": [],
            "top_p": self.top_p,
            "truncation": "disabled",
            "usage": usage,
            "metadata": self.metadata,
        })
    }

    /// The assistant message item; `text` is its one part, when it has one.
    fn message(&self, status: &str, text: Option<&str>) -> Value {
        let content: Vec<Value> = text.map(output_text).into_iter().collect();
        json!({
            "type": "message",
            "id": self.message_id,
            "status": status,
            "role": "assistant",
            "content": content,
        })
    }

    /// The final response: `completed` when the model stopped by itself,
    /// `incomplete` when `max_output_tokens` cut it.
    fn finished(&self, text: &str, finish: FinishKind, tokens: FinishedTokens) -> Value {
        let status = status(finish);
        self.value(
            status,
            vec![self.message(status, Some(text))],
            Some(usage(tokens)),
        )
    }
}

fn status(finish: FinishKind) -> &'static str {
    match finish {
        FinishKind::Stop => "completed",
        FinishKind::Length | FinishKind::Abort => "incomplete",
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn usage(tokens: FinishedTokens) -> Value {
    json!({
        "input_tokens": tokens.prompt,
        "input_tokens_details": {"cached_tokens": tokens.cached},
        "output_tokens": tokens.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": tokens.prompt + tokens.completion,
    })
}

/// The Responses event stream of one request.
struct ResponseWriter {
    object: ResponseObject,
    filler: Filler,
    /// The answer so far, for the `done` events.
    text: String,
    /// Whether the output item and its content part were announced.
    opened: bool,
    sequence: u64,
}

impl ResponseWriter {
    /// `response.created` and `response.in_progress`, sent at once.
    fn opening(&mut self) -> Vec<Bytes> {
        let response = self.object.value("in_progress", Vec::new(), None);
        vec![
            self.event("response.created", json!({"response": response})),
            self.event("response.in_progress", json!({"response": response})),
        ]
    }

    /// One SSE event: `event: TYPE`, then `data:` with the type and the
    /// sequence number added to `fields`.
    fn event(&mut self, kind: &str, mut fields: Value) -> Bytes {
        fields["type"] = json!(kind);
        fields["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        let mut out = format!("event: {kind}\ndata: ").into_bytes();
        serde_json::to_writer(&mut out, &fields).expect("events serialize");
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    }

    /// Fields of the events about the one content part.
    fn part_fields(&self) -> Value {
        json!({"item_id": self.object.message_id, "output_index": 0, "content_index": 0})
    }

    fn open(&mut self, out: &mut VecDeque<Bytes>) {
        if std::mem::replace(&mut self.opened, true) {
            return;
        }
        let item = self.object.message("in_progress", None);
        out.push_back(self.event(
            "response.output_item.added",
            json!({"output_index": 0, "item": item}),
        ));
        let mut fields = self.part_fields();
        fields["part"] = output_text("");
        out.push_back(self.event("response.content_part.added", fields));
    }

    fn push_token(&mut self, out: &mut VecDeque<Bytes>) {
        let delta = self.filler.next_token();
        self.text.push_str(delta);
        let mut fields = self.part_fields();
        fields["delta"] = json!(delta);
        fields["logprobs"] = json!([]);
        out.push_back(self.event("response.output_text.delta", fields));
    }

    fn close(&mut self, finish: FinishKind, tokens: FinishedTokens, out: &mut VecDeque<Bytes>) {
        self.open(out);
        let status = status(finish);
        let mut fields = self.part_fields();
        fields["text"] = json!(self.text);
        out.push_back(self.event("response.output_text.done", fields));
        let mut fields = self.part_fields();
        fields["part"] = output_text(&self.text);
        out.push_back(self.event("response.content_part.done", fields));
        let item = self.object.message(status, Some(&self.text));
        out.push_back(self.event(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        let response = self.object.finished(&self.text, finish, tokens);
        out.push_back(self.event(&format!("response.{status}"), json!({"response": response})));
    }
}

impl StreamWriter for ResponseWriter {
    fn on_event(&mut self, event: Option<RequestEvent>, out: &mut VecDeque<Bytes>) -> bool {
        match event {
            Some(RequestEvent::FirstToken { .. }) => {
                self.open(out);
                self.push_token(out);
                false
            }
            Some(RequestEvent::Token) => {
                self.push_token(out);
                false
            }
            Some(RequestEvent::Finished { tokens, finish }) => {
                self.close(finish, tokens, out);
                true
            }
            Some(RequestEvent::Rejected { reason }) => {
                let error = ApiError::bad_request(reason);
                let fields = json!({"code": error.kind, "message": error.message, "param": null});
                out.push_back(self.event("error", fields));
                true
            }
            // The engine stopped: the stream ends unfinished.
            None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(body: Value) -> ResponsesRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn input_strings_and_message_lists_make_the_same_prompt() {
        let text = request(json!({"input": "Hello there"}));
        let items = request(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Hello there"}]}
        ]}));
        let typed = request(json!({"input": [
            {"type": "message", "role": "user", "content": "Hello there"}
        ]}));
        assert_eq!(text.prompt_tokens(), items.prompt_tokens());
        assert_eq!(text.prompt_tokens(), typed.prompt_tokens());
        let instructed = request(json!({"input": "Hello there", "instructions": "Be brief."}));
        assert!(instructed.prompt_tokens().len() > text.prompt_tokens().len());
        assert_eq!(
            instructed.turns()[0],
            ("system".to_owned(), "Be brief.".to_owned())
        );
        let tool = request(json!({"input": [
            {"role": "user", "content": "weather?"},
            {"type": "function_call", "name": "weather", "arguments": "{}", "call_id": "c1"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ]}));
        let roles: Vec<String> = tool.turns().into_iter().map(|(role, _)| role).collect();
        assert_eq!(roles, ["user", "tool"]);
        assert!(serde_json::from_value::<ResponsesRequest>(json!({"input": 3})).is_err());
    }

    #[test]
    fn events_carry_their_type_and_sequence() {
        let object = ResponseObject::new(&request(json!({"input": "x"})), "m".into());
        let mut writer = ResponseWriter {
            object,
            filler: Filler::new(1),
            text: String::new(),
            opened: false,
            sequence: 0,
        };
        let opening = writer.opening();
        let first = std::str::from_utf8(&opening[0]).unwrap();
        let (head, data) = first.split_once('\n').unwrap();
        assert_eq!(head, "event: response.created");
        let data: Value =
            serde_json::from_str(data.strip_prefix("data: ").unwrap().trim_end()).unwrap();
        assert_eq!(data["type"], "response.created");
        assert_eq!(data["sequence_number"], 0);
        assert_eq!(data["response"]["status"], "in_progress");
        assert_eq!(data["response"]["usage"], Value::Null);

        let mut out = VecDeque::new();
        let tokens = FinishedTokens {
            prompt: 7,
            completion: 2,
            cached: 0,
        };
        writer.on_event(
            Some(RequestEvent::FirstToken { cached_tokens: 0 }),
            &mut out,
        );
        writer.on_event(Some(RequestEvent::Token), &mut out);
        let ended = writer.on_event(
            Some(RequestEvent::Finished {
                tokens,
                finish: FinishKind::Length,
            }),
            &mut out,
        );
        assert!(ended);
        let kinds: Vec<String> = out
            .iter()
            .map(|e| {
                let text = std::str::from_utf8(e).unwrap();
                text.lines().next().unwrap()["event: ".len()..].to_owned()
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.incomplete",
            ]
        );
        assert_eq!(writer.sequence, 10);
    }
}
