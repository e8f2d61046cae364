//! `POST /v1/chat/completions` and `POST /v1/completions`: parse, check the
//! model and the context window, hand the prompt to the engine, and answer
//! as the tokens come — one SSE event per token when streaming.
//!
//! A prompt that continues an answer (a chat's final assistant message it
//! asks to continue, a completion prompt ending with the beginning of its
//! head's answer, as text or token ids) gets the rest of that answer; see
//! `output` for how continuations are recognised and how long they run.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use hyper::body::Incoming;

use super::body::{ApiError, ResponseBody, json, read_body};
use super::connection::Kill;
use super::disaggregated::{Leg, RoomGuard};
use super::generate::{self, EventStream, Prompt, Started, StreamWriter};
use super::openai::{
    ChatCompletionRequest, ChunkIds, CompletionRequest, DONE_EVENT, Endpoint, ResponseHeader,
    StreamOptions, Usage, error_event,
};
use super::output::{Filler, OutputPlan};
use super::state::AppState;
use crate::disaggregation::Release;
use crate::metrics::Dialect;
use crate::replica::{KvHandoff, RequestEvent};

/// What both endpoints reduce a request to.
struct Parsed {
    prompt: Prompt,
    stream: bool,
    include_usage: bool,
    continuous_usage: bool,
    return_token_ids: bool,
}

pub(super) async fn handle(
    state: Arc<AppState>,
    body: Incoming,
    endpoint: Endpoint,
    kill: Arc<Kill>,
) -> Response<ResponseBody> {
    match generate(state, body, endpoint, kill).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn generate(
    state: Arc<AppState>,
    body: Incoming,
    endpoint: Endpoint,
    kill: Arc<Kill>,
) -> Result<Response<ResponseBody>, ApiError> {
    generate::faults(&state).await?;
    let bytes = read_body(body).await?;
    let leg = Leg::of(&bytes, &state.disaggregated)?;
    let mut parsed = parse(&bytes, endpoint, &state)?;
    let prompt_tokens = parsed.prompt.tokens.len() as u32;
    let side = &state.disaggregated;
    // A disaggregated leg: what this replica computes, and what it hands on.
    let mut handoff = KvHandoff::Local;
    let mut hold_for_decode = false;
    let mut room = None;
    match &leg {
        Leg::Whole => {}
        // A streamed prefill leg is answered as any request.
        Leg::VllmPrefill if parsed.stream => {}
        Leg::VllmPrefill => {
            hold_for_decode = true;
            handoff = KvHandoff::Hold;
        }
        Leg::VllmDecode {
            engine_id,
            first_block,
        } => {
            if let Some(link) = side.pull_held(engine_id, *first_block, prompt_tokens) {
                handoff = KvHandoff::Pull(link);
            }
        }
        Leg::SglangPrefill { room: paired } => {
            // The prefill server computes the prompt and its first token
            // only; its own answer is that one token, whole.
            parsed.prompt.max_tokens = Some(1);
            parsed.stream = false;
            room = Some(*paired);
            handoff = KvHandoff::Hold;
        }
        Leg::SglangDecode {
            room: paired,
            bootstrap,
        } => {
            let link = side.wait_room(*paired, bootstrap, prompt_tokens).await?;
            handoff = KvHandoff::Pull(link);
        }
    }
    let room = RoomGuard::new(side, room);
    let prompt_ids = parsed
        .return_token_ids
        .then(|| parsed.prompt.tokens.clone());
    let mut started = generate::start_with(&state, parsed.prompt, kill, handoff)?;
    let held = (handoff == KvHandoff::Hold).then(|| Release {
        engine: state.engine.clone(),
        id: started.request.id(),
    });
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
            strike,
            ..
        } = started;
        let writer = ChunkWriter::new(header, plan, prompt_tokens, usage, prompt_ids);
        return Ok(EventStream::new(request, writer, Vec::new(), strike).into_response());
    }
    let (finished, text) = match generate::answer(&mut started).await {
        Ok(answer) => answer,
        Err(error) => {
            // Nobody will pull what it held.
            if let Some(held) = held {
                held.release();
            }
            return Err(error);
        }
    };
    let tokens = finished.tokens;
    let usage = Usage::new(tokens.prompt, tokens.completion, tokens.cached);
    let answer_ids = prompt_ids
        .as_ref()
        .map(|_| started.plan.filler().ids(tokens.completion));
    let ids = prompt_ids.as_deref().zip(answer_ids.as_deref());
    let mut response = header.response_with_ids(&text, finished.finish.as_str(), usage, ids);
    if let Some(held) = held {
        if hold_for_decode {
            response["kv_transfer_params"] = side.hold_for_remote_decode(tokens.prompt, held);
        } else {
            room.complete(tokens.prompt, held);
        }
    }
    Ok(json(StatusCode::OK, &response))
}

fn parse(bytes: &[u8], endpoint: Endpoint, state: &AppState) -> Result<Parsed, ApiError> {
    let invalid =
        |e: serde_json::Error| ApiError::bad_request(format!("Invalid request body: {e}"));
    match endpoint {
        Endpoint::Chat => {
            let request: ChatCompletionRequest = serde_json::from_slice(bytes).map_err(invalid)?;
            let prompt = request
                .prompt(state.seed, state.dialect == Dialect::Llamacpp)
                .map_err(ApiError::bad_request)?;
            let options = request.stream_options.as_ref();
            Ok(Parsed {
                prompt: Prompt {
                    tokens: prompt.tokens,
                    max_tokens: request.requested_max_tokens(),
                    priority: request.priority,
                    model: request.model,
                    resume: prompt.resume,
                },
                stream: request.stream.unwrap_or(false),
                include_usage: StreamOptions::include_usage(options),
                continuous_usage: StreamOptions::continuous_usage(options),
                return_token_ids: request.return_token_ids.unwrap_or(false),
            })
        }
        Endpoint::Completions => {
            let request: CompletionRequest = serde_json::from_slice(bytes).map_err(invalid)?;
            let prompt = request
                .prompt
                .resolve(state.seed)
                .map_err(|message| ApiError::bad_request(message).with_param("prompt"))?;
            let options = request.stream_options.as_ref();
            Ok(Parsed {
                prompt: Prompt {
                    tokens: prompt.tokens,
                    max_tokens: request.max_tokens,
                    priority: request.priority,
                    model: request.model,
                    resume: prompt.resume,
                },
                stream: request.stream.unwrap_or(false),
                include_usage: StreamOptions::include_usage(options),
                continuous_usage: StreamOptions::continuous_usage(options),
                return_token_ids: request.return_token_ids.unwrap_or(false),
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
    /// With `return_token_ids`: ids are reported, the prompt's on the first
    /// chunk (taken then).
    return_token_ids: bool,
    prompt_ids: Option<Vec<u32>>,
}

impl ChunkWriter {
    fn new(
        header: ResponseHeader,
        plan: OutputPlan,
        prompt_tokens: u32,
        usage: UsageOptions,
        prompt_ids: Option<Vec<u32>>,
    ) -> Self {
        Self {
            header,
            filler: plan.filler(),
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
            return_token_ids: prompt_ids.is_some(),
            prompt_ids,
        }
    }

    fn push_token(&mut self, out: &mut VecDeque<Bytes>) {
        self.sent_tokens += 1;
        let last = self.sent_tokens >= self.planned_tokens;
        let finish_reason = last.then_some(self.finish_reason);
        self.finish_sent |= last;
        let (text, id) = self.filler.next_with_id();
        let usage = self.running_usage(self.sent_tokens);
        let prompt = self.prompt_ids.take();
        let ids = ChunkIds {
            prompt: prompt.as_deref(),
            tokens: self.return_token_ids.then_some(std::slice::from_ref(&id)),
        };
        out.push_back(
            self.header
                .chunk_with_ids(None, text, finish_reason, usage, ids),
        );
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
                    // vLLM opens a chat stream with the role once output
                    // starts, the prompt's ids on it.
                    let usage = self.running_usage(0);
                    let prompt = self.prompt_ids.take();
                    let ids = ChunkIds {
                        prompt: prompt.as_deref(),
                        tokens: None,
                    };
                    out.push_back(self.header.chunk_with_ids(
                        Some("assistant"),
                        "",
                        None,
                        usage,
                        ids,
                    ));
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
