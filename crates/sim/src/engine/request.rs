//! Requests inside the engine and the table that holds them.
//!
//! Slots are reused; their vectors keep their capacity, so a long run does
//! not allocate per request once the table is warm.

use super::kv_cache::BlockHasher;
use super::lora::AdapterId;
use super::waiting::SlotRef;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    Free,
    Waiting,
    Running,
    /// Its prompt's KV is on the way from a prefill replica; it joins the
    /// waiting queue when the transfer ends.
    Arriving,
}

pub(crate) struct Request {
    pub id: u64,
    /// Unique for the engine's lifetime; seeds the synthetic output tokens.
    pub serial: u64,
    pub phase: Phase,
    pub generation: u32,
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    /// Output tokens sampled so far.
    pub output_len: u32,
    /// Tokens whose KV is computed (or taken from the prefix cache).
    pub num_computed: u32,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: Option<u32>,
    pub adapter: Option<AdapterId>,
    /// The request's `priority` (lower first under priority scheduling).
    pub priority: i64,
    /// Root of the prefix-cache hash chain (depends on the adapter).
    pub hash_root: u64,
    /// Chained hashes of the full blocks hashed so far.
    pub block_hashes: Vec<u64>,
    /// KV block table.
    pub blocks: Vec<u32>,
    /// Leading blocks already offered to the prefix cache.
    pub registered_blocks: u32,
    /// The prompt's KV came from a prefill replica: at admission only the
    /// last prompt token is computed (vLLM's remote prefill).
    pub remote_kv: bool,
    /// Its KV outlives it, held for a remote decode to pull.
    pub hold_kv: bool,
}

impl Request {
    fn empty() -> Self {
        Request {
            id: 0,
            serial: 0,
            phase: Phase::Free,
            generation: 0,
            prompt: Vec::new(),
            max_tokens: 0,
            output_len: 0,
            num_computed: 0,
            cached_tokens: None,
            adapter: None,
            priority: 0,
            hash_root: 0,
            block_hashes: Vec::new(),
            blocks: Vec::new(),
            registered_blocks: 0,
            remote_kv: false,
            hold_kv: false,
        }
    }

    pub fn prompt_len(&self) -> u32 {
        self.prompt.len() as u32
    }

    /// Tokens known so far: the prompt plus every sampled output token.
    pub fn num_tokens(&self) -> u32 {
        self.prompt_len() + self.output_len
    }

    /// Waiting-queue lane: 0 for the base model, adapter + 1 otherwise.
    pub fn lane(&self) -> usize {
        self.adapter.map_or(0, |a| a as usize + 1)
    }

    /// Token id at `position`. Output tokens are synthetic but fixed per
    /// request, so a request preempted and recomputed finds its own output
    /// blocks in the prefix cache, and no two requests share them.
    pub fn token_at(&self, position: u32) -> u32 {
        match self.prompt.get(position as usize) {
            Some(&token) => token,
            None => synthetic_output_token(self.serial, position),
        }
    }

    /// Extend `block_hashes` over every full block of the first `tokens`.
    pub fn hash_blocks(&mut self, hasher: &mut BlockHasher, block_size: u32, tokens: u32) {
        let full = tokens / block_size;
        while (self.block_hashes.len() as u32) < full {
            let index = self.block_hashes.len() as u32;
            let parent = self.block_hashes.last().copied().unwrap_or(self.hash_root);
            let start = index * block_size;
            let hash = hasher.hash(
                parent,
                (start..start + block_size).map(|p| self.token_at(p)),
            );
            self.block_hashes.push(hash);
        }
    }
}

fn synthetic_output_token(serial: u64, position: u32) -> u32 {
    // SplitMix64 finaliser: cheap and well mixed.
    let mut z = serial
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(u64::from(position));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

/// Request table with slot reuse.
pub(crate) struct RequestTable {
    slots: Vec<Request>,
    free: Vec<u32>,
}

impl RequestTable {
    pub(crate) fn new() -> Self {
        RequestTable {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// A cleared slot for a new request.
    pub(crate) fn insert(&mut self) -> u32 {
        match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(Request::empty());
                (self.slots.len() - 1) as u32
            }
        }
    }

    /// Return a slot; stale references to it stop matching.
    pub(crate) fn remove(&mut self, slot: u32) {
        let r = &mut self.slots[slot as usize];
        r.phase = Phase::Free;
        r.generation = r.generation.wrapping_add(1);
        r.prompt = Vec::new();
        r.block_hashes.clear();
        debug_assert!(r.blocks.is_empty(), "blocks must be freed first");
        self.free.push(slot);
    }

    pub(crate) fn get(&self, slot: u32) -> &Request {
        &self.slots[slot as usize]
    }

    pub(crate) fn get_mut(&mut self, slot: u32) -> &mut Request {
        &mut self.slots[slot as usize]
    }

    pub(crate) fn slot_ref(&self, slot: u32) -> SlotRef {
        SlotRef {
            slot,
            generation: self.slots[slot as usize].generation,
        }
    }

    /// Does `at` still name a request in `phase`?
    pub(crate) fn is(&self, at: SlotRef, phase: Phase) -> bool {
        let r = &self.slots[at.slot as usize];
        r.generation == at.generation && r.phase == phase
    }
}
