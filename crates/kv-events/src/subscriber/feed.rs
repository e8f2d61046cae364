//! One rank's task: connect, catch up, follow, and start over when the
//! connection drops.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::watch;
use xxhash_rust::xxh3::xxh3_64;
use zeromq::{Socket, SocketEvent, SocketOptions, SocketRecv, SubSocket};

use super::config::SubscriberConfig;
use super::replay::replay;
use super::sequence::{Tracker, Verdict};
use crate::index::{PublisherIndex, Source, Unsure};
use crate::wire::{decode_batch, decode_sequence};

pub(super) struct Feed {
    endpoint: String,
    replay_endpoint: Option<String>,
    topic: String,
    connect_timeout: Duration,
    backoff_initial: Duration,
    backoff_max: Duration,
    idle_replay: Option<Duration>,
    index: PublisherIndex,
    tracker: Tracker,
    /// Bumped after anything that may change the status.
    changed: Arc<watch::Sender<()>>,
    /// The source when the connection last dropped: what a reconnection
    /// that missed nothing restores.
    before_disconnect: Option<Source>,
}

impl Feed {
    pub fn new(
        endpoint: String,
        replay_endpoint: Option<String>,
        config: &SubscriberConfig,
        index: PublisherIndex,
        changed: Arc<watch::Sender<()>>,
    ) -> Self {
        Feed {
            endpoint,
            idle_replay: config.idle_replay.filter(|_| replay_endpoint.is_some()),
            replay_endpoint,
            topic: config.topic.clone(),
            connect_timeout: config.connect_timeout,
            backoff_initial: config.backoff_initial,
            backoff_max: config.backoff_max,
            index,
            tracker: Tracker::new(),
            changed,
            before_disconnect: None,
        }
    }

    pub async fn run(mut self) {
        let mut backoff = self.backoff_initial;
        loop {
            match self.connect().await {
                Ok((socket, monitor)) => {
                    backoff = self.backoff_initial;
                    self.follow(socket, monitor).await;
                }
                Err(error) => {
                    tracing::debug!(endpoint = %self.endpoint, %error, "kv events: cannot connect");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.backoff_max);
        }
    }

    async fn connect(&self) -> Result<(SubSocket, impl Monitor + use<>), zeromq::ZmqError> {
        let mut options = SocketOptions::default();
        options.connect_timeout(self.connect_timeout);
        let mut socket = SubSocket::with_options(options);
        let monitor = socket.monitor();
        // The socket's own timeout covers its retries; ours also covers a
        // handshake that never ends.
        tokio::time::timeout(self.connect_timeout, socket.connect(&self.endpoint))
            .await
            .map_err(|_| zeromq::ZmqError::Other("connect timed out"))??;
        socket.subscribe(&self.topic).await?;
        Ok((socket, monitor))
    }

    /// Read batches until the connection drops.
    async fn follow(&mut self, mut socket: SubSocket, mut monitor: impl Monitor) {
        tracing::debug!(endpoint = %self.endpoint, "kv events: connected");
        self.index.set_connected(true);
        self.catch_up().await;
        self.bump();
        loop {
            tokio::select! {
                // Batches already received are read before a disconnection.
                biased;
                message = socket.recv() => match message {
                    Ok(message) => self.on_message(message.into_vec()).await,
                    Err(error) => {
                        tracing::debug!(endpoint = %self.endpoint, %error, "kv events: receive failed");
                        break;
                    }
                },
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) | None => break,
                    Some(_) => continue,
                },
                () = idle(self.idle_replay) => self.check_tail().await,
            }
            self.bump();
        }
        tracing::debug!(endpoint = %self.endpoint, "kv events: disconnected");
        self.index.set_connected(false);
        // Batches published from now on are not heard until the next
        // connection catches up.
        let source = self.source();
        if source != Source::Unsure(Unsure::Disconnected) {
            self.before_disconnect = Some(source);
        }
        self.index.set_source(Source::Unsure(Unsure::Disconnected));
        self.bump();
    }

    /// On connecting: ask the replay socket what was missed. The first
    /// time, that is everything; after that, everything from the last batch
    /// applied, which must come back unchanged: if it does not, the engine
    /// restarted while the connection was down. Without a replay socket the
    /// next live batch tells.
    async fn catch_up(&mut self) {
        if self.replay_endpoint.is_none() {
            return;
        }
        let Some((last, digest)) = self.tracker.last() else {
            return self.sync_from_start().await;
        };
        let Some(batches) = self.fetch(last).await else {
            return;
        };
        match batches.first() {
            Some((seq, payload)) if *seq == last && xxh3_64(payload) == digest => {
                self.apply_replayed(batches);
                self.reconnected();
            }
            Some((seq, _)) if *seq > last => {
                // Too much was published meanwhile to tell.
                self.apply_replayed(batches);
                self.lost(last + 1);
            }
            _ => {
                tracing::info!(endpoint = %self.endpoint, "kv events: the engine restarted");
                self.index.restart();
                self.tracker.reset();
                self.before_disconnect = None;
                self.sync_from_start().await;
            }
        }
    }

    /// Replay the stream from its first batch: the index is exact if the
    /// publisher still has it, or has published nothing yet (its cache is
    /// empty then, like the index).
    async fn sync_from_start(&mut self) {
        let Some(batches) = self.fetch(0).await else {
            return;
        };
        let complete = batches.first().is_none_or(|&(seq, _)| seq == 0);
        self.apply_replayed(batches);
        if complete {
            if self.tracker.next().is_none() {
                self.tracker.expect(0);
            }
            self.before_disconnect = None;
            self.index.set_source(Source::Events);
        } else {
            self.lost(0);
        }
    }

    /// Nothing heard for a while: ask the replay socket for batches after
    /// the last one applied, in case the last ones sent were lost.
    async fn check_tail(&mut self) {
        let Some(next) = self.tracker.next() else {
            return self.catch_up().await;
        };
        let Some(batches) = self.fetch(next).await else {
            return;
        };
        match batches.first() {
            None => {}
            Some(&(seq, _)) => {
                self.index.note_gap();
                self.apply_replayed(batches);
                if seq != next {
                    self.lost(next);
                }
            }
        }
    }

    async fn on_message(&mut self, frames: Vec<Bytes>) {
        let [topic, seq, payload] = frames.as_slice() else {
            return self.undecodable();
        };
        if !self.topic.is_empty() && topic.as_ref() != self.topic.as_bytes() {
            return;
        }
        let Ok(seq) = decode_sequence(seq) else {
            return self.undecodable();
        };
        let digest = xxh3_64(payload);
        match self.tracker.classify(seq, digest) {
            Verdict::InOrder if self.tracker.next().is_none() => {
                // The engine's first batch: the index starts exact.
                self.index.set_source(Source::Events);
            }
            Verdict::InOrder => self.reconnected(),
            Verdict::Duplicate => return,
            Verdict::Restarted => {
                tracing::info!(endpoint = %self.endpoint, seq, "kv events: the engine restarted");
                self.index.restart();
                self.tracker.reset();
                self.before_disconnect = None;
                if seq == 0 {
                    self.index.set_source(Source::Events);
                } else {
                    self.missing(0, seq).await;
                }
            }
            Verdict::Missing { from } => {
                if self.tracker.next().is_some() {
                    self.index.note_gap();
                }
                self.missing(from, seq).await;
                // A replay may have brought this batch already.
                if self.tracker.next().is_some_and(|next| seq < next) {
                    return;
                }
            }
        }
        self.apply(seq, payload);
        self.tracker.live(seq, digest);
    }

    /// Batches `from..seq` were not heard: fill them in, or mark the index
    /// unsure.
    async fn missing(&mut self, from: u64, seq: u64) {
        let mut filled = false;
        if let Some(batches) = self.fetch(from).await {
            let starts_at_from = batches.first().is_some_and(|&(s, _)| s == from);
            self.apply_replayed(batches);
            filled = starts_at_from && self.tracker.next().is_some_and(|next| next >= seq);
        }
        if !filled {
            tracing::debug!(endpoint = %self.endpoint, from, seq, "kv events: batches lost");
            // The live batch is applied after whatever the replay brought.
            return self.lost(from);
        }
        if from == 0 {
            // Everything since the engine's first batch.
            self.before_disconnect = None;
            self.index.set_source(Source::Events);
        } else {
            self.reconnected();
        }
    }

    /// The publisher's buffered batches from `from` on; `None` without a
    /// replay socket or when the replay failed.
    async fn fetch(&mut self, from: u64) -> Option<Vec<(u64, Bytes)>> {
        let endpoint = self.replay_endpoint.clone()?;
        match replay(&endpoint, from, self.connect_timeout).await {
            Ok(batches) => {
                self.index.note_replay(batches.len() as u64);
                Some(batches)
            }
            Err(error) => {
                tracing::debug!(%endpoint, from, %error, "kv events: replay failed");
                self.index.note_replay(0);
                None
            }
        }
    }

    /// Apply replayed batches the index does not have yet, in order.
    fn apply_replayed(&mut self, batches: Vec<(u64, Bytes)>) {
        for (seq, payload) in batches {
            if self.tracker.next().is_some_and(|next| seq < next) {
                continue;
            }
            self.apply(seq, &payload);
            self.tracker.replayed(seq, xxh3_64(&payload));
        }
    }

    fn apply(&mut self, seq: u64, payload: &[u8]) {
        match decode_batch(payload) {
            Ok(batch) => self.index.apply(seq, &batch),
            Err(error) => {
                tracing::warn!(endpoint = %self.endpoint, seq, %error, "kv events: undecodable batch");
                self.undecodable();
            }
        }
    }

    fn undecodable(&mut self) {
        self.index.note_decode_error();
        self.before_disconnect = None;
        self.index.set_source(Source::Unsure(Unsure::DecodeError));
    }

    /// Batches from `from` on are lost for good.
    fn lost(&mut self, from: u64) {
        let why = if from == 0 {
            Unsure::JoinedLate
        } else {
            Unsure::Gap
        };
        self.before_disconnect = None;
        self.index.set_source(Source::Unsure(why));
    }

    /// The stream goes on where it was: what a disconnection put in doubt
    /// is restored.
    fn reconnected(&mut self) {
        if let Some(source) = self.before_disconnect.take() {
            self.index.set_source(source);
        }
    }

    fn source(&self) -> Source {
        self.index
            .status()
            .map_or(Source::Unsure(Unsure::NotSynced), |s| s.source)
    }

    fn bump(&self) {
        self.changed.send_replace(());
    }
}

/// Resolves after `after` (never for `None`).
async fn idle(after: Option<Duration>) {
    match after {
        Some(after) => tokio::time::sleep(after).await,
        None => std::future::pending().await,
    }
}

/// The socket's connection events.
trait Monitor: futures_util::Stream<Item = SocketEvent> + Unpin {}

impl<T: futures_util::Stream<Item = SocketEvent> + Unpin> Monitor for T {}
