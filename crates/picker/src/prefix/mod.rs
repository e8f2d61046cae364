//! Approximate prefix-cache affinity.
//!
//! The engine caches the KV of prompt prefixes it has computed. We cannot
//! see that cache, so we model it: prompts are cut into fixed-size blocks
//! whose hashes chain (block `i` identifies the whole prefix `0..=i`), and
//! the [`PrefixIndex`] remembers which blocks were recently sent to which
//! replica, bounded like the replica's own KV cache.

mod exact;
mod hash;
mod index;
mod lru;

pub use exact::{ExactPrefix, PrefixSource};
pub use hash::{PromptHasher, PromptValue, chain_seed, prompt_hashes};
pub use index::{MatchScratch, PrefixIndex};
