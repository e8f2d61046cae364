//! An exact index of the blocks each replica's engine holds, built from its
//! KV events.
//!
//! # Shape
//!
//! One [`PoolIndex`] per pool, shared by every replica's subscriber and by
//! the picker:
//!
//! - a shared map from our block key ([`crate::keys`]) to the publishers
//!   holding that block, with a count per tier (GPU, offload);
//! - per publisher (one per replica and data-parallel rank), the map from
//!   the engine's block hash to our key (how `BlockRemoved`, which names
//!   only engine hashes, finds the block), and its stream's status.
//!
//! A query hashes the prompt once and walks its keys through the shared
//! map a single time, extending every publisher's run as it goes, so asking
//! for all candidates costs one walk over the matched prefix, not one walk
//! per replica. It stops at the first block nobody holds.
//!
//! Writers (a subscriber applying a batch) take the pool's lock once per
//! batch; queries take it shared. A publisher's blocks leave the pool when
//! its [`PublisherIndex`] is dropped, so dropping a replica's subscription
//! is all it takes to forget it.
//!
//! # What it can not know
//!
//! - A store whose parent block the index never saw (it came before the
//!   subscriber joined) cannot be keyed and is counted as orphaned. (A
//!   parent removed a moment ago is fine: the keys of the last removed
//!   blocks are remembered, since engines store children of a duplicate
//!   block whose first copy was evicted.)
//! - Only the first KV-cache group is indexed (hybrid models publish one
//!   group per attention kind; a prefix hit needs full attention's).
//! - Blocks whose engine hash covers more than tokens (images, a cache
//!   salt) are indexed under keys no prompt can produce: never a false hit.

mod holders;
mod query;
mod rate;
mod state;
mod types;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::keys::{self, BlockKey};
use crate::wire::EventBatch;
use holders::Holders;
pub use query::{BlockMatch, PrefixMatches};
use state::PublisherState;
pub use types::{PublisherId, PublisherStatus, Source, Tier, Unsure};

/// The block index of one pool. See the module docs.
pub struct PoolIndex {
    state: RwLock<PoolState>,
    attachments: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    holders: Holders,
    /// By slot; a detached publisher's slot is `None` until reused.
    publishers: Vec<Option<PublisherState>>,
    /// Every replica with a publisher, by id, and whether all its
    /// publishers are exact; rebuilt when that changes (rarely), shared
    /// with every query's answer.
    replicas: Arc<Vec<(u64, bool)>>,
}

impl PoolState {
    fn refresh_replicas(&mut self) {
        let mut replicas: Vec<(u64, bool)> = Vec::new();
        let mut all: Vec<_> = self
            .publishers
            .iter()
            .flatten()
            .map(|p| (p.id.replica, p.status.source == Source::Events))
            .collect();
        all.sort_unstable();
        for (replica, exact) in all {
            match replicas.last_mut() {
                Some((last, all_exact)) if *last == replica => *all_exact &= exact,
                _ => replicas.push((replica, exact)),
            }
        }
        if *self.replicas != replicas {
            self.replicas = Arc::new(replicas);
        }
    }

    fn slot_of(&self, id: PublisherId) -> Option<u32> {
        self.publishers
            .iter()
            .position(|p| p.as_ref().is_some_and(|p| p.id == id))
            .map(|i| i as u32)
    }

    fn detach(&mut self, slot: u32) {
        if let Some(mut publisher) = self.publishers[slot as usize].take() {
            publisher.clear(slot, &mut self.holders);
        }
        self.refresh_replicas();
    }
}

impl PoolIndex {
    pub fn new() -> Arc<Self> {
        Arc::new(PoolIndex {
            state: RwLock::new(PoolState::default()),
            attachments: AtomicU64::new(0),
        })
    }

    /// Start indexing a publisher's blocks; the handle writes them and
    /// removes them when dropped. Attaching an id again replaces the
    /// earlier attachment, whose handle then writes nothing.
    pub fn attach(self: &Arc<Self>, id: PublisherId) -> PublisherIndex {
        let attachment = self.attachments.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.write();
        if let Some(old) = state.slot_of(id) {
            state.detach(old);
        }
        let fresh = PublisherState::new(id, attachment);
        let slot = match state.publishers.iter().position(Option::is_none) {
            Some(free) => {
                state.publishers[free] = Some(fresh);
                free
            }
            None => {
                state.publishers.push(Some(fresh));
                state.publishers.len() - 1
            }
        } as u32;
        state.refresh_replicas();
        PublisherIndex {
            pool: self.clone(),
            slot,
            attachment,
        }
    }

    /// How many leading blocks of a prompt each publisher holds. `keys`
    /// come from [`keys::prompt_keys`] with the engines' block size.
    pub fn match_prefix(&self, keys: &[BlockKey]) -> PrefixMatches {
        let state = self.state.read();
        query::walk(&state.holders, &state.publishers, &state.replicas, keys)
    }

    /// A single replica's match (best data-parallel rank): the shape of the
    /// question when only one replica is asked about.
    pub fn matched_blocks(
        &self,
        replica: u64,
        tokens: &[u32],
        lora: Option<&str>,
        block_size: u32,
    ) -> BlockMatch {
        self.match_prefix(&keys::prompt_keys(tokens, lora, block_size))
            .get(replica)
    }

    /// The block size the pool's engines report (from their stores; the
    /// smallest if they differ, `None` before any store): what to cut
    /// prompts into for [`PoolIndex::match_prefix`].
    pub fn block_size(&self) -> Option<u32> {
        let state = self.state.read();
        state
            .publishers
            .iter()
            .flatten()
            .filter_map(|p| p.status.block_size)
            .min()
    }

    /// Every publisher's status, by id.
    pub fn statuses(&self) -> Vec<PublisherStatus> {
        let state = self.state.read();
        let mut all: Vec<_> = state
            .publishers
            .iter()
            .flatten()
            .map(PublisherState::status)
            .collect();
        all.sort_by_key(|s| s.id);
        all
    }

    /// The statuses of one replica's publishers (one per rank).
    pub fn replica_status(&self, replica: u64) -> Vec<PublisherStatus> {
        let mut statuses = self.statuses();
        statuses.retain(|s| s.id.replica == replica);
        statuses
    }

    /// Whether every publisher of `replica` is in sync (and it has one).
    pub fn is_exact(&self, replica: u64) -> bool {
        query::exact(&self.state.read().replicas, replica) == Some(true)
    }

    /// The engine hashes (as [`BlockHash::id`](crate::wire::BlockHash::id))
    /// a publisher holds in `tier`, sorted: to compare with an engine's own
    /// view in tests and debugging.
    pub fn block_ids(&self, id: PublisherId, tier: Tier) -> Vec<u64> {
        let state = self.state.read();
        state
            .slot_of(id)
            .and_then(|slot| state.publishers[slot as usize].as_ref())
            .map(|p| p.block_ids(tier))
            .unwrap_or_default()
    }

    /// Distinct blocks held by any publisher of the pool.
    pub fn distinct_blocks(&self) -> usize {
        self.state.read().holders.len()
    }
}

/// The writer of one publisher's blocks (held by its subscriber). Dropping
/// it removes them from the pool.
pub struct PublisherIndex {
    pool: Arc<PoolIndex>,
    slot: u32,
    attachment: u64,
}

impl PublisherIndex {
    /// Apply a batch, in order, as batch `seq` of the stream.
    pub fn apply(&self, seq: u64, batch: &EventBatch) {
        self.with(|p, holders, slot| {
            p.apply(slot, holders, batch);
            p.status.last_sequence = Some(seq);
        });
    }

    /// The engine restarted (or the stream starts over): forget every block
    /// and the sequence.
    pub fn restart(&self) {
        self.with(|p, holders, slot| {
            p.clear(slot, holders);
            p.status.restarts += 1;
            p.status.last_sequence = None;
        });
    }

    pub fn set_source(&self, source: Source) {
        self.with(|p, _, _| p.status.source = source);
    }

    pub fn set_connected(&self, connected: bool) {
        self.with(|p, _, _| p.status.connected = connected);
    }

    pub fn note_gap(&self) {
        self.with(|p, _, _| p.status.gaps += 1);
    }

    pub fn note_replay(&self, batches: u64) {
        self.with(|p, _, _| {
            p.status.replays += 1;
            p.status.replayed_batches += batches;
        });
    }

    pub fn note_decode_error(&self) {
        self.with(|p, _, _| p.status.decode_errors += 1);
    }

    pub fn status(&self) -> Option<PublisherStatus> {
        let state = self.pool.state.read();
        self.mine(&state).map(PublisherState::status)
    }

    /// This publisher's match for a prompt: `(gpu, offload)` leading blocks.
    pub fn matched_blocks(
        &self,
        tokens: &[u32],
        lora: Option<&str>,
        block_size: u32,
    ) -> BlockMatch {
        let keys = keys::prompt_keys(tokens, lora, block_size);
        let state = self.pool.state.read();
        match self.mine(&state) {
            Some(_) => query::walk_one(&state.holders, self.slot, &keys),
            None => BlockMatch::default(),
        }
    }

    pub fn pool(&self) -> &Arc<PoolIndex> {
        &self.pool
    }

    fn mine<'s>(&self, state: &'s PoolState) -> Option<&'s PublisherState> {
        state.publishers[self.slot as usize]
            .as_ref()
            .filter(|p| p.attachment == self.attachment)
    }

    fn with(&self, f: impl FnOnce(&mut PublisherState, &mut Holders, u32)) {
        let mut guard = self.pool.state.write();
        let state = &mut *guard;
        if let Some(p) = state.publishers[self.slot as usize].as_mut()
            && p.attachment == self.attachment
        {
            let before = p.status.source;
            f(p, &mut state.holders, self.slot);
            if p.status.source != before {
                state.refresh_replicas();
            }
        }
    }
}

impl Drop for PublisherIndex {
    fn drop(&mut self) {
        let mut state = self.pool.state.write();
        if state.publishers[self.slot as usize]
            .as_ref()
            .is_some_and(|p| p.attachment == self.attachment)
        {
            state.detach(self.slot);
        }
    }
}
