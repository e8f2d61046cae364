//! What the endpoints that run prompts through the engine share: the
//! faults every request meets first, handing a prompt to the engine,
//! waiting for a whole answer, and a streaming body fed by the engine's
//! events; both meet the `*_after_tokens` faults. The wire formats (chat,
//! completions, responses) are the callers'.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame};

use super::body::{ApiError, ResponseBody, boxed};
use super::connection::Kill;
use super::output::{self, OutputPlan, Resume};
use super::state::AppState;
use crate::engine::SchedulingPolicy;
use crate::faults::{TokenFault, TokenFaultKind};
use crate::metrics::{FinishKind, FinishedTokens};
use crate::replica::{Generation, KvHandoff, RequestEvent, RequestHandle};

/// The faults that strike before a request is even read: `hang` (accepted,
/// never answered, nothing reaches the engine) and `error_rate`.
pub(super) async fn faults(state: &AppState) -> Result<(), ApiError> {
    if state.faults.current().hang {
        std::future::pending::<()>().await;
    }
    if state.faults.inject_error() {
        return Err(ApiError::internal(
            "Injected fault: the simulated server failed this request.",
        ));
    }
    Ok(())
}

/// A prompt to answer, as every generating endpoint reduces its request.
pub(super) struct Prompt {
    /// The `model` the client named, if any.
    pub model: Option<String>,
    pub tokens: Vec<u32>,
    /// The client's limit on the answer's length.
    pub max_tokens: Option<i64>,
    /// vLLM's request `priority`.
    pub priority: i64,
    /// The answer the prompt resumes, when it is a continuation.
    pub resume: Option<Resume>,
}

/// A prompt the engine accepted.
pub(super) struct Started {
    pub request: RequestHandle,
    pub plan: OutputPlan,
    /// The model name to answer with.
    pub model: String,
    pub prompt_tokens: u32,
    /// The fault that strikes this answer, if any.
    pub strike: Option<Strike>,
}

/// A `*_after_tokens` fault, and the connection it strikes.
pub(super) struct Strike {
    fault: TokenFault,
    kill: Arc<Kill>,
}

/// Checks the model and the context window, settles the answer's length and
/// submits the prompt. `kill` is the connection's, for the faults that
/// strike after some tokens.
pub(super) fn start(
    state: &AppState,
    prompt: Prompt,
    kill: Arc<Kill>,
) -> Result<Started, ApiError> {
    start_with(state, prompt, kill, KvHandoff::Local)
}

/// [`start`], with the prompt's KV pulled from a prefill replica (a
/// disaggregated decode) or held for a decode (a prefill).
pub(super) fn start_with(
    state: &AppState,
    prompt: Prompt,
    kill: Arc<Kill>,
    handoff: KvHandoff,
) -> Result<Started, ApiError> {
    let (model, adapter) = state.resolve_model(prompt.model.as_deref())?;
    // vLLM refuses a priority its scheduler would ignore.
    if prompt.priority != 0 && state.scheduling_policy != SchedulingPolicy::Priority {
        return Err(ApiError::bad_request(format!(
            "Got priority {} but Priority scheduling is not enabled.",
            prompt.priority
        ))
        .with_param("priority"));
    }
    if prompt.tokens.is_empty() {
        return Err(ApiError::bad_request(
            "The prompt is empty; send at least one token.",
        ));
    }
    let plan = output::plan(
        state.seed,
        &prompt.tokens,
        prompt.max_tokens,
        state.max_model_len,
        prompt.resume,
    )
    .map_err(ApiError::bad_request)?;
    let prompt_tokens = prompt.tokens.len() as u32;
    let generation = Generation {
        prompt: prompt.tokens,
        max_tokens: plan.max_tokens,
        adapter,
        priority: prompt.priority,
        limited_by_max_tokens: plan.limited_by_max_tokens,
    };
    let request = state
        .engine
        .submit_with(generation, handoff)
        .map_err(|_| engine_gone())?;
    let strike = state
        .faults
        .current()
        .token_fault(plan.max_tokens)
        .map(|fault| Strike { fault, kill });
    Ok(Started {
        request,
        plan,
        model,
        prompt_tokens,
        strike,
    })
}

/// Hands a generation to the engine; 503 when the engine has stopped.
pub(super) fn submit(state: &AppState, generation: Generation) -> Result<RequestHandle, ApiError> {
    state.engine.submit(generation).map_err(|_| engine_gone())
}

fn engine_gone() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "ServiceUnavailable",
        "The engine has stopped.",
    )
}

/// How a request ended in the engine.
pub(super) struct Finished {
    pub tokens: FinishedTokens,
    pub finish: FinishKind,
}

/// Waits for the end of a request. If the client goes away, the caller's
/// future is dropped with the handle, which aborts the request.
pub(super) async fn finished(request: &mut RequestHandle) -> Result<Finished, ApiError> {
    loop {
        match request.next().await {
            Some(RequestEvent::FirstToken { .. } | RequestEvent::Token) => {}
            Some(RequestEvent::Finished { tokens, finish }) => {
                return Ok(Finished { tokens, finish });
            }
            Some(RequestEvent::Rejected { reason }) => return Err(ApiError::bad_request(reason)),
            None => return Err(engine_stopped()),
        }
    }
}

/// The whole answer of a started request: how it ended and its text. A
/// `*_after_tokens` fault strikes once that many tokens are generated: the
/// connection is closed without a response, the replica crashes, or the
/// answer never comes.
pub(super) async fn answer(started: &mut Started) -> Result<(Finished, String), ApiError> {
    let finished = match &started.strike {
        None => finished(&mut started.request).await?,
        Some(strike) => {
            let mut tokens = 0;
            loop {
                if tokens >= strike.fault.after {
                    match strike.fault.kind {
                        TokenFaultKind::Cut => strike.kill.close_now(),
                        TokenFaultKind::Crash => strike.kill.crash_now(),
                        TokenFaultKind::Stall => {}
                    }
                    std::future::pending::<()>().await;
                }
                match started.request.next().await {
                    Some(RequestEvent::FirstToken { .. } | RequestEvent::Token) => tokens += 1,
                    Some(RequestEvent::Finished { tokens, finish }) => {
                        break Finished { tokens, finish };
                    }
                    Some(RequestEvent::Rejected { reason }) => {
                        return Err(ApiError::bad_request(reason));
                    }
                    None => return Err(engine_stopped()),
                }
            }
        }
    };
    let text = started.plan.filler().text(finished.tokens.completion);
    Ok((finished, text))
}

fn engine_stopped() -> ApiError {
    ApiError::internal("The engine stopped before the answer was complete.")
}

/// Turns a request's engine events into SSE events, in one wire format.
pub(super) trait StreamWriter: Send + Unpin + 'static {
    /// Appends the events `event` calls for to `out`; `true` once the
    /// stream is complete. `None` means the engine stopped: the stream then
    /// ends as a crashed server's would, without its closing events.
    fn on_event(&mut self, event: Option<RequestEvent>, out: &mut VecDeque<Bytes>) -> bool;
}

/// The body of a streaming answer: the writer's events as the engine's
/// arrive. Dropping it (client gone) aborts the request.
pub(super) struct EventStream<W> {
    request: RequestHandle,
    writer: W,
    /// Events ready to be written.
    pending: VecDeque<Bytes>,
    ended: bool,
    /// Tokens the engine has produced so far.
    tokens: u32,
    strike: Option<Strike>,
    struck: bool,
}

impl<W: StreamWriter> EventStream<W> {
    /// A stream that starts with `opening` (sent before the first token),
    /// struck by `strike` once the events of that many tokens are written.
    pub(super) fn new(
        request: RequestHandle,
        writer: W,
        opening: Vec<Bytes>,
        strike: Option<Strike>,
    ) -> Self {
        Self {
            request,
            writer,
            pending: opening.into(),
            ended: false,
            tokens: 0,
            strike,
            struck: false,
        }
    }

    /// The `text/event-stream` response carrying this stream.
    pub(super) fn into_response(self) -> Response<ResponseBody> {
        let mut response = Response::new(boxed(self));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        response
    }
}

impl<W: StreamWriter> Body for EventStream<W> {
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
            if let Some(strike) = &this.strike
                && this.tokens >= strike.fault.after
            {
                // Every event up to here is handed over: a cut or a crash
                // waits for them to leave (see `connection`); a stall just
                // never sends more.
                if !std::mem::replace(&mut this.struck, true) {
                    match strike.fault.kind {
                        TokenFaultKind::Cut => strike.kill.close_after_flush(),
                        TokenFaultKind::Crash => strike.kill.crash_after_flush(),
                        TokenFaultKind::Stall => {}
                    }
                }
                return Poll::Pending;
            }
            let event = ready!(this.request.poll_next(cx));
            if matches!(
                event,
                Some(RequestEvent::FirstToken { .. } | RequestEvent::Token)
            ) {
                this.tokens += 1;
            }
            this.ended = this.writer.on_event(event, &mut this.pending);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.is_empty()
    }
}
