//! One client connection, served by hyper: HTTP/1.1, or HTTP/2 when it
//! opens with the HTTP/2 preface (h2c). hyper owns the framing; this file
//! owns the limits around it, which hyper leaves to its user:
//!
//! - a new connection must deliver its first request within the header
//!   timeout, or it is closed (a client that connects and sends nothing
//!   holds a connection slot for nothing);
//! - a connection with no request under way for [`IDLE_TIMEOUT`] is closed
//!   gracefully (HTTP/1.1: at once; HTTP/2: with a GOAWAY);
//! - a client that takes none of a response for [`SEND_TIMEOUT`] is taken
//!   to be gone: the socket write fails ([`SendTimeout`]) and a stalled
//!   HTTP/2 stream loses its body ([`Streams::cut_stalled`]), either of
//!   which drops the response body and so aborts the replica's request;
//! - an HTTP/2 client that stops answering pings is dropped;
//! - draining closes idle connections and lets requests in flight finish;
//! - a handler that panics answers 500 instead of taking the connection
//!   (and a flood of log lines) with it.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::FutureExt;
use http::Response;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::request::{Client, Request, WorkerId};
use super::streams::{Expired, Streams};
use crate::error::ApiError;
use crate::headers::HEAD_LIMIT;
use crate::inbound::drain::Watch;
use crate::outbound::response_body::ResponseBody;

/// A kept-alive connection with no request under way for this long is
/// closed, so that connections clients abandoned do not pile up (nginx's
/// default; clients' pools expire theirs sooner, httpx's after 5 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// A client that takes none of a response for this long is taken to be
/// gone (nginx's `send_timeout`). A client that stops reading would
/// otherwise hold its replica's request for ever.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// Most header fields in an HTTP/1.1 request head.
const MAX_HEADERS: usize = 100;

/// How long an HTTP/2 client may send nothing before it is pinged, and
/// then have to answer the ping.
const PING_INTERVAL: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

/// The timeouts of a client connection.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// For the first request's head, from accept.
    pub header: Duration,
    pub idle: Duration,
    pub send: Duration,
    /// `None`: no pings (tests in paused time).
    pub ping_interval: Option<Duration>,
    pub ping_timeout: Duration,
}

impl Timeouts {
    pub fn new(header: Duration) -> Self {
        Self {
            header,
            idle: IDLE_TIMEOUT,
            send: SEND_TIMEOUT,
            ping_interval: Some(PING_INTERVAL),
            ping_timeout: PING_TIMEOUT,
        }
    }
}

/// Serve requests on `io` from `client` with `handler` until the client
/// closes the connection, a timeout closes it, or draining ends it.
pub async fn serve<I, H, F>(
    io: I,
    client: impl Into<Client>,
    handler: H,
    worker: WorkerId,
    watch: Watch,
    timeouts: Timeouts,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Fn(WorkerId, Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let client: Client = client.into();
    let peer = client.peer;
    let streams = Arc::new(Streams::<ResponseBody>::default());
    let counted = Arc::clone(&streams);
    let service = service_fn(move |req: http::Request<Incoming>| {
        let open = Streams::open(&counted);
        let streams = Arc::clone(&counted);
        let (parts, body) = req.into_parts();
        let handling = handler(
            worker,
            Request {
                method: parts.method,
                uri: parts.uri,
                version: parts.version,
                headers: parts.headers,
                body,
                peer,
                tls: client.tls,
                client_cert: client.certificate.clone(),
            },
        );
        async move {
            let response = match AssertUnwindSafe(handling).catch_unwind().await {
                Ok(response) => response,
                Err(_) => {
                    // The panic hook has reported it.
                    ApiError::internal().into_response()
                }
            };
            Ok::<_, Infallible>(response.map(|body| Streams::respond(&streams, body, open)))
        }
    });

    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        // hyper's header timeout restarts at every request and so would
        // also bound keep-alive idle time; the first request's is timed
        // below, later ones by the idle timeout.
        .header_read_timeout(None)
        // A larger head gets hyper's 431.
        .max_buf_size(HEAD_LIMIT)
        .max_headers(MAX_HEADERS);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(timeouts.ping_interval)
        .keep_alive_timeout(timeouts.ping_timeout)
        .max_header_list_size(HEAD_LIMIT as u32);
    let io = TokioIo::new(SendTimeout::new(io, timeouts.send));
    let conn = builder.serve_connection(io, service);
    let mut conn = pin!(conn);
    let expired = streams.expired(
        Some(timeouts.header),
        Some(timeouts.idle),
        Some(timeouts.send),
    );
    // Biased: the connection first, as it is what wakes the task nearly
    // every time, and no random draw per wake-up.
    let ended = tokio::select! {
        biased;
        ended = conn.as_mut() => ended,
        () = watch.draining() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        expired = expired => match expired {
            Expired::Idle => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
            Expired::NoRequest => {
                tracing::debug!(%peer, timeout = ?timeouts.header, "no request in time; closing");
                return;
            }
        },
    };
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// A socket whose writes fail with `TimedOut` once the peer has taken
/// none of them for the send timeout. The timer is armed only while the
/// socket is full, which a client that reads leaves it only briefly.
struct SendTimeout<T> {
    io: T,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> SendTimeout<T> {
    fn new(io: T, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            stalled: None,
        }
    }

    fn on_write<R>(
        &mut self,
        cx: &mut Context<'_>,
        written: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if written.is_ready() {
            self.stalled = None;
            return written;
        }
        let timeout = self.timeout;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::ErrorKind::TimedOut.into())),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        self.on_write(cx, written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.on_write(cx, written)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let flushed = Pin::new(&mut self.io).poll_flush(cx);
        self.on_write(cx, flushed)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
