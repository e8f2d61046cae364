//! HTTP/2 with prior knowledge (h2c) from clients, served by hyper. The
//! connection's first bytes, read to tell it from HTTP/1.1, are replayed
//! to hyper before the socket's.
//!
//! As for HTTP/1.1, a connection with no request under way for
//! [`IDLE_TIMEOUT`] is closed (with a GOAWAY), and a stream whose client
//! takes none of its response for [`SEND_TIMEOUT`] loses its response
//! body, which aborts the replica's request ([`streams`]). A client that
//! stops answering is found by pings: one after [`PING_INTERVAL`] without
//! a frame from it, and the connection closed if [`PING_TIMEOUT`] passes
//! without the answer.

mod streams;

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use self::streams::Streams;
use super::{IDLE_TIMEOUT, SEND_TIMEOUT, WorkerId};
use crate::body::{RequestBody, ResponseBody};
use crate::drain::Watch;
use crate::fields::{self, Fields};

pub async fn serve<H, F>(
    io: TcpStream,
    read: Bytes,
    handler: H,
    worker: WorkerId,
    watch: Watch,
    peer: SocketAddr,
) where
    H: Fn(WorkerId, super::Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    serve_with(io, read, handler, worker, watch, peer, TIMEOUTS).await;
}

/// [`serve`] with other timeouts, for tests.
async fn serve_with<H, F>(
    io: TcpStream,
    read: Bytes,
    handler: H,
    worker: WorkerId,
    watch: Watch,
    peer: SocketAddr,
    timeouts: Timeouts,
) where
    H: Fn(WorkerId, super::Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let streams = Arc::new(Streams::<ResponseBody>::default());
    let counted = Arc::clone(&streams);
    let service = service_fn(move |req: Request<Incoming>| {
        let open = Streams::open(&counted);
        let streams = Arc::clone(&counted);
        let (parts, body) = req.into_parts();
        let handling = handler(
            worker,
            super::Request {
                method: parts.method,
                uri: parts.uri,
                version: parts.version,
                headers: Fields::from_map(&parts.headers),
                body: RequestBody::Streaming(body),
            },
        );
        async move {
            let response = with_replica_headers(handling.await);
            Ok::<_, Infallible>(response.map(|body| Streams::respond(&streams, body, open)))
        }
    });
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .keep_alive_interval(timeouts.ping_interval)
        .keep_alive_timeout(timeouts.ping_timeout)
        .serve_connection(TokioIo::new(Replayed { read, io }), service);
    let mut conn = pin!(conn);
    let cut_stalled = streams.cut_stalled(timeouts.send);
    let ended = tokio::select! {
        ended = conn.as_mut() => ended,
        () = watch.draining() => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = streams.idle_for(timeouts.idle) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
        () = cut_stalled => unreachable!("watches for as long as the connection lives"),
    };
    if let Err(e) = ended {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// hyper writes a response's headers from its map: the replica's, which
/// a proxied body carries as they arrived, join the gateway's there.
fn with_replica_headers(response: Response<ResponseBody>) -> Response<ResponseBody> {
    let (mut parts, body) = response.into_parts();
    let replica = fields::header_map(body.forwarded_headers(&parts.headers));
    // None of the replica's names is among the gateway's.
    parts.headers.extend(replica);
    Response::from_parts(parts, body)
}

/// How long a client may send nothing before it is pinged, and then
/// have to answer the ping.
const PING_INTERVAL: Duration = Duration::from_secs(20);
const PING_TIMEOUT: Duration = Duration::from_secs(20);

#[derive(Clone, Copy)]
struct Timeouts {
    idle: Duration,
    send: Duration,
    ping_interval: Option<Duration>,
    ping_timeout: Duration,
}

const TIMEOUTS: Timeouts = Timeouts {
    idle: IDLE_TIMEOUT,
    send: SEND_TIMEOUT,
    ping_interval: Some(PING_INTERVAL),
    ping_timeout: PING_TIMEOUT,
};

/// A socket whose first bytes were already read: `read` comes first.
struct Replayed {
    read: Bytes,
    io: TcpStream,
}

impl AsyncRead for Replayed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.read.is_empty() {
            return Pin::new(&mut self.io).poll_read(cx, buf);
        }
        let n = self.read.len().min(buf.remaining());
        buf.put_slice(&self.read[..n]);
        self.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Replayed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
