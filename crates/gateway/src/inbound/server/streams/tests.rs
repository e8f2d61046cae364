//! Stream accounting and the cut of stalled streams, in paused time, with
//! a body whose end the test sees: a channel the body reads its frames
//! from, whose sender learns when the body is dropped.

use std::future::poll_fn;

use tokio::sync::mpsc;

use super::*;

const TIMEOUT: Duration = Duration::from_secs(60);

/// Frames sent on a channel; dropped, it closes the channel.
struct Channel(mpsc::Receiver<Bytes>);

impl Body for Channel {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.0.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d))))
    }
}

/// A stream answered with a [`Channel`] body, the channel's sender, and
/// the connection's watcher of stalled streams running.
fn stream() -> (Counted<Channel>, mpsc::Sender<Bytes>, Arc<Streams<Channel>>) {
    let streams = Arc::new(Streams::default());
    let (tx, rx) = mpsc::channel(8);
    let open = Streams::open(&streams);
    let body = Streams::respond(&streams, Channel(rx), open);
    let watching = Arc::clone(&streams);
    tokio::spawn(async move { watching.cut_stalled(TIMEOUT).await });
    (body, tx, streams)
}

async fn next(body: &mut Counted<Channel>) -> Option<Result<Frame<Bytes>, BoxError>> {
    poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
}

#[tokio::test(start_paused = true)]
async fn a_stream_whose_data_is_not_taken_loses_its_body() {
    let (mut body, tx, _streams) = stream();
    tx.send(Bytes::from_static(b"a")).await.unwrap();
    assert!(next(&mut body).await.unwrap().is_ok());
    // Not asked for more, as hyper does not when the client has no room.
    let handed_out = Instant::now();
    tokio::time::timeout(TIMEOUT * 10, tx.closed())
        .await
        .expect("the body is dropped");
    let cut_after = handed_out.elapsed();
    assert!(cut_after >= TIMEOUT, "{cut_after:?}");
    assert!(cut_after <= TIMEOUT + TIMEOUT / 4, "{cut_after:?}");
    // Asked again, the stream fails (hyper then resets it).
    assert!(next(&mut body).await.unwrap().is_err());
}

#[tokio::test(start_paused = true)]
async fn a_stream_read_slowly_or_waiting_for_its_replica_keeps_its_body() {
    let (mut body, tx, _streams) = stream();
    // Taken a piece at a time, each just before the timeout.
    for _ in 0..4 {
        tx.send(Bytes::from_static(b"a")).await.unwrap();
        assert!(next(&mut body).await.unwrap().is_ok());
        tokio::time::sleep(TIMEOUT - Duration::from_secs(1)).await;
    }
    // Waiting for the replica's next frame for long: nothing was handed
    // out that the client has not taken.
    let waiting = next(&mut body);
    assert!(
        tokio::time::timeout(TIMEOUT * 3, waiting).await.is_err(),
        "no frame was sent"
    );
    assert!(!tx.is_closed());
    tx.send(Bytes::from_static(b"b")).await.unwrap();
    assert_eq!(
        next(&mut body).await.unwrap().unwrap().into_data().unwrap(),
        "b"
    );
}

#[tokio::test(start_paused = true)]
async fn streams_count_as_open_until_their_body_is_dropped() {
    let (body, _tx, streams) = stream();
    let idle = streams.idle_for(TIMEOUT);
    let mut idle = pin!(idle);
    // A stream is open: never idle.
    assert!(
        tokio::time::timeout(TIMEOUT * 3, idle.as_mut())
            .await
            .is_err()
    );
    drop(body);
    let dropped_at = Instant::now();
    idle.await;
    assert!(dropped_at.elapsed() >= TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn ended_streams_do_not_pile_up() {
    let streams = Arc::new(Streams::<Channel>::default());
    for _ in 0..1_000 {
        let (_tx, rx) = mpsc::channel(1);
        let open = Streams::open(&streams);
        drop(Streams::respond(&streams, Channel(rx), open));
    }
    assert!(streams.sending.lock().len() <= 16);
}
