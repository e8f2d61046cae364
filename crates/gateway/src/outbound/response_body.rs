//! Response bodies: a gateway-made body, or a replica's body streamed
//! through frame by frame. (Request bodies are read whole before routing:
//! [`crate::inbound::read_body`].)
//!
//! A proxied body owns the request's [`Lease`] on its replica and its [`Record`], so
//! the replica's load is released and the request is recorded exactly once,
//! when the body ends — finished, failed, or dropped because the client went
//! away. Dropping the upstream body before its end closes its connection,
//! which makes the replica abort the generation and free its KV cache; a
//! body read to its end hands its connection back for the next request.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::error::BoxError;
use crate::flow::Lease;
use crate::outbound::connections;
use crate::outbound::stream_usage::UsageStripper;
use crate::record::Record;

pub fn full(bytes: Bytes) -> ResponseBody {
    ResponseBody::Full(Some(bytes))
}

pub enum ResponseBody {
    Full(Option<Bytes>),
    Proxied(Box<ProxiedBody>),
    /// Chunks a task of the gateway's sends as it makes them (the load
    /// summary stream); dropping the body tells the task to stop.
    Lines(tokio::sync::mpsc::Receiver<Bytes>),
    /// A global member's answer (members/body.rs).
    Member(Box<crate::members::answer_body::MemberBody>),
}

pub struct ProxiedBody {
    inner: connections::Body,
    /// A frame read before the response was passed on (the first of a
    /// non-streaming answer, to know it arrives at all).
    first: Option<Frame<Bytes>>,
    /// The replica answers with server-sent events: a failure midway ends
    /// the stream with an error event the client can read, rather than a
    /// cut connection.
    sse: bool,
    /// The error event has been sent; the body ends.
    ended: bool,
    /// Set when the gateway asked for the stream's usage in the client's
    /// place: the usage event is the gateway's, not the client's.
    strip_usage: Option<UsageStripper>,
    idle_timeout: Duration,
    /// Fires `idle_timeout` after the last frame. Armed the first time the
    /// body has to wait, which a response that arrives whole never does,
    /// and moved forward lazily, when it fires, so that a busy stream does
    /// not touch the timer on every frame.
    idle: Option<Pin<Box<Sleep>>>,
    last_frame: Instant,
    // Dropped with the body; see the module comment.
    lease: Lease,
    record: Box<Record>,
    /// What the request keeps alive until its body ends: the generation
    /// of the config it started under.
    _keep: Arc<dyn Send + Sync>,
}

impl ProxiedBody {
    pub fn new(
        inner: connections::Body,
        first: Option<Frame<Bytes>>,
        sse: bool,
        load: Lease,
        record: Box<Record>,
        idle_timeout: Duration,
        keep: Arc<dyn Send + Sync>,
    ) -> Self {
        Self {
            inner,
            first,
            sse,
            ended: false,
            strip_usage: None,
            idle_timeout,
            idle: None,
            last_frame: Instant::now(),
            lease: load,
            record,
            _keep: keep,
        }
    }
}

impl ProxiedBody {
    /// Take the usage event out of the stream the client sees.
    pub fn strip_usage(mut self) -> Self {
        if self.sse {
            self.strip_usage = Some(UsageStripper::default());
        }
        self
    }
}

#[derive(Debug, thiserror::Error)]
#[error("the replica sent nothing for {0:?}")]
pub struct IdleTimeout(Duration);

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ResponseBody::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            ResponseBody::Proxied(p) => p.poll_frame(cx),
            ResponseBody::Lines(lines) => {
                lines.poll_recv(cx).map(|l| l.map(|l| Ok(Frame::data(l))))
            }
            ResponseBody::Member(m) => Pin::new(m.as_mut()).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(bytes) => bytes.is_none(),
            ResponseBody::Lines(_) => false,
            ResponseBody::Member(m) => m.is_end_stream(),
            ResponseBody::Proxied(p) => {
                p.ended
                    || (p.first.is_none()
                        && p.inner.is_end_stream()
                        && p.strip_usage.as_ref().is_none_or(UsageStripper::is_empty))
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
            ResponseBody::Lines(_) => SizeHint::default(),
            ResponseBody::Member(m) => m.size_hint(),
            // An SSE body may end with an error event of its own.
            ResponseBody::Proxied(p) if p.sse => SizeHint::default(),
            ResponseBody::Proxied(p) => {
                let first = p
                    .first
                    .as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |d| d.len() as u64);
                let inner = p.inner.size_hint();
                match inner.exact() {
                    Some(n) => SizeHint::with_exact(n + first),
                    None => SizeHint::default(),
                }
            }
        }
    }
}

impl ProxiedBody {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let polled = match self.first.take() {
            Some(frame) => Poll::Ready(Some(Ok(frame))),
            None => Pin::new(&mut self.inner).poll_frame(cx),
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    // For a stream, its first token: the request has left
                    // the replica's queue and prefill.
                    self.lease.answered();
                    self.record.on_data(data);
                }
                // A body of known length is not polled past its last byte.
                if self.first.is_none() && self.inner.is_end_stream() {
                    self.record.on_end();
                }
                self.last_frame = Instant::now();
                match (&mut self.strip_usage, frame.into_data()) {
                    (None, Ok(data)) => Poll::Ready(Some(Ok(Frame::data(data)))),
                    (Some(stripper), Ok(data)) => {
                        let kept = stripper.filter(&data);
                        if kept.is_empty() {
                            // Nothing for the client in this frame (an
                            // empty frame could end a chunked body): poll
                            // again at once.
                            cx.waker().wake_by_ref();
                            return Poll::Pending;
                        }
                        Poll::Ready(Some(Ok(Frame::data(kept))))
                    }
                    (_, Err(frame)) => Poll::Ready(Some(Ok(frame))),
                }
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(self.failed(e)),
            Poll::Ready(None) => {
                self.record.on_end();
                match self.strip_usage.as_mut().and_then(UsageStripper::finish) {
                    Some(rest) => Poll::Ready(Some(Ok(Frame::data(rest)))),
                    None => Poll::Ready(None),
                }
            }
            Poll::Pending => loop {
                let deadline = self.last_frame + self.idle_timeout;
                let idle = self
                    .idle
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                ready!(idle.as_mut().poll(cx));
                if deadline > Instant::now() {
                    idle.as_mut().reset(deadline);
                    continue;
                }
                return Poll::Ready(self.failed(IdleTimeout(self.idle_timeout).into()));
            },
        }
    }

    /// The replica's body failed midway. Too late for another status: a
    /// stream of events ends with an error event, anything else is cut
    /// short, which the client sees as an incomplete response.
    fn failed(&mut self, e: BoxError) -> Option<Result<Frame<Bytes>, BoxError>> {
        self.record.on_error(&e.to_string());
        if !self.sse {
            return Some(Err(e));
        }
        self.ended = true;
        self.record.on_end();
        Some(Ok(Frame::data(sse_error_event(&e.to_string()))))
    }
}

/// An OpenAI-shaped error as a server-sent event, the way OpenAI-compatible
/// servers report a failure inside a stream (the SDKs raise it).
fn sse_error_event(detail: &str) -> Bytes {
    let error = serde_json::json!({"error": {
        "message": format!("The replica failed while streaming: {detail}"),
        "type": "upstream_error",
        "param": null,
        "code": "upstream_failed",
    }});
    // A leading blank line ends any event the replica left half-sent.
    Bytes::from(format!("\n\ndata: {error}\n\n"))
}
