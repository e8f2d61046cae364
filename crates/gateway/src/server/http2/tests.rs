//! h2c client connections in paused time: closed once idle, kept while a
//! stream is open, and closed when the client stops answering pings.

use std::sync::Arc;

use http_body_util::{BodyExt, Empty};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::*;
use crate::body;
use crate::drain::Drain;

/// A served h2c connection answering with `handler`, and the client's
/// socket.
async fn served<H, F>(handler: H, timeouts: Timeouts) -> (tokio::task::JoinHandle<()>, TcpStream)
where
    H: Fn(WorkerId, super::super::Request) -> F + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, peer) = listener.accept().await.unwrap();
    let watch = Drain::new().watch();
    let task = tokio::spawn(serve_with(
        server,
        Bytes::new(),
        handler,
        0,
        watch,
        peer,
        timeouts,
    ));
    (task, client)
}

fn ok() -> Response<ResponseBody> {
    Response::new(body::full(Bytes::from_static(b"ok")))
}

/// Longer than any timeout here, for waits in paused time.
async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(600), f)
        .await
        .expect("timed out")
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_closes_after_the_idle_timeout_but_not_with_a_stream_open() {
    let (release, released) = oneshot::channel::<()>();
    let released = Arc::new(parking_lot::Mutex::new(Some(released)));
    let (handling_tx, mut handling) = tokio::sync::mpsc::unbounded_channel::<()>();
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
        ..TIMEOUTS
    };
    let (task, io) = served(handler, no_pings).await;
    let (mut client, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
            .await
            .unwrap();
    let client_conn = tokio::spawn(conn);
    let request = || {
        Request::post("http://gw/v1/chat/completions")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    // The first request waits in the handler well past the idle timeout:
    // its stream is open, so the connection stays.
    let started = Instant::now();
    let slow = tokio::spawn(client.send_request(request()));
    // Paused time would jump ahead while the request is on the wire.
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
async fn a_client_that_does_not_answer_pings_is_dropped() {
    let (task, mut io) = served(|_, _| async { ok() }, TIMEOUTS).await;
    // The preface and empty settings, then silence: pings go unanswered.
    io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let started = Instant::now();
    within(task).await.unwrap();
    let closed_after = started.elapsed();
    assert!(closed_after >= PING_INTERVAL, "{closed_after:?}");
    assert!(closed_after < IDLE_TIMEOUT, "{closed_after:?}");
    // The server's frames, then the end of the connection.
    let mut rest = Vec::new();
    within(io.read_to_end(&mut rest)).await.unwrap();
    assert!(!rest.is_empty());
}
