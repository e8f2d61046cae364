//! Publishing KV events the way vLLM's `ZmqEventPublisher` does, for the
//! simulator and tests: a PUB socket sending `(topic, seq, payload)`, and
//! optionally a ROUTER socket answering replays from a buffer of the last
//! batches.
//!
//! Publishing never waits on subscribers: batches go to a task through an
//! unbounded queue, and the task does the socket work.

use std::collections::VecDeque;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::subscriber::replay::END_SEQUENCE;
use crate::wire::{Encoding, EventBatch, encode_batch};

/// vLLM's default replay buffer, in batches.
pub const DEFAULT_BUFFER_STEPS: usize = 10_000;

#[derive(Debug, Clone)]
pub struct PublisherConfig {
    /// Where the PUB socket binds: `tcp://127.0.0.1:5557`; port 0 picks a
    /// free one (see [`Publisher::endpoint`]).
    pub endpoint: String,
    /// Where the ROUTER socket for replays binds, if any.
    pub replay_endpoint: Option<String>,
    pub topic: String,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    pub encoding: Encoding,
    /// Fraction of batches not sent (still kept for replay): lost messages,
    /// for testing how subscribers cope. 0 sends everything.
    pub drop_fraction: f64,
    /// Seeds which batches are dropped.
    pub seed: u64,
}

impl PublisherConfig {
    pub fn new(endpoint: impl Into<String>) -> Self {
        PublisherConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: DEFAULT_BUFFER_STEPS,
            encoding: Encoding::default(),
            drop_fraction: 0.0,
            seed: 0,
        }
    }
}

enum Command {
    Publish(EventBatch),
    Flush(oneshot::Sender<Option<u64>>),
}

/// A running publisher; dropping it closes its sockets.
pub struct Publisher {
    commands: mpsc::UnboundedSender<Command>,
    endpoint: String,
    replay_endpoint: Option<String>,
    task: JoinHandle<()>,
}

impl Publisher {
    /// Bind the sockets and start publishing. Call from within a tokio
    /// runtime.
    pub async fn bind(config: PublisherConfig) -> Result<Publisher, zeromq::ZmqError> {
        if !(0.0..=1.0).contains(&config.drop_fraction) {
            return Err(zeromq::ZmqError::Other(
                "drop_fraction must be between 0 and 1",
            ));
        }
        let mut socket = PubSocket::new();
        let endpoint = socket.bind(&config.endpoint).await?.to_string();
        let (router, replay_endpoint) = match &config.replay_endpoint {
            Some(at) => {
                let mut router = RouterSocket::new();
                let bound = router.bind(at).await?.to_string();
                (Some(router), Some(bound))
            }
            None => (None, None),
        };
        let (commands, inbox) = mpsc::unbounded_channel();
        let worker = Worker {
            socket,
            router,
            topic: Bytes::from(config.topic.into_bytes()),
            encoding: config.encoding,
            buffer: VecDeque::new(),
            buffer_steps: config.buffer_steps,
            drop_fraction: config.drop_fraction,
            rng: SmallRng::seed_from_u64(config.seed),
            next_seq: 0,
        };
        Ok(Publisher {
            commands,
            endpoint,
            replay_endpoint,
            task: tokio::spawn(worker.run(inbox)),
        })
    }

    /// The PUB socket's address, port resolved.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Queue a batch; it gets the next sequence number.
    pub fn publish(&self, batch: EventBatch) {
        // The task only stops when the publisher is dropped.
        let _ = self.commands.send(Command::Publish(batch));
    }

    /// Wait until every batch queued before is published; the last
    /// sequence number used, `None` before the first batch.
    pub async fn flush(&self) -> Option<u64> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Flush(reply)).ok()?;
        answer.await.ok().flatten()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Worker {
    socket: PubSocket,
    router: Option<RouterSocket>,
    topic: Bytes,
    encoding: Encoding,
    buffer: VecDeque<(u64, Bytes)>,
    buffer_steps: usize,
    drop_fraction: f64,
    rng: SmallRng,
    next_seq: u64,
}

impl Worker {
    async fn run(mut self, mut inbox: mpsc::UnboundedReceiver<Command>) {
        loop {
            tokio::select! {
                command = inbox.recv() => match command {
                    Some(Command::Publish(batch)) => self.publish(&batch).await,
                    Some(Command::Flush(reply)) => {
                        let _ = reply.send(self.next_seq.checked_sub(1));
                    }
                    None => return,
                },
                request = recv_replay(&mut self.router) => match request {
                    Ok(request) => self.replay(request).await,
                    Err(error) => tracing::debug!(%error, "kv events publisher: replay socket"),
                },
            }
        }
    }

    async fn publish(&mut self, batch: &EventBatch) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let payload = Bytes::from(encode_batch(batch, self.encoding));
        if self.buffer_steps > 0 {
            if self.buffer.len() == self.buffer_steps {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, payload.clone()));
        }
        if self.drop_fraction > 0.0 && self.rng.gen_bool(self.drop_fraction) {
            return;
        }
        let frames = vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        let message = ZmqMessage::try_from(frames).expect("three frames");
        if let Err(error) = self.socket.send(message).await {
            tracing::debug!(%error, seq, "kv events publisher: send failed");
        }
    }

    /// Answer `(identity, b"", start)` with every buffered batch from
    /// `start` on, then the end marker.
    async fn replay(&mut self, request: ZmqMessage) {
        let frames = request.into_vec();
        let (identity, start) = match frames.as_slice() {
            [identity, empty, start] if empty.is_empty() => (identity.clone(), start),
            _ => return,
        };
        let Ok(start) = <[u8; 8]>::try_from(start.as_ref()).map(u64::from_be_bytes) else {
            return;
        };
        let Some(router) = self.router.as_mut() else {
            return;
        };
        let answers = self
            .buffer
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()))
            .chain([(Bytes::from_static(&END_SEQUENCE), Bytes::new())]);
        for (seq, payload) in answers {
            let frames = vec![identity.clone(), Bytes::new(), seq, payload];
            let message = ZmqMessage::try_from(frames).expect("four frames");
            if let Err(error) = router.send(message).await {
                tracing::debug!(%error, "kv events publisher: replay answer failed");
                return;
            }
        }
    }
}

async fn recv_replay(router: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match router {
        Some(router) => router.recv().await,
        None => std::future::pending().await,
    }
}
