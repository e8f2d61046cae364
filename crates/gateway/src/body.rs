//! Request bodies as the pipeline receives them, and response bodies: a
//! gateway-made body, or a replica's body streamed through frame by frame.
//!
//! A proxied body owns the request's [`Lease`] on its replica and its [`Record`], so
//! the replica's load is released and the request is recorded exactly once,
//! when the body ends — finished, failed, or dropped because the client went
//! away. Dropping the upstream body before its end closes its connection,
//! which makes the replica abort the generation and free its KV cache; a
//! body read to its end hands its connection back for the next request.

use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::admit::Lease;
use crate::error::ApiError;
use crate::fields::Fields;
use crate::record::Record;
use crate::upstream::connections;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request's body: read by the HTTP/1.1 server before the request is
/// handled (or refused by it: too large, or its framing malformed), or
/// still arriving on an HTTP/2 stream.
pub enum RequestBody {
    Read(Result<Bytes, ApiError>),
    Streaming(hyper::body::Incoming),
}

pub fn full(bytes: Bytes) -> ResponseBody {
    ResponseBody::Full(Some(bytes))
}

pub fn empty() -> ResponseBody {
    ResponseBody::Full(None)
}

pub enum ResponseBody {
    Full(Option<Bytes>),
    Proxied(Box<ProxiedBody>),
}

impl ResponseBody {
    /// The replica's headers that go on to the client with this body: its
    /// end-to-end ones, but any of the gateway's own response headers
    /// (`own`) replace.
    pub fn forwarded_headers<'a>(
        &'a self,
        own: &'a HeaderMap,
    ) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let replica = match self {
            ResponseBody::Proxied(body) => Some(&body.replica_headers),
            ResponseBody::Full(_) => None,
        };
        replica
            .into_iter()
            .flat_map(Fields::end_to_end)
            .filter(|(name, _)| {
                !own.keys()
                    .any(|k| k.as_str().as_bytes().eq_ignore_ascii_case(name))
            })
    }
}

pub struct ProxiedBody {
    inner: connections::Body,
    /// The head's fields, kept as they arrived: the server writes those
    /// that go on (see [`ResponseBody::forwarded_headers`]) without a map
    /// built in between.
    replica_headers: Fields,
    idle_timeout: Duration,
    /// Fires `idle_timeout` after the last frame. Armed the first time the
    /// body has to wait, which a response that arrives whole never does,
    /// and moved forward lazily, when it fires, so that a busy stream does
    /// not touch the timer on every frame.
    idle: Option<Pin<Box<Sleep>>>,
    last_frame: Instant,
    // Dropped with the body; see the module comment.
    lease: Lease,
    record: Record,
}

impl ProxiedBody {
    pub fn new(
        inner: connections::Body,
        replica_headers: Fields,
        load: Lease,
        record: Record,
        idle_timeout: Duration,
    ) -> Self {
        Self {
            inner,
            replica_headers,
            idle_timeout,
            idle: None,
            last_frame: Instant::now(),
            lease: load,
            record,
        }
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
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ResponseBody::Full(bytes) => bytes.is_none(),
            ResponseBody::Proxied(p) => p.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ResponseBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ResponseBody::Full(None) => SizeHint::with_exact(0),
            ResponseBody::Proxied(p) => p.inner.size_hint(),
        }
    }
}

impl ProxiedBody {
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    // For a stream, its first token: the request has left
                    // the replica's queue and prefill.
                    self.lease.answered();
                    self.record.on_data(data);
                }
                // A body of known length is not polled past its last byte.
                if self.inner.is_end_stream() {
                    self.record.on_end();
                }
                self.last_frame = Instant::now();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.record.on_error(&e.to_string());
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.record.on_end();
                Poll::Ready(None)
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
                let err = IdleTimeout(self.idle_timeout);
                self.record.on_error(&err.to_string());
                return Poll::Ready(Some(Err(err.into())));
            },
        }
    }
}
