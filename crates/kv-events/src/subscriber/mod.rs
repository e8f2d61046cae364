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

mod config;
mod feed;
pub mod replay;
pub mod sequence;

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::index::{PoolIndex, PublisherId, PublisherStatus};
pub use config::{ConfigError, SubscriberConfig, rank_endpoint};
use feed::Feed;

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
