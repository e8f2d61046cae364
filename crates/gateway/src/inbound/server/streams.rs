//! A client connection's requests (HTTP/1.1) or streams (HTTP/2), as the
//! connection watches them: whether its first request has come, how many
//! are open (for the idle timeout), and whether one's client has stopped
//! taking its response.
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
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::BoxError;

/// A connection's streams, whose response bodies are `B`.
pub(crate) struct Streams<B> {
    /// Streams from request to response body dropped.
    open: AtomicUsize,
    /// Streams ever opened.
    opened: AtomicUsize,
    changed: Notify,
    /// Response bodies being sent.
    sending: Mutex<Vec<Weak<Sending<B>>>>,
}

impl<B> Default for Streams<B> {
    fn default() -> Self {
        Self {
            open: AtomicUsize::new(0),
            opened: AtomicUsize::new(0),
            changed: Notify::new(),
            sending: Mutex::new(Vec::new()),
        }
    }
}

impl<B> Streams<B> {
    /// A stream begins: it counts as open until the [`Open`] is dropped.
    pub(crate) fn open(this: &Arc<Self>) -> Open<B> {
        this.open.fetch_add(1, Ordering::Relaxed);
        this.opened.fetch_add(1, Ordering::Relaxed);
        this.changed.notify_waiters();
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

    /// Completes if no stream opens within `timeout`; once one has, never.
    pub(crate) async fn none_within(&self, timeout: Duration) {
        let first = async {
            loop {
                let changed = self.changed.notified();
                let mut changed = pin!(changed);
                changed.as_mut().enable();
                if self.opened.load(Ordering::Relaxed) > 0 {
                    return;
                }
                changed.await;
            }
        };
        if tokio::time::timeout(timeout, first).await.is_ok() {
            std::future::pending::<()>().await;
        }
    }

    /// Completes once no stream has been open for `timeout`.
    pub(crate) async fn idle_for(&self, timeout: Duration) {
        loop {
            let changed = self.changed.notified();
            let mut changed = pin!(changed);
            // Registered before the count is read: no change is missed.
            changed.as_mut().enable();
            if self.open.load(Ordering::Relaxed) > 0 {
                changed.await;
                continue;
            }
            tokio::select! {
                () = tokio::time::sleep(timeout) => return,
                () = changed => {}
            }
        }
    }

    /// Drop the body of any stream that handed out data and was not asked
    /// for more within `timeout`, looking every quarter of it while a
    /// stream is open. Never completes.
    pub(crate) async fn cut_stalled(&self, timeout: Duration) {
        loop {
            loop {
                let changed = self.changed.notified();
                let mut changed = pin!(changed);
                changed.as_mut().enable();
                if self.open.load(Ordering::Relaxed) > 0 {
                    break;
                }
                changed.await;
            }
            tokio::time::sleep(timeout / 4).await;
            let now = Instant::now();
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
}

pub(crate) struct Open<B>(Arc<Streams<B>>);

impl<B> Drop for Open<B> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0.changed.notify_waiters();
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
