//! Which replica recently received which prompt blocks.
//!
//! One map from block hash to the replicas holding it serves every replica
//! at once, so scoring a prompt against a whole pool costs a handful of
//! lookups rather than one search per replica. Each replica also keeps its
//! blocks in recency order, bounded by its KV capacity, and forgets the
//! least recently sent block first, as the engine's own cache does.
//!
//! Because block hashes chain, holding block `i` means having been sent the
//! whole prefix `0..=i`. Blocks are touched tail first, so within a replica
//! a block is never less recent than any later block of the same chain and
//! eviction removes chains from the end. Matches are therefore always
//! leading runs, and a binary search over block positions finds them.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::RwLock;

use super::lru::{LruList, NodeId};
use crate::policy::PrefixConfig;

/// Replica `replica` holds a block; `node` is its place in the replica's
/// recency list.
#[derive(Debug, Clone, Copy)]
struct Holder {
    replica: u32,
    node: NodeId,
}

/// The replicas holding one block, sorted by replica. Most blocks belong to
/// one replica (that is what affinity aims for), so that case is stored
/// inline without a heap allocation.
#[derive(Debug, Clone)]
enum Holders {
    One(Holder),
    Many(Vec<Holder>),
}

impl Holders {
    fn as_slice(&self) -> &[Holder] {
        match self {
            Holders::One(holder) => std::slice::from_ref(holder),
            Holders::Many(holders) => holders,
        }
    }

    fn position(&self, replica: u32) -> Result<usize, usize> {
        self.as_slice()
            .binary_search_by_key(&replica, |holder| holder.replica)
    }

    fn contains(&self, replica: u32) -> bool {
        self.position(replica).is_ok()
    }

    fn node_of(&self, replica: u32) -> Option<NodeId> {
        self.position(replica)
            .ok()
            .map(|at| self.as_slice()[at].node)
    }

    fn insert(&mut self, holder: Holder) {
        let Err(at) = self.position(holder.replica) else {
            return;
        };
        match self {
            Holders::One(only) => {
                let mut many = Vec::with_capacity(2);
                many.push(*only);
                many.insert(at, holder);
                *self = Holders::Many(many);
            }
            Holders::Many(holders) => holders.insert(at, holder),
        }
    }

    /// Remove `replica`; returns true when no holder is left.
    fn remove(&mut self, replica: u32) -> bool {
        let Ok(at) = self.position(replica) else {
            return false;
        };
        match self {
            Holders::One(_) => true,
            Holders::Many(holders) => {
                holders.remove(at);
                let remaining = holders.len();
                if remaining == 1 {
                    let last = holders[0];
                    *self = Holders::One(last);
                }
                remaining == 0
            }
        }
    }
}

/// Block hashes are already uniformly distributed (xxh3), so the map uses
/// them as they are instead of hashing them again.
#[derive(Default)]
struct BlockHashHasher(u64);

impl Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

type BlockMap = HashMap<u64, Holders, BuildHasherDefault<BlockHashHasher>>;

/// `replica` no longer holds `hash`; the block goes when nobody does.
fn remove_holder(holders: &mut BlockMap, hash: u64, replica: u32) {
    let Entry::Occupied(mut entry) = holders.entry(hash) else {
        return;
    };
    if entry.get_mut().remove(replica) {
        entry.remove();
    }
}

#[derive(Debug, Default)]
struct Replica {
    recency: LruList,
}

#[derive(Default)]
struct IndexState {
    holders: BlockMap,
    /// By endpoint index.
    replicas: Vec<Replica>,
}

impl IndexState {
    fn evict_oldest(&mut self, replica: u32) {
        let Some(hash) = self.replicas[replica as usize].recency.pop_oldest() else {
            return;
        };
        remove_holder(&mut self.holders, hash, replica);
    }

    fn holds(&self, replica: u32, hash: u64) -> bool {
        self.holders
            .get(&hash)
            .is_some_and(|holders| holders.contains(replica))
    }
}

/// Reusable buffers for [`PrefixIndex::match_lengths_with`], so a caller on
/// a hot path allocates them once.
#[derive(Debug, Default)]
pub struct MatchScratch {
    order: Vec<u32>,
    pending: Vec<Range>,
    spill: Vec<u32>,
}

/// Candidates `order[start..end]` all match between `lo` and `hi` blocks.
#[derive(Debug, Clone, Copy)]
struct Range {
    lo: usize,
    hi: usize,
    start: usize,
    end: usize,
}

/// Remembers, per replica, the prompt blocks recently sent to it.
///
/// Replicas are named by endpoint index. Safe to share between threads:
/// lookups take a read lock, [`PrefixIndex::record`] a write lock.
pub struct PrefixIndex {
    state: RwLock<IndexState>,
    default_capacity: usize,
}

impl Default for PrefixIndex {
    fn default() -> Self {
        PrefixIndex::new(PrefixConfig::DEFAULT_CAPACITY_BLOCKS)
    }
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.read();
        f.debug_struct("PrefixIndex")
            .field("blocks", &state.holders.len())
            .field("replicas", &state.replicas.len())
            .field("default_capacity", &self.default_capacity)
            .finish()
    }
}

impl PrefixIndex {
    /// `default_capacity`: blocks remembered per replica when
    /// [`PrefixIndex::record`] gets no capacity hint.
    pub fn new(default_capacity: usize) -> Self {
        PrefixIndex {
            state: RwLock::new(IndexState::default()),
            default_capacity: default_capacity.max(1),
        }
    }

    /// Note that `hashes` (one prompt's chained block hashes) were sent to
    /// `endpoint`. `capacity_hint` is the replica's KV capacity in prompt
    /// blocks, when known; the replica then remembers at most that many
    /// blocks, evicting the least recently sent first.
    pub fn record(&self, endpoint: usize, hashes: &[u64], capacity_hint: Option<u64>) {
        let Ok(replica) = u32::try_from(endpoint) else {
            return;
        };
        if hashes.is_empty() {
            return;
        }
        let capacity = capacity_hint
            .map_or(self.default_capacity, |c| {
                usize::try_from(c).unwrap_or(usize::MAX)
            })
            .max(1);

        let mut state = self.state.write();
        if state.replicas.len() <= endpoint {
            state.replicas.resize_with(endpoint + 1, Replica::default);
        }
        let IndexState { holders, replicas } = &mut *state;
        let recency = &mut replicas[endpoint].recency;
        // Tail first: the prompt's first blocks end up the most recent.
        for &hash in hashes.iter().rev() {
            match holders.entry(hash) {
                Entry::Occupied(mut entry) => match entry.get().node_of(replica) {
                    Some(node) => recency.touch(node),
                    None => {
                        let node = recency.push_newest(hash);
                        entry.get_mut().insert(Holder { replica, node });
                    }
                },
                Entry::Vacant(entry) => {
                    let node = recency.push_newest(hash);
                    entry.insert(Holders::One(Holder { replica, node }));
                }
            }
        }
        // Evict after touching, so a block this prompt still needs is never
        // evicted and re-inserted within one call.
        while state.replicas[endpoint].recency.len() > capacity {
            state.evict_oldest(replica);
        }
    }

    /// Number of leading blocks of `hashes` that `endpoint` holds.
    pub fn longest_match(&self, endpoint: usize, hashes: &[u64]) -> usize {
        let Ok(replica) = u32::try_from(endpoint) else {
            return 0;
        };
        let state = self.state.read();
        // Leading runs only (see module docs): the held blocks are a prefix
        // of `hashes`, so binary-search its length.
        let (mut lo, mut hi) = (0, hashes.len());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if state.holds(replica, hashes[mid - 1]) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    }

    /// Up to `limit` endpoints holding the longest leading run of `hashes`
    /// that any endpoint holds, appended to `out`; none when no endpoint
    /// holds the first block. When more hold it, a window of `limit` of
    /// them starting at `offset` (modulo their number) is taken, so
    /// callers can rotate through them.
    pub fn deepest_holders(
        &self,
        hashes: &[u64],
        limit: usize,
        offset: usize,
        out: &mut Vec<usize>,
    ) {
        if limit == 0 || hashes.is_empty() {
            return;
        }
        let state = self.state.read();
        // Someone holding block `i` holds every block before it (module
        // docs), so "someone holds block i" is monotone in `i`.
        let (mut lo, mut hi) = (0, hashes.len());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if state.holders.contains_key(&hashes[mid - 1]) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        if lo == 0 {
            return;
        }
        let holders = state.holders[&hashes[lo - 1]].as_slice();
        let take = limit.min(holders.len());
        let start = offset % holders.len();
        out.extend(
            holders
                .iter()
                .cycle()
                .skip(start)
                .take(take)
                .map(|holder| holder.replica as usize),
        );
    }

    /// [`PrefixIndex::longest_match`] for many endpoints at once:
    /// `out[i]` = leading blocks of `hashes` held by `endpoints[i]`.
    ///
    /// Splits the candidates at each probed block into those that hold it
    /// and those that do not, so the cost grows with the number of distinct
    /// match lengths, not with the number of candidates.
    pub fn match_lengths(&self, hashes: &[u64], endpoints: &[usize], out: &mut [usize]) {
        self.match_lengths_with(hashes, endpoints, out, &mut MatchScratch::default());
    }

    /// [`PrefixIndex::match_lengths`] with caller-owned buffers.
    pub fn match_lengths_with(
        &self,
        hashes: &[u64],
        endpoints: &[usize],
        out: &mut [usize],
        scratch: &mut MatchScratch,
    ) {
        assert_eq!(endpoints.len(), out.len(), "one output per endpoint");
        out.fill(0);
        if hashes.is_empty() || endpoints.is_empty() {
            return;
        }
        let state = self.state.read();
        if state.holders.is_empty() {
            return;
        }
        let MatchScratch {
            order,
            pending,
            spill,
        } = scratch;
        // Candidates sorted by endpoint index (usually already are, which
        // the sort detects in linear time); partitions below keep each
        // range sorted so membership can be a merge with the sorted holders.
        order.clear();
        order.extend(0..endpoints.len() as u32);
        order.sort_by_key(|&candidate| endpoints[candidate as usize]);
        pending.clear();
        pending.push(Range {
            lo: 0,
            hi: hashes.len(),
            start: 0,
            end: endpoints.len(),
        });
        while let Some(Range { lo, hi, start, end }) = pending.pop() {
            if lo == hi {
                for &candidate in &order[start..end] {
                    out[candidate as usize] = lo;
                }
                continue;
            }
            // Probe block `mid - 1`: holders match at least `mid` blocks.
            let mid = lo + (hi - lo).div_ceil(2);
            let split = match state.holders.get(&hashes[mid - 1]) {
                None => start,
                Some(holders) => {
                    start
                        + partition_holders(
                            &mut order[start..end],
                            endpoints,
                            holders.as_slice(),
                            spill,
                        )
                }
            };
            if split > start {
                pending.push(Range {
                    lo: mid,
                    hi,
                    start,
                    end: split,
                });
            }
            if end > split {
                pending.push(Range {
                    lo,
                    hi: mid - 1,
                    start: split,
                    end,
                });
            }
        }
    }

    /// Drop everything known about `endpoint` (it left the pool, or its
    /// index now names a different replica).
    pub fn forget(&self, endpoint: usize) {
        let Ok(replica) = u32::try_from(endpoint) else {
            return;
        };
        let mut state = self.state.write();
        let Some(entry) = state.replicas.get_mut(endpoint) else {
            return;
        };
        let recency = std::mem::take(&mut entry.recency);
        for hash in recency.iter_newest_first() {
            remove_holder(&mut state.holders, hash, replica);
        }
    }

    /// Blocks remembered for `endpoint`.
    pub fn blocks_held(&self, endpoint: usize) -> usize {
        self.state
            .read()
            .replicas
            .get(endpoint)
            .map_or(0, |r| r.recency.len())
    }

    /// Distinct blocks remembered across all replicas.
    pub fn distinct_blocks(&self) -> usize {
        self.state.read().holders.len()
    }
}

/// Move the candidates in `group` (sorted by endpoint index) that appear
/// in `holders` (sorted by replica) to the front, keeping both sides
/// sorted; returns how many moved.
///
/// When one side is much smaller, it is looked up in the other by binary
/// search: a few holders probed against the whole pool (the common case: a
/// conversation lives on one replica) usually touch nothing; a few
/// candidates probing a block every replica holds stay cheap. Otherwise
/// the two sorted lists are merged.
fn partition_holders(
    group: &mut [u32],
    endpoints: &[usize],
    holders: &[Holder],
    spill: &mut Vec<u32>,
) -> usize {
    let endpoint_of = |candidate: u32| endpoints[candidate as usize];
    if holders.len().saturating_mul(16) < group.len() {
        let in_group = |holder: &Holder| {
            group
                .binary_search_by_key(&(holder.replica as usize), |&c| endpoint_of(c))
                .is_ok()
        };
        if !holders.iter().any(in_group) {
            return 0;
        }
    }
    let search = group.len().saturating_mul(16) < holders.len();
    let mut cursor = 0;
    let mut is_holder = |endpoint: usize| -> bool {
        let Ok(replica) = u32::try_from(endpoint) else {
            return false;
        };
        if search {
            return holders
                .binary_search_by_key(&replica, |holder| holder.replica)
                .is_ok();
        }
        while cursor < holders.len() && holders[cursor].replica < replica {
            cursor += 1;
        }
        cursor < holders.len() && holders[cursor].replica == replica
    };
    spill.clear();
    let mut kept = 0;
    for i in 0..group.len() {
        let candidate = group[i];
        if is_holder(endpoint_of(candidate)) {
            group[kept] = candidate;
            kept += 1;
        } else {
            spill.push(candidate);
        }
    }
    group[kept..].copy_from_slice(spill);
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `len` distinct stand-ins for one prompt's chained hashes.
    fn chain(prompt: u64, len: usize) -> Vec<u64> {
        (0..len as u64)
            .map(|i| (prompt << 32) ^ ((i + 1) * 0x9e37_79b9))
            .collect()
    }

    /// The first `shared` hashes of `prefix`, then a different tail.
    fn diverging(prefix: &[u64], shared: usize, len: usize, salt: u64) -> Vec<u64> {
        let mut hashes = prefix[..shared].to_vec();
        hashes.extend(chain(salt, len).into_iter().skip(shared));
        hashes
    }

    #[test]
    fn longest_match_counts_leading_blocks() {
        let index = PrefixIndex::default();
        let prompt = chain(1, 10);
        index.record(0, &prompt[..6], None);
        assert_eq!(index.longest_match(0, &prompt), 6);
        assert_eq!(index.longest_match(0, &prompt[..3]), 3);
        assert_eq!(index.longest_match(1, &prompt), 0, "other replica");
        assert_eq!(index.longest_match(0, &chain(2, 10)), 0, "other prompt");
        assert_eq!(index.longest_match(0, &[]), 0);
    }

    #[test]
    fn batch_matches_agree_with_single_lookups() {
        let index = PrefixIndex::default();
        let prompt = chain(9, 64);
        // Replica r got the first 8*r blocks, replica 7 a different prompt.
        for r in 0..7 {
            index.record(r, &prompt[..8 * r], None);
        }
        index.record(7, &diverging(&prompt, 5, 64, 3), None);
        let endpoints: Vec<usize> = (0..9).collect();
        let mut out = vec![usize::MAX; endpoints.len()];
        index.match_lengths(&prompt, &endpoints, &mut out);
        let expected: Vec<usize> = endpoints
            .iter()
            .map(|&e| index.longest_match(e, &prompt))
            .collect();
        assert_eq!(out, expected);
        assert_eq!(out, [0, 8, 16, 24, 32, 40, 48, 5, 0]);
    }

    #[test]
    fn batch_matches_with_widely_shared_blocks_and_any_endpoint_order() {
        let index = PrefixIndex::default();
        let prompt = chain(4, 40);
        for r in 0..100 {
            // Everyone holds the first 8 blocks; every tenth replica more.
            let held = if r % 10 == 0 { 8 + r / 10 } else { 8 };
            index.record(r, &prompt[..held], None);
        }
        let check = |endpoints: &[usize]| {
            let mut out = vec![usize::MAX; endpoints.len()];
            index.match_lengths(&prompt, endpoints, &mut out);
            for (&endpoint, &len) in endpoints.iter().zip(&out) {
                assert_eq!(
                    len,
                    index.longest_match(endpoint, &prompt),
                    "endpoint {endpoint}"
                );
            }
            out
        };
        let mut shuffled: Vec<usize> = (0..105).rev().collect();
        shuffled.swap(3, 70);
        let out = check(&shuffled);
        assert_eq!(out[shuffled.iter().position(|&e| e == 90).unwrap()], 17);
        assert_eq!(out[shuffled.iter().position(|&e| e == 101).unwrap()], 0);
        // A lone candidate probing blocks a hundred replicas hold.
        assert_eq!(check(&[37]), [8]);
        assert_eq!(check(&[50, 3]), [13, 8]);
    }

    #[test]
    fn deepest_holders_are_the_endpoints_with_the_longest_match() {
        let index = PrefixIndex::default();
        let doc = chain(7, 10);
        index.record(0, &doc[..3], None);
        index.record(1, &doc[..8], None);
        index.record(2, &doc[..8], None);
        index.record(3, &diverging(&doc, 2, 10, 9), None);
        let holders = |limit, offset| {
            let mut out = Vec::new();
            index.deepest_holders(&doc, limit, offset, &mut out);
            out
        };
        assert_eq!(holders(8, 0), [1, 2]);
        assert_eq!(holders(1, 0), [1]);
        assert_eq!(holders(1, 1), [2], "the offset rotates through them");
        assert_eq!(holders(0, 0), Vec::<usize>::new());
        let mut none = Vec::new();
        index.deepest_holders(&chain(99, 4), 8, 0, &mut none);
        assert!(none.is_empty(), "nobody holds an unseen prompt");
    }

    #[test]
    fn per_replica_bound_evicts_least_recent_first() {
        let index = PrefixIndex::default();
        let old = chain(1, 4);
        let new = chain(2, 4);
        index.record(0, &old, Some(6));
        index.record(0, &new, Some(6));
        assert_eq!(index.blocks_held(0), 6);
        assert_eq!(index.longest_match(0, &new), 4, "newest prompt kept");
        // The old prompt lost its tail, not its head: still a leading run.
        assert_eq!(index.longest_match(0, &old), 2);
        // Touching the old prompt again makes the other one the victim.
        index.record(0, &old, Some(6));
        assert_eq!(index.longest_match(0, &old), 4);
        assert_eq!(index.longest_match(0, &new), 2);
    }

    #[test]
    fn default_bound_applies_without_hint_and_shrinking_hint_evicts() {
        let index = PrefixIndex::new(3);
        index.record(0, &chain(1, 10), None);
        assert_eq!(index.blocks_held(0), 3);
        assert_eq!(index.longest_match(0, &chain(1, 10)), 3);
        index.record(0, &chain(2, 2), Some(2));
        assert_eq!(index.blocks_held(0), 2);
        assert_eq!(index.longest_match(0, &chain(1, 10)), 0);
    }

    #[test]
    fn prompt_longer_than_capacity_keeps_its_head() {
        let index = PrefixIndex::default();
        let prompt = chain(5, 100);
        index.record(3, &prompt, Some(10));
        assert_eq!(index.longest_match(3, &prompt), 10);
    }

    #[test]
    fn eviction_on_one_replica_leaves_others_intact() {
        let index = PrefixIndex::default();
        let shared = chain(1, 8);
        index.record(0, &shared, Some(8));
        index.record(1, &shared, Some(8));
        index.record(0, &chain(2, 8), Some(8));
        assert_eq!(index.longest_match(0, &shared), 0);
        assert_eq!(index.longest_match(1, &shared), 8);
        assert_eq!(index.distinct_blocks(), 16);
    }

    #[test]
    fn forget_drops_one_replica() {
        let index = PrefixIndex::default();
        let prompt = chain(1, 8);
        index.record(0, &prompt, None);
        index.record(1, &prompt, None);
        index.forget(0);
        assert_eq!(index.longest_match(0, &prompt), 0);
        assert_eq!(index.longest_match(1, &prompt), 8);
        assert_eq!(index.blocks_held(0), 0);
        index.forget(1);
        assert_eq!(index.distinct_blocks(), 0);
    }

    #[test]
    fn holders_stay_sorted_and_shrink_back_inline() {
        let mut holders = Holders::One(Holder {
            replica: 5,
            node: 0,
        });
        for replica in [9, 1, 7] {
            holders.insert(Holder {
                replica,
                node: replica,
            });
        }
        let replicas: Vec<u32> = holders.as_slice().iter().map(|h| h.replica).collect();
        assert_eq!(replicas, [1, 5, 7, 9]);
        assert_eq!(holders.node_of(7), Some(7));
        assert!(!holders.remove(1));
        assert!(!holders.remove(9));
        assert!(!holders.remove(5));
        assert!(matches!(holders, Holders::One(Holder { replica: 7, .. })));
        assert!(!holders.remove(3), "absent replica");
        assert!(holders.remove(7));
    }
}
