//! The pool against a fake HTTP/1.1 replica on 127.0.0.1 that counts its
//! connections and misbehaves on cue, and a real h2c server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{Connections, Error, Settings};
use crate::outbound::{Forwarded, Outgoing, TrustedProxies};

/// What the fake replica does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// 200 with the connection's number as the body, `c0`, `c1`, …
    Ok,
    /// Like `Ok`, then the replica closes the connection while it is idle,
    /// as a keep-alive timeout would.
    OkThenClose,
    /// The replica closes the connection without answering.
    HangUp,
    /// A head announcing 10 bytes, and 2 of them; the rest never comes.
    Partial,
    /// Like `Ok`, the body chunked, one chunk per character, written in
    /// pieces.
    Chunked,
    /// 200 with a body of [`LARGE`] bytes, more than one read takes.
    Large,
    /// Like `Ok`, with bytes no request asked for right behind it.
    OkThenGarbage,
    /// An informational `100 Continue`, then the replica closes the
    /// connection.
    ContinueThenHangUp,
}

const LARGE: usize = 300_000;

/// The answer to the `request`-th request (from 0) on the `conn`-th
/// connection (from 0, in accept order).
type Plan = dyn Fn(usize, usize) -> Answer + Send + Sync;

struct FakeReplica {
    addr: SocketAddr,
    accepted: watch::Receiver<usize>,
    /// Connections the pool closed (the replica read end-of-file).
    closed_by_pool: watch::Receiver<usize>,
    /// Connections the replica closed itself.
    closed_by_replica: watch::Receiver<usize>,
    /// The connection of each request received, in order.
    requests: Arc<Mutex<Vec<usize>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Counters {
    accepted: watch::Sender<usize>,
    closed_by_pool: watch::Sender<usize>,
    closed_by_replica: watch::Sender<usize>,
    requests: Arc<Mutex<Vec<usize>>>,
}

impl FakeReplica {
    async fn start(plan: impl Fn(usize, usize) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (accepted, accepted_rx) = watch::channel(0);
        let (closed_by_pool, closed_by_pool_rx) = watch::channel(0);
        let (closed_by_replica, closed_by_replica_rx) = watch::channel(0);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let counters = Arc::new(Counters {
            accepted,
            closed_by_pool,
            closed_by_replica,
            requests: Arc::clone(&requests),
        });
        let plan: Arc<Plan> = Arc::new(plan);
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            for conn in 0.. {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                counters.accepted.send_modify(|n| *n += 1);
                connections.spawn(serve(
                    stream,
                    conn,
                    Arc::clone(&plan),
                    Arc::clone(&counters),
                ));
            }
        });
        Self {
            addr,
            accepted: accepted_rx,
            closed_by_pool: closed_by_pool_rx,
            closed_by_replica: closed_by_replica_rx,
            requests,
            task,
        }
    }

    fn accepted(&self) -> usize {
        *self.accepted.borrow()
    }
}

async fn serve(mut stream: TcpStream, conn: usize, plan: Arc<Plan>, counters: Arc<Counters>) {
    for request in 0.. {
        if !read_request(&mut stream).await {
            counters.closed_by_pool.send_modify(|n| *n += 1);
            return;
        }
        counters.requests.lock().push(conn);
        let body = format!("c{conn}");
        let ok = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        match plan(conn, request) {
            Answer::Ok => stream.write_all(ok.as_bytes()).await.unwrap(),
            Answer::OkThenClose => {
                stream.write_all(ok.as_bytes()).await.unwrap();
                drop(stream);
                counters.closed_by_replica.send_modify(|n| *n += 1);
                return;
            }
            Answer::HangUp => {
                drop(stream);
                counters.closed_by_replica.send_modify(|n| *n += 1);
                return;
            }
            Answer::Chunked => {
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await
                    .unwrap();
                for c in body.chars() {
                    stream
                        .write_all(format!("1;ext=x\r\n{c}").as_bytes())
                        .await
                        .unwrap();
                    stream.write_all(b"\r\n").await.unwrap();
                }
                stream.write_all(b"0\r\ntrailer: t\r\n\r\n").await.unwrap();
            }
            Answer::Large => {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {LARGE}\r\n\r\n");
                stream.write_all(head.as_bytes()).await.unwrap();
                stream.write_all(&vec![b'x'; LARGE]).await.unwrap();
            }
            Answer::ContinueThenHangUp => {
                stream
                    .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                    .await
                    .unwrap();
                drop(stream);
                counters.closed_by_replica.send_modify(|n| *n += 1);
                return;
            }
            Answer::OkThenGarbage => {
                // One write: the stray bytes arrive with the response.
                let both = format!("{ok}HTTP/1.1 200 OK\r\n");
                stream.write_all(both.as_bytes()).await.unwrap();
            }
            Answer::Partial => {
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nab")
                    .await
                    .unwrap();
                // Nothing more is sent; wait for the pool to give up.
                let mut rest = [0u8; 64];
                while stream.read(&mut rest).await.is_ok_and(|n| n > 0) {}
                counters.closed_by_pool.send_modify(|n| *n += 1);
                return;
            }
        }
    }
}

/// Read one request (head and `content-length` body); false at end of file.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap());
    while buf.len() < head_end + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

fn settings() -> Settings {
    Settings::new(config::Protocol::Http1, Duration::from_secs(5))
}

/// The request every test sends, to any replica.
fn request(_to: SocketAddr) -> &'static Outgoing<'static> {
    static URI: LazyLock<Uri> = LazyLock::new(|| Uri::from_static("/v1/chat/completions"));
    static HEADERS: LazyLock<HeaderMap> = LazyLock::new(HeaderMap::new);
    static FORWARDED: LazyLock<Forwarded> = LazyLock::new(|| {
        let peer = "127.0.0.1:1".parse().unwrap();
        Forwarded::new(&HEADERS, peer, "http", &TrustedProxies::default())
    });
    static BODY: Bytes = Bytes::from_static(b"{}");
    static ID: HeaderValue = HeaderValue::from_static("r1");
    static TRACE: HeaderValue =
        HeaderValue::from_static("00-11111111111111111111111111111111-2222222222222222-01");
    static REQUEST: LazyLock<Outgoing<'static>> = LazyLock::new(|| Outgoing {
        method: &Method::POST,
        uri: &URI,
        headers: &HEADERS,
        body: &BODY,
        request_id: &ID,
        traceparent: &TRACE,
        forwarded: &FORWARDED,
        caller: Default::default(),
    });
    &REQUEST
}

/// Send a request and read its body to the end.
async fn fetch(pool: &Connections, addr: SocketAddr) -> Result<String, Error> {
    let resp = within(pool.send(&addr.to_string(), request(addr))).await?;
    assert_eq!(resp.status, StatusCode::OK);
    Ok(body_text(resp).await)
}

async fn body_text(resp: crate::outbound::Response) -> String {
    let bytes = within(resp.body.collect()).await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Waits in these tests are for events; this only keeps a broken pool
/// from hanging the test run.
async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(10), f)
        .await
        .expect("timed out")
}

async fn until(counter: &watch::Receiver<usize>, n: usize) {
    let mut counter = counter.clone();
    within(counter.wait_for(|c| *c >= n)).await.unwrap();
}

#[tokio::test]
async fn an_idle_connection_is_reused() {
    let replica = FakeReplica::start(|_, _| Answer::Ok).await;
    let pool = Connections::new(settings());
    for _ in 0..3 {
        assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c0");
        assert_eq!(pool.idle(&replica.addr.to_string()), 1);
    }
    assert_eq!(replica.accepted(), 1);
}

#[tokio::test]
async fn the_most_recently_used_idle_connection_goes_first() {
    let replica = FakeReplica::start(|_, _| Answer::Ok).await;
    let pool = Connections::new(settings());
    let addr = replica.addr.to_string();
    // Two requests at once need two connections.
    let (a, b) = tokio::join!(
        pool.send(&addr, request(replica.addr)),
        pool.send(&addr, request(replica.addr))
    );
    assert_eq!(replica.accepted(), 2);
    let first = body_text(a.unwrap()).await;
    let last = body_text(b.unwrap()).await;
    assert_ne!(first, last);
    // The connection whose response ended last is reused first.
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), last);
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), last);
    assert_eq!(replica.accepted(), 2);
}

#[tokio::test]
async fn a_connection_the_replica_closed_while_idle_costs_no_failed_request() {
    let replica = FakeReplica::start(|conn, _| match conn {
        0 => Answer::OkThenClose,
        _ => Answer::Ok,
    })
    .await;
    let pool = Connections::new(settings());
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c0");
    until(&replica.closed_by_replica, 1).await;
    // At once, while the pool may not have noticed the close yet.
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c1");
    assert_eq!(replica.accepted(), 2);
    assert_eq!(*replica.requests.lock(), [0, 1]);
}

#[tokio::test]
async fn a_request_written_to_a_reused_connection_that_then_closes_is_not_sent_again() {
    // The replica reads the second request on the first connection whole,
    // then closes it without answering: it may be generating already, so
    // the request must not reach it (or another replica) a second time.
    let replica = FakeReplica::start(|conn, request| match (conn, request) {
        (0, 1) => Answer::HangUp,
        _ => Answer::Ok,
    })
    .await;
    let pool = Connections::new(settings());
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c0");
    let err = fetch(&pool, replica.addr).await.unwrap_err();
    assert!(err.was_sent() && !err.is_connect(), "{err:?}");
    assert_eq!(*replica.requests.lock(), [0, 0]);
    assert_eq!(replica.accepted(), 1);
}

#[tokio::test]
async fn a_fresh_connection_that_fails_is_the_callers_to_handle() {
    let replica = FakeReplica::start(|_, _| Answer::HangUp).await;
    let pool = Connections::new(settings());
    let err = fetch(&pool, replica.addr).await.unwrap_err();
    assert!(err.was_sent(), "{err:?}");
    assert!(!err.is_connect());
    // Not sent again.
    assert_eq!(replica.accepted(), 1);
    assert_eq!(replica.requests.lock().len(), 1);
}

#[tokio::test]
async fn a_response_not_read_to_its_end_does_not_return_its_connection() {
    let replica = FakeReplica::start(|conn, _| match conn {
        0 => Answer::Partial,
        _ => Answer::Ok,
    })
    .await;
    let pool = Connections::new(settings());
    let resp = within(pool.send(&replica.addr.to_string(), request(replica.addr)))
        .await
        .unwrap();
    let mut body = resp.body;
    let frame = within(body.frame()).await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "ab");
    // The client went away mid-body.
    drop(body);
    assert_eq!(pool.idle(&replica.addr.to_string()), 0);
    // The replica sees the connection close: its generation would stop.
    until(&replica.closed_by_pool, 1).await;
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c1");
    assert_eq!(replica.accepted(), 2);
}

#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout() {
    let replica = FakeReplica::start(|_, _| Answer::Ok).await;
    let idle_timeout = Duration::from_millis(200);
    let pool = Connections::new(Settings {
        idle_timeout,
        ..settings()
    });
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c0");
    let idle_since = tokio::time::Instant::now();
    until(&replica.closed_by_pool, 1).await;
    assert!(
        idle_since.elapsed() >= idle_timeout,
        "closed after {:?}",
        idle_since.elapsed()
    );
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c1");
    assert_eq!(replica.accepted(), 2);
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let pool = Connections::new(settings());
    let err = within(pool.send(&addr.to_string(), request(addr)))
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    assert!(matches!(err, Error::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn a_connection_that_is_never_accepted_times_out() {
    // A listener whose accept queue is full: the kernel drops further SYNs,
    // so connecting hangs until the connect timeout.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut queued = Vec::new();
    while let Ok(Ok(s)) =
        tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(addr)).await
    {
        queued.push(s);
        assert!(queued.len() < 64, "the accept queue never filled");
    }
    let connect_timeout = Duration::from_millis(100);
    let pool = Connections::new(Settings {
        connect_timeout,
        ..settings()
    });
    let err = within(pool.send(&addr.to_string(), request(addr)))
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    assert!(matches!(err, Error::ConnectTimeout { .. }), "{err:?}");
}

#[tokio::test]
async fn h2c_requests_share_one_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted_tx, accepted) = watch::channel(0usize);
    let server = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            accepted_tx.send_modify(|n| *n += 1);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                        let version = format!("{:?}", req.version());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(version))))
                    });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let pool = Connections::new(Settings::new(config::Protocol::H2c, Duration::from_secs(5)));
    let key = addr.to_string();
    let h2 = request(addr);
    // The first requests arrive together, before any connection is open:
    // they wait for one rather than each opening their own.
    let (first, second) =
        within(async { tokio::join!(pool.send(&key, h2), pool.send(&key, h2)) }).await;
    // Later ones, and one while a response is still being read, share it.
    let held = within(pool.send(&key, h2)).await.unwrap();
    let (b, c) = tokio::join!(pool.send(&key, h2), pool.send(&key, h2));
    for resp in [
        first.unwrap(),
        second.unwrap(),
        held,
        b.unwrap(),
        c.unwrap(),
    ] {
        assert_eq!(body_text(resp).await, "HTTP/2.0");
    }
    assert_eq!(*accepted.borrow(), 1);
    server.abort();
}

#[tokio::test]
async fn a_chunked_response_is_decoded_and_its_connection_reused() {
    let replica = FakeReplica::start(|_, _| Answer::Chunked).await;
    let pool = Connections::new(settings());
    for _ in 0..3 {
        assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c0");
    }
    assert_eq!(replica.accepted(), 1);
}

#[tokio::test]
async fn a_body_larger_than_a_read_arrives_whole() {
    let replica = FakeReplica::start(|_, _| Answer::Large).await;
    let pool = Connections::new(settings());
    for _ in 0..2 {
        let body = fetch(&pool, replica.addr).await.unwrap();
        assert_eq!(body.len(), LARGE);
        assert!(body.bytes().all(|b| b == b'x'));
    }
    assert_eq!(replica.accepted(), 1);
}

#[tokio::test]
async fn a_connection_with_bytes_nobody_asked_for_is_not_reused() {
    let replica = FakeReplica::start(|conn, _| match conn {
        0 => Answer::OkThenGarbage,
        _ => Answer::Ok,
    })
    .await;
    let pool = Connections::new(settings());
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c0");
    // What follows the response is not a response to anything sent: the
    // connection is not used again.
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c1");
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c1");
    assert_eq!(replica.accepted(), 2);
}

#[tokio::test]
async fn requests_waiting_for_an_h2c_connection_share_its_failure() {
    // Nothing listens here: the connection is refused.
    let addr = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let pool = Connections::new(Settings::new(config::Protocol::H2c, Duration::from_secs(5)));
    let key = addr.to_string();
    let (a, b) = within(async {
        tokio::join!(
            pool.send(&key, request(addr)),
            pool.send(&key, request(addr))
        )
    })
    .await;
    for err in [a.unwrap_err(), b.unwrap_err()] {
        assert!(err.is_connect(), "{err:?}");
        assert!(err.to_string().contains("cannot connect"), "{err}");
    }
    // Nothing is left half-open: the next request tries again.
    assert!(
        within(pool.send(&key, request(addr)))
            .await
            .unwrap_err()
            .is_connect()
    );
}

#[tokio::test]
async fn a_request_the_replica_began_to_answer_is_not_sent_again() {
    let replica = FakeReplica::start(|_, request| match request {
        0 => Answer::Ok,
        _ => Answer::ContinueThenHangUp,
    })
    .await;
    let pool = Connections::new(settings());
    assert_eq!(fetch(&pool, replica.addr).await.unwrap(), "c0");
    // On the reused connection the replica answered `100 Continue` and
    // closed: it had the request, so it fails rather than going out twice.
    let err = fetch(&pool, replica.addr).await.unwrap_err();
    assert!(err.was_sent() && !err.is_connect(), "{err:?}");
    assert_eq!(replica.requests.lock().len(), 2);
    assert_eq!(replica.accepted(), 1);
}
