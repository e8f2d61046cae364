//! The subscriber against an engine stand-in on 127.0.0.1: an XPUB socket
//! (a PUB that also tells when a subscriber's subscription arrived, so no
//! test publishes into the void) and a ROUTER answering replays from a
//! buffer, written here independently of the crate's own publisher.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kv_events::index::{PoolIndex, PublisherStatus, Source, Unsure};
use kv_events::subscriber::{SubscriberConfig, Subscription, subscribe};
use kv_events::wire::{BlockHash, BlockStored, Encoding, EventBatch, KvEvent, encode_batch};
use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use zeromq::{RouterSocket, Socket, SocketRecv, SocketSend, XPubSocket, ZmqMessage};

const TOPIC: &str = "kv@pod-a@llama";
const BS: u32 = 2;
const WAIT: Duration = Duration::from_secs(20);

type Buffer = Arc<Mutex<Vec<(u64, Bytes)>>>;

/// An engine's publisher: sequence numbers from 0, every batch buffered.
struct Engine {
    socket: XPubSocket,
    endpoint: String,
    replay: Option<Replay>,
    buffer: Buffer,
    next_seq: u64,
}

struct Replay {
    endpoint: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Engine {
    async fn start(at: &str, replay_at: Option<&str>) -> Engine {
        let mut socket = XPubSocket::new();
        let endpoint = socket.bind(at).await.unwrap().to_string();
        let buffer = Buffer::default();
        let replay = match replay_at {
            Some(at) => Some(Replay::start(at, buffer.clone()).await),
            None => None,
        };
        Engine {
            socket,
            endpoint,
            replay,
            buffer,
            next_seq: 0,
        }
    }

    fn replay_endpoint(&self) -> Option<String> {
        self.replay.as_ref().map(|r| r.endpoint.clone())
    }

    /// Resolves when a subscriber's subscription to the topic arrived.
    async fn subscribed(&mut self) {
        loop {
            let message = self.socket.recv().await.unwrap();
            let frame = message.get(0).unwrap();
            if frame.first() == Some(&1) && TOPIC.as_bytes().starts_with(&frame[1..]) {
                return;
            }
        }
    }

    fn buffer(&mut self, events: Vec<KvEvent>) -> (u64, Bytes) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let batch = EventBatch {
            ts: seq as f64,
            events,
            data_parallel_rank: Some(0),
        };
        let payload = Bytes::from(encode_batch(&batch, Encoding::Map));
        self.buffer.lock().push((seq, payload.clone()));
        (seq, payload)
    }

    async fn publish(&mut self, events: Vec<KvEvent>) -> u64 {
        let (seq, payload) = self.buffer(events);
        self.send(TOPIC, seq, payload).await;
        seq
    }

    async fn send(&mut self, topic: &str, seq: u64, payload: Bytes) {
        let frames = vec![
            Bytes::copy_from_slice(topic.as_bytes()),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ];
        self.socket
            .send(ZmqMessage::try_from(frames).unwrap())
            .await
            .unwrap();
    }

    /// A batch the subscriber never hears (still buffered for replay).
    fn lose(&mut self, events: Vec<KvEvent>) -> u64 {
        self.buffer(events).0
    }

    /// Close every socket and connection, as a dying engine does.
    async fn stop(mut self) {
        self.socket.unbind_all().await;
        if let Some(replay) = self.replay {
            let _ = replay.stop.send(());
            replay.task.await.unwrap();
        }
    }
}

impl Replay {
    async fn start(at: &str, buffer: Buffer) -> Replay {
        let mut socket = RouterSocket::new();
        let endpoint = socket.bind(at).await.unwrap().to_string();
        let (stop, mut stopped) = oneshot::channel();
        let task = tokio::spawn(async move {
            loop {
                let request = tokio::select! {
                    request = socket.recv() => request.unwrap().into_vec(),
                    _ = &mut stopped => break,
                };
                let [identity, _, start] = request.as_slice() else {
                    panic!("replay request of {} frames", request.len());
                };
                let start = u64::from_be_bytes(start.as_ref().try_into().unwrap());
                let answers: Vec<(u64, Bytes)> = buffer
                    .lock()
                    .iter()
                    .filter(|(seq, _)| *seq >= start)
                    .cloned()
                    .collect();
                let end = (Bytes::copy_from_slice(&(-1i64).to_be_bytes()), Bytes::new());
                let answers = answers
                    .into_iter()
                    .map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload))
                    .chain([end]);
                for (seq, payload) in answers {
                    let frames = vec![identity.clone(), Bytes::new(), seq, payload];
                    socket
                        .send(ZmqMessage::try_from(frames).unwrap())
                        .await
                        .unwrap();
                }
            }
            socket.unbind_all().await;
        });
        Replay {
            endpoint,
            stop,
            task,
        }
    }
}

fn config(engine: &Engine) -> SubscriberConfig {
    SubscriberConfig {
        replay_endpoint: engine.replay_endpoint(),
        topic: TOPIC.into(),
        connect_timeout: Duration::from_millis(500),
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        // Each test says when batches are lost; no polling behind its back.
        idle_replay: None,
        ..SubscriberConfig::new(engine.endpoint.clone())
    }
}

/// A store of `blocks` blocks hashed `first..`, chained after `parent`;
/// block `h` holds tokens `[h, h]`.
fn store(first: u64, blocks: u64, parent: Option<u64>) -> KvEvent {
    let hashes: Vec<u64> = (first..first + blocks).collect();
    let tokens = hashes.iter().flat_map(|&h| [h as u32; 2]).collect();
    KvEvent::BlockStored(BlockStored::new(
        hashes.into_iter().map(BlockHash::Unsigned).collect(),
        parent.map(BlockHash::Unsigned),
        tokens,
        BS,
        None,
    ))
}

/// The tokens of blocks `first..first + blocks` as `store` wrote them.
fn prompt(first: u64, blocks: u64) -> Vec<u32> {
    (first..first + blocks)
        .flat_map(|h| [h as u32; 2])
        .collect()
}

async fn wait(
    subscription: &Subscription,
    what: &str,
    done: impl FnMut(&[PublisherStatus]) -> bool,
) {
    if tokio::time::timeout(WAIT, subscription.wait_until(done))
        .await
        .is_err()
    {
        panic!(
            "timed out waiting until {what}: {:#?}",
            subscription.statuses()
        );
    }
}

/// Rank 0 has applied batch `seq`.
fn at(seq: u64) -> impl FnMut(&[PublisherStatus]) -> bool {
    move |s| s[0].last_sequence == Some(seq)
}

#[tokio::test]
async fn a_lost_batch_is_replayed() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", Some("tcp://127.0.0.1:0")).await;
    let pool = PoolIndex::new();
    let sub = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    // The first connection asked the replay socket for everything: an
    // engine that published nothing holds nothing, so the index is exact.
    wait(&sub, "synced", |s| s[0].source == Source::Events).await;

    engine.publish(vec![store(10, 2, None)]).await;
    engine.lose(vec![store(12, 2, Some(11))]);
    let last = engine.publish(vec![store(14, 1, Some(13))]).await;
    wait(&sub, "the last batch applied", at(last)).await;

    let status = &sub.statuses()[0];
    assert_eq!(status.source, Source::Events);
    assert_eq!(status.gaps, 1);
    assert_eq!(status.gpu_blocks, 5);
    assert_eq!(status.orphaned_blocks, 0);
    assert!(status.replayed_batches >= 2, "{status:#?}");
    assert!(status.connected);
    assert_eq!(pool.matched_blocks(1, &prompt(10, 5), None, BS).gpu, 5);
}

#[tokio::test]
async fn a_lost_last_batch_is_found_when_the_stream_goes_quiet() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", Some("tcp://127.0.0.1:0")).await;
    let pool = PoolIndex::new();
    let sub = subscribe(
        &pool,
        1,
        SubscriberConfig {
            idle_replay: Some(Duration::from_millis(50)),
            ..config(&engine)
        },
    )
    .unwrap();
    engine.subscribed().await;
    wait(&sub, "synced", |s| s[0].source == Source::Events).await;
    engine.publish(vec![store(10, 1, None)]).await;
    // No batch follows the lost one to reveal the gap.
    let lost = engine.lose(vec![store(11, 1, Some(10))]);
    wait(&sub, "the lost batch", at(lost)).await;
    let status = &sub.statuses()[0];
    assert_eq!(status.source, Source::Events);
    assert_eq!(status.gaps, 1);
    assert_eq!(status.gpu_blocks, 2);
}

#[tokio::test]
async fn without_a_replay_socket_a_gap_leaves_the_index_unsure_until_a_clear() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", None).await;
    let pool = PoolIndex::new();
    let sub = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    wait(&sub, "connected", |s| s[0].connected).await;
    assert_eq!(sub.statuses()[0].source, Source::Unsure(Unsure::NotSynced));

    let first = engine.publish(vec![store(10, 2, None)]).await;
    wait(&sub, "the first batch", at(first)).await;
    assert_eq!(sub.statuses()[0].source, Source::Events);

    engine.lose(vec![store(12, 1, Some(11))]);
    // Another topic's batches are not this replica's.
    engine.send("kv@pod-b@llama", 99, Bytes::new()).await;
    let after_gap = engine.publish(vec![store(13, 1, Some(12))]).await;
    wait(&sub, "the batch after the gap", at(after_gap)).await;
    let status = &sub.statuses()[0];
    assert_eq!(status.source, Source::Unsure(Unsure::Gap));
    assert_eq!(status.gaps, 1);
    assert_eq!(
        status.orphaned_blocks, 1,
        "its parent was in the lost batch"
    );
    assert_eq!(status.decode_errors, 0);
    assert!(!pool.is_exact(1));

    let cleared = engine
        .publish(vec![KvEvent::AllBlocksCleared, store(20, 1, None)])
        .await;
    wait(&sub, "the clear", at(cleared)).await;
    let status = &sub.statuses()[0];
    assert_eq!(status.source, Source::Events);
    assert_eq!(status.gpu_blocks, 1);
    assert!(pool.is_exact(1));
}

#[tokio::test]
async fn a_restarted_engine_empties_the_index() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", None).await;
    let endpoint = engine.endpoint.clone();
    let pool = PoolIndex::new();
    let sub = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    engine.publish(vec![store(10, 2, None)]).await;
    let last = engine.publish(vec![store(12, 2, Some(11))]).await;
    wait(&sub, "the old engine's batches", at(last)).await;
    assert_eq!(sub.statuses()[0].gpu_blocks, 4);

    engine.stop().await;
    wait(&sub, "the disconnection", |s| !s[0].connected).await;
    assert_eq!(
        sub.statuses()[0].source,
        Source::Unsure(Unsure::Disconnected)
    );

    // The new engine numbers its batches from 0 again.
    let mut engine = Engine::start(&endpoint, None).await;
    engine.subscribed().await;
    engine.publish(vec![store(50, 1, None)]).await;
    wait(&sub, "the restart", |s| {
        s[0].restarts == 1 && s[0].last_sequence == Some(0)
    })
    .await;
    let status = &sub.statuses()[0];
    assert_eq!(status.source, Source::Events);
    assert_eq!(status.gpu_blocks, 1);
    assert_eq!(pool.matched_blocks(1, &prompt(10, 2), None, BS).gpu, 0);
    assert_eq!(pool.matched_blocks(1, &prompt(50, 1), None, BS).gpu, 1);
}

#[tokio::test]
async fn a_restart_is_seen_through_the_replay_before_any_new_batch() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", Some("tcp://127.0.0.1:0")).await;
    let (endpoint, replay) = (engine.endpoint.clone(), engine.replay_endpoint().unwrap());
    let pool = PoolIndex::new();
    let sub = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    let last = engine.publish(vec![store(10, 3, None)]).await;
    wait(&sub, "the old engine's batch", at(last)).await;
    engine.stop().await;
    wait(&sub, "the disconnection", |s| !s[0].connected).await;

    // Reconnected, the subscriber asks for its last batch again; the new
    // engine does not have it.
    let mut engine = Engine::start(&endpoint, Some(&replay)).await;
    engine.subscribed().await;
    wait(&sub, "the restart", |s| {
        s[0].restarts == 1 && s[0].source == Source::Events
    })
    .await;
    assert_eq!(sub.statuses()[0].gpu_blocks, 0);
    let first = engine.publish(vec![store(30, 1, None)]).await;
    wait(&sub, "the new engine's batch", at(first)).await;
    assert_eq!(sub.statuses()[0].gpu_blocks, 1);
}

#[tokio::test]
async fn a_reconnection_that_missed_nothing_keeps_the_index() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", None).await;
    let endpoint = engine.endpoint.clone();
    let pool = PoolIndex::new();
    let sub = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    let last = engine.publish(vec![store(10, 2, None)]).await;
    wait(&sub, "the batch", at(last)).await;
    let next_seq = engine.next_seq;
    engine.stop().await;
    wait(&sub, "the disconnection", |s| !s[0].connected).await;

    // Only the connection dropped: the same engine goes on numbering.
    let mut engine = Engine::start(&endpoint, None).await;
    engine.next_seq = next_seq;
    engine.subscribed().await;
    let next = engine.publish(vec![store(12, 1, Some(11))]).await;
    wait(&sub, "the next batch", at(next)).await;
    let status = &sub.statuses()[0];
    assert_eq!(status.source, Source::Events);
    assert_eq!(status.restarts, 0);
    assert_eq!(status.gpu_blocks, 3);
}

#[tokio::test]
async fn joining_a_running_engine_without_replay_is_unsure() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", None).await;
    engine.lose(vec![store(10, 1, None)]);
    let pool = PoolIndex::new();
    let sub = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    let seq = engine.publish(vec![store(20, 1, None)]).await;
    wait(&sub, "the batch", at(seq)).await;
    let status = &sub.statuses()[0];
    assert_eq!(status.source, Source::Unsure(Unsure::JoinedLate));
    assert_eq!(status.gaps, 0, "joining late is not a gap");
    assert_eq!(status.gpu_blocks, 1);
}

#[tokio::test]
async fn an_undecodable_batch_is_counted_and_makes_the_index_unsure() {
    let mut engine = Engine::start("tcp://127.0.0.1:0", None).await;
    let pool = PoolIndex::new();
    let sub = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    engine.publish(vec![store(10, 1, None)]).await;
    engine
        .send(TOPIC, 1, Bytes::from_static(&[0x93, 0x01]))
        .await;
    wait(&sub, "the bad batch", |s| s[0].decode_errors == 1).await;
    assert_eq!(
        sub.statuses()[0].source,
        Source::Unsure(Unsure::DecodeError)
    );
    // The stream goes on after it without a gap.
    engine.next_seq = 2;
    let seq = engine.publish(vec![store(11, 1, Some(10))]).await;
    wait(&sub, "the next batch", at(seq)).await;
    let status = &sub.statuses()[0];
    assert_eq!(status.gaps, 0);
    assert_eq!(status.gpu_blocks, 2);
}

#[tokio::test]
async fn data_parallel_ranks_are_followed_on_consecutive_ports() {
    // Two engines on ports p and p + 1 (replays on q and q + 1).
    let (mut rank0, mut rank1) = loop {
        let rank0 = Engine::start("tcp://127.0.0.1:0", None).await;
        let port: u16 = rank0.endpoint.rsplit(':').next().unwrap().parse().unwrap();
        let mut rank1 = XPubSocket::new();
        if let Ok(bound) = rank1.bind(&format!("tcp://127.0.0.1:{}", port + 1)).await {
            let rank1 = Engine {
                socket: rank1,
                endpoint: bound.to_string(),
                replay: None,
                buffer: Buffer::default(),
                next_seq: 0,
            };
            break (rank0, rank1);
        }
    };
    let pool = PoolIndex::new();
    let sub = subscribe(
        &pool,
        7,
        SubscriberConfig {
            data_parallel_size: 2,
            ..config(&rank0)
        },
    )
    .unwrap();
    rank0.subscribed().await;
    rank1.subscribed().await;
    rank0.publish(vec![store(10, 1, None)]).await;
    rank1.publish(vec![store(90, 3, None)]).await;
    wait(&sub, "both ranks", |s| {
        s.len() == 2 && s.iter().all(|s| s.last_sequence == Some(0))
    })
    .await;
    let statuses = sub.statuses();
    assert_eq!((statuses[0].id.rank, statuses[0].gpu_blocks), (0, 1));
    assert_eq!((statuses[1].id.rank, statuses[1].gpu_blocks), (1, 3));
    assert_eq!(pool.matched_blocks(7, &prompt(90, 3), None, BS).gpu, 3);
    assert!(pool.is_exact(7));
}

#[tokio::test]
async fn an_unreachable_publisher_blocks_nothing_and_dropping_forgets_the_replica() {
    // A port nobody listens on: bind one, then close it.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("tcp://{}", listener.local_addr().unwrap())
    };
    let pool = PoolIndex::new();
    let unreachable = subscribe(
        &pool,
        2,
        SubscriberConfig {
            connect_timeout: Duration::from_millis(100),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
            ..SubscriberConfig::new(dead)
        },
    )
    .unwrap();

    let mut engine = Engine::start("tcp://127.0.0.1:0", None).await;
    let live = subscribe(&pool, 1, config(&engine)).unwrap();
    engine.subscribed().await;
    let seq = engine.publish(vec![store(10, 1, None)]).await;
    wait(&live, "the live replica's batch", at(seq)).await;

    let status = &unreachable.statuses()[0];
    assert!(!status.connected);
    assert_eq!(status.source, Source::Unsure(Unsure::NotSynced));
    assert!(!pool.is_exact(2));

    drop(live);
    // Aborted tasks drop their index writers on the runtime: await it.
    tokio::time::timeout(WAIT, async {
        while !pool.replica_status(1).is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the dropped replica is forgotten");
    assert_eq!(pool.distinct_blocks(), 0);
    assert_eq!(pool.statuses().len(), 1);
}
