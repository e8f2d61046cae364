//! Connections from one worker to the replicas of one pool, over hyper's
//! client connections.
//!
//! Each worker thread has its own [`Connections`] per pool, and a connection
//! is only ever used by the worker that opened it, by the requests that
//! worker serves. That is why this is not hyper-util's pooled client: that
//! client shares one pool between all its clones behind a lock, hashes a
//! scheme-and-authority key, and spawns a task per request that waits for
//! the connection to be ready again before handing it back. Here a request
//! takes an idle connection, sends on it, and the response body hands the
//! connection back when it has been read to its end. The pool is behind a
//! mutex only because the pipeline's futures must be `Send`; one thread
//! uses it, so the lock is never contended.
//!
//! - **HTTP/1.1**: a connection carries one request at a time. Idle
//!   connections are reused most recently used first, so under a light load
//!   the same few stay warm and the rest reach the idle timeout and close.
//!   A response body dropped before its end (the client went away, an
//!   error) drops its connection instead of returning it: the replica sees
//!   the connection close and stops generating.
//! - **h2c**: requests to a replica share one connection, multiplexed;
//!   nothing is checked out or returned. Requests that find no connection
//!   while one is being opened wait for that one instead of each opening
//!   their own.
//! - **Sent at most once**: a replica may close an idle connection at any
//!   time (its keep-alive timeout). A closed connection is skipped when
//!   taking one, and a request that hyper hands back unsent (the
//!   connection closed before any of it was written) goes again on a fresh
//!   connection. A request some of which was written is never sent again,
//!   here or by the caller: the replica may be generating it already
//!   ([`Error::was_sent`]).
//! - **Idle timeout**: a connection unused for that long is closed (an h2c
//!   one is let go: it closes when its last stream ends) by one task per
//!   worker and pool that sleeps until the oldest idle connection expires
//!   and ends when none is left.
//! - Sockets get `TCP_NODELAY` (without it small SSE events wait ~40 ms for
//!   Nagle against delayed ACKs), TCP keep-alive probes, and the configured
//!   connect timeout. A response head over [`HEAD_LIMIT`] is an error.
//! - **TLS**: a replica written `https://host:port` is reached over TLS
//!   with the pool's settings ([`PoolTls`]), the handshake within the
//!   connect timeout too. A failed handshake sent nothing, so another
//!   replica may be tried; it does not make the replica unreachable (its
//!   network is fine, its certificate is not). Each connection remembers
//!   the settings it was opened under, and one opened under settings a
//!   reload has since replaced is not reused.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared as SharedFuture};
use http_body::{Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::outgoing::{InvalidTarget, ToReplica};
use crate::error::BoxError;
use crate::headers::HEAD_LIMIT;
use crate::tls::client::PoolTls;

type SendRequest1 = http1::SendRequest<Full<Bytes>>;
type SendRequest2 = http2::SendRequest<Full<Bytes>>;
type Outbound = http::Request<Full<Bytes>>;

/// Most header fields in a replica's response head.
const MAX_HEADERS: usize = 100;

/// An h2c connection being opened, awaited by every request that needs it.
type Opening = SharedFuture<BoxFuture<'static, Result<(SendRequest2, TlsId), Arc<Error>>>>;

/// The [`PoolTls::id`] a connection was opened under; 0 for plain TCP.
type TlsId = u64;

#[derive(Debug, Clone)]
pub struct Settings {
    pub protocol: config::Protocol,
    pub connect_timeout: Duration,
    /// An idle connection unused for this long is closed.
    pub idle_timeout: Duration,
    /// Idle time before the kernel sends TCP keep-alive probes.
    pub keepalive: Duration,
    /// TLS for `https://` replicas, shared by every worker's connections
    /// to the pool, and replaced when a reload changes it.
    pub tls: Arc<ArcSwapOption<PoolTls>>,
}

impl Settings {
    /// Shorter than the keep-alive timeout of the servers behind us (5 s in
    /// uvicorn, which serves vLLM and SGLang, and in llama.cpp's server), so
    /// the gateway closes an idle connection
    /// before the replica does. The other way round, a request can cross the
    /// replica's close on the wire and must be sent again.
    pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4);

    pub fn new(protocol: config::Protocol, connect_timeout: Duration) -> Self {
        Self {
            protocol,
            connect_timeout,
            idle_timeout: Self::IDLE_TIMEOUT,
            keepalive: Duration::from_secs(60),
            tls: Arc::default(),
        }
    }

    /// Whether a connection opened under `tls` may still be used: plain
    /// ones always, TLS ones while their settings are in force.
    fn current(&self, tls: TlsId) -> bool {
        tls == 0 || self.tls.load().as_ref().is_some_and(|t| t.id == tls)
    }
}

/// One worker's connections to the replicas of one pool, keyed by replica
/// address.
pub struct Connections {
    shared: Arc<Shared>,
}

struct Shared {
    settings: Settings,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Replica address → index in `replicas`.
    index: HashMap<Box<str>, usize>,
    replicas: Vec<Replica>,
    /// Whether the task that closes expired connections is running.
    reaper: bool,
}

#[derive(Default)]
struct Replica {
    /// HTTP/1.1 connections waiting for a request, least recently used
    /// first.
    idle: VecDeque<Idle<SendRequest1>>,
    /// h2c connections, each shared by any number of requests; the last is
    /// the one in use.
    shared: Vec<Idle<SendRequest2>>,
    /// The h2c connection being opened, if one is.
    opening: Option<Opening>,
}

struct Idle<C> {
    conn: C,
    /// Since when it has been idle (HTTP/1.1) or last used (h2c).
    since: Instant,
    tls: TlsId,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: String,
        source: std::io::Error,
    },
    #[error("connecting to {addr} took longer than {timeout:?}")]
    ConnectTimeout { addr: String, timeout: Duration },
    #[error("HTTP/2 handshake with {addr} failed: {source}")]
    Handshake { addr: String, source: hyper::Error },
    /// The TLS handshake failed (or took longer than the connect timeout):
    /// nothing was sent. The replica is reachable; its certificate, or
    /// ours, is not accepted.
    #[error("TLS handshake with {addr} failed: {source}")]
    Tls { addr: String, source: io::Error },
    /// Opening the h2c connection this request waited for failed.
    #[error(transparent)]
    Opening(Arc<Error>),
    #[error(transparent)]
    InvalidTarget(InvalidTarget),
    /// The connection failed before any of the request was written.
    #[error("the connection to the replica closed before the request was sent: {0}")]
    Unsent(hyper::Error),
    /// The request (or some of it) reached the replica, and no response
    /// came back.
    #[error("the replica failed before answering: {0}")]
    Sent(hyper::Error),
}

impl Error {
    /// The replica could not be reached at all: no connection was made.
    pub fn is_connect(&self) -> bool {
        match self {
            Error::Opening(e) => e.is_connect(),
            Error::Connect { .. } | Error::ConnectTimeout { .. } | Error::Handshake { .. } => true,
            Error::Tls { .. } | Error::InvalidTarget(_) | Error::Unsent(_) | Error::Sent(_) => {
                false
            }
        }
    }

    /// Whether any of the request may have reached the replica, which may
    /// then be generating it: such a request is never sent again.
    pub fn was_sent(&self) -> bool {
        matches!(self, Error::Sent(_))
    }
}

/// A replica's answer: its status, its head's fields and its body, which
/// streams from the connection.
#[derive(Debug)]
pub struct Response {
    pub status: http::StatusCode,
    pub headers: http::HeaderMap,
    pub body: Body,
}

impl Connections {
    pub fn new(settings: Settings) -> Self {
        Self {
            shared: Arc::new(Shared {
                settings,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Send `request` to the replica at `addr`, on an idle connection if
    /// there is one. A request that a reused connection hands back unsent
    /// goes once more, on a fresh connection.
    pub async fn send(&self, addr: &str, request: &impl ToReplica) -> Result<Response, Error> {
        let mut outbound = match self.shared.settings.protocol {
            config::Protocol::Http1 => request.http1(addr),
            config::Protocol::H2c => request.http2(addr),
        }
        .map_err(Error::InvalidTarget)?;
        let (replica, mut idle) = self.shared.take(addr);
        loop {
            let (conn, reused) = match idle.take() {
                Some(conn) => (conn, true),
                // Boxed: connecting is rare, and its state would otherwise
                // be part of every request's future.
                None => (Box::pin(self.connect(addr, replica)).await?, false),
            };
            match self.send_on(conn, outbound, replica).await {
                Ok(resp) => return Ok(resp),
                // Once: `idle` is empty now, so the next try connects.
                Err((e, Some(unsent))) if reused => {
                    tracing::debug!(%addr, error = %e, "reused connection was closed; sending on a fresh one");
                    outbound = unsent;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// The response, whose body hands an HTTP/1.1 connection back once read
    /// to its end. On failure, the request too if none of it was sent.
    async fn send_on(
        &self,
        conn: Conn,
        outbound: Outbound,
        replica: usize,
    ) -> Result<Response, (Error, Option<Outbound>)> {
        let sent = match conn {
            Conn::H1(mut sender, tls) => {
                // A connection whose last response just ended may need a
                // moment to be ready again; one that closed never will.
                if let Err(e) = sender.ready().await {
                    return Err((Error::Unsent(e), Some(outbound)));
                }
                let reuse = Reuse {
                    shared: Arc::clone(&self.shared),
                    replica,
                    tls,
                };
                sender
                    .try_send_request(outbound)
                    .await
                    .map(|resp| (resp, Some((sender, reuse))))
            }
            Conn::H2(mut sender) => sender.try_send_request(outbound).await.map(|r| (r, None)),
        };
        match sent {
            Ok((resp, conn)) => {
                let (head, inner) = resp.into_parts();
                let mut body = match conn {
                    Some(conn) => Body::H1 {
                        inner,
                        conn: Some(conn),
                    },
                    None => Body::H2(inner),
                };
                body.hand_back_if_done();
                Ok(Response {
                    status: head.status,
                    headers: head.headers,
                    body,
                })
            }
            Err(mut e) => {
                let unsent = e.take_message();
                let error = e.into_error();
                let error = if unsent.is_some() {
                    Error::Unsent(error)
                } else {
                    Error::Sent(error)
                };
                Err((error, unsent))
            }
        }
    }

    /// Idle HTTP/1.1 connections to `addr`.
    #[cfg(test)]
    fn idle(&self, addr: &str) -> usize {
        let state = self.shared.state.lock();
        state
            .index
            .get(addr)
            .map_or(0, |&i| state.replicas[i].idle.len())
    }

    async fn connect(&self, addr: &str, replica: usize) -> Result<Conn, Error> {
        match self.shared.settings.protocol {
            config::Protocol::Http1 => open_h1(&self.shared.settings, addr)
                .await
                .map(|(sender, tls)| Conn::H1(sender, tls)),
            config::Protocol::H2c => self
                .shared
                .opening(addr, replica)
                .await
                .map(|(sender, _)| Conn::H2(sender))
                .map_err(Error::Opening),
        }
    }
}

/// A TCP connection to the replica at `addr` (`host:port` or
/// `https://host:port`), with the socket options every connection gets.
async fn tcp(settings: &Settings, addr: &str) -> Result<TcpStream, Error> {
    let host_port = config::endpoint_scheme(addr).1;
    let stream = tokio::time::timeout(settings.connect_timeout, TcpStream::connect(host_port))
        .await
        .map_err(|_| Error::ConnectTimeout {
            addr: addr.to_owned(),
            timeout: settings.connect_timeout,
        })?
        .map_err(|source| Error::Connect {
            addr: addr.to_owned(),
            source,
        })?;
    // Best effort: a socket that refuses an option still works.
    let _ = stream.set_nodelay(true);
    let keepalive = socket2::TcpKeepalive::new().with_time(settings.keepalive);
    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
    Ok(stream)
}

/// A connection to the replica at `addr`: TCP, and TLS over it for an
/// `https://` replica.
enum Dialled {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>, TlsId),
}

async fn dial(settings: &Settings, addr: &str) -> Result<Dialled, Error> {
    let (scheme, host_port) = config::endpoint_scheme(addr);
    let stream = tcp(settings, addr).await?;
    if scheme == config::Scheme::Http {
        return Ok(Dialled::Plain(stream));
    }
    let failed = |source| Error::Tls {
        addr: addr.to_owned(),
        source,
    };
    let Some(tls) = settings.tls.load_full() else {
        return Err(failed(io::Error::other("the pool has no TLS settings")));
    };
    let timeout = settings.connect_timeout;
    let shaken = tokio::time::timeout(timeout, tls.connect(host_port, stream))
        .await
        .map_err(|_| {
            failed(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no handshake within {timeout:?}"),
            ))
        })?
        .map_err(failed)?;
    Ok(Dialled::Tls(Box::new(shaken), tls.id))
}

/// An HTTP/1.1 connection to `addr`, its task running.
async fn open_h1(settings: &Settings, addr: &str) -> Result<(SendRequest1, TlsId), Error> {
    match dial(settings, addr).await? {
        Dialled::Plain(stream) => Ok((handshake_h1(addr, stream).await?, 0)),
        Dialled::Tls(stream, tls) => Ok((handshake_h1(addr, stream).await?, tls)),
    }
}

async fn handshake_h1<I>(addr: &str, io: I) -> Result<SendRequest1, Error>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http1::Builder::new()
        .max_header_size(HEAD_LIMIT)
        .max_headers(MAX_HEADERS)
        .handshake(TokioIo::new(io))
        .await
        .map_err(|source| Error::Handshake {
            addr: addr.to_owned(),
            source,
        })?;
    tokio::spawn(drive(conn));
    Ok(sender)
}

/// An HTTP/2 connection to `addr` (h2c, or h2 over TLS), its task running.
async fn open_h2(settings: &Settings, addr: &str) -> Result<(SendRequest2, TlsId), Error> {
    match dial(settings, addr).await? {
        Dialled::Plain(stream) => Ok((handshake_h2(addr, stream).await?, 0)),
        Dialled::Tls(stream, tls) => Ok((handshake_h2(addr, stream).await?, tls)),
    }
}

async fn handshake_h2<I>(addr: &str, io: I) -> Result<SendRequest2, Error>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(io))
        .await
        .map_err(|source| Error::Handshake {
            addr: addr.to_owned(),
            source,
        })?;
    tokio::spawn(drive(conn));
    Ok(sender)
}

/// Run an h2c connection until it closes; the replica's side of any error is
/// seen by the request that was using it.
async fn drive<C: Future<Output = hyper::Result<()>>>(conn: C) {
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "upstream connection ended with an error");
    }
}

/// A connection taken for one request.
enum Conn {
    H1(SendRequest1, TlsId),
    H2(SendRequest2),
}

impl Shared {
    /// The index of the replica at `addr`, and an open connection to it:
    /// the most recently used idle HTTP/1.1 one, or the h2c one in use.
    fn take(&self, addr: &str) -> (usize, Option<Conn>) {
        let mut state = self.state.lock();
        let replica = match state.index.get(addr) {
            Some(&i) => i,
            None => {
                let i = state.replicas.len();
                state.replicas.push(Replica::default());
                state.index.insert(addr.into(), i);
                i
            }
        };
        let r = &mut state.replicas[replica];
        let conn = match self.settings.protocol {
            config::Protocol::Http1 => loop {
                match r.idle.pop_back() {
                    Some(idle) => {
                        if !idle.conn.is_closed() && self.settings.current(idle.tls) {
                            break Some(Conn::H1(idle.conn, idle.tls));
                        }
                    }
                    None => break None,
                }
            },
            config::Protocol::H2c => loop {
                match r.shared.last_mut() {
                    Some(last) if last.conn.is_ready() && self.settings.current(last.tls) => {
                        last.since = Instant::now();
                        break Some(Conn::H2(last.conn.clone()));
                    }
                    Some(_) => drop(r.shared.pop()),
                    None => break None,
                }
            },
        };
        (replica, conn)
    }

    /// The h2c connection being opened to the replica at `addr`, started
    /// if none is. Whichever request polls it drives it; it holds the pool
    /// weakly, so one left unfinished does not keep the pool alive.
    fn opening(self: &Arc<Self>, addr: &str, replica: usize) -> Opening {
        let mut state = self.state.lock();
        if let Some(opening) = &state.replicas[replica].opening {
            return opening.clone();
        }
        let pool = Arc::downgrade(self);
        let settings = self.settings.clone();
        let addr = addr.to_owned();
        let opening = async move {
            let opened = open_h2(&settings, &addr).await;
            if let Some(pool) = pool.upgrade() {
                pool.state.lock().replicas[replica].opening = None;
                if let Ok((sender, tls)) = &opened {
                    pool.share(replica, sender.clone(), *tls);
                }
            }
            opened.map_err(Arc::new)
        }
        .boxed()
        .shared();
        state.replicas[replica].opening = Some(opening.clone());
        opening
    }

    fn share(self: &Arc<Self>, replica: usize, sender: SendRequest2, tls: TlsId) {
        let now = Instant::now();
        let mut state = self.state.lock();
        state.replicas[replica].shared.push(Idle {
            conn: sender,
            since: now,
            tls,
        });
        self.arm_reaper(&mut state, now);
    }

    /// An HTTP/1.1 connection whose response was read to its end; dropped
    /// (closed) instead when its TLS settings were replaced meanwhile.
    fn put_back(self: &Arc<Self>, replica: usize, conn: SendRequest1, tls: TlsId) {
        if !self.settings.current(tls) {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock();
        state.replicas[replica].idle.push_back(Idle {
            conn,
            since: now,
            tls,
        });
        self.arm_reaper(&mut state, now);
    }

    /// Start the task that closes expired connections, unless it runs.
    fn arm_reaper(self: &Arc<Self>, state: &mut State, newest: Instant) {
        if state.reaper || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        state.reaper = true;
        let shared = Arc::downgrade(self);
        let first = newest + self.settings.idle_timeout;
        tokio::spawn(reap(shared, first));
    }
}

/// Close connections idle for longer than the idle timeout, sleeping until
/// the next one expires; end when none is left (or the pool is gone).
async fn reap(shared: Weak<Shared>, mut deadline: Instant) {
    loop {
        tokio::time::sleep_until(deadline).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let timeout = shared.settings.idle_timeout;
        let now = Instant::now();
        let mut expired = Vec::new();
        let mut state = shared.state.lock();
        let mut next: Option<Instant> = None;
        for r in &mut state.replicas {
            while r
                .idle
                .front()
                .is_some_and(|i| i.since + timeout <= now || i.conn.is_closed())
            {
                expired.extend(r.idle.pop_front().map(|i| Conn::H1(i.conn, i.tls)));
            }
            r.shared
                .retain(|i| i.since + timeout > now && !i.conn.is_closed());
            let oldest = r
                .idle
                .front()
                .map(|i| i.since)
                .into_iter()
                .chain(r.shared.iter().map(|i| i.since))
                .min();
            if let Some(oldest) = oldest {
                next = Some(next.map_or(oldest, |n| n.min(oldest)));
            }
        }
        match next {
            Some(oldest) => deadline = oldest + timeout,
            None => {
                state.reaper = false;
                return;
            }
        }
        drop(state);
        // Closing happens as the connections drop, outside the lock.
        drop(expired);
    }
}

/// A replica's response body. Read to its end, it hands its HTTP/1.1
/// connection back to the pool; dropped before, it drops the connection,
/// which closes it.
pub enum Body {
    H1 {
        inner: Incoming,
        /// The connection and where it goes back to; `None` once handed
        /// back, or once the body failed.
        conn: Option<(SendRequest1, Reuse)>,
    },
    H2(Incoming),
    /// Let go of: the replica's answer was abandoned, its connection
    /// closed (which tells the engine to stop generating).
    Closed,
}

pub struct Reuse {
    shared: Arc<Shared>,
    replica: usize,
    tls: TlsId,
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Body::H1 { conn, .. } => f
                .debug_struct("Body::H1")
                .field("returns_connection", &conn.is_some())
                .finish(),
            Body::H2(_) => f.write_str("Body::H2"),
            Body::Closed => f.write_str("Body::Closed"),
        }
    }
}

impl Body {
    /// Once the body has been read to its end, its connection goes back to
    /// the pool.
    fn hand_back_if_done(&mut self) {
        if let Body::H1 { inner, conn } = self
            && http_body::Body::is_end_stream(inner)
            && let Some((sender, reuse)) = conn.take()
        {
            reuse.shared.put_back(reuse.replica, sender, reuse.tls);
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = match &mut *self {
            Body::H1 { inner, conn } => {
                let polled = ready!(Pin::new(inner).poll_frame(cx));
                match &polled {
                    Some(Err(_)) => *conn = None,
                    // hyper reports a body's end with its last frame only
                    // when it knows the length; else here.
                    None => {
                        if let Some((sender, reuse)) = conn.take() {
                            reuse.shared.put_back(reuse.replica, sender, reuse.tls);
                        }
                    }
                    Some(Ok(_)) => {}
                }
                polled
            }
            Body::H2(inner) => ready!(Pin::new(inner).poll_frame(cx)),
            Body::Closed => None,
        };
        self.hand_back_if_done();
        Poll::Ready(polled.map(|f| f.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::H1 { inner, .. } | Body::H2(inner) => inner.is_end_stream(),
            Body::Closed => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Body::H1 { inner, .. } | Body::H2(inner) => inner.size_hint(),
            Body::Closed => SizeHint::with_exact(0),
        }
    }
}

#[cfg(test)]
mod tests;
