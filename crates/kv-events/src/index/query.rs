//! Prefix queries: one walk of a prompt's keys through the shared map.
//!
//! A publisher's match is its GPU run, then the offload run that continues
//! it: the engine takes the longest prefix from GPU memory and asks its
//! offload tier for the blocks after it (vLLM's connector lookup), so a
//! block found only offloaded ends the GPU run, and after it a block found
//! only on the GPU ends the match.

use std::sync::Arc;

use super::holders::{Holder, Holders};
use super::state::PublisherState;
use super::types::PublisherId;
use crate::keys::BlockKey;

/// Leading blocks of a prompt a publisher holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockMatch {
    /// Blocks in GPU memory, from the first.
    pub gpu: u32,
    /// Blocks after those, in an offload tier.
    pub offload: u32,
}

impl BlockMatch {
    pub fn total(self) -> u32 {
        self.gpu + self.offload
    }

    /// The share of `prompt_blocks` saved, counting an offloaded block as
    /// `offload_weight` of a GPU block (loading it back costs part of what
    /// recomputing it does); 1 for a prompt of no full block.
    pub fn share(self, prompt_blocks: u32, offload_weight: f64) -> f64 {
        if prompt_blocks == 0 {
            return 1.0;
        }
        (f64::from(self.gpu) + offload_weight * f64::from(self.offload)) / f64::from(prompt_blocks)
    }

    /// Orders matches: more GPU blocks first, then more offloaded ones.
    fn rank(self) -> (u32, u32) {
        (self.gpu, self.offload)
    }
}

/// Every publisher's match for one prompt.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefixMatches {
    prompt_blocks: u32,
    /// Publishers holding at least the first block, by id.
    matched: Vec<(PublisherId, BlockMatch)>,
    /// Every replica with a publisher, and whether its index is exact, as
    /// of the query.
    replicas: Arc<Vec<(u64, bool)>>,
}

impl PrefixMatches {
    /// Full blocks in the prompt.
    pub fn prompt_blocks(&self) -> u32 {
        self.prompt_blocks
    }

    /// A replica's match: its best data-parallel rank, nothing when no
    /// rank holds the first block.
    pub fn get(&self, replica: u64) -> BlockMatch {
        let start = self.matched.partition_point(|(id, _)| id.replica < replica);
        self.matched[start..]
            .iter()
            .take_while(|(id, _)| id.replica == replica)
            .map(|&(_, m)| m)
            .max_by_key(|m| m.rank())
            .unwrap_or_default()
    }

    /// The replica's share of the prompt, an offloaded block counting
    /// `offload_weight` of a GPU block ([`BlockMatch::share`]); `None` when
    /// the events cannot speak for it (no publisher, or one not exact), so
    /// the caller falls back to its own guess for that replica alone.
    pub fn exact_share(&self, replica: u64, offload_weight: f64) -> Option<f64> {
        match exact(&self.replicas, replica) {
            Some(true) => Some(self.get(replica).share(self.prompt_blocks, offload_weight)),
            _ => None,
        }
    }

    /// Every publisher that holds the first block.
    pub fn iter(&self) -> impl Iterator<Item = (PublisherId, BlockMatch)> + '_ {
        self.matched.iter().copied()
    }
}

/// One publisher's run while walking.
#[derive(Clone, Copy)]
struct Run {
    /// Blocks matched so far; the run is alive while it equals the index of
    /// the block being looked at.
    len: u32,
    matched: BlockMatch,
}

impl Run {
    /// Extend with the next block as `holder` holds it; false when the run
    /// ends here.
    fn extend(&mut self, holder: &Holder) -> bool {
        if self.matched.offload == 0 && holder.gpu > 0 {
            self.matched.gpu += 1;
        } else if holder.offload > 0 {
            self.matched.offload += 1;
        } else {
            return false;
        }
        self.len += 1;
        true
    }
}

const NO_RUN: u32 = u32::MAX;

/// Whether a replica's index is exact; `None` without a publisher.
pub(crate) fn exact(replicas: &[(u64, bool)], replica: u64) -> Option<bool> {
    replicas
        .binary_search_by_key(&replica, |&(r, _)| r)
        .ok()
        .map(|i| replicas[i].1)
}

pub(crate) fn walk(
    holders: &Holders,
    publishers: &[Option<PublisherState>],
    replicas: &Arc<Vec<(u64, bool)>>,
    keys: &[BlockKey],
) -> PrefixMatches {
    let prompt_blocks = keys.len() as u32;
    let mut runs: Vec<(u32, Run)> = Vec::new();
    // Slot → position in `runs`: slots are dense, so a table beats a map.
    let mut position = vec![NO_RUN; publishers.len()];
    for (i, &key) in keys.iter().enumerate() {
        let mut extended = false;
        for holder in holders.get(key) {
            let slot = holder.slot as usize;
            if i == 0 {
                let mut run = Run {
                    len: 0,
                    matched: BlockMatch::default(),
                };
                if run.extend(holder) {
                    position[slot] = runs.len() as u32;
                    runs.push((holder.slot, run));
                    extended = true;
                }
            } else if position[slot] != NO_RUN {
                let run = &mut runs[position[slot] as usize].1;
                if run.len == i as u32 && run.extend(holder) {
                    extended = true;
                }
            }
        }
        if !extended {
            break;
        }
    }
    let mut matched: Vec<(PublisherId, BlockMatch)> = runs
        .into_iter()
        .filter_map(|(slot, run)| Some((publishers[slot as usize].as_ref()?.id, run.matched)))
        .collect();
    matched.sort_unstable_by_key(|(id, _)| *id);
    PrefixMatches {
        prompt_blocks,
        matched,
        replicas: replicas.clone(),
    }
}

/// One publisher's match, without building the others'.
pub(crate) fn walk_one(holders: &Holders, slot: u32, keys: &[BlockKey]) -> BlockMatch {
    let mut run = Run {
        len: 0,
        matched: BlockMatch::default(),
    };
    for &key in keys {
        match holders.get(key).iter().find(|h| h.slot == slot) {
            Some(holder) if run.extend(holder) => {}
            _ => break,
        }
    }
    run.matched
}
