//! The server connection against a raw client on 127.0.0.1: framing both
//! ways, keep-alive and pipelining, refusals, the client leaving, and
//! draining. Streamed responses are covered by the gateway's tests, whose
//! replicas stream.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use super::*;
use crate::body;
use crate::drain::Drain;

const LIMIT: u64 = 1000;

/// What the handler saw of a request, as its response body.
fn echo(req: Request) -> Response<ResponseBody> {
    match req.body {
        RequestBody::Read(Ok(body)) => Response::new(body::full(Bytes::from(format!(
            "{} {} {}",
            req.method,
            req.uri,
            String::from_utf8_lossy(&body)
        )))),
        RequestBody::Read(Err(e)) => e.into_response(),
        RequestBody::Streaming(_) => unreachable!("HTTP/1.1 bodies are read"),
    }
}

/// A served connection (watched by `drain`) answering with `handler`, and
/// the client's end.
async fn served<H, F>(handler: H, drain: &Drain) -> (tokio::task::JoinHandle<()>, TcpStream)
where
    H: Fn(WorkerId, Request) -> F + Send + 'static,
    F: Future<Output = Response<ResponseBody>> + Send,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let watch = drain.watch();
    let task = tokio::spawn(async move {
        Connection::new(server)
            .serve(handler, 0, LIMIT, watch)
            .await;
    });
    (task, client)
}

async fn echoing() -> (tokio::task::JoinHandle<()>, TcpStream) {
    served(|_, req| async move { echo(req) }, &Drain::new()).await
}

/// Longer than [`ARRIVAL_TIMEOUT`] and twice [`IDLE_TIMEOUT`], for the tests
/// that run in paused time.
async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(200), f)
        .await
        .expect("timed out")
}

/// One response read off `client`: its head, and its body as framed by
/// Content-Length, chunks, or the connection closing.
async fn response(client: &mut TcpStream, buf: &mut Vec<u8>) -> (String, String) {
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8(buf.drain(..end + 4).collect()).unwrap();
            if head.starts_with("HTTP/1.1 100 ") {
                continue;
            }
            let lower = head.to_ascii_lowercase();
            let body = if let Some(len) = lower
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
            {
                let len: usize = len.trim().parse().unwrap();
                while buf.len() < len {
                    read_more(client, buf).await;
                }
                buf.drain(..len).collect()
            } else if lower.contains("transfer-encoding: chunked") {
                while !buf.windows(5).any(|w| w == b"0\r\n\r\n") {
                    read_more(client, buf).await;
                }
                let end = buf.windows(5).position(|w| w == b"0\r\n\r\n").unwrap() + 5;
                buf.drain(..end).collect()
            } else {
                while read_more(client, buf).await > 0 {}
                std::mem::take(buf)
            };
            return (head, String::from_utf8(body).unwrap());
        }
        assert!(read_more(client, buf).await > 0, "closed before a head");
    }
}

async fn read_more(client: &mut TcpStream, buf: &mut Vec<u8>) -> usize {
    let mut chunk = [0u8; 4096];
    let n = within(client.read(&mut chunk)).await.unwrap_or(0);
    buf.extend_from_slice(&chunk[..n]);
    n
}

/// Whether the server closed the connection (after any bytes left).
async fn closed(client: &mut TcpStream) -> bool {
    let mut rest = Vec::new();
    within(client.read_to_end(&mut rest)).await.is_ok()
}

#[test]
fn a_head_is_parsed_only_once_complete_and_shares_its_bytes() {
    let bytes = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: gw\r\nContent-Length: 2\r\nX-A: 1\r\nx-a: 2\r\n\r\n{}";
    let mut buf = BytesMut::new();
    for (i, &b) in bytes.iter().enumerate() {
        buf.extend_from_slice(&[b]);
        let Some(head) = parse_head(&mut buf).unwrap() else {
            continue;
        };
        assert_eq!(i, bytes.len() - 3, "complete exactly at the blank line");
        assert_eq!(head.method, Method::POST);
        assert_eq!(head.uri.path(), "/v1/chat/completions");
        assert_eq!(head.uri.query(), Some("x=1"));
        assert_eq!(head.version, Version::HTTP_11);
        let values: Vec<_> = head.headers.get_all("x-a").collect();
        assert_eq!(values, [b"1", b"2"]);
        assert!(head.keep_alive);
        assert!(matches!(head.body, BodyFraming::Decoder(d) if d.remaining() == Some(2)));
        assert!(buf.is_empty());
        return;
    }
    panic!("never complete");
}

#[test]
fn heads_that_frame_a_body_badly_are_refused() {
    let refused = |head: &str| match parse_head(&mut BytesMut::from(head)) {
        Err(e) => e.status,
        Ok(Some(Head {
            body: BodyFraming::Refused(e),
            ..
        })) => e.status,
        Ok(_) => StatusCode::OK,
    };
    let both = "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n";
    assert_eq!(refused(both), StatusCode::BAD_REQUEST);
    let conflicting = "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n";
    assert_eq!(refused(conflicting), StatusCode::BAD_REQUEST);
    let signed = "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\n";
    assert_eq!(refused(signed), StatusCode::BAD_REQUEST);
    let gzip = "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n";
    assert_eq!(refused(gzip), StatusCode::NOT_IMPLEMENTED);
    assert_eq!(refused("GET / HTTP/1.1\r\n\r\n"), StatusCode::OK);
    // Repeated equal lengths are one length.
    let repeated = "POST / HTTP/1.1\r\nContent-Length: 3, 3\r\n\r\n";
    assert_eq!(refused(repeated), StatusCode::OK);
}

#[test]
fn chunk_size_lines_and_lengths_are_written_in_their_bases() {
    assert_eq!(chunk_size_line(0, &mut [0; 20]), b"0\r\n");
    assert_eq!(chunk_size_line(255, &mut [0; 20]), b"ff\r\n");
    assert_eq!(chunk_size_line(4096, &mut [0; 20]), b"1000\r\n");
    assert_eq!(itoa(0, &mut [0; 20]), b"0");
    assert_eq!(
        itoa(u64::MAX, &mut [0; 20]),
        u64::MAX.to_string().as_bytes()
    );
}

#[tokio::test]
async fn requests_on_a_kept_alive_connection_are_answered_in_turn() {
    let (_task, mut client) = echoing().await;
    let mut buf = Vec::new();
    for i in 0..3 {
        let body = format!("body {i}");
        let req = format!(
            "POST /v1/x HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        client.write_all(req.as_bytes()).await.unwrap();
        let (head, answer) = response(&mut client, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("\r\ndate: "), "{head}");
        assert!(!head.contains("connection: close"), "{head}");
        assert_eq!(answer, format!("POST /v1/x {body}"));
    }
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (_task, mut client) = echoing().await;
    client
        .write_all(
            b"POST /a HTTP/1.1\r\nContent-Length: 1\r\n\r\n1GET /b HTTP/1.1\r\n\r\nPOST /c HTTP/1.1\r\nContent-Length: 1\r\n\r\n3",
        )
        .await
        .unwrap();
    let mut buf = Vec::new();
    for expected in ["POST /a 1", "GET /b ", "POST /c 3"] {
        assert_eq!(response(&mut client, &mut buf).await.1, expected);
    }
}

#[tokio::test]
async fn a_chunked_request_body_arriving_in_pieces_is_read_whole() {
    let (_task, mut client) = echoing().await;
    let pieces: [&[u8]; 5] = [
        b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"5;ext=1\r\nhel",
        b"lo\r\n",
        b"6\r\n world\r\n0\r\n",
        b"Trailer: x\r\n\r\n",
    ];
    for piece in pieces {
        client.write_all(piece).await.unwrap();
        client.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    let (_, answer) = response(&mut client, &mut Vec::new()).await;
    assert_eq!(answer, "POST /v1/x hello world");
}

#[tokio::test]
async fn expect_100_continue_is_answered_before_the_body_is_sent() {
    let (_task, mut client) = echoing().await;
    client
        .write_all(b"POST /v1/x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        assert!(read_more(&mut client, &mut buf).await > 0);
    }
    assert!(buf.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"));
    buf.drain(..25);
    client.write_all(b"{}").await.unwrap();
    assert_eq!(response(&mut client, &mut buf).await.1, "POST /v1/x {}");
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused_and_the_connection_closed() {
    // Declared too large: refused without reading it, and without
    // inviting it with a 100 Continue.
    let (_task, mut client) = echoing().await;
    let req = format!(
        "POST /v1/x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        LIMIT + 1
    );
    client.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let (head, body) = response(&mut client, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 413 "), "{head}");
    assert!(head.contains("connection: close"), "{head}");
    assert!(body.contains("body_too_large"), "{body}");
    assert!(closed(&mut client).await);

    // Chunked, found too large while reading.
    let (_task, mut client) = echoing().await;
    let chunk = "x".repeat(LIMIT as usize);
    let req = format!(
        "POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n1\r\nx\r\n0\r\n\r\n",
        chunk.len()
    );
    client.write_all(req.as_bytes()).await.unwrap();
    let (head, _) = response(&mut client, &mut Vec::new()).await;
    assert!(head.starts_with("HTTP/1.1 413 "), "{head}");
    assert!(closed(&mut client).await);
}

#[tokio::test]
async fn malformed_requests_get_an_openai_error_and_a_close() {
    for (request, status) in [
        ("GET / HTTP/1.1\r\nBad Header: x\r\n\r\n", "400"),
        ("NOT HTTP AT ALL\r\n\r\n", "400"),
        (
            "POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "400",
        ),
        ("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", "501"),
    ] {
        let (_task, mut client) = echoing().await;
        client.write_all(request.as_bytes()).await.unwrap();
        let (head, body) = response(&mut client, &mut Vec::new()).await;
        assert!(
            head.starts_with(&format!("HTTP/1.1 {status} ")),
            "{request:?}: {head}"
        );
        let error: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(error["error"]["type"], "invalid_request_error", "{body}");
        assert!(closed(&mut client).await, "{request:?}");
    }
}

#[tokio::test]
async fn a_head_over_the_limit_is_refused_with_431() {
    let (_task, mut client) = echoing().await;
    let long = "x".repeat(HEAD_LIMIT);
    let req = format!("GET / HTTP/1.1\r\nX-Long: {long}\r\n\r\n");
    // The server may close before reading all of it.
    let _ = client.write_all(req.as_bytes()).await;
    let (head, _) = response(&mut client, &mut Vec::new()).await;
    assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
}

#[tokio::test]
async fn http_1_0_closes_unless_asked_to_keep_alive() {
    let (task, mut client) = echoing().await;
    client.write_all(b"GET /a HTTP/1.0\r\n\r\n").await.unwrap();
    let (head, body) = response(&mut client, &mut Vec::new()).await;
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, "GET /a ");
    assert!(closed(&mut client).await);
    within(task).await.unwrap();

    let (_task, mut client) = echoing().await;
    let mut buf = Vec::new();
    for _ in 0..2 {
        client
            .write_all(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
            .await
            .unwrap();
        let (head, _) = response(&mut client, &mut buf).await;
        assert!(head.contains("connection: keep-alive"), "{head}");
    }
}

#[tokio::test]
async fn connection_close_is_honoured_after_the_response() {
    let (task, mut client) = echoing().await;
    client
        .write_all(b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let (head, body) = response(&mut client, &mut Vec::new()).await;
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, "GET /a ");
    assert!(closed(&mut client).await);
    within(task).await.unwrap();
}

#[tokio::test]
async fn a_client_leaving_drops_the_request_being_handled() {
    // The handler holds `_dropped` until it is dropped, and never answers.
    let (started_tx, mut started) = mpsc::unbounded_channel::<oneshot::Sender<()>>();
    let (task, mut client) = served(
        move |_, _req| {
            let (dropped, on_drop) = oneshot::channel::<()>();
            started_tx.send(dropped).unwrap();
            async move {
                let _on_drop = on_drop;
                std::future::pending::<Response<ResponseBody>>().await
            }
        },
        &Drain::new(),
    )
    .await;
    client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let mut dropped = within(started.recv()).await.unwrap();
    drop(client);
    within(dropped.closed()).await;
    within(task).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_request_that_stops_arriving_is_refused_with_408() {
    let (task, mut client) = echoing().await;
    client
        .write_all(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345")
        .await
        .unwrap();
    // Paused time moves to the deadline once every task waits.
    let (head, _) = response(&mut client, &mut Vec::new()).await;
    assert!(head.starts_with("HTTP/1.1 408 "), "{head}");
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_waits_for_requests_until_the_idle_timeout() {
    let (task, mut client) = echoing().await;
    let mut buf = Vec::new();
    // Idle longer than a request may take to arrive: not a slow request.
    for _ in 0..3 {
        tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(1)).await;
        assert!(!task.is_finished());
        client
            .write_all(b"GET /late HTTP/1.1\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(response(&mut client, &mut buf).await.1, "GET /late ");
    }
    // Then idle past the timeout (moved on at most once): closed, without
    // a response.
    tokio::time::sleep(IDLE_TIMEOUT * 2 + Duration::from_secs(1)).await;
    assert!(task.is_finished());
    assert!(closed(&mut client).await);
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_never_sends_closes_after_the_idle_timeout() {
    let (task, mut client) = echoing().await;
    tokio::time::sleep(IDLE_TIMEOUT - Duration::from_secs(1)).await;
    assert!(!task.is_finished());
    within(task).await.unwrap();
    let mut rest = Vec::new();
    assert_eq!(client.read_to_end(&mut rest).await.unwrap(), 0);
}

/// A response far larger than the socket buffers between server and
/// client, for a client that reads little or nothing of it, from a
/// connection that gives up on the client after `send_timeout`.
async fn serving_a_large_response(
    send_timeout: Duration,
) -> (tokio::task::JoinHandle<()>, TcpStream, usize) {
    const SIZE: usize = 64 << 20;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let handler = |_, _| async { Response::new(body::full(Bytes::from(vec![b'x'; SIZE]))) };
    let watch = Drain::new().watch();
    let task = tokio::spawn(async move {
        Connection::new(server)
            .with_send_timeout(send_timeout)
            .serve(handler, 0, LIMIT, watch)
            .await;
    });
    client.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
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
    let (idle, _idle_client) = served(handler.clone(), &drain).await;
    let (busy, mut client) = served(handler, &drain).await;
    client
        .write_all(b"GET /slow HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    within(serving.recv()).await.unwrap();

    drain.start();
    within(idle).await.unwrap();
    let finished = drain.finished();
    tokio::pin!(finished);
    assert!(futures_util::poll!(finished.as_mut()).is_pending());
    release.send(()).unwrap();
    let (head, body) = response(&mut client, &mut Vec::new()).await;
    assert!(head.contains("connection: close"), "{head}");
    assert_eq!(body, "GET /slow ");
    within(busy).await.unwrap();
    within(finished).await;
}

#[tokio::test]
async fn the_http2_preface_is_told_from_http1() {
    let drain = Drain::new();
    for (sent, http2) in [
        (HTTP2_PREFACE, Some(true)),
        (b"GET / HTTP/1.1\r\n\r\n", Some(false)),
        // Alike up to "PR": read on until they differ.
        (b"PRX", Some(false)),
        (&HTTP2_PREFACE[..10], None),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        for &b in sent {
            client.write_all(&[b]).await.unwrap();
        }
        // A prefix of the preface and then nothing: the client is gone.
        client.shutdown().await.unwrap();
        let mut conn = Connection::new(server);
        assert_eq!(
            within(conn.starts_with_http2(&drain.watch())).await,
            http2,
            "{:?}",
            String::from_utf8_lossy(sent)
        );
    }
}

#[tokio::test]
async fn a_response_to_head_has_no_body() {
    let (_task, mut client) = echoing().await;
    client
        .write_all(b"HEAD /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    // Read the first head alone: a body after it would be taken for the
    // next response's head.
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        read_more(&mut client, &mut buf).await;
    }
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let first = String::from_utf8(buf.drain(..end).collect()).unwrap();
    assert!(first.starts_with("HTTP/1.1 200 "), "{first}");
    assert_eq!(response(&mut client, &mut buf).await.1, "GET /b ");
}

#[tokio::test]
async fn a_body_is_collected_across_many_reads() {
    let (_task, mut client) = echoing().await;
    let body = "y".repeat(LIMIT as usize);
    let req = format!(
        "POST /big HTTP/1.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    client.write_all(req.as_bytes()).await.unwrap();
    for piece in body.as_bytes().chunks(100) {
        client.write_all(piece).await.unwrap();
        tokio::task::yield_now().await;
    }
    let (_, answer) = response(&mut client, &mut Vec::new()).await;
    assert_eq!(answer, format!("POST /big {body}"));
}

#[tokio::test]
async fn requests_split_anywhere_are_read_the_same() {
    use rand::{Rng, SeedableRng};
    let requests = [
        (
            "POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nfirst",
            "POST /a first",
        ),
        (
            "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nsec\r\n3\r\nond\r\n0\r\n\r\n",
            "POST /b second",
        ),
        ("GET /c?q=1 HTTP/1.1\r\nX-Empty:\r\n\r\n", "GET /c?q=1 "),
        (
            "\r\nPOST /d HTTP/1.1\r\ncontent-length: 0\r\n\r\n",
            "POST /d ",
        ),
    ];
    let stream: String = requests.iter().map(|(r, _)| *r).collect();
    for seed in 0..20 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let (_task, mut client) = echoing().await;
        let mut rest = stream.as_bytes();
        while !rest.is_empty() {
            let n = rng.gen_range(1..=rest.len().min(24));
            client.write_all(&rest[..n]).await.unwrap();
            client.flush().await.unwrap();
            rest = &rest[n..];
            tokio::task::yield_now().await;
        }
        let mut buf = Vec::new();
        for (_, expected) in requests {
            let (head, body) = response(&mut client, &mut buf).await;
            assert!(head.starts_with("HTTP/1.1 200 "), "seed {seed}: {head}");
            assert_eq!(body, expected, "seed {seed}");
        }
    }
}
