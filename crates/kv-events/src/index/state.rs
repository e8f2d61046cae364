//! One publisher's part of the index: the engine's hashes mapped to our
//! keys, and what its stream has been like. Applying events changes this
//! state and the pool's shared map together, under the pool's lock.

use std::collections::VecDeque;
use std::time::Instant;

use super::holders::{Holders, MixMap};
use super::rate::RateMeter;
use super::types::{PublisherId, PublisherStatus, Source, Tier};
use crate::keys::{self, BlockKey, KeyHasher};
use crate::wire::{BlockRemoved, BlockStored, EventBatch, KvEvent, Value};

/// A block as one publisher holds it.
#[derive(Debug, Clone, Copy)]
struct Held {
    key: BlockKey,
    /// `Tier::bit`s of the tiers it is in.
    tiers: u8,
}

/// Removed blocks whose keys are remembered (per publisher).
const REMEMBERED_REMOVALS: usize = 4096;

pub(crate) struct PublisherState {
    pub id: PublisherId,
    /// Which attachment owns the slot (a publisher attached again gets a new
    /// one, and the old handle's writes are ignored).
    pub attachment: u64,
    /// Engine hash (`BlockHash::id`) → our key.
    blocks: MixMap<u64, Held>,
    /// The keys of the last blocks removed, by engine hash, oldest first in
    /// `removal_order`. An engine can store a child after its parent's
    /// hash was removed: a duplicate of the parent, computed by another
    /// request while the first copy was cached, is not reported again when
    /// the first copy is evicted (vLLM reports the hash as removed; the
    /// simulator keeps the duplicate private). The child is still keyed.
    removed: MixMap<u64, BlockKey>,
    removal_order: VecDeque<u64>,
    tier_blocks: [usize; 2],
    rate: RateMeter,
    pub status: PublisherStatus,
}

impl PublisherState {
    pub fn new(id: PublisherId, attachment: u64) -> Self {
        PublisherState {
            id,
            attachment,
            blocks: MixMap::default(),
            removed: MixMap::default(),
            removal_order: VecDeque::new(),
            tier_blocks: [0; 2],
            rate: RateMeter::new(Instant::now()),
            status: PublisherStatus::new(id),
        }
    }

    pub fn status(&self) -> PublisherStatus {
        let mut status = self.status.clone();
        status.gpu_blocks = self.tier_blocks[Tier::Gpu as usize];
        status.offload_blocks = self.tier_blocks[Tier::Offload as usize];
        status.events_per_second = self.rate.rate(Instant::now());
        status
    }

    /// Engine hashes (their ids) held in `tier`, sorted.
    pub fn block_ids(&self, tier: Tier) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .blocks
            .iter()
            .filter(|(_, held)| held.tiers & tier.bit() != 0)
            .map(|(&id, _)| id)
            .collect();
        ids.sort_unstable();
        ids
    }

    pub fn apply(&mut self, slot: u32, holders: &mut Holders, batch: &EventBatch) {
        self.status.batches += 1;
        self.status.events += batch.events.len() as u64;
        self.rate.add(batch.events.len() as u64, Instant::now());
        let mut hasher = KeyHasher::new();
        for event in &batch.events {
            match event {
                KvEvent::BlockStored(stored) => self.store(slot, holders, &mut hasher, stored),
                KvEvent::BlockRemoved(removed) => self.remove(slot, holders, removed),
                KvEvent::AllBlocksCleared => {
                    self.clear(slot, holders);
                    // Empty is exactly the engine's state now, whatever was
                    // missed before.
                    self.status.source = Source::Events;
                }
                KvEvent::Unknown { .. } => self.status.unknown_events += 1,
            }
        }
    }

    /// Forget every block.
    pub fn clear(&mut self, slot: u32, holders: &mut Holders) {
        for (_, held) in self.blocks.drain() {
            for tier in Tier::ALL {
                if held.tiers & tier.bit() != 0 {
                    holders.remove(held.key, slot, tier);
                }
            }
        }
        self.tier_blocks = [0; 2];
        self.removed.clear();
        self.removal_order.clear();
    }

    fn store(&mut self, slot: u32, holders: &mut Holders, hasher: &mut KeyHasher, e: &BlockStored) {
        if !first_group(e.group_idx) {
            self.status.skipped_events += 1;
            return;
        }
        let size = e.block_size as usize;
        if size == 0 || e.token_ids.len() != e.block_hashes.len() * size {
            self.status.skipped_events += 1;
            return;
        }
        let mut parent = match &e.parent_block_hash {
            None => root_of(e),
            Some(hash) => match self.key_of(hash.id()) {
                Some(key) => key,
                // Its parent was never seen (or left long ago): without the
                // prefix's key the blocks cannot be keyed.
                None => {
                    self.status.orphaned_blocks += e.block_hashes.len() as u64;
                    return;
                }
            },
        };
        self.status.block_size = Some(e.block_size);
        let tier = Tier::of(e.medium.as_deref());
        for (i, (hash, tokens)) in e
            .block_hashes
            .iter()
            .zip(e.token_ids.chunks_exact(size))
            .enumerate()
        {
            let extra = e
                .extra_keys
                .as_ref()
                .and_then(|keys| keys.get(i))
                .and_then(|key| extra_bytes(key.as_ref(), e.lora_name.as_deref()));
            let key = match extra {
                None => hasher.key(parent, tokens),
                Some(extra) => hasher.key_with_extra(parent, tokens, &extra),
            };
            self.hold(slot, holders, hash.id(), key, tier);
            parent = key;
        }
    }

    fn hold(&mut self, slot: u32, holders: &mut Holders, id: u64, key: BlockKey, tier: Tier) {
        let held = self.blocks.entry(id).or_insert(Held { key, tiers: 0 });
        if held.key != key {
            // The engine reused a hash for other content: the old block is
            // gone from every tier.
            for t in Tier::ALL {
                if held.tiers & t.bit() != 0 {
                    holders.remove(held.key, slot, t);
                    self.tier_blocks[t as usize] -= 1;
                }
            }
            *held = Held { key, tiers: 0 };
        }
        if held.tiers & tier.bit() == 0 {
            held.tiers |= tier.bit();
            holders.add(key, slot, tier);
            self.tier_blocks[tier as usize] += 1;
            self.status.stored_blocks += 1;
        }
    }

    fn remove(&mut self, slot: u32, holders: &mut Holders, e: &BlockRemoved) {
        if !first_group(e.group_idx) {
            self.status.skipped_events += 1;
            return;
        }
        let tier = Tier::of(e.medium.as_deref());
        for hash in &e.block_hashes {
            let id = hash.id();
            let Some(held) = self.blocks.get_mut(&id) else {
                self.status.missing_removals += 1;
                continue;
            };
            if held.tiers & tier.bit() == 0 {
                self.status.missing_removals += 1;
                continue;
            }
            held.tiers &= !tier.bit();
            holders.remove(held.key, slot, tier);
            self.tier_blocks[tier as usize] -= 1;
            self.status.removed_blocks += 1;
            if held.tiers == 0 {
                let key = held.key;
                self.blocks.remove(&id);
                self.remember_removal(id, key);
            }
        }
    }

    /// Our key for an engine hash: held, or removed recently.
    fn key_of(&self, id: u64) -> Option<BlockKey> {
        match self.blocks.get(&id) {
            Some(held) => Some(held.key),
            None => self.removed.get(&id).copied(),
        }
    }

    fn remember_removal(&mut self, id: u64, key: BlockKey) {
        if self.removed.insert(id, key).is_none() {
            self.removal_order.push_back(id);
        }
        if self.removal_order.len() > REMEMBERED_REMOVALS
            && let Some(oldest) = self.removal_order.pop_front()
        {
            self.removed.remove(&oldest);
        }
    }
}

/// Hybrid models keep one KV group per attention kind; a prefix hit needs
/// the first group (full attention in vLLM's order), and models with one
/// group send no index or 0.
fn first_group(group: Option<i64>) -> bool {
    group.unwrap_or(0) == 0
}

/// The chain's root for the first block of a store.
fn root_of(e: &BlockStored) -> BlockKey {
    match (&e.lora_name, e.lora_id) {
        (Some(name), _) => keys::root(Some(name)),
        // Releases before `lora_name` only give vLLM's integer id, which no
        // request names: key it apart from every adapter name.
        (None, Some(id)) => keys::root(Some(&format!("\0lora-id {id}"))),
        (None, None) => keys::root(None),
    }
}

/// What of a block's extra keys the engine's hash covered beyond the LoRA
/// name (already in our root): multimodal hashes, a cache salt. `None` when
/// nothing is left; else its msgpack bytes, to fold into the key.
fn extra_bytes(extra: Option<&Value>, lora: Option<&str>) -> Option<Vec<u8>> {
    let is_lora = |v: &Value| lora.is_some() && v.as_str() == lora;
    let rest: Vec<&Value> = match extra? {
        Value::Array(items) => items.iter().filter(|v| !is_lora(v)).collect(),
        single if is_lora(single) => Vec::new(),
        single => vec![single],
    };
    if rest.is_empty() {
        return None;
    }
    let mut bytes = Vec::new();
    for value in rest {
        rmpv::encode::write_value(&mut bytes, value).expect("writing to a Vec cannot fail");
    }
    Some(bytes)
}
