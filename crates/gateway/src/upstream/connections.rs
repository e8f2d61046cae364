//! Connections from one worker to the replicas of one pool.
//!
//! Each worker thread has its own [`Connections`] per pool, and a connection
//! is only ever used by the worker that opened it: its task runs on that
//! worker's runtime, and so do the requests sent over it. That is why this
//! is not hyper-util's pooled client: that client shares one pool between
//! all its clones behind a lock, hashes a scheme-and-authority key, and
//! spawns a task per request that waits for the connection to be ready
//! again before handing it back. Here a request takes an idle connection,
//! sends on it, and the response body hands the connection back when it has
//! been read to its end — no task per request. (The hop to the connection's
//! own task and back remains: that is how hyper's connection API works.)
//! The pool is behind a mutex only because the pipeline's futures must be
//! `Send` (hyper's server connections run as spawned tasks); one thread
//! uses it, so the lock is never contended: taking a connection and handing
//! it back cost one uncontended lock each.
//!
//! - **HTTP/1.1**: a connection carries one request at a time. Idle
//!   connections are reused most recently used first, so under a light load
//!   the same few stay warm and the rest reach the idle timeout and close.
//!   A response body dropped before its end (the client went away, an
//!   error) drops its connection instead of returning it: the replica sees
//!   the connection close and stops generating.
//! - **h2c**: requests to a replica share one connection, multiplexed;
//!   nothing is checked out or returned.
//! - **Replica closed it**: a replica may close an idle connection at any
//!   time (its keep-alive timeout). A closed connection is skipped when
//!   taking one; and a request that fails on a reused connection before any
//!   response byte — the close crossed the request on the wire — is sent
//!   again once on a fresh connection, so a stale connection never costs
//!   the client a failure. A fresh connection's failure goes back to the
//!   caller, which may try another replica.
//! - **Idle timeout**: a connection unused for that long is closed (an h2c
//!   one is let go: it closes when its last stream ends) by one task per
//!   worker and pool that sleeps until the oldest idle connection expires
//!   and ends when none is left.
//! - Sockets get `TCP_NODELAY` (without it small SSE events wait ~40 ms for
//!   Nagle against delayed ACKs), TCP keep-alive probes, and the configured
//!   connect timeout.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::Instant;

type SendRequest1 = http1::SendRequest<Full<Bytes>>;
type SendRequest2 = http2::SendRequest<Full<Bytes>>;

#[derive(Debug, Clone)]
pub struct Settings {
    pub protocol: config::Protocol,
    pub connect_timeout: Duration,
    /// An idle connection unused for this long is closed.
    pub idle_timeout: Duration,
    /// Idle time before the kernel sends TCP keep-alive probes.
    pub keepalive: Duration,
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
        }
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
}

struct Idle<S> {
    sender: S,
    /// Since when it has been idle (HTTP/1.1) or last used (h2c).
    since: Instant,
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
    #[error("HTTP handshake with {addr} failed: {source}")]
    Handshake { addr: String, source: hyper::Error },
    #[error("{0}")]
    Request(#[source] hyper::Error),
}

impl Error {
    /// The replica could not be reached at all: no connection was made.
    pub fn is_connect(&self) -> bool {
        !matches!(self, Error::Request(_))
    }
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

    /// Send the request that `request` makes to the replica at `addr`, on
    /// an idle connection if there is one. `request` is called again only
    /// if a reused connection turned out closed before answering.
    pub async fn send(
        &self,
        addr: &str,
        request: impl Fn() -> Request<Full<Bytes>>,
    ) -> Result<Response<Body>, Error> {
        let (replica, mut idle) = self.shared.take(addr);
        loop {
            let (mut conn, reused) = match idle.take() {
                Some(conn) => (conn, true),
                // Boxed: connecting is rare, and its state would otherwise
                // be part of every request's future.
                None => (Box::pin(self.connect(addr, replica)).await?, false),
            };
            match conn.send(request(), reused).await {
                Ok(resp) => return Ok(self.body(resp, conn, replica)),
                // Once: `idle` is empty now, so the next try connects.
                Err(e) if reused && is_stale(&e) => {
                    tracing::debug!(%addr, error = %e, "reused connection was closed; sending on a fresh one");
                }
                Err(e) => return Err(Error::Request(e)),
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

    /// The response, whose body hands an HTTP/1.1 connection back once read
    /// to its end (at once when it has none).
    fn body(&self, resp: Response<Incoming>, conn: Conn, replica: usize) -> Response<Body> {
        let keep_alive = keep_alive(&resp);
        let (head, inner) = resp.into_parts();
        let mut body = Body {
            inner,
            reuse: match conn {
                Conn::H1(sender) if keep_alive => Some(Reuse {
                    shared: Arc::clone(&self.shared),
                    replica,
                    sender,
                }),
                _ => None,
            },
        };
        if body.inner.is_end_stream() {
            body.done();
        }
        Response::from_parts(head, body)
    }

    async fn connect(&self, addr: &str, replica: usize) -> Result<Conn, Error> {
        let settings = &self.shared.settings;
        let stream = tokio::time::timeout(settings.connect_timeout, TcpStream::connect(addr))
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
        let io = TokioIo::new(stream);
        let handshake = |source| Error::Handshake {
            addr: addr.to_owned(),
            source,
        };
        match settings.protocol {
            config::Protocol::Http1 => {
                let (sender, conn) = http1::handshake(io).await.map_err(handshake)?;
                tokio::spawn(drive(conn));
                Ok(Conn::H1(sender))
            }
            config::Protocol::H2c => {
                let (sender, conn) = http2::handshake(TokioExecutor::new(), io)
                    .await
                    .map_err(handshake)?;
                tokio::spawn(drive(conn));
                self.shared.share(replica, sender.clone());
                Ok(Conn::H2(sender))
            }
        }
    }
}

/// Run a connection until it closes; the replica's side of any error is
/// seen by the request that was using it.
async fn drive<C: Future<Output = hyper::Result<()>>>(conn: C) {
    if let Err(e) = conn.await {
        tracing::debug!(error = %e, "upstream connection ended with an error");
    }
}

/// A connection taken for one request.
enum Conn {
    H1(SendRequest1),
    H2(SendRequest2),
}

impl Conn {
    async fn send(
        &mut self,
        req: Request<Full<Bytes>>,
        reused: bool,
    ) -> hyper::Result<Response<Incoming>> {
        match self {
            Conn::H1(sender) => {
                // A connection handed back as its response ended may not
                // have taken note of the end yet; a closed one fails here.
                // A new one takes its first request before it is polled.
                if reused {
                    sender.ready().await?;
                }
                sender.send_request(req).await
            }
            Conn::H2(sender) => sender.send_request(req).await,
        }
    }
}

/// The replica closed the connection (or it was found closed) before any
/// response byte: the request may be sent again on a fresh connection.
fn is_stale(e: &hyper::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    e.is_canceled()
        || e.is_closed()
        || e.is_incomplete_message()
        || std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .is_some_and(|io| matches!(io.kind(), ConnectionReset | BrokenPipe | ConnectionAborted))
}

/// Whether an HTTP/1.1 connection may carry another request after this
/// response.
fn keep_alive(resp: &Response<Incoming>) -> bool {
    resp.version() == http::Version::HTTP_11
        && !resp
            .headers()
            .get_all(http::header::CONNECTION)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"close"))
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
                    Some(idle) if idle.sender.is_closed() => continue,
                    Some(idle) => break Some(Conn::H1(idle.sender)),
                    None => break None,
                }
            },
            config::Protocol::H2c => loop {
                match r.shared.last_mut() {
                    Some(last) if last.sender.is_ready() => {
                        last.since = Instant::now();
                        break Some(Conn::H2(last.sender.clone()));
                    }
                    Some(_) => drop(r.shared.pop()),
                    None => break None,
                }
            },
        };
        (replica, conn)
    }

    fn share(self: &Arc<Self>, replica: usize, sender: SendRequest2) {
        let now = Instant::now();
        let mut state = self.state.lock();
        state.replicas[replica]
            .shared
            .push(Idle { sender, since: now });
        self.arm_reaper(&mut state, now);
    }

    /// An HTTP/1.1 connection whose response was read to its end.
    fn put_back(self: &Arc<Self>, replica: usize, sender: SendRequest1) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock();
        state.replicas[replica]
            .idle
            .push_back(Idle { sender, since: now });
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
                .is_some_and(|i| i.since + timeout <= now || i.sender.is_closed())
            {
                expired.extend(r.idle.pop_front().map(|i| Conn::H1(i.sender)));
            }
            r.shared
                .retain(|i| i.since + timeout > now && !i.sender.is_closed());
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
        // Closing happens as the senders drop, outside the lock.
        drop(expired);
    }
}

/// A replica's response body. Read to its end, it hands its HTTP/1.1
/// connection back to the pool; dropped before, it drops the connection,
/// which closes it.
pub struct Body {
    inner: Incoming,
    reuse: Option<Reuse>,
}

struct Reuse {
    shared: Arc<Shared>,
    replica: usize,
    sender: SendRequest1,
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Body")
            .field("returns_connection", &self.reuse.is_some())
            .finish()
    }
}

impl Body {
    fn done(&mut self) {
        if let Some(r) = self.reuse.take() {
            r.shared.put_back(r.replica, r.sender);
        }
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        match &frame {
            // A body of known length is not polled past its last byte.
            Some(Ok(_)) if self.inner.is_end_stream() => self.done(),
            Some(Ok(_)) => {}
            Some(Err(_)) => self.reuse = None,
            None => self.done(),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
