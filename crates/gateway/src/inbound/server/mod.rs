//! Listeners: accept connections, hand each to a worker, which serves it
//! with hyper ([`connection`]: HTTP/1.1 and h2c, with the timeouts hyper
//! leaves to its user), and drain them on shutdown. On a TLS listener the
//! worker shakes hands first ([`crate::tls::server`]), within the header
//! timeout, and then serves the connection the same way (HTTP/2 when the
//! client chose `h2` by ALPN).
//!
//! Connections are served by [`Workers`]: one single-threaded runtime per
//! core, each serving its connections from start to end, with its own
//! upstream connection pools. A request, its upstream call and its response
//! then stay on one thread: no work stealing, no wake-ups across threads,
//! which at low load cost more than the proxying itself.

pub(crate) mod connection;
mod request;
mod streams;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::Response;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, oneshot, watch};

use crate::inbound::drain::{Drain, Watch};
use crate::outbound::response_body::ResponseBody;
use crate::tls::server::Acceptor;

pub use connection::Timeouts;
pub use request::{Client, Request, WorkerId};

/// The data plane's threads. Dropping this ends them, closing any
/// connection still open on them.
pub struct Workers {
    handles: Vec<Handle>,
    next: AtomicUsize,
    // Each thread runs until its sender is dropped.
    _exit: Vec<oneshot::Sender<()>>,
}

impl Workers {
    /// One worker per core the process may use.
    pub fn default_count() -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }

    pub fn start(count: usize) -> anyhow::Result<Self> {
        let mut handles = Vec::with_capacity(count);
        let mut exit = Vec::with_capacity(count);
        // Workers log to the subscriber in force where the gateway starts:
        // the global one, or a thread's own (as in tests).
        let dispatch = tracing::dispatcher::get_default(Clone::clone);
        for i in 0..count.max(1) {
            let dispatch = dispatch.clone();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            handles.push(runtime.handle().clone());
            let (tx, rx) = oneshot::channel::<()>();
            exit.push(tx);
            std::thread::Builder::new()
                .name(format!("infergate-worker-{i}"))
                .spawn(move || {
                    let _logging = tracing::dispatcher::set_default(&dispatch);
                    // Drives the connections spawned onto this runtime.
                    runtime.block_on(async move {
                        tokio::select! {
                            _ = rx => {}
                            () = tick_forever() => {}
                        }
                    });
                })?;
        }
        Ok(Self {
            handles,
            next: AtomicUsize::new(0),
            _exit: exit,
        })
    }

    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// Tasks alive on the workers' runtimes.
    pub fn alive_tasks(&self) -> usize {
        self.handles
            .iter()
            .map(|h| h.metrics().num_alive_tasks())
            .sum()
    }

    /// Workers take new connections in turn, which balances connections
    /// exactly (a hash over `SO_REUSEPORT` listeners would not).
    fn next(&self) -> (WorkerId, &Handle) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) % self.handles.len();
        (id, &self.handles[id])
    }
}

/// Tokio's timer wakes its own thread (an eventfd write and an extra
/// epoll round) whenever a new deadline is earlier than every pending one,
/// which for a lone request's first-byte timeout is every time. A timer
/// that is always due within [`TICK`] keeps request timeouts from being the
/// earliest, at the price of one wake-up per tick.
async fn tick_forever() {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
    }
}

/// Shorter than any timeout a request arms in the common configuration
/// (first byte, idle), long enough to cost nothing when idle.
const TICK: std::time::Duration = std::time::Duration::from_secs(1);

/// Serve `handler` on `listener` until `stop` turns true, then stop
/// accepting; open connections finish through `drain`. Accepting
/// runs on the caller's runtime; each connection is handed to a worker.
/// A connection holds one of `slots` while it is open; with none free,
/// accepting waits. With `tls`, connections are TLS.
#[allow(clippy::too_many_arguments)]
pub fn serve<H, F>(
    listener: TcpListener,
    workers: Arc<Workers>,
    handler: H,
    mut stop: watch::Receiver<bool>,
    drain: Arc<Drain>,
    timeouts: Timeouts,
    slots: ConnectionSlots,
    tls: Option<Arc<Acceptor>>,
) -> tokio::task::JoinHandle<()>
where
    H: Fn(WorkerId, Request) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    tokio::spawn(async move {
        // Said once each time the limit is reached, not per connection.
        let mut at_limit = false;
        loop {
            let full = slots.semaphore.available_permits() == 0;
            if full && !at_limit {
                tracing::warn!(
                    limit = slots.limit,
                    "connection limit reached: new connections wait to be accepted"
                );
            }
            at_limit = full;
            let slot = tokio::select! {
                slot = Arc::clone(&slots.semaphore).acquire_owned() => {
                    slot.expect("the semaphore is never closed")
                }
                _ = stop.wait_for(|s| *s) => break,
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|s| *s) => break,
            };
            let (stream, peer) = match accepted {
                Ok(conn) => conn,
                // The connection failed before it was accepted.
                Err(e) if is_connection_error(&e) => continue,
                // Out of file descriptors (or memory): accepting again at
                // once would fail again, in a busy loop. Open connections
                // go on meanwhile, and some will close.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; pausing accepts");
                    tokio::select! {
                        () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                        _ = stop.wait_for(|s| *s) => break,
                    }
                }
            };
            let Some(slot) = slots.for_client(slot, peer.ip()) else {
                // Closing at once: the client learns without a slot spent.
                tracing::debug!(%peer, "per-client connection limit reached; closing");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (worker, runtime) = workers.next();
            let stream = match stream.into_std().and_then(|s| register(runtime, s)) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "cannot hand a connection to a worker");
                    continue;
                }
            };
            // Counted as open from now: a drain that starts before the
            // connection's task first runs still waits for it.
            let watch = drain.watch();
            let handler = handler.clone();
            let tls = tls.clone();
            runtime.spawn(async move {
                let _slot = slot;
                match tls {
                    None => connection::serve(stream, peer, handler, worker, watch, timeouts).await,
                    Some(tls) => {
                        serve_tls(&tls, stream, peer, handler, worker, watch, timeouts).await;
                    }
                }
            });
        }
    })
}

/// Shake hands on `stream`, then serve it. The handshake and the first
/// request's head share the header timeout, so a client that never
/// finishes the handshake holds its slot no longer than one that sends
/// nothing; a drain that starts meanwhile closes it.
async fn serve_tls<H, F>(
    tls: &Acceptor,
    stream: TcpStream,
    peer: SocketAddr,
    handler: H,
    worker: WorkerId,
    watch: Watch,
    timeouts: Timeouts,
) where
    H: Fn(WorkerId, Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let started = tokio::time::Instant::now();
    let accepted = tokio::select! {
        accepted = tls.accept(stream, timeouts.header) => accepted,
        () = watch.draining() => return,
    };
    let accepted = match accepted {
        Ok(accepted) => accepted,
        Err(e) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed; closing");
            return;
        }
    };
    let client = Client {
        peer,
        tls: true,
        certificate: accepted.client_cert,
    };
    let timeouts = Timeouts {
        header: timeouts.header.saturating_sub(started.elapsed()),
        ..timeouts
    };
    connection::serve(accepted.stream, client, handler, worker, watch, timeouts).await;
}

/// How long accepting pauses after an error that is not one connection's,
/// such as running out of file descriptors.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(100);

/// An error that concerns only the connection being accepted.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

/// Room for this many client connections open at once, shared by the
/// listeners given it, and optionally for this many from one address.
#[derive(Clone)]
pub struct ConnectionSlots {
    semaphore: Arc<Semaphore>,
    limit: u32,
    per_client: Option<Arc<PerClient>>,
    /// Connections accepted and still open (the accept loop holds a slot
    /// while it waits, which the semaphore alone would count).
    open: Arc<AtomicUsize>,
}

struct PerClient {
    limit: u32,
    open: Mutex<HashMap<IpAddr, u32>>,
}

/// A connection's place: its slot, and its count against its address.
pub struct Slot {
    _slot: tokio::sync::OwnedSemaphorePermit,
    client: Option<(Arc<PerClient>, IpAddr)>,
    open: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        if let Some((per_client, ip)) = &self.client {
            let mut open = per_client.open.lock();
            if let Some(n) = open.get_mut(ip) {
                *n -= 1;
                if *n == 0 {
                    open.remove(ip);
                }
            }
        }
    }
}

impl ConnectionSlots {
    pub fn new(limit: u32, per_client: Option<u32>) -> Self {
        Self {
            semaphore: Arc::new(Semaphore::new(limit as usize)),
            limit,
            per_client: per_client.map(|limit| {
                Arc::new(PerClient {
                    limit,
                    open: Mutex::new(HashMap::new()),
                })
            }),
            open: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Client connections open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// `slot` for a connection from `ip`, unless that address has its
    /// limit of connections open.
    fn for_client(&self, slot: tokio::sync::OwnedSemaphorePermit, ip: IpAddr) -> Option<Slot> {
        let client = match &self.per_client {
            None => None,
            Some(per_client) => {
                let mut open = per_client.open.lock();
                let n = open.entry(ip).or_insert(0);
                if *n >= per_client.limit {
                    return None;
                }
                *n += 1;
                Some((Arc::clone(per_client), ip))
            }
        };
        self.open.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            _slot: slot,
            client,
            open: Arc::clone(&self.open),
        })
    }
}

/// Move a socket to `runtime`'s I/O driver, so that its readiness wakes
/// that worker.
fn register(runtime: &Handle, stream: std::net::TcpStream) -> std::io::Result<TcpStream> {
    // `from_std` registers with the runtime entered on this thread.
    let _entered = runtime.enter();
    TcpStream::from_std(stream)
}

/// Raise the process's soft limit on open file descriptors to its hard
/// limit, as Go's runtime does at start: the soft limit is often 1,024,
/// which a gateway (a descriptor per client connection and per replica
/// connection) outgrows long before `limits.maxConnections`. Returns the
/// limit now in force.
pub fn raise_descriptor_limit() -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain calls on a valid rlimit value.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit = raised;
        }
    }
    Ok(limit.rlim_cur)
}

pub async fn bind(address: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {address}: {e}"))?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}
