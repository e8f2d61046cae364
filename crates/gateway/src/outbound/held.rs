//! A streaming request held for a cold pool: once it has waited its
//! pool's `coldStart.heartbeat`, the client gets the response's head (200,
//! server-sent events) and a comment line every heartbeat, so proxies in
//! front with idle timeouts keep the connection; the answer follows when a
//! replica is ready, or an error event says why none came.
//!
//! The request's work (admission, forwarding) goes on inside the body: it
//! is one future, started by the pipeline, that the body polls between
//! heartbeats. A client that leaves drops the body, and with it the work,
//! which takes the request out of line.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Sleep;

use crate::error::BoxError;
use crate::outbound::response_body::ResponseBody;

/// The request's work to its response.
pub type Work = Pin<Box<dyn Future<Output = Response<ResponseBody>> + Send>>;

/// The comment a held stream gets: SSE clients ignore it.
const WAITING: &[u8] = b": waiting for a replica of the pool to start\n\n";

/// Set by admission when a streaming request starts waiting for a cold
/// pool whose heartbeat is on: the pipeline may then answer the head
/// early.
#[derive(Debug)]
pub struct EarlyHead(Mutex<Option<oneshot::Sender<Duration>>>);

impl EarlyHead {
    pub fn new() -> (EarlyHead, oneshot::Receiver<Duration>) {
        let (tx, rx) = oneshot::channel();
        (EarlyHead(Mutex::new(Some(tx))), rx)
    }

    /// The request waits for a cold pool; a heartbeat every `every`.
    pub fn waiting_cold(&self, every: Duration) {
        if let Some(tx) = self.0.lock().take() {
            // The pipeline may have answered already: nothing to do then.
            let _ = tx.send(every);
        }
    }
}

/// The response to a request whose work is `work`: its own, if it comes
/// before the request has waited a heartbeat for a cold pool; else a held
/// stream.
pub async fn respond(mut work: Work, early: oneshot::Receiver<Duration>) -> Response<ResponseBody> {
    // A sender dropped unused (the usual case) disables the branch.
    let every = tokio::select! {
        response = &mut work => return response,
        Ok(every) = early => every,
    };
    tokio::select! {
        response = &mut work => response,
        () = tokio::time::sleep(every) => held(work, every),
    }
}

fn held(work: Work, every: Duration) -> Response<ResponseBody> {
    let body = HeldBody {
        work: Some(work),
        every,
        beat: None,
        answer: None,
    };
    let mut response = Response::new(ResponseBody::Boxed(Box::pin(body)));
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

struct HeldBody {
    work: Option<Work>,
    every: Duration,
    /// The next heartbeat; `None` before the first, sent at once.
    beat: Option<Pin<Box<Sleep>>>,
    /// The answer's body, once the work has given it.
    answer: Option<ResponseBody>,
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.get_mut().poll_next(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.work.is_none() && self.answer.as_ref().is_none_or(Body::is_end_stream)
    }
}

impl HeldBody {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(answer) = &mut self.answer {
            return Pin::new(answer).poll_frame(cx);
        }
        let Some(work) = &mut self.work else {
            return Poll::Ready(None);
        };
        if let Poll::Ready(response) = work.as_mut().poll(cx) {
            self.work = None;
            let (parts, body) = response.into_parts();
            self.answer = Some(if parts.status.is_success() {
                // The head already went out; the answer's events follow.
                body
            } else {
                ResponseBody::Full(Some(error_event(body)))
            });
            return self.poll_next(cx);
        }
        let beat = match &mut self.beat {
            None => {
                self.beat = Some(Box::pin(tokio::time::sleep(self.every)));
                true
            }
            Some(sleep) => {
                let due = sleep.as_mut().poll(cx).is_ready();
                if due {
                    let next = tokio::time::Instant::now() + self.every;
                    sleep.as_mut().reset(next);
                    // Registers the new deadline's wake-up.
                    let _ = sleep.as_mut().poll(cx);
                }
                due
            }
        };
        if beat {
            Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(WAITING)))))
        } else {
            Poll::Pending
        }
    }
}

/// A refusal's OpenAI-shaped JSON body as a server-sent event: the status
/// went out as 200 before the request was refused.
fn error_event(body: ResponseBody) -> Bytes {
    let json = match body {
        ResponseBody::Full(Some(bytes)) => bytes,
        _ => Bytes::from_static(
            br#"{"error":{"message":"the request failed while it waited for a replica","type":"server_error","param":null,"code":null}}"#,
        ),
    };
    let mut event = Vec::with_capacity(json.len() + 8);
    event.extend_from_slice(b"data: ");
    event.extend_from_slice(&json);
    event.extend_from_slice(b"\n\n");
    Bytes::from(event)
}
