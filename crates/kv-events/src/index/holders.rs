//! The pool's shared map: block key → the publishers holding that block,
//! with a count per tier.
//!
//! Counts rather than flags because two engine hashes of one publisher can
//! map to one key (a block stored twice under different hashes); the block
//! leaves the publisher only when the last of them is removed.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::types::Tier;
use crate::keys::BlockKey;

/// One publisher's hold on one block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    /// The publisher's slot in the pool.
    pub slot: u32,
    pub gpu: u32,
    pub offload: u32,
}

impl Holder {
    pub fn count_mut(&mut self, tier: Tier) -> &mut u32 {
        match tier {
            Tier::Gpu => &mut self.gpu,
            Tier::Offload => &mut self.offload,
        }
    }
}

#[derive(Default)]
pub(crate) struct Holders {
    map: HashMap<BlockKey, Vec<Holder>, BuildHasherDefault<Mix64>>,
}

impl Holders {
    pub fn get(&self, key: BlockKey) -> &[Holder] {
        self.map.get(&key).map_or(&[], Vec::as_slice)
    }

    pub fn add(&mut self, key: BlockKey, slot: u32, tier: Tier) {
        let holders = self.map.entry(key).or_insert_with(|| Vec::with_capacity(1));
        let holder = match holders.iter().position(|h| h.slot == slot) {
            Some(i) => &mut holders[i],
            None => {
                holders.push(Holder {
                    slot,
                    gpu: 0,
                    offload: 0,
                });
                holders.last_mut().expect("just pushed")
            }
        };
        *holder.count_mut(tier) += 1;
    }

    pub fn remove(&mut self, key: BlockKey, slot: u32, tier: Tier) {
        let Some(holders) = self.map.get_mut(&key) else {
            debug_assert!(false, "removing a key nobody holds");
            return;
        };
        let Some(i) = holders.iter().position(|h| h.slot == slot) else {
            debug_assert!(false, "removing a key the publisher does not hold");
            return;
        };
        let count = holders[i].count_mut(tier);
        *count = count.saturating_sub(1);
        if holders[i].gpu == 0 && holders[i].offload == 0 {
            holders.swap_remove(i);
            if holders.is_empty() {
                self.map.remove(&key);
            }
        }
    }

    /// Distinct keys held by anyone.
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

/// A cheap mixer for keys that are already hashes (ours, or an engine's)
/// but may come from an engine as small sequential integers: one multiply
/// and a fold spreads those too.
#[derive(Default)]
pub(crate) struct Mix64(u64);

impl Hasher for Mix64 {
    fn finish(&self) -> u64 {
        let product = u128::from(self.0) * 0x9e37_79b9_7f4a_7c15;
        (product as u64) ^ ((product >> 64) as u64)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

pub(crate) type MixMap<K, V> = HashMap<K, V, BuildHasherDefault<Mix64>>;
