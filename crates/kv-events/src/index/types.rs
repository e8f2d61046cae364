//! The index's plain data: who publishes, where a block is, and how far a
//! publisher's stream can be trusted. A leaf, so the pool and its parts
//! (holders, state, queries) all name these without naming each other.

use crate::wire::MEDIUM_GPU;

/// One event publisher: a replica's engine, or one data-parallel rank of it
/// (each rank has its own cache and its own stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PublisherId {
    /// The gateway's id of the replica.
    pub replica: u64,
    pub rank: u32,
}

/// Where a block is: in GPU memory, or in a slower tier it can be loaded
/// back from (CPU memory, disk), which saves less of a prefill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    Gpu = 0,
    Offload = 1,
}

impl Tier {
    pub const ALL: [Tier; 2] = [Tier::Gpu, Tier::Offload];

    /// An event's medium: none (releases before tiers) or `"GPU"` is the
    /// GPU, anything else an offload tier.
    pub fn of(medium: Option<&str>) -> Tier {
        match medium {
            None => Tier::Gpu,
            Some(m) if m.eq_ignore_ascii_case(MEDIUM_GPU) => Tier::Gpu,
            Some(_) => Tier::Offload,
        }
    }

    pub(super) fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// Whether a publisher's blocks can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Every batch since a known-empty state was applied: the index is the
    /// engine's cache.
    Events,
    /// Something may be missing or stale; prefer a guess for this replica.
    Unsure(Unsure),
}

/// Why a publisher's blocks are not trusted, until an `AllBlocksCleared` or
/// a restart of its engine (or a replay that fills the hole).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsure {
    /// Nothing heard yet that proves where the stream stands.
    NotSynced,
    /// The first batch heard was not the engine's first, and no replay
    /// filled in the ones before.
    JoinedLate,
    /// Batches were lost and no replay filled them in.
    Gap,
    /// A batch could not be decoded.
    DecodeError,
    /// The connection to the publisher dropped; batches may be missed.
    Disconnected,
}

/// A publisher's state, for `/debug` pages and the picker's choice between
/// events and guessing.
#[derive(Debug, Clone, PartialEq)]
pub struct PublisherStatus {
    pub id: PublisherId,
    pub source: Source,
    pub connected: bool,
    /// Blocks indexed, by tier (a block in both tiers counts in each).
    pub gpu_blocks: usize,
    pub offload_blocks: usize,
    /// The engine's block size, from its last store.
    pub block_size: Option<u32>,
    /// The last batch applied.
    pub last_sequence: Option<u64>,
    pub batches: u64,
    pub events: u64,
    /// Events per second lately (over about ten seconds).
    pub events_per_second: f64,
    /// Blocks stored and removed, over the stream's life (a block stored in
    /// two tiers counts twice).
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    /// Events of kinds this crate does not know (ignored).
    pub unknown_events: u64,
    /// Events of other KV groups, or with tokens that do not fill their
    /// blocks (ignored).
    pub skipped_events: u64,
    /// Stored blocks whose parent the index did not hold (not indexed).
    pub orphaned_blocks: u64,
    /// Removals of blocks the index did not hold.
    pub missing_removals: u64,
    /// Holes in the sequence numbers.
    pub gaps: u64,
    /// Replays asked for, and batches they brought.
    pub replays: u64,
    pub replayed_batches: u64,
    /// Times the sequence went back (the engine restarted).
    pub restarts: u64,
    pub decode_errors: u64,
}

impl PublisherStatus {
    pub(super) fn new(id: PublisherId) -> Self {
        PublisherStatus {
            id,
            source: Source::Unsure(Unsure::NotSynced),
            connected: false,
            gpu_blocks: 0,
            offload_blocks: 0,
            block_size: None,
            last_sequence: None,
            batches: 0,
            events: 0,
            events_per_second: 0.0,
            stored_blocks: 0,
            removed_blocks: 0,
            unknown_events: 0,
            skipped_events: 0,
            orphaned_blocks: 0,
            missing_removals: 0,
            gaps: 0,
            replays: 0,
            replayed_batches: 0,
            restarts: 0,
            decode_errors: 0,
        }
    }

    /// Blocks indexed, all tiers.
    pub fn blocks(&self) -> usize {
        self.gpu_blocks + self.offload_blocks
    }
}
