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

use crate::error::{ApiError, BoxError};
use crate::flow::Lease;
use crate::generation::pool::Pool;
use crate::outbound::connections;
use crate::outbound::continuation::{self, Cause, Continued, Relay, Stopped};
use crate::outbound::stream_usage::UsageStripper;
use crate::record::Record;

/// A continuation on its way to another replica.
type Resuming = Pin<Box<dyn Future<Output = Result<Continued, ApiError>> + Send>>;

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
    /// A body made elsewhere: a stream held for a cold pool, heartbeats
    /// then the answer (held.rs).
    Boxed(Pin<Box<dyn Body<Data = Bytes, Error = BoxError> + Send>>),
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
    /// Set for a stream that can be continued on another replica: the
    /// events the client gets pass through it.
    relay: Option<Box<Relay>>,
    resuming: Option<Resuming>,
    /// The replica answering, as the relay watches it for evacuation.
    replica: Option<Arc<picker::Endpoint>>,
    /// Why a stream of a pool that continues answers is not relayed: what
    /// its error event says should its replica fail it.
    not_continuable: Option<(continuation::NotContinued, Arc<Pool>)>,
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
            relay: None,
            resuming: None,
            replica: None,
            not_continuable: None,
        }
    }

    /// Relay the stream event by event, to continue it on another replica
    /// should `replica` fail it.
    pub fn continuable(mut self, relay: Relay, replica: Arc<picker::Endpoint>) -> Self {
        if self.sse {
            self.relay = Some(Box::new(relay));
            self.replica = Some(replica);
        }
        self
    }

    /// A stream that will not be continued, for `why`.
    pub fn not_continuable(mut self, why: continuation::NotContinued, pool: Arc<Pool>) -> Self {
        self.not_continuable = Some((why, pool));
        self
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
            ResponseBody::Boxed(b) => b.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(bytes) => bytes.is_none(),
            ResponseBody::Lines(_) => false,
            ResponseBody::Member(m) => m.is_end_stream(),
            ResponseBody::Boxed(b) => b.is_end_stream(),
            ResponseBody::Proxied(p) => {
                p.ended
                    || (p.first.is_none()
                        && p.resuming.is_none()
                        && p.relay.as_ref().is_none_or(|r| r.is_idle())
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
            ResponseBody::Boxed(b) => b.size_hint(),
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
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            if let Some(resuming) = &mut self.resuming {
                let resumed = ready!(resuming.as_mut().poll(cx));
                self.resuming = None;
                match resumed {
                    Ok(continued) => self.resume(continued),
                    Err(e) => return Poll::Ready(self.stop(Stopped::Failed(e), Cause::Broken)),
                }
            }
            let polled = match self.first.take() {
                Some(frame) => Poll::Ready(Some(Ok(frame))),
                None => Pin::new(&mut self.inner).poll_frame(cx),
            };
            let frame = match polled {
                Poll::Ready(Some(Ok(frame))) => frame,
                Poll::Ready(Some(Err(e))) => match self.interrupt(Cause::Broken, &e.to_string()) {
                    Some(end) => return Poll::Ready(end),
                    None => continue,
                },
                Poll::Ready(None) => match self.ended_by_replica() {
                    Some(end) => return Poll::Ready(end),
                    None => continue,
                },
                Poll::Pending => {
                    ready!(self.poll_idle(cx));
                    let limit = self.idle_limit();
                    let stalled = IdleTimeout(limit).to_string();
                    match self.interrupt(Cause::Stalled, &stalled) {
                        Some(end) => return Poll::Ready(end),
                        None => continue,
                    }
                }
            };
            self.last_frame = Instant::now();
            if self.replica.as_ref().is_some_and(|r| r.evacuating()) {
                // What the frame holds is dropped with the replica's part:
                // the continuation generates it again.
                match self.interrupt(Cause::Evacuated, "the replica is being evacuated") {
                    Some(end) => return Poll::Ready(end),
                    None => continue,
                }
            }
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            let data = match &mut self.relay {
                None => data,
                Some(relay) => match relay.relay(&data) {
                    Some(events) if !events.is_empty() => events,
                    // Nothing complete for the client yet.
                    _ => continue,
                },
            };
            // For a stream, its first token: the request has left the
            // replica's queue and prefill.
            self.lease.answered();
            self.record.on_data(&data);
            // A body of known length is not polled past its last byte.
            if self.first.is_none() && self.inner.is_end_stream() && self.relay.is_none() {
                self.record.on_end();
            }
            match &mut self.strip_usage {
                None => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Some(stripper) => {
                    let kept = stripper.filter(&data);
                    // Nothing for the client in this frame (an empty frame
                    // could end a chunked body): read on.
                    if !kept.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(kept))));
                    }
                }
            }
        }
    }

    /// Ready when the replica has sent nothing for the idle limit.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            let deadline = self.last_frame + self.idle_limit();
            let idle = self
                .idle
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            // The limit shortens once a continuable answer starts.
            if idle.deadline() > deadline {
                idle.as_mut().reset(deadline);
            }
            ready!(idle.as_mut().poll(cx));
            if deadline > Instant::now() {
                idle.as_mut().reset(deadline);
                continue;
            }
            return Poll::Ready(());
        }
    }

    /// How long the replica may send nothing: the pool's continuation
    /// limit once a continuable answer has started (before its first
    /// token, the request may be waiting in the engine's queue), the
    /// gateway's idle timeout otherwise.
    fn idle_limit(&self) -> Duration {
        match &self.relay {
            Some(relay) if relay.started() => relay.settings.idle_timeout.min(self.idle_timeout),
            _ => self.idle_timeout,
        }
    }

    /// The replica's body ended, cleanly: the answer's end, as the
    /// replica meant it (a replica that dies mid-answer leaves its body
    /// incomplete, an error).
    fn ended_by_replica(&mut self) -> Option<Option<Result<Frame<Bytes>, BoxError>>> {
        self.record.on_end();
        let rest = self.strip_usage.as_mut().and_then(UsageStripper::finish);
        Some(rest.map(|rest| Ok(Frame::data(rest))))
    }

    /// The replica failed the answer: continue it elsewhere (`None`: poll
    /// on), or end the client's stream.
    fn interrupt(
        &mut self,
        cause: Cause,
        detail: &str,
    ) -> Option<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(relay) = &mut self.relay else {
            let e: BoxError = match cause {
                Cause::Stalled => IdleTimeout(self.idle_timeout).into(),
                _ => detail.to_owned().into(),
            };
            return Some(self.failed(e));
        };
        let next = relay.next_request();
        let tokens = relay.transcript.tokens();
        let body = match next {
            Ok(body) => body,
            Err(stopped) => {
                self.record.on_error(detail);
                return Some(self.stop(stopped, cause));
            }
        };
        relay.continuations += 1;
        relay.last_cause = Some(cause);
        relay.transcript.next_part();
        let resend = Arc::clone(&relay.resend);
        let tried = relay.tried.clone();
        tracing::info!(pool = %resend.pool.name(), cause = cause.as_str(), tokens, error = detail,
            "continuing the answer on another replica");
        self.record.moved(cause.as_str(), tokens);
        // Let go of the replica: closing its connection stops its work,
        // and its load is released with the lease when the next replica's
        // replaces it.
        self.inner = connections::Body::Closed;
        self.idle = None;
        self.resuming = Some(Box::pin(continuation::send(resend, body, tried)));
        None
    }

    /// The continuation reached a replica: its stream follows.
    fn resume(&mut self, continued: Continued) {
        let Continued {
            answer,
            admitted,
            sent_at,
        } = continued;
        let endpoint = Arc::clone(&admitted.decision.endpoint);
        self.record.picked(&admitted.decision);
        self.record.answering(Arc::clone(&endpoint), sent_at);
        if let Some(relay) = &mut self.relay {
            relay.tried.push(endpoint.index);
            relay
                .resend
                .pool
                .metrics()
                .count_decision(&admitted.decision);
            relay.count(relay.last_cause, continuation::Outcome::Continued);
        }
        self.inner = answer.body;
        self.lease = admitted.lease;
        self.replica = Some(endpoint);
        self.last_frame = Instant::now();
    }

    /// End the client's stream after a failure that is not continued:
    /// with the answer's end when only that was missing, else with an
    /// error event saying why.
    fn stop(&mut self, stopped: Stopped, cause: Cause) -> Option<Result<Frame<Bytes>, BoxError>> {
        self.ended = true;
        self.record.on_end();
        let Some(relay) = &mut self.relay else {
            return None;
        };
        let (outcome, event) = match stopped {
            Stopped::Complete => (continuation::Outcome::Completed, relay.ending()),
            Stopped::NotContinued(why) => {
                let detail = format!(
                    "The replica failed while streaming ({}); the answer was not continued on another replica because {}.",
                    cause.as_str(),
                    why.explain()
                );
                (
                    continuation::Outcome::NotContinued,
                    sse_error(&detail, "upstream_failed"),
                )
            }
            Stopped::Failed(e) => {
                self.record.on_error(&e.message);
                let detail = format!(
                    "The replica failed while streaming and the answer could not be continued: {}",
                    e.message
                );
                (
                    continuation::Outcome::Failed,
                    sse_error(&detail, "upstream_failed"),
                )
            }
        };
        relay.count(Some(cause), outcome);
        self.record.on_data(&event);
        let event = match &mut self.strip_usage {
            Some(stripper) => stripper.filter(&event),
            None => event,
        };
        Some(Ok(Frame::data(event)))
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
        let event = match &self.not_continuable {
            Some((why, pool)) => {
                let cause = if e.is::<IdleTimeout>() {
                    Cause::Stalled
                } else {
                    Cause::Broken
                };
                let outcome = continuation::Outcome::NotContinued;
                pool.metrics()
                    .count_migration(cause.as_str(), outcome.as_str());
                let detail = format!(
                    "The replica failed while streaming ({e}); the answer was not continued on another replica because {}.",
                    why.explain()
                );
                sse_error(&detail, "upstream_failed")
            }
            None => sse_error_event(&e.to_string()),
        };
        Some(Ok(Frame::data(event)))
    }
}

/// An OpenAI-shaped error event, after a blank line that ends any event
/// left half-sent.
fn sse_error(message: &str, code: &str) -> Bytes {
    let error = serde_json::json!({"error": {
        "message": message,
        "type": "upstream_error",
        "param": null,
        "code": code,
    }});
    Bytes::from(format!("\n\ndata: {error}\n\n"))
}

/// An OpenAI-shaped error as a server-sent event, the way OpenAI-compatible
/// servers report a failure inside a stream (the SDKs raise it).
fn sse_error_event(detail: &str) -> Bytes {
    sse_error(
        &format!("The replica failed while streaming: {detail}"),
        "upstream_failed",
    )
}
