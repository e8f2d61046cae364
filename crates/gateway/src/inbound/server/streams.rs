//! A client connection's requests (HTTP/1.1) or streams (HTTP/2), as the
//! connection watches them: whether its first request has come, how many
//! are open (for the idle timeout), and whether one's client has stopped
//! taking its response.
//!
//! The connection's timeouts share one timer ([`Streams::expired`]), which
//! wakes the connection only when one of them may be due (at least every
//! quarter of the send timeout): a request opening or ending notifies
//! nobody, it only updates counts (and, for the last one to end, the time
//! the connection went idle). Waking the connection's watchers and
//! re-arming a timer on every request was 4 % of a proxied request's
//! instructions (docs/perf/overhead-proxy-cost.md).
//!
//! hyper asks a response body for more only when the client has room for
//! it. The body of a stream whose client stopped reading is therefore
//! never polled again and cannot notice by itself; its replica request
//! would stay open for as long as the connection does. So the connection
//! looks at its streams now and then, and drops the body of one that
//! handed out data nobody came back for within the send timeout, which
//! aborts the replica's request.

use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::error::BoxError;

/// A connection's streams, whose response bodies are `B`.
pub(crate) struct Streams<B> {
    /// Streams from request to response body dropped.
    open: AtomicUsize,
    /// Streams ever opened.
    opened: AtomicUsize,
    /// When the last open stream ended (or the connection opened): the
    /// idle timeout runs from there. Written under the lock only by the
    /// stream that leaves none open, so a reader sees the count and the
    /// time agree.
    idle_since: Mutex<Instant>,
    /// Response bodies being sent.
    sending: Mutex<Vec<Weak<Sending<B>>>>,
}

impl<B> Default for Streams<B> {
    fn default() -> Self {
        Self {
            open: AtomicUsize::new(0),
            opened: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            sending: Mutex::new(Vec::new()),
        }
    }
}

/// Why a connection's wait ended ([`Streams::expired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// No request came within the first request's timeout.
    NoRequest,
    /// No stream was open for the idle timeout.
    Idle,
}

impl<B> Streams<B> {
    /// A stream begins: it counts as open until the [`Open`] is dropped.
    pub(crate) fn open(this: &Arc<Self>) -> Open<B> {
        this.open.fetch_add(1, Ordering::Relaxed);
        this.opened.fetch_add(1, Ordering::Relaxed);
        Open(Arc::clone(this))
    }

    /// `body` answers the stream `open` counts.
    pub(crate) fn respond(this: &Arc<Self>, body: B, open: Open<B>) -> Counted<B> {
        let sending = Arc::new(Sending {
            state: Mutex::new(State {
                handed_out: None,
                body: Some(body),
            }),
        });
        let mut all = this.sending.lock();
        // Ended streams leave their entry behind; clear them out before
        // they outnumber the open ones (amortised over the pushes).
        if all.len() >= 2 * this.open.load(Ordering::Relaxed) + 16 {
            all.retain(|s| s.strong_count() > 0);
        }
        all.push(Arc::downgrade(&sending));
        drop(all);
        Counted {
            sending,
            _open: open,
        }
    }

    /// The connection's timeouts, on one timer: [`Expired::NoRequest`]
    /// when no stream opened within `first`, [`Expired::Idle`] once no
    /// stream has been open for `idle`; meanwhile, every quarter of `send`,
    /// the body of any stream that handed out data and was not asked for
    /// more within `send` is dropped (see the module's comment). A timeout
    /// that is `None` does not apply; with neither of the first two, this
    /// never completes.
    pub(crate) async fn expired(
        &self,
        first: Option<Duration>,
        idle: Option<Duration>,
        send: Option<Duration>,
    ) -> Expired {
        let started = Instant::now();
        let mut first = first.map(|t| started + t);
        let mut next_look = send.map(|t| started + t / 4);
        let sleep = tokio::time::sleep_until(started);
        let mut sleep = pin!(sleep);
        loop {
            let now = Instant::now();
            if let Some(at) = first {
                if self.opened.load(Ordering::Relaxed) > 0 {
                    first = None;
                } else if now >= at {
                    return Expired::NoRequest;
                }
            }
            let idle_at = match (idle, self.idle_since()) {
                (Some(t), Some(since)) if now >= since + t => return Expired::Idle,
                (Some(t), Some(since)) => Some(since + t),
                // A stream is open: not idle before `t` from now.
                (Some(t), None) => Some(now + t),
                (None, _) => None,
            };
            if let (Some(timeout), Some(at)) = (send, next_look)
                && now >= at
            {
                self.cut_stalled_now(now, timeout);
                next_look = Some(now + timeout / 4);
            }
            // Streams open and close without telling this timer, so it
            // looks again at the earliest time one of them may be due.
            match [first, idle_at, next_look].into_iter().flatten().min() {
                Some(at) => {
                    sleep.as_mut().reset(at);
                    sleep.as_mut().await;
                }
                None => std::future::pending().await,
            }
        }
    }

    /// Since when no stream has been open; `None` while one is.
    fn idle_since(&self) -> Option<Instant> {
        let since = self.idle_since.lock();
        (self.open.load(Ordering::Relaxed) == 0).then_some(*since)
    }

    /// Completes once no stream has been open for `timeout`.
    #[cfg(test)]
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        self.expired(None, Some(timeout), None).await;
    }

    /// Drop the body of any stream that handed out data and was not asked
    /// for more within `timeout`, looking every quarter of it. Never
    /// completes.
    #[cfg(test)]
    pub(crate) async fn cut_stalled(&self, timeout: Duration) {
        self.expired(None, None, Some(timeout)).await;
    }

    fn cut_stalled_now(&self, now: Instant, timeout: Duration) {
        self.sending
            .lock()
            .retain(|sending| match sending.upgrade() {
                Some(sending) => {
                    sending.cut_if_stalled(now, timeout);
                    true
                }
                None => false,
            });
    }
}

pub(crate) struct Open<B>(Arc<Streams<B>>);

impl<B> Drop for Open<B> {
    fn drop(&mut self) {
        let mut since = self.0.idle_since.lock();
        if self.0.open.fetch_sub(1, Ordering::Relaxed) == 1 {
            *since = Instant::now();
        }
    }
}

/// A response body being sent, which the connection may cut.
struct Sending<B> {
    state: Mutex<State<B>>,
}

struct State<B> {
    /// When the body last handed out a frame that hyper has not come back
    /// after.
    handed_out: Option<Instant>,
    /// `None` once cut.
    body: Option<B>,
}

impl<B> Sending<B> {
    fn cut_if_stalled(&self, now: Instant, timeout: Duration) {
        let mut state = self.state.lock();
        if state
            .handed_out
            .is_some_and(|at| now.duration_since(at) >= timeout)
        {
            state.handed_out = None;
            // Dropping a proxied body aborts the replica's request.
            state.body = None;
        }
    }
}

/// A stream's response body: counts the stream as open while it lives,
/// and notes when it hands out a frame for [`Streams::cut_stalled`].
pub(crate) struct Counted<B> {
    sending: Arc<Sending<B>>,
    _open: Open<B>,
}

impl<B> Body for Counted<B>
where
    B: Body<Data = Bytes, Error = BoxError> + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut state = self.sending.state.lock();
        state.handed_out = None;
        let Some(body) = state.body.as_mut() else {
            return Poll::Ready(Some(Err(
                "the client took none of the response for the send timeout".into(),
            )));
        };
        let polled = Pin::new(body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            state.handed_out = Some(Instant::now());
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        let state = self.sending.state.lock();
        state.body.as_ref().is_some_and(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let state = self.sending.state.lock();
        state
            .body
            .as_ref()
            .map_or_else(SizeHint::default, Body::size_hint)
    }
}

#[cfg(test)]
mod tests;
