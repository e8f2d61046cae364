//! A member's answer streamed through to the client. It owns the
//! request's [`Record`] and its place in the member's in-flight count, so
//! both end exactly once, when the body does — finished, failed, or
//! dropped because the client went away (which drops the member's
//! connection, and the member stops generating). A failure midway counts
//! against the member's health; a stream of server-sent events ends with
//! an error event the client can read rather than a cut connection.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::member::{InFlight, Outcome};
use crate::error::BoxError;
use crate::record::Record;

/// The event that ends a stream cut midway, in the OpenAI error shape.
const CUT_EVENT: &[u8] = b"data: {\"error\":{\"message\":\"the member failed while streaming the answer\",\"type\":\"upstream_error\",\"param\":null,\"code\":\"upstream_error\"}}\n\n";

pub struct MemberBody {
    inner: reqwest::Body,
    sse: bool,
    ended: bool,
    in_flight: InFlight,
    record: Record,
    /// The config generation the request started under, kept to its end.
    _keep: Arc<dyn Send + Sync>,
}

impl MemberBody {
    pub fn new(
        inner: reqwest::Body,
        sse: bool,
        in_flight: InFlight,
        record: Record,
        keep: Arc<dyn Send + Sync>,
    ) -> Self {
        Self {
            inner,
            sse,
            ended: false,
            in_flight,
            record,
            _keep: keep,
        }
    }

    pub fn is_sse(&self) -> bool {
        self.sse
    }
}

impl Body for MemberBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    this.record.on_data(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            None => {
                this.ended = true;
                this.record.on_end();
                Poll::Ready(None)
            }
            Some(Err(e)) => {
                this.ended = true;
                let member = this.in_flight.member();
                let message = format!("member {} failed mid-answer: {e}", member.name());
                this.record.on_error(&message);
                member.on_outcome(Outcome::Failed, Instant::now());
                tracing::warn!(member = member.name(), error = %e, "a member's answer was cut midway");
                if this.sse {
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(CUT_EVENT)))))
                } else {
                    Poll::Ready(Some(Err(e.into())))
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        if self.sse {
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}
