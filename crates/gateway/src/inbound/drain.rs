//! Graceful shutdown of the connections a listener served: once draining
//! starts, each connection finishes the request it is serving and closes
//! (an idle one closes at once), and [`Drain::finished`] resolves when the
//! last one has.
//!
//! Each connection holds a [`Watch`] for as long as it is open, and asks it
//! whether draining has started where it would wait for a next request.
//! Asking costs an atomic load and re-registering the connection task's
//! waker (no lock); starting to drain wakes each connection once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use parking_lot::Mutex;
use tokio::sync::Notify;

#[derive(Default)]
pub struct Drain {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    draining: AtomicBool,
    /// The wakers of the connections still open, by connection id.
    open: Mutex<HashMap<u64, Arc<AtomicWaker>>>,
    next_id: AtomicU64,
    /// Signalled when the last open connection closes.
    all_closed: Notify,
}

impl Drain {
    pub fn new() -> Self {
        Self::default()
    }

    /// A new connection's watch; the connection counts as open until it is
    /// dropped.
    pub fn watch(&self) -> Watch {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let waker = Arc::new(AtomicWaker::new());
        self.inner.open.lock().insert(id, Arc::clone(&waker));
        Watch {
            waker,
            registered: AtomicBool::new(false),
            id,
            inner: Arc::clone(&self.inner),
        }
    }

    /// Ask every connection, open or opened later, to finish and close.
    pub fn start(&self) {
        self.inner.draining.store(true, Ordering::Release);
        for waker in self.inner.open.lock().values() {
            waker.wake();
        }
    }

    /// Every watched connection has closed.
    pub async fn finished(&self) {
        loop {
            let closed = self.inner.all_closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            closed.await;
        }
    }

    /// Connections watched and still open.
    fn open(&self) -> usize {
        self.inner.open.lock().len()
    }
}

/// One open connection's view of its [`Drain`], used by the one task that
/// serves the connection.
pub struct Watch {
    waker: Arc<AtomicWaker>,
    /// The task's waker is registered: it stays valid for the task's life,
    /// so it is registered once rather than on every wait for a request.
    registered: AtomicBool,
    id: u64,
    inner: Arc<Inner>,
}

impl Watch {
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }

    /// Ready once draining has started; until then, a drain that starts
    /// wakes the task that first polled.
    pub fn poll_draining(&self, cx: &mut Context<'_>) -> Poll<()> {
        // Registered before the flag is read: a drain that starts after the
        // read wakes this task.
        if !self.registered.load(Ordering::Relaxed) {
            self.registered.store(true, Ordering::Relaxed);
            self.waker.register(cx.waker());
        }
        if self.is_draining() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    pub async fn draining(&self) {
        std::future::poll_fn(|cx| self.poll_draining(cx)).await
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut open = self.inner.open.lock();
        open.remove(&self.id);
        if open.is_empty() {
            self.inner.all_closed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    async fn within<F: Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("timed out")
    }

    #[tokio::test]
    async fn a_waiting_connection_is_woken_when_draining_starts() {
        let drain = Arc::new(Drain::new());
        let watch = drain.watch();
        let waiting = tokio::spawn(async move {
            watch.draining().await;
            assert!(watch.is_draining());
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drain.start();
        within(waiting).await.unwrap();
        // The watch was dropped with its task: nothing is open.
        within(drain.finished()).await;
        assert_eq!(drain.open(), 0);
    }

    #[tokio::test]
    async fn finished_waits_for_every_connection_to_close() {
        let drain = Drain::new();
        let first = drain.watch();
        let second = drain.watch();
        drain.start();
        // Opened after the drain started: told at once.
        assert!(drain.watch().is_draining());
        let finished = drain.finished();
        tokio::pin!(finished);
        assert!(futures_util::poll!(finished.as_mut()).is_pending());
        drop(first);
        assert!(futures_util::poll!(finished.as_mut()).is_pending());
        assert_eq!(drain.open(), 1);
        drop(second);
        within(finished).await;
    }
}
