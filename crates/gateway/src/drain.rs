//! Graceful shutdown of the connections a listener served: once draining
//! starts, each connection finishes the request it is serving and closes
//! (an idle one closes at once), and [`Drain::finished`] resolves when the
//! last one has.
//!
//! hyper-util's `GracefulShutdown` does the same with a watch channel whose
//! change every connection polls, a mutex taken on every poll of every
//! connection. Here a poll costs an atomic load and re-registering the
//! connection task's waker (no lock); starting to drain wakes each
//! connection once.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use hyper_util::server::graceful::GracefulConnection;
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

    /// `conn`, shut down gracefully once draining starts.
    pub fn watch<C: GracefulConnection>(&self, conn: C) -> Watched<C> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let waker = Arc::new(AtomicWaker::new());
        self.inner.open.lock().insert(id, Arc::clone(&waker));
        Watched {
            conn: Box::pin(conn),
            waker,
            id,
            shutting_down: false,
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

/// A connection that shuts down gracefully when its [`Drain`] starts.
pub struct Watched<C> {
    // Boxed so that this wrapper is `Unpin` and needs no pin projection;
    // one allocation per connection.
    conn: Pin<Box<C>>,
    waker: Arc<AtomicWaker>,
    id: u64,
    shutting_down: bool,
    inner: Arc<Inner>,
}

impl<C: GracefulConnection> Future for Watched<C> {
    type Output = C::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let this = &mut *self;
        if !this.shutting_down {
            // Registered before the flag is read: a drain that starts after
            // the read wakes this task.
            this.waker.register(cx.waker());
            if this.inner.draining.load(Ordering::Acquire) {
                this.shutting_down = true;
                this.conn.as_mut().graceful_shutdown();
            }
        }
        this.conn.as_mut().poll(cx)
    }
}

impl<C> Drop for Watched<C> {
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
    use std::convert::Infallible;
    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// A served HTTP/1.1 connection, watched by `drain`, whose one request
    /// is answered when `answer` is sent; the client's end; and a notice
    /// that the request is being served.
    async fn served(
        drain: &Drain,
        answer: tokio::sync::oneshot::Receiver<()>,
    ) -> (
        tokio::task::JoinHandle<()>,
        TcpStream,
        tokio::sync::oneshot::Receiver<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (serving, being_served) = tokio::sync::oneshot::channel();
        let first = Arc::new(Mutex::new(Some((answer, serving))));
        let service = service_fn(move |_req| {
            let first = first.lock().take();
            async move {
                if let Some((answer, serving)) = first {
                    let _ = serving.send(());
                    let _ = answer.await;
                }
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"done"))))
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server), service);
        let watched = drain.watch(conn);
        let task = tokio::spawn(async move {
            let _ = watched.await;
        });
        (task, client, being_served)
    }

    async fn within<F: Future>(f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(10), f)
            .await
            .expect("timed out")
    }

    #[tokio::test]
    async fn an_idle_connection_closes_when_draining_starts() {
        let drain = Drain::new();
        let (_never, answer) = tokio::sync::oneshot::channel();
        let (task, _client, _) = served(&drain, answer).await;
        assert_eq!(drain.open(), 1);
        drain.start();
        within(task).await.unwrap();
        within(drain.finished()).await;
        assert_eq!(drain.open(), 0);
    }

    #[tokio::test]
    async fn a_request_in_flight_is_answered_before_its_connection_closes() {
        let drain = Drain::new();
        let (release, answer) = tokio::sync::oneshot::channel();
        let (task, client, being_served) = served(&drain, answer).await;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = tokio::spawn(async move {
            let req = http::Request::get("/")
                .body(Full::new(Bytes::new()))
                .unwrap();
            let resp = sender.send_request(req).await.unwrap();
            resp.into_body().collect().await.unwrap().to_bytes()
        });
        within(being_served).await.unwrap();
        drain.start();
        let finished = drain.finished();
        tokio::pin!(finished);
        // Still serving: not finished.
        assert!(futures_util::poll!(finished.as_mut()).is_pending());
        release.send(()).unwrap();
        assert_eq!(within(request).await.unwrap(), "done");
        within(task).await.unwrap();
        within(finished).await;
    }
}
