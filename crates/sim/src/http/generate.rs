//! What the endpoints that run prompts through the engine share: the
//! faults every request meets first, handing a prompt to the engine,
//! waiting for a whole answer, and a streaming body fed by the engine's
//! events. The wire formats (chat, completions, responses) are the
//! callers'.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame};

use super::body::{ApiError, ResponseBody, boxed};
use super::output::{self, Filler, OutputPlan};
use super::state::AppState;
use crate::engine::SchedulingPolicy;
use crate::metrics::{FinishKind, FinishedTokens};
use crate::replica::{Generation, RequestEvent, RequestHandle};

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
}

/// A prompt the engine accepted.
pub(super) struct Started {
    pub request: RequestHandle,
    pub plan: OutputPlan,
    /// The model name to answer with.
    pub model: String,
    pub prompt_tokens: u32,
}

/// Checks the model and the context window, settles the answer's length and
/// submits the prompt.
pub(super) fn start(state: &AppState, prompt: Prompt) -> Result<Started, ApiError> {
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
    )
    .map_err(ApiError::bad_request)?;
    let prompt_tokens = prompt.tokens.len() as u32;
    let request = submit(
        state,
        Generation {
            prompt: prompt.tokens,
            max_tokens: plan.max_tokens,
            adapter,
            priority: prompt.priority,
            limited_by_max_tokens: plan.limited_by_max_tokens,
        },
    )?;
    Ok(Started {
        request,
        plan,
        model,
        prompt_tokens,
    })
}

/// Hands a generation to the engine; 503 when the engine has stopped.
pub(super) fn submit(state: &AppState, generation: Generation) -> Result<RequestHandle, ApiError> {
    state.engine.submit(generation).map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "The engine has stopped.",
        )
    })
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
            None => {
                return Err(ApiError::internal(
                    "The engine stopped before the answer was complete.",
                ));
            }
        }
    }
}

/// The whole answer of a started request: how it ended and its text.
pub(super) async fn answer(started: &mut Started) -> Result<(Finished, String), ApiError> {
    let finished = finished(&mut started.request).await?;
    let text = Filler::new(started.plan.content_seed).text(finished.tokens.completion);
    Ok((finished, text))
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
}

impl<W: StreamWriter> EventStream<W> {
    /// A stream that starts with `opening` (sent before the first token).
    pub(super) fn new(request: RequestHandle, writer: W, opening: Vec<Bytes>) -> Self {
        Self {
            request,
            writer,
            pending: opening.into(),
            ended: false,
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
            let event = ready!(this.request.poll_next(cx));
            this.ended = this.writer.on_event(event, &mut this.pending);
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.pending.is_empty()
    }
}
