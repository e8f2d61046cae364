//! Asking a publisher's replay socket for the batches from a sequence number
//! on.
//!
//! The publisher's ROUTER answers a DEALER's `(b"", start as 8 bytes
//! big-endian)` with one `(b"", seq, payload)` message per buffered batch
//! with `seq >= start`, then `(b"", -1 as 8 bytes, b"")`. (The empty frame
//! is the ROUTER/DEALER envelope; a REQ client would not see it.)

use std::time::Duration;

use bytes::Bytes;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, ZmqMessage};

use crate::wire::decode_sequence;

/// The end marker's sequence frame: -1 as a signed 8-byte integer.
pub const END_SEQUENCE: [u8; 8] = (-1i64).to_be_bytes();

/// More batches than any buffer holds (vLLM keeps 10,000 by default): an
/// answer that long is a broken publisher, not a replay.
const MAX_BATCHES: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("replay socket: {0}")]
    Socket(#[from] zeromq::ZmqError),
    #[error("the replay did not answer within {0:?}")]
    Timeout(Duration),
    #[error("malformed replay answer: {0}")]
    Malformed(String),
}

/// Every buffered batch from `start` on, as (sequence, payload), in order.
/// `timeout` bounds the connection and each wait for the next message.
pub async fn replay(
    endpoint: &str,
    start: u64,
    timeout: Duration,
) -> Result<Vec<(u64, Bytes)>, ReplayError> {
    let mut options = SocketOptions::default();
    options.connect_timeout(timeout);
    let mut socket = DealerSocket::with_options(options);
    within(timeout, socket.connect(endpoint)).await??;
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(Bytes::copy_from_slice(&start.to_be_bytes()));
    within(timeout, socket.send(request)).await??;

    let mut batches = Vec::new();
    loop {
        let answer = within(timeout, socket.recv()).await??;
        let mut frames = answer.into_vec();
        // Drop the envelope's empty frame if the socket left it in.
        if frames.len() == 3 && frames[0].is_empty() {
            frames.remove(0);
        }
        let [seq, payload] = <[Bytes; 2]>::try_from(frames).map_err(|frames| {
            ReplayError::Malformed(format!(
                "{} frames, expected sequence and payload",
                frames.len()
            ))
        })?;
        if seq.as_ref() == END_SEQUENCE {
            return Ok(batches);
        }
        let seq = decode_sequence(&seq).map_err(|e| ReplayError::Malformed(e.to_string()))?;
        if batches.len() >= MAX_BATCHES {
            return Err(ReplayError::Malformed(format!(
                "more than {MAX_BATCHES} batches"
            )));
        }
        batches.push((seq, payload));
    }
}

async fn within<T>(timeout: Duration, work: impl Future<Output = T>) -> Result<T, ReplayError> {
    tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ReplayError::Timeout(timeout))
}
