//! Paged KV cache with automatic prefix caching, after vLLM V1's block pool.
//!
//! - Memory is a fixed number of blocks of `block_size` tokens. A request
//!   holds a block table; blocks are shared between requests by reference
//!   count when their contents (chained block hash) are equal.
//! - Free blocks sit in an LRU queue. A freed block keeps its hash and stays
//!   findable until the allocator reuses it (eviction), so a later request
//!   with the same prefix can pick it back up.
//! - Allocation takes never-used blocks first, then the least recently freed.
//!   A request's blocks are freed tail first, so its last blocks are evicted
//!   before its first ones (the shared prefix survives longest).
//!
//! Per-block state is created lazily, the first time a block is handed out,
//! so thousands of lightly loaded replicas stay small in memory.
//!
//! When asked, the cache logs what becomes findable and what is evicted, in
//! order ([`KvCacheEvent`]), for the simulator's KV-event publisher.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::interface::KvCacheEvent;

/// Marks a block without a cached hash; real hashes are never 0.
const NO_HASH: u64 = 0;
/// End of the intrusive free list.
const NIL: u32 = u32::MAX;

/// Chained block hashes: the hash of block `i` covers its tokens and the hash
/// of block `i - 1`, so equal hashes mean equal whole prefixes.
pub(crate) struct BlockHasher {
    scratch: Vec<u8>,
}

impl BlockHasher {
    pub(crate) fn new() -> Self {
        BlockHasher {
            scratch: Vec::new(),
        }
    }

    /// Root of a chain: requests for different adapters never share blocks,
    /// because the same tokens produce different KV under different weights.
    pub(crate) fn root(adapter: Option<&str>) -> u64 {
        const BASE_MODEL_ROOT: u64 = 0x9e37_79b9_7f4a_7c15;
        match adapter {
            None => BASE_MODEL_ROOT,
            Some(name) => xxh3_64_with_seed(name.as_bytes(), BASE_MODEL_ROOT),
        }
    }

    pub(crate) fn hash(&mut self, parent: u64, tokens: impl Iterator<Item = u32>) -> u64 {
        self.scratch.clear();
        for token in tokens {
            self.scratch.extend_from_slice(&token.to_le_bytes());
        }
        match xxh3_64_with_seed(&self.scratch, parent) {
            NO_HASH => 1,
            h => h,
        }
    }
}

/// Keys are already uniformly distributed block hashes: hashing them again
/// would only cost time on the hottest map of the simulator.
#[derive(Default)]
struct PassThroughHasher(u64);

impl Hasher for PassThroughHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type BlockMap = HashMap<u64, u32, BuildHasherDefault<PassThroughHasher>>;

/// One block's state, kept together: allocating, freeing or evicting a
/// block then touches one cache line rather than one per field, which is
/// what a 1,000-replica simulation spends its time waiting for.
#[derive(Clone, Copy)]
struct Block {
    /// Chained hash of the contents while findable, else `NO_HASH`.
    hash: u64,
    ref_cnt: u32,
    /// Neighbours in the free queue (`NIL` at its ends and when not queued).
    prev: u32,
    next: u32,
}

pub(crate) struct KvCache {
    num_blocks: u32,
    block_size: u32,
    caching: bool,
    /// By block id, for blocks `0..blocks.len()`; the rest were never
    /// handed out.
    blocks: Vec<Block>,
    /// LRU queue of freed blocks: allocation pops at `head`, frees push at `tail`.
    head: u32,
    tail: u32,
    queued: u32,
    cached: BlockMap,
    /// Changes since the last drain, when logging is on.
    log: Option<Vec<KvCacheEvent>>,
}

impl KvCache {
    pub(crate) fn new(num_blocks: u32, block_size: u32, caching: bool) -> Self {
        KvCache {
            num_blocks,
            block_size: block_size.max(1),
            caching,
            blocks: Vec::new(),
            head: NIL,
            tail: NIL,
            queued: 0,
            cached: BlockMap::default(),
            log: None,
        }
    }

    /// Log stores and evictions from now on (or stop, dropping the log).
    pub(crate) fn set_logging(&mut self, on: bool) {
        self.log = on.then(Vec::new);
    }

    pub(crate) fn logging(&self) -> bool {
        self.log.is_some()
    }

    /// Move the changes logged so far to `out`, oldest first.
    pub(crate) fn drain_log(&mut self, out: &mut Vec<KvCacheEvent>) {
        if let Some(log) = &mut self.log {
            out.append(log);
        }
    }

    /// Log blocks that [`KvCache::register`] made findable (the cache does
    /// not know their tokens; the caller does).
    pub(crate) fn log_stored(&mut self, event: KvCacheEvent) {
        if let Some(log) = &mut self.log {
            log.push(event);
        }
    }

    /// The hashes of every findable block, sorted.
    pub(crate) fn cached_hashes(&self) -> Vec<u64> {
        let mut hashes: Vec<u64> = self.cached.keys().copied().collect();
        hashes.sort_unstable();
        hashes
    }

    pub(crate) fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    /// Blocks that can be allocated now (never used, or freed and evictable).
    pub(crate) fn num_free(&self) -> u32 {
        self.num_blocks - self.touched() + self.queued
    }

    /// Fraction of blocks referenced by requests, as vLLM's `kv_cache_usage_perc`.
    pub(crate) fn usage(&self) -> f64 {
        if self.num_blocks == 0 {
            return 0.0;
        }
        1.0 - f64::from(self.num_free()) / f64::from(self.num_blocks)
    }

    /// Blocks handed out at least once.
    fn touched(&self) -> u32 {
        self.blocks.len() as u32
    }

    pub(crate) fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }

    /// Push the blocks holding the longest cached prefix of `hashes` into
    /// `out`; returns how many were found.
    pub(crate) fn find_cached_prefix(&self, hashes: &[u64], out: &mut Vec<u32>) -> usize {
        out.clear();
        if !self.caching {
            return 0;
        }
        for h in hashes {
            match self.cached.get(h) {
                Some(&block) => out.push(block),
                None => break,
            }
        }
        out.len()
    }

    /// How many leading blocks of `hashes` are findable (a read-only
    /// [`KvCache::find_cached_prefix`]).
    pub(crate) fn cached_prefix_len(&self, hashes: &[u64]) -> usize {
        if !self.caching {
            return 0;
        }
        hashes
            .iter()
            .take_while(|h| self.cached.contains_key(h))
            .count()
    }

    /// Give a new request its cached prefix blocks `hits` plus fresh blocks
    /// for `total_tokens` in all. Fails, changing nothing, when memory is short.
    pub(crate) fn allocate_with_prefix(
        &mut self,
        table: &mut Vec<u32>,
        hits: &[u32],
        total_tokens: u32,
    ) -> bool {
        debug_assert!(table.is_empty());
        let needed = self
            .blocks_for(total_tokens)
            .saturating_sub(hits.len() as u32);
        // Hit blocks nobody references are counted as free; taking them
        // removes them from the pool the new blocks come from.
        let idle_hits = hits
            .iter()
            .filter(|&&b| self.blocks[b as usize].ref_cnt == 0)
            .count() as u32;
        if needed > self.num_free() - idle_hits {
            return false;
        }
        for &block in hits {
            self.acquire(block);
            table.push(block);
        }
        self.push_fresh(table, needed);
        true
    }

    /// Extend a running request's table to hold `total_tokens`. Fails,
    /// changing nothing, when memory is short.
    pub(crate) fn grow(&mut self, table: &mut Vec<u32>, total_tokens: u32) -> bool {
        let needed = self
            .blocks_for(total_tokens)
            .saturating_sub(table.len() as u32);
        if needed > self.num_free() {
            return false;
        }
        self.push_fresh(table, needed);
        true
    }

    /// Make a full block findable by its chained hash; whether it became
    /// findable. A block whose content is already cached under another
    /// block stays private.
    pub(crate) fn register(&mut self, block: u32, hash: u64) -> bool {
        if !self.caching || self.blocks[block as usize].hash != NO_HASH {
            return false;
        }
        if let std::collections::hash_map::Entry::Vacant(slot) = self.cached.entry(hash) {
            slot.insert(block);
            self.blocks[block as usize].hash = hash;
            return true;
        }
        false
    }

    /// Release a request's blocks, tail first, and empty its table.
    pub(crate) fn free(&mut self, table: &mut Vec<u32>) {
        for &block in table.iter().rev() {
            let state = &mut self.blocks[block as usize];
            debug_assert!(state.ref_cnt > 0);
            state.ref_cnt -= 1;
            if state.ref_cnt == 0 {
                self.enqueue(block);
            }
        }
        table.clear();
    }

    fn push_fresh(&mut self, table: &mut Vec<u32>, count: u32) {
        for _ in 0..count {
            let block = self.take_free();
            table.push(block);
        }
    }

    /// Never-used blocks first (they sit at the front of vLLM's queue), then
    /// the least recently freed, evicting its cached hash.
    fn take_free(&mut self) -> u32 {
        if self.touched() < self.num_blocks {
            let block = self.touched();
            self.blocks.push(Block {
                hash: NO_HASH,
                ref_cnt: 1,
                prev: NIL,
                next: NIL,
            });
            return block;
        }
        let block = self.head;
        debug_assert_ne!(block, NIL, "take_free called without a free block");
        self.unlink(block);
        let state = &mut self.blocks[block as usize];
        let old = std::mem::replace(&mut state.hash, NO_HASH);
        state.ref_cnt = 1;
        if old != NO_HASH && self.cached.get(&old) == Some(&block) {
            self.cached.remove(&old);
            if let Some(log) = &mut self.log {
                // Evictions in a row make one event (vLLM sends one per
                // block; consumers read both alike).
                match log.last_mut() {
                    Some(KvCacheEvent::Removed { hashes }) => hashes.push(old),
                    _ => log.push(KvCacheEvent::Removed { hashes: vec![old] }),
                }
            }
        }
        block
    }

    /// Take a reference to a cached block (a prefix hit).
    fn acquire(&mut self, block: u32) {
        if self.blocks[block as usize].ref_cnt == 0 {
            self.unlink(block);
        }
        self.blocks[block as usize].ref_cnt += 1;
    }

    fn enqueue(&mut self, block: u32) {
        let state = &mut self.blocks[block as usize];
        state.prev = self.tail;
        state.next = NIL;
        if self.tail == NIL {
            self.head = block;
        } else {
            self.blocks[self.tail as usize].next = block;
        }
        self.tail = block;
        self.queued += 1;
    }

    fn unlink(&mut self, block: u32) {
        let state = &mut self.blocks[block as usize];
        let (prev, next) = (state.prev, state.next);
        state.prev = NIL;
        state.next = NIL;
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.queued -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(hasher: &mut BlockHasher, tokens: &[u32], block_size: usize) -> Vec<u64> {
        let mut parent = BlockHasher::root(None);
        tokens
            .chunks_exact(block_size)
            .map(|block| {
                parent = hasher.hash(parent, block.iter().copied());
                parent
            })
            .collect()
    }

    #[test]
    fn block_hash_depends_on_the_whole_prefix_and_the_adapter() {
        let mut h = BlockHasher::new();
        let a = chain(&mut h, &[1, 2, 3, 4, 5, 6, 7, 8], 4);
        let b = chain(&mut h, &[9, 2, 3, 4, 5, 6, 7, 8], 4);
        assert_ne!(a[0], b[0]);
        assert_ne!(a[1], b[1], "same tokens after a different prefix");
        let root_lora = BlockHasher::root(Some("sql-lora"));
        assert_ne!(h.hash(root_lora, [1, 2, 3, 4].into_iter()), a[0]);
    }

    #[test]
    fn allocation_fails_cleanly_when_memory_is_short() {
        let mut kv = KvCache::new(4, 16, true);
        let mut a = Vec::new();
        assert!(kv.allocate_with_prefix(&mut a, &[], 48));
        assert_eq!(a.len(), 3);
        let mut b = Vec::new();
        assert!(!kv.allocate_with_prefix(&mut b, &[], 32));
        assert!(b.is_empty());
        assert_eq!(kv.num_free(), 1);
        assert!(kv.grow(&mut a, 64));
        assert!(!kv.grow(&mut a, 65));
        assert_eq!(kv.usage(), 1.0);
        kv.free(&mut a);
        assert_eq!(kv.num_free(), 4);
        assert_eq!(kv.usage(), 0.0);
    }

    #[test]
    fn freed_blocks_stay_findable_until_evicted_lru() {
        let mut h = BlockHasher::new();
        let mut kv = KvCache::new(4, 4, true);
        let hashes = chain(&mut h, &[1, 2, 3, 4, 5, 6, 7, 8], 4);
        let mut a = Vec::new();
        assert!(kv.allocate_with_prefix(&mut a, &[], 8));
        kv.register(a[0], hashes[0]);
        kv.register(a[1], hashes[1]);
        kv.free(&mut a);

        let mut hits = Vec::new();
        assert_eq!(kv.find_cached_prefix(&hashes, &mut hits), 2);
        // Two never-used blocks are handed out before any cached one.
        let mut b = Vec::new();
        assert!(kv.allocate_with_prefix(&mut b, &[], 8));
        assert_eq!(kv.find_cached_prefix(&hashes, &mut hits), 2);
        // The next allocation evicts the tail block first (freed first).
        let mut c = Vec::new();
        assert!(kv.allocate_with_prefix(&mut c, &[], 4));
        assert_eq!(kv.find_cached_prefix(&hashes, &mut hits), 1);
        let mut d = Vec::new();
        assert!(kv.allocate_with_prefix(&mut d, &[], 4));
        assert_eq!(kv.find_cached_prefix(&hashes, &mut hits), 0);
    }

    #[test]
    fn prefix_hits_share_blocks_by_reference() {
        let mut h = BlockHasher::new();
        let mut kv = KvCache::new(3, 4, true);
        let hashes = chain(&mut h, &[1, 2, 3, 4], 4);
        let mut a = Vec::new();
        assert!(kv.allocate_with_prefix(&mut a, &[], 6));
        kv.register(a[0], hashes[0]);
        let mut hits = Vec::new();
        kv.find_cached_prefix(&hashes, &mut hits);
        let mut b = Vec::new();
        // 1 shared + 1 new block: fits although only one block is free.
        assert!(kv.allocate_with_prefix(&mut b, &hits, 6));
        assert_eq!(a[0], b[0]);
        assert_eq!(kv.num_free(), 0);
        kv.free(&mut a);
        assert_eq!(kv.num_free(), 1, "the shared block is still referenced");
        kv.free(&mut b);
        assert_eq!(kv.num_free(), 3);
    }

    #[test]
    fn idle_hit_blocks_are_not_counted_twice() {
        let mut h = BlockHasher::new();
        let mut kv = KvCache::new(2, 4, true);
        let hashes = chain(&mut h, &[1, 2, 3, 4], 4);
        let mut a = Vec::new();
        assert!(kv.allocate_with_prefix(&mut a, &[], 4));
        kv.register(a[0], hashes[0]);
        kv.free(&mut a);
        let mut hits = Vec::new();
        kv.find_cached_prefix(&hashes, &mut hits);
        // Hit (idle, counted free) + 2 new blocks would need 3 blocks of 2.
        let mut b = Vec::new();
        assert!(!kv.allocate_with_prefix(&mut b, &hits, 12));
        assert!(kv.allocate_with_prefix(&mut b, &hits, 8));
    }

    #[test]
    fn caching_disabled_never_hits() {
        let mut h = BlockHasher::new();
        let mut kv = KvCache::new(2, 4, false);
        let hashes = chain(&mut h, &[1, 2, 3, 4], 4);
        let mut a = Vec::new();
        assert!(kv.allocate_with_prefix(&mut a, &[], 4));
        kv.register(a[0], hashes[0]);
        let mut hits = Vec::new();
        assert_eq!(kv.find_cached_prefix(&hashes, &mut hits), 0);
    }
}
