//! A TCP relay on 127.0.0.1 that holds every byte for a fixed time in each
//! direction before passing it on: a peer "far away", with real delay on
//! the wire (every exchange pays it, as on a long link) and no limit on
//! throughput.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Stops relaying (new and open connections) when dropped.
pub struct DelayedRelay {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for DelayedRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Relay connections made to the returned address to `target`, each
/// byte `one_way` late in both directions (a round trip of twice that).
pub async fn relay(target: SocketAddr, one_way: Duration) -> DelayedRelay {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        while let Ok((client, _)) = listener.accept().await {
            connections.spawn(async move {
                let Ok(server) = TcpStream::connect(target).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::join!(
                    late(client_read, server_write, one_way),
                    late(server_read, client_write, one_way),
                );
            });
        }
    });
    DelayedRelay { addr, task }
}

/// Copy `from` to `to`, each chunk written `delay` after it was read;
/// the end of `from` is passed on as a shutdown, as late.
async fn late(
    mut from: impl AsyncRead + Unpin + Send + 'static,
    mut to: impl AsyncWrite + Unpin,
    delay: Duration,
) {
    let (send, mut receive) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let reader = tokio::spawn(async move {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let n = from.read(&mut buffer).await.unwrap_or(0);
            let chunk = (n > 0).then(|| buffer[..n].to_vec());
            let done = chunk.is_none();
            if send.send((Instant::now() + delay, chunk)).is_err() || done {
                return;
            }
        }
    });
    while let Some((due, chunk)) = receive.recv().await {
        tokio::time::sleep_until(due).await;
        match chunk {
            Some(bytes) if to.write_all(&bytes).await.is_ok() => {}
            _ => break,
        }
    }
    let _ = to.shutdown().await;
    reader.abort();
}
