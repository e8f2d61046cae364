//! Client connections against real sockets on 127.0.0.1: hyper's framing,
//! and the limits this server puts around it. Timeouts are tested in
//! paused time.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioExecutor;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::*;
use crate::inbound::drain::Drain;
use crate::outbound::response_body;

const HEADER_TIMEOUT: Duration = Duration::from_secs(15);

fn timeouts() -> Timeouts {
    Timeouts::new(HEADER_TIMEOUT)
}

/// A served connection answering with `handler`, and the client's socket.
async fn served<H, F>(handler: H, drain: &Drain, timeouts: Timeouts) -> (JoinHandle<()>, TcpStream)
where
    H: Fn(WorkerId, Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    let watch = drain.watch();
    let task = tokio::spawn(serve(server, peer, handler, 0, watch, timeouts));
    (task, client)
}

/// Answers with the method and path.
fn echo(req: Request) -> Response<ResponseBody> {
    Response::new(response_body::full(Bytes::from(format!(
        "{} {}",
        req.method,
        req.uri.path()
    ))))
}

async fn echoing() -> (JoinHandle<()>, TcpStream) {
    served(|_, req| async move { echo(req) }, &Drain::new(), timeouts()).await
}

/// Longer than any timeout here, for waits in paused time; in real time
/// it only keeps a broken server from hanging the run.
async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(600), f)
        .await
        .expect("timed out")
}

/// One response: its head, and its body (by Content-Length).
async fn response(client: &mut TcpStream, buf: &mut Vec<u8>) -> (String, String) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf[..end + 4].to_vec()).unwrap();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                read_more(client, buf).await;
            }
            let body = String::from_utf8(buf[end + 4..end + 4 + length].to_vec()).unwrap();
            buf.drain(..end + 4 + length);
            return (head, body);
        }
        read_more(client, buf).await;
    }
}

async fn read_more(client: &mut TcpStream, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    let n = within(client.read(&mut chunk)).await.unwrap();
    assert!(
        n > 0,
        "closed; read so far: {:?}",
        String::from_utf8_lossy(buf)
    );
    buf.extend_from_slice(&chunk[..n]);
}

/// Whether the server closed the connection (end of file or reset).
async fn closed(client: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    matches!(within(client.read_to_end(&mut rest)).await, Ok(_) | Err(_)) && rest.is_empty()
}

#[tokio::test]
async fn kept_alive_and_pipelined_requests_are_answered_in_order() {
    let (_task, mut client) = echoing().await;
    let mut buf = Vec::new();
    client
        .write_all(b"GET /a HTTP/1.1\r\nhost: gw\r\n\r\nGET /b HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut client, &mut buf).await.1, "GET /a");
    assert_eq!(response(&mut client, &mut buf).await.1, "GET /b");
    client
        .write_all(b"POST /c HTTP/1.1\r\nhost: gw\r\ncontent-length: 2\r\n\r\n{}")
        .await
        .unwrap();
    assert_eq!(response(&mut client, &mut buf).await.1, "POST /c");
}

#[tokio::test]
async fn a_client_leaving_drops_the_request_being_handled() {
    // The handler holds `_on_drop` until it is dropped, and never answers.
    let (started_tx, mut started) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let handler = move |_, _req| {
        let (dropped, on_drop) = oneshot::channel::<()>();
        started_tx.send(dropped).unwrap();
        async move {
            let _on_drop = on_drop;
            std::future::pending::<Response<ResponseBody>>().await
        }
    };
    let (task, mut client) = served(handler, &Drain::new(), timeouts()).await;
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    let mut dropped = within(started.recv()).await.unwrap();
    drop(client);
    within(dropped.closed()).await;
    within(task).await.unwrap();
}

#[tokio::test]
async fn a_panicking_handler_answers_500_and_the_connection_goes_on() {
    let handler = |_, req: Request| async move {
        assert!(req.uri.path() != "/panic", "a bug in a stage");
        echo(req)
    };
    let (_task, mut client) = served(handler, &Drain::new(), timeouts()).await;
    let mut buf = Vec::new();
    client
        .write_all(b"GET /panic HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = response(&mut client, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 500 "), "{head}");
    assert!(body.contains("\"code\":\"internal_error\""), "{body}");
    client
        .write_all(b"GET /fine HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(response(&mut client, &mut buf).await.1, "GET /fine");
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_sends_no_request_closes_after_the_header_timeout() {
    for sent in [&b""[..], b"GET / HTTP/1.1\r\nhost:"] {
        let (task, mut client) = echoing().await;
        client.write_all(sent).await.unwrap();
        let started = Instant::now();
        within(task).await.unwrap();
        let after = started.elapsed();
        assert!(after >= HEADER_TIMEOUT && after < IDLE_TIMEOUT, "{after:?}");
        assert!(closed(&mut client).await);
    }
}

#[tokio::test(start_paused = true)]
async fn a_kept_alive_connection_waits_for_the_idle_timeout_not_the_header_timeout() {
    let (task, mut client) = echoing().await;
    let mut buf = Vec::new();
    for _ in 0..3 {
        client
            .write_all(b"GET /late HTTP/1.1\r\nhost: gw\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(response(&mut client, &mut buf).await.1, "GET /late");
        tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        assert!(!task.is_finished());
    }
    let idle_since = Instant::now();
    within(task).await.unwrap();
    assert!(
        idle_since.elapsed() <= Duration::from_secs(2),
        "{:?}",
        idle_since.elapsed()
    );
    assert!(closed(&mut client).await);
}

/// A response far larger than the socket buffers between server and
/// client, for a client that reads little or nothing of it.
async fn serving_a_large_response(send: Duration) -> (JoinHandle<()>, TcpStream, usize) {
    const SIZE: usize = 64 << 20;
    let handler =
        |_, _| async { Response::new(response_body::full(Bytes::from(vec![b'x'; SIZE]))) };
    let (task, mut client) = served(handler, &Drain::new(), Timeouts { send, ..timeouts() }).await;
    client
        .write_all(b"GET / HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    (task, client, SIZE)
}

#[tokio::test(start_paused = true)]
async fn a_client_that_stops_reading_is_dropped_after_the_send_timeout() {
    let (task, _client, _) = serving_a_large_response(SEND_TIMEOUT).await;
    tokio::time::sleep(SEND_TIMEOUT - Duration::from_secs(1)).await;
    assert!(!task.is_finished());
    // Paused time moves to the deadline once every task waits.
    within(task).await.unwrap();
}

/// In real time: in paused time, the clock may jump past the deadline
/// before the kernel has told the server the client read.
#[tokio::test]
async fn a_client_that_reads_slowly_gets_the_whole_response() {
    let timeout = Duration::from_secs(1);
    let (task, client, size) = serving_a_large_response(timeout).await;
    let mut buf = vec![0; 1 << 20];
    let mut read = 0;
    // All that has arrived, then a pause of a quarter of the timeout, six
    // times, the pauses longer than the timeout together: each read lets
    // the server write more, which moves the timeout on.
    for pause in 0.. {
        client.readable().await.unwrap();
        loop {
            match client.try_read(&mut buf) {
                Ok(0) => panic!("closed after {read} bytes"),
                Ok(n) => read += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        if read >= size {
            break;
        }
        if pause < 6 {
            tokio::time::sleep(timeout / 4).await;
        }
    }
    assert!(!task.is_finished());
}

#[tokio::test]
async fn draining_closes_idle_connections_and_finishes_requests_in_flight() {
    let drain = Arc::new(Drain::new());
    let (release, released) = oneshot::channel::<()>();
    let released = Arc::new(parking_lot::Mutex::new(Some(released)));
    let (serving_tx, mut serving) = mpsc::unbounded_channel::<()>();
    let handler = move |_, req: Request| {
        let wait = released.lock().take();
        serving_tx.send(()).unwrap();
        async move {
            if let Some(wait) = wait {
                let _ = wait.await;
            }
            echo(req)
        }
    };
    let (idle, mut idle_client) = served(handler.clone(), &drain, timeouts()).await;
    let (busy, mut client) = served(handler, &drain, timeouts()).await;
    client
        .write_all(b"GET /slow HTTP/1.1\r\nhost: gw\r\n\r\n")
        .await
        .unwrap();
    within(serving.recv()).await.unwrap();

    drain.start();
    within(idle).await.unwrap();
    assert!(closed(&mut idle_client).await);
    let finished = drain.finished();
    tokio::pin!(finished);
    assert!(futures_util::poll!(finished.as_mut()).is_pending());
    release.send(()).unwrap();
    let (head, body) = response(&mut client, &mut Vec::new()).await;
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, "GET /slow");
    within(busy).await.unwrap();
    within(finished).await;
}

fn ok() -> Response<ResponseBody> {
    Response::new(response_body::full(Bytes::from_static(b"ok")))
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served_on_the_same_port() {
    let (_task, io) = echoing().await;
    let (mut client, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::post("http://gw/v1/x")
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = within(client.send_request(req)).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(
        resp.into_body().collect().await.unwrap().to_bytes(),
        "POST /v1/x"
    );
}

#[tokio::test(start_paused = true)]
async fn an_idle_h2c_connection_closes_after_the_idle_timeout_but_not_with_a_stream_open() {
    let (release, released) = oneshot::channel::<()>();
    let released = Arc::new(parking_lot::Mutex::new(Some(released)));
    let (handling_tx, mut handling) = mpsc::unbounded_channel::<()>();
    let handler = move |_, _| {
        let wait = released.lock().take();
        handling_tx.send(()).unwrap();
        async move {
            if let Some(wait) = wait {
                let _ = wait.await;
            }
            ok()
        }
    };
    // Without pings: in paused time the clock could pass a ping's deadline
    // before the client's answer, on a real socket, is read.
    let no_pings = Timeouts {
        ping_interval: None,
        ..timeouts()
    };
    let (task, io) = served(handler, &Drain::new(), no_pings).await;
    let (mut client, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    let client_conn = tokio::spawn(conn);
    let request = || {
        http::Request::post("http://gw/v1/chat/completions")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    // The first request waits in the handler well past the idle timeout:
    // its stream is open, so the connection stays.
    let started = Instant::now();
    let slow = tokio::spawn(client.send_request(request()));
    within(handling.recv()).await.unwrap();
    tokio::time::sleep(IDLE_TIMEOUT * 2).await;
    assert!(!task.is_finished());
    release.send(()).unwrap();
    let answer = within(slow).await.unwrap().unwrap();
    assert_eq!(answer.into_body().collect().await.unwrap().to_bytes(), "ok");
    // Then idle: closed after the timeout, not before.
    let idle_since = Instant::now();
    within(task).await.unwrap();
    assert!(idle_since.elapsed() >= IDLE_TIMEOUT);
    assert!(started.elapsed() >= IDLE_TIMEOUT * 3);
    within(client_conn).await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_h2c_client_that_does_not_answer_pings_is_dropped() {
    // A header timeout longer than the rest, so that pings are what ends
    // the connection.
    let patient = Timeouts {
        header: IDLE_TIMEOUT * 2,
        ..timeouts()
    };
    let (task, mut io) = served(|_, _| async { ok() }, &Drain::new(), patient).await;
    // The preface and empty settings, then silence: pings go unanswered.
    io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let started = Instant::now();
    within(task).await.unwrap();
    let closed_after = started.elapsed();
    assert!(closed_after >= PING_INTERVAL, "{closed_after:?}");
    assert!(closed_after < IDLE_TIMEOUT, "{closed_after:?}");
    let mut rest = Vec::new();
    within(io.read_to_end(&mut rest)).await.unwrap();
    assert!(!rest.is_empty());
}
