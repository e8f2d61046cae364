//! Following a replica's event stream into the index: one task per
//! data-parallel rank, each with a ZMQ SUB socket on that rank's port.
//!
//! A task connects (retrying with backoff while the publisher is down or
//! unreachable), subscribes to the topic, and applies each batch to its
//! rank's [`PublisherIndex`](crate::index::PublisherIndex). It watches the
//! sequence numbers: a hole is filled from the replay socket when one is
//! configured, else the index is marked unsure until the engine clears its
//! cache or restarts; a sequence that goes back means a restart, and the
//! index is emptied. On connecting it asks the replay socket for what it
//! missed, so a fresh gateway knows a young engine's cache at once.
//!
//! Nothing waits on a publisher: a silent one costs a parked task, an
//! unreachable one a reconnect now and then. Dropping the [`Subscription`]
//! stops the tasks, and their blocks leave the pool.

mod feed;
pub mod replay;
pub mod sequence;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::index::{PoolIndex, PublisherId, PublisherStatus};
use feed::Feed;

/// Where a replica publishes, and how patiently to follow it.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// Rank 0's PUB socket, `tcp://host:port` (vLLM's `endpoint`, with the
    /// replica's address for `*`).
    pub endpoint: String,
    /// Rank 0's ROUTER socket for replays (vLLM's `replay_endpoint`), if
    /// the engine has one.
    pub replay_endpoint: Option<String>,
    /// Only batches published under exactly this topic are read; empty
    /// reads every topic (vLLM's default topic is empty).
    pub topic: String,
    /// Ranks publish on consecutive ports: rank `r` on `port + r`, for both
    /// sockets (vLLM's data parallelism).
    pub data_parallel_size: u32,
    /// Longest wait for a connection (or a replay's next message).
    pub connect_timeout: Duration,
    /// Waits between reconnects, doubling from the first to the last.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// After this long without a batch, ask the replay socket whether any
    /// were missed: a lost batch shows as a gap only when the next one
    /// arrives, and an idle engine may send none for a long time. `None`
    /// asks only on gaps.
    pub idle_replay: Option<Duration>,
}

impl SubscriberConfig {
    pub fn new(endpoint: impl Into<String>) -> Self {
        SubscriberConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            data_parallel_size: 1,
            connect_timeout: Duration::from_secs(2),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            idle_replay: Some(Duration::from_secs(5)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0:?} is not a tcp://host:port endpoint")]
    Endpoint(String),
    #[error("port {port} + rank {rank} is out of range")]
    Port { port: u16, rank: u32 },
    #[error("data_parallel_size must be at least 1")]
    NoRanks,
}

/// The endpoint of data-parallel rank `rank`: the port moved up by it.
pub fn rank_endpoint(endpoint: &str, rank: u32) -> Result<String, ConfigError> {
    let bad = || ConfigError::Endpoint(endpoint.to_owned());
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    let moved = u32::from(port)
        .checked_add(rank)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or(ConfigError::Port { port, rank })?;
    Ok(format!("tcp://{host}:{moved}"))
}

/// Follow `replica`'s ranks into `pool`. Call from within a tokio runtime.
/// One subscription per replica: a second one for the same id takes its
/// place in the index, and the first one's tasks write nothing more.
pub fn subscribe(
    pool: &Arc<PoolIndex>,
    replica: u64,
    config: SubscriberConfig,
) -> Result<Subscription, ConfigError> {
    if config.data_parallel_size == 0 {
        return Err(ConfigError::NoRanks);
    }
    // Every endpoint is checked before any task starts.
    let endpoints = (0..config.data_parallel_size)
        .map(|rank| {
            let replay = config
                .replay_endpoint
                .as_deref()
                .map(|e| rank_endpoint(e, rank))
                .transpose()?;
            Ok((rank, rank_endpoint(&config.endpoint, rank)?, replay))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    let (changed, watch) = watch::channel(());
    let changed = Arc::new(changed);
    let tasks = endpoints
        .into_iter()
        .map(|(rank, endpoint, replay)| {
            let feed = Feed::new(
                endpoint,
                replay,
                &config,
                pool.attach(PublisherId { replica, rank }),
                changed.clone(),
            );
            tokio::spawn(feed.run())
        })
        .collect();
    Ok(Subscription {
        pool: pool.clone(),
        replica,
        tasks,
        changed: watch,
    })
}

/// A replica's running subscription. Dropping it stops following the
/// replica and forgets its blocks.
pub struct Subscription {
    pool: Arc<PoolIndex>,
    replica: u64,
    tasks: Vec<JoinHandle<()>>,
    changed: watch::Receiver<()>,
}

impl Subscription {
    pub fn replica(&self) -> u64 {
        self.replica
    }

    /// Its ranks' statuses, by rank.
    pub fn statuses(&self) -> Vec<PublisherStatus> {
        self.pool.replica_status(self.replica)
    }

    /// Resolves once `done` holds for the ranks' statuses; checked after
    /// every batch, connection change and replay. Bound it with a timeout.
    pub async fn wait_until(&self, mut done: impl FnMut(&[PublisherStatus]) -> bool) {
        let mut changed = self.changed.clone();
        loop {
            changed.borrow_and_update();
            if done(&self.statuses()) {
                return;
            }
            if changed.changed().await.is_err() {
                // Every task has stopped: nothing will change any more.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_publish_on_consecutive_ports() {
        assert_eq!(
            rank_endpoint("tcp://10.0.0.5:5557", 0).unwrap(),
            "tcp://10.0.0.5:5557"
        );
        assert_eq!(
            rank_endpoint("tcp://pod-a.svc:5557", 3).unwrap(),
            "tcp://pod-a.svc:5560"
        );
        assert_eq!(
            rank_endpoint("tcp://[::1]:5557", 1).unwrap(),
            "tcp://[::1]:5558"
        );
        assert!(rank_endpoint("ipc:///tmp/kv", 0).is_err());
        assert!(rank_endpoint("tcp://host", 0).is_err());
        assert!(rank_endpoint("tcp://:5557", 0).is_err());
        assert_eq!(
            rank_endpoint("tcp://h:65535", 1),
            Err(ConfigError::Port {
                port: 65535,
                rank: 1
            })
        );
    }
}
