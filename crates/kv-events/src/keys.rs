//! The index's own block keys, computed from token ids.
//!
//! Engines hash blocks their own way (vLLM: sha256 or xxhash over a seed
//! that is random per process unless `PYTHONHASHSEED` is set, SGLang: its
//! own), so the gateway cannot compute the engine's hashes for a prompt.
//! Instead every block gets a key of ours, chained like the engine's: the
//! key of block `i` is xxh3 over the key of block `i - 1` (or the root, for
//! the first block) and the block's token ids, so equal keys mean equal
//! whole prefixes. The root depends on the LoRA adapter: the same tokens
//! under other weights are other KV, and since every key chains from the
//! root, the adapter is part of every key.
//!
//! The index turns an event's blocks into these keys from the `token_ids`
//! the event carries; a query turns a prompt's token ids into the same keys.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// A block's key: it stands for the whole prefix up to and including the
/// block, for one adapter.
pub type BlockKey = u64;

const BASE_MODEL_ROOT: BlockKey = 0x6b76_2d72_6f6f_7421;
const ADAPTER_SEED: u64 = 0x6c6f_7261_2d72_6f6f;
/// Blocks whose engine hash covers more than their tokens (images, a cache
/// salt) are keyed with this seed, so no prompt's key can equal theirs.
const EXTRA_SEED: u64 = 0x6578_7472_612d_6b65;

/// The root of a chain: the base model's, or an adapter's.
pub fn root(lora: Option<&str>) -> BlockKey {
    match lora {
        None => BASE_MODEL_ROOT,
        Some(name) => xxh3_64_with_seed(name.as_bytes(), ADAPTER_SEED),
    }
}

/// The keys of every full block of `tokens` (a trailing partial block is
/// never cached, so it has no key). `block_size` 0 gives no keys.
pub fn prompt_keys(tokens: &[u32], lora: Option<&str>, block_size: u32) -> Vec<BlockKey> {
    let mut hasher = KeyHasher::new();
    let mut parent = root(lora);
    if block_size == 0 {
        return Vec::new();
    }
    tokens
        .chunks_exact(block_size as usize)
        .map(|block| {
            parent = hasher.key(parent, block);
            parent
        })
        .collect()
}

/// Computes chained keys, reusing one buffer.
#[derive(Default)]
pub struct KeyHasher {
    scratch: Vec<u8>,
}

impl KeyHasher {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key of a block of `tokens` after the block keyed `parent`.
    pub fn key(&mut self, parent: BlockKey, tokens: &[u32]) -> BlockKey {
        self.fill(parent, tokens);
        xxh3_64(&self.scratch)
    }

    /// The key of a block whose engine hash also covered `extra` (encoded
    /// extra keys): never equal to a key [`KeyHasher::key`] computes.
    pub fn key_with_extra(&mut self, parent: BlockKey, tokens: &[u32], extra: &[u8]) -> BlockKey {
        self.fill(parent, tokens);
        self.scratch.extend_from_slice(extra);
        xxh3_64_with_seed(&self.scratch, EXTRA_SEED)
    }

    fn fill(&mut self, parent: BlockKey, tokens: &[u32]) {
        self.scratch.clear();
        self.scratch.extend_from_slice(&parent.to_le_bytes());
        for token in tokens {
            self.scratch.extend_from_slice(&token.to_le_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_stand_for_the_whole_prefix_and_the_adapter() {
        let a = prompt_keys(&[1, 2, 3, 4, 5, 6, 7, 8, 9], None, 4);
        assert_eq!(a.len(), 2, "the partial block has no key");
        let b = prompt_keys(&[0, 2, 3, 4, 5, 6, 7, 8], None, 4);
        assert_ne!(a[1], b[1], "same block after another prefix");
        let lora = prompt_keys(&[1, 2, 3, 4], Some("sql"), 4);
        assert_ne!(a[0], lora[0]);
        assert_eq!(prompt_keys(&[1, 2, 3, 4], Some("sql"), 4), lora);
        assert!(prompt_keys(&[1, 2], None, 0).is_empty());
    }

    #[test]
    fn extra_keys_never_collide_with_plain_keys() {
        let mut hasher = KeyHasher::new();
        let plain = hasher.key(root(None), &[1, 2]);
        assert_ne!(hasher.key_with_extra(root(None), &[1, 2], &[]), plain);
    }
}
