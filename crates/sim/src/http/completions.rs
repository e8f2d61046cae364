//! `POST /v1/chat/completions` and `POST /v1/completions`: parse, check the
//! model and the context window, hand the prompt to the engine, and answer
//! as the tokens come — one SSE event per token when streaming.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use hyper::body::Incoming;

use super::body::{ApiError, ResponseBody, json, read_body};
use super::generate::{self, EventStream, Prompt, Started, StreamWriter};
use super::openai::{
    ChatCompletionRequest, CompletionRequest, DONE_EVENT, Endpoint, ResponseHeader, StreamOptions,
    Usage, error_event,
};
use super::output::{Filler, OutputPlan};
use super::state::AppState;
use crate::replica::RequestEvent;

/// What both endpoints reduce a request to.
struct Parsed {
    prompt: Prompt,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
}

pub(super) async fn handle(
    state: Arc<AppState>,
    body: Incoming,
    endpoint: Endpoint,
) -> Response<ResponseBody> {
    match generate(state, body, endpoint).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn generate(
    state: Arc<AppState>,
    body: Incoming,
    endpoint: Endpoint,
) -> Result<Response<ResponseBody>, ApiError> {
    generate::faults(&state).await?;
    let bytes = read_body(body).await?;
    let parsed = parse(&bytes, endpoint)?;
    let mut started = generate::start(&state, parsed.prompt)?;
    let header = ResponseHeader::new(endpoint, started.model.clone());

    if parsed.stream {
        let usage = UsageOptions {
            include: parsed.include_usage,
            continuous: parsed.continuous_usage,
        };
        let Started {
            request,
            plan,
            prompt_tokens,
            ..
        } = started;
        let writer = ChunkWriter::new(header, plan, prompt_tokens, usage);
        return Ok(EventStream::new(request, writer, Vec::new()).into_response());
    }
    let (finished, text) = generate::answer(&mut started).await?;
    let tokens = finished.tokens;
    let usage = Usage::new(tokens.prompt, tokens.completion, tokens.cached);
    Ok(json(
        StatusCode::OK,
        &header.response(&text, finished.finish.as_str(), usage),
    ))
}

fn parse(bytes: &[u8], endpoint: Endpoint) -> Result<Parsed, ApiError> {
    let invalid =
        |e: serde_json::Error| ApiError::bad_request(format!("Invalid request body: {e}"));
    match endpoint {
        Endpoint::Chat => {
            let request: ChatCompletionRequest = serde_json::from_slice(bytes).map_err(invalid)?;
            let options = request.stream_options.as_ref();
            Ok(Parsed {
                prompt: Prompt {
                    tokens: request.prompt_tokens(),
                    max_tokens: request.requested_max_tokens(),
                    priority: request.priority,
                    model: request.model,
                },
                stream: request.stream.unwrap_or(false),
                include_usage: StreamOptions::include_usage(options),
                continuous_usage: StreamOptions::continuous_usage(options),
            })
        }
        Endpoint::Completions => {
            let request: CompletionRequest = serde_json::from_slice(bytes).map_err(invalid)?;
            let prompt = request
                .prompt_tokens()
                .map_err(|message| ApiError::bad_request(message).with_param("prompt"))?;
            let options = request.stream_options.as_ref();
            Ok(Parsed {
                prompt: Prompt {
                    tokens: prompt,
                    max_tokens: request.max_tokens,
                    priority: request.priority,
                    model: request.model,
                },
                stream: request.stream.unwrap_or(false),
                include_usage: StreamOptions::include_usage(options),
                continuous_usage: StreamOptions::continuous_usage(options),
            })
        }
    }
}

/// `stream_options`: a final usage chunk, and usage on every chunk.
#[derive(Debug, Clone, Copy)]
struct UsageOptions {
    include: bool,
    continuous: bool,
}

/// Chat and completion chunks: one `data:` event per token as the engine
/// produces it, then `data: [DONE]`.
struct ChunkWriter {
    header: ResponseHeader,
    filler: Filler,
    /// Tokens the answer will have unless aborted.
    planned_tokens: u32,
    finish_reason: &'static str,
    prompt_tokens: u32,
    cached_tokens: u32,
    sent_tokens: u32,
    finish_sent: bool,
    include_usage: bool,
    continuous_usage: bool,
}

impl ChunkWriter {
    fn new(
        header: ResponseHeader,
        plan: OutputPlan,
        prompt_tokens: u32,
        usage: UsageOptions,
    ) -> Self {
        Self {
            header,
            filler: Filler::new(plan.content_seed),
            planned_tokens: plan.max_tokens,
            finish_reason: if plan.limited_by_max_tokens {
                "length"
            } else {
                "stop"
            },
            prompt_tokens,
            cached_tokens: 0,
            sent_tokens: 0,
            finish_sent: false,
            include_usage: usage.include,
            continuous_usage: usage.continuous,
        }
    }

    fn push_token(&mut self, out: &mut VecDeque<Bytes>) {
        self.sent_tokens += 1;
        let last = self.sent_tokens >= self.planned_tokens;
        let finish_reason = last.then_some(self.finish_reason);
        self.finish_sent |= last;
        let text = self.filler.next_token();
        let usage = self.running_usage(self.sent_tokens);
        out.push_back(self.header.chunk(None, text, finish_reason, usage));
    }

    fn running_usage(&self, completion_tokens: u32) -> Option<Usage> {
        (self.include_usage && self.continuous_usage)
            .then(|| Usage::new(self.prompt_tokens, completion_tokens, self.cached_tokens))
    }
}

impl StreamWriter for ChunkWriter {
    fn on_event(&mut self, event: Option<RequestEvent>, out: &mut VecDeque<Bytes>) -> bool {
        match event {
            Some(RequestEvent::FirstToken { cached_tokens }) => {
                self.cached_tokens = cached_tokens;
                if self.header.endpoint == Endpoint::Chat {
                    // vLLM opens a chat stream with the role once output starts.
                    let usage = self.running_usage(0);
                    out.push_back(self.header.chunk(Some("assistant"), "", None, usage));
                }
                self.push_token(out);
                false
            }
            Some(RequestEvent::Token) => {
                self.push_token(out);
                false
            }
            Some(RequestEvent::Finished { tokens, .. }) => {
                if !self.finish_sent {
                    let usage = self.running_usage(self.sent_tokens);
                    let reason = Some(self.finish_reason);
                    out.push_back(self.header.chunk(None, "", reason, usage));
                }
                if self.include_usage {
                    let usage = Usage::new(tokens.prompt, tokens.completion, tokens.cached);
                    out.push_back(self.header.usage_chunk(usage));
                }
                out.push_back(Bytes::from_static(DONE_EVENT));
                true
            }
            Some(RequestEvent::Rejected { reason }) => {
                out.push_back(error_event(&ApiError::bad_request(reason).body()));
                out.push_back(Bytes::from_static(DONE_EVENT));
                true
            }
            // The engine stopped: end the stream without [DONE], as a
            // crashed server would.
            None => true,
        }
    }
}
