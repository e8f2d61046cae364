//! `POST /v1/chat/completions` and `POST /v1/completions`: parse, check the
//! model and the context window, hand the prompt to the engine, and answer
//! as the tokens come — one SSE event per token when streaming.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame};
use hyper::body::Incoming;

use super::AppState;
use super::body::{ApiError, ResponseBody, boxed, json};
use super::openai::{
    ChatCompletionRequest, CompletionRequest, DONE_EVENT, Endpoint, ResponseHeader, StreamOptions,
    Usage, error_event,
};
use super::output::{self, Filler, OutputPlan};
use crate::replica::{Generation, RequestEvent, RequestHandle};

/// What both endpoints reduce a request to.
struct Parsed {
    model: Option<String>,
    prompt: Vec<u32>,
    max_tokens: Option<i64>,
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
    if state.faults.current().hang {
        // Accepted and never answered; nothing reaches the engine.
        std::future::pending::<()>().await;
    }
    if state.faults.inject_error() {
        return Err(ApiError::internal(
            "Injected fault: the simulated server failed this request.",
        ));
    }
    let bytes = super::read_body(body).await?;
    let parsed = parse(&bytes, endpoint)?;
    let (model, adapter) = state.resolve_model(parsed.model.as_deref())?;
    if parsed.prompt.is_empty() {
        return Err(ApiError::bad_request(
            "The prompt is empty; send at least one token.",
        ));
    }
    let plan = output::plan(
        state.seed,
        &parsed.prompt,
        parsed.max_tokens,
        state.max_model_len,
    )
    .map_err(ApiError::bad_request)?;

    let prompt_tokens = parsed.prompt.len() as u32;
    let usage = UsageOptions {
        include: parsed.include_usage,
        continuous: parsed.continuous_usage,
    };
    let generation = Generation {
        prompt: parsed.prompt,
        max_tokens: plan.max_tokens,
        adapter,
        limited_by_max_tokens: plan.limited_by_max_tokens,
    };
    let request = state.engine.submit(generation).map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "The engine has stopped.",
        )
    })?;
    let header = ResponseHeader::new(endpoint, model);

    if parsed.stream {
        let stream = TokenStream::new(request, header, plan, prompt_tokens, usage);
        let mut response = Response::new(boxed(stream));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        return Ok(response);
    }
    collect(request, header, plan).await
}

fn parse(bytes: &[u8], endpoint: Endpoint) -> Result<Parsed, ApiError> {
    let invalid =
        |e: serde_json::Error| ApiError::bad_request(format!("Invalid request body: {e}"));
    match endpoint {
        Endpoint::Chat => {
            let request: ChatCompletionRequest = serde_json::from_slice(bytes).map_err(invalid)?;
            let options = request.stream_options.as_ref();
            Ok(Parsed {
                prompt: request.prompt_tokens(),
                max_tokens: request.requested_max_tokens(),
                stream: request.stream.unwrap_or(false),
                include_usage: StreamOptions::include_usage(options),
                continuous_usage: StreamOptions::continuous_usage(options),
                model: request.model,
            })
        }
        Endpoint::Completions => {
            let request: CompletionRequest = serde_json::from_slice(bytes).map_err(invalid)?;
            let prompt = request
                .prompt_tokens()
                .map_err(|message| ApiError::bad_request(message).with_param("prompt"))?;
            let options = request.stream_options.as_ref();
            Ok(Parsed {
                prompt,
                max_tokens: request.max_tokens,
                stream: request.stream.unwrap_or(false),
                include_usage: StreamOptions::include_usage(options),
                continuous_usage: StreamOptions::continuous_usage(options),
                model: request.model,
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

/// Waits for the whole answer (non-streaming). If the client goes away, this
/// future is dropped with the request handle, which aborts the request.
async fn collect(
    mut request: RequestHandle,
    header: ResponseHeader,
    plan: OutputPlan,
) -> Result<Response<ResponseBody>, ApiError> {
    loop {
        match request.next().await {
            Some(RequestEvent::FirstToken { .. } | RequestEvent::Token) => {}
            Some(RequestEvent::Finished { tokens, finish }) => {
                let text = Filler::new(plan.content_seed).text(tokens.completion);
                let usage = Usage::new(tokens.prompt, tokens.completion, tokens.cached);
                return Ok(json(
                    StatusCode::OK,
                    &header.response(&text, finish.as_str(), usage),
                ));
            }
            Some(RequestEvent::Rejected { reason }) => return Err(ApiError::bad_request(reason)),
            None => {
                return Err(ApiError::internal(
                    "The engine stopped before the answer was complete.",
                ));
            }
        }
    }
}

/// The SSE body of a streaming answer: one `data:` event per token as the
/// engine produces it. Dropping it (client gone) aborts the request.
struct TokenStream {
    request: RequestHandle,
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
    /// Events ready to be written.
    pending: VecDeque<Bytes>,
    ended: bool,
}

impl TokenStream {
    fn new(
        request: RequestHandle,
        header: ResponseHeader,
        plan: OutputPlan,
        prompt_tokens: u32,
        usage: UsageOptions,
    ) -> Self {
        Self {
            request,
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
            pending: VecDeque::new(),
            ended: false,
        }
    }

    fn on_event(&mut self, event: Option<RequestEvent>) {
        match event {
            Some(RequestEvent::FirstToken { cached_tokens }) => {
                self.cached_tokens = cached_tokens;
                if self.header.endpoint == Endpoint::Chat {
                    // vLLM opens a chat stream with the role once output starts.
                    let usage = self.running_usage(0);
                    self.pending
                        .push_back(self.header.chunk(Some("assistant"), "", None, usage));
                }
                self.push_token();
            }
            Some(RequestEvent::Token) => self.push_token(),
            Some(RequestEvent::Finished { tokens, .. }) => {
                if !self.finish_sent {
                    let usage = self.running_usage(self.sent_tokens);
                    let reason = Some(self.finish_reason);
                    self.pending
                        .push_back(self.header.chunk(None, "", reason, usage));
                }
                if self.include_usage {
                    let usage = Usage::new(tokens.prompt, tokens.completion, tokens.cached);
                    self.pending.push_back(self.header.usage_chunk(usage));
                }
                self.finish();
            }
            Some(RequestEvent::Rejected { reason }) => {
                self.pending
                    .push_back(error_event(&ApiError::bad_request(reason).body()));
                self.finish();
            }
            // The engine stopped: end the stream without [DONE], as a
            // crashed server would.
            None => self.ended = true,
        }
    }

    fn push_token(&mut self) {
        self.sent_tokens += 1;
        let last = self.sent_tokens >= self.planned_tokens;
        let finish_reason = last.then_some(self.finish_reason);
        self.finish_sent |= last;
        let text = self.filler.next_token();
        let usage = self.running_usage(self.sent_tokens);
        self.pending
            .push_back(self.header.chunk(None, text, finish_reason, usage));
    }

    fn running_usage(&self, completion_tokens: u32) -> Option<Usage> {
        (self.include_usage && self.continuous_usage)
            .then(|| Usage::new(self.prompt_tokens, completion_tokens, self.cached_tokens))
    }

    fn finish(&mut self) {
        self.pending.push_back(Bytes::from_static(DONE_EVENT));
        self.ended = true;
    }
}

impl Body for TokenStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        loop {
            if let Some(event) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(event))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            let event = ready!(this.request.poll_next(cx));
            this.on_event(event);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.is_empty()
    }
}
