//! Prompt → chain of block hashes.
//!
//! The prompt is read as one byte stream (chat messages in order, role and
//! content, or the completion prompt), cut into blocks of
//! [`PrefixConfig::block_bytes`], and each block is hashed with the previous
//! block's hash as seed, starting from a seed derived from the model and
//! adapter. Equal hashes at position `i` therefore mean equal prompts up to
//! the end of block `i`, for the same model and adapter. A trailing partial
//! block is not hashed: the engine cannot reuse a block it has not filled.

use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::policy::PrefixConfig;

/// Separates a message's role from its content in the stream, so that
/// `("user", "x")` and `("userx", "")` differ. Not valid UTF-8 text content.
const FIELD_SEPARATOR: &[u8] = &[0x1f];
/// Ends a message (or one prompt of a prompt array), standing in for the
/// chat template's turn delimiters.
const RECORD_SEPARATOR: &[u8] = &[0x1e];
/// Mixed into the seed when an adapter is named, so that adapter `""` and
/// no adapter differ.
const ADAPTER_DOMAIN: u64 = 0x9e37_79b9_7f4a_7c15;

/// The first link of the chain: a function of the model and the adapter,
/// because an engine never reuses KV computed for another model or adapter.
pub fn chain_seed(model: &str, adapter: Option<&str>) -> u64 {
    let model_seed = xxh3_64(model.as_bytes());
    match adapter {
        None => model_seed,
        Some(adapter) => xxh3_64_with_seed(adapter.as_bytes(), model_seed ^ ADAPTER_DOMAIN),
    }
}

/// A JSON value as the prompt walk reads it. Implemented for a parsed
/// [`Value`]; the gateway implements it for its borrowed, partial parse of
/// a request body, so both hash the same prompt to the same chain.
pub trait PromptValue: Sized {
    /// The member named `key` of an object (the last one, if repeated).
    fn get(&self, key: &str) -> Option<&Self>;
    fn as_str(&self) -> Option<&str>;
    fn as_array(&self) -> Option<&[Self]>;
    /// A non-negative integer.
    fn as_u64(&self) -> Option<u64>;
    /// Call `f` with each string member value of an object, in key order,
    /// one per key.
    fn for_each_str_member(&self, f: impl FnMut(&str));
}

impl PromptValue for Value {
    fn get(&self, key: &str) -> Option<&Self> {
        Value::get(self, key)
    }
    fn as_str(&self) -> Option<&str> {
        Value::as_str(self)
    }
    fn as_array(&self) -> Option<&[Self]> {
        Value::as_array(self).map(Vec::as_slice)
    }
    fn as_u64(&self) -> Option<u64> {
        Value::as_u64(self)
    }
    fn for_each_str_member(&self, mut f: impl FnMut(&str)) {
        if let Value::Object(fields) = self {
            fields.values().filter_map(Value::as_str).for_each(&mut f);
        }
    }
}

/// Streams prompt bytes into chained block hashes. Feed the prompt in any
/// number of pieces; the result depends only on the concatenation. It
/// allocates the output and one block buffer, never per block.
#[derive(Debug, Clone)]
pub struct PromptHasher {
    block_bytes: usize,
    max_blocks: usize,
    /// Bytes of a block that straddles two `feed` calls.
    pending: Vec<u8>,
    chain: u64,
    hashes: Vec<u64>,
    bytes_fed: u64,
}

impl PromptHasher {
    pub fn new(model: &str, adapter: Option<&str>, config: &PrefixConfig) -> Self {
        let block_bytes = config.block_bytes.max(1);
        PromptHasher {
            block_bytes,
            max_blocks: config.max_blocks,
            pending: Vec::with_capacity(block_bytes),
            chain: chain_seed(model, adapter),
            hashes: Vec::new(),
            bytes_fed: 0,
        }
    }

    /// Append prompt bytes.
    pub fn feed(&mut self, mut bytes: &[u8]) {
        self.bytes_fed += bytes.len() as u64;
        while !bytes.is_empty() && !self.is_full() {
            if self.pending.is_empty() && bytes.len() >= self.block_bytes {
                // Whole block in the caller's slice: hash it in place.
                let (block, rest) = bytes.split_at(self.block_bytes);
                self.push_block(block);
                bytes = rest;
                continue;
            }
            let take = (self.block_bytes - self.pending.len()).min(bytes.len());
            let (head, rest) = bytes.split_at(take);
            self.pending.extend_from_slice(head);
            bytes = rest;
            if self.pending.len() == self.block_bytes {
                let block = std::mem::take(&mut self.pending);
                self.push_block(&block);
                self.pending = block;
                self.pending.clear();
            }
        }
    }

    fn push_block(&mut self, block: &[u8]) {
        self.chain = xxh3_64_with_seed(block, self.chain);
        self.hashes.push(self.chain);
    }

    /// True once `max_blocks` blocks are hashed; further input is ignored
    /// (but still counted by [`PromptHasher::bytes_fed`]).
    pub fn is_full(&self) -> bool {
        self.hashes.len() >= self.max_blocks
    }

    /// Prompt bytes fed so far, including any beyond `max_blocks`: a cheap
    /// prompt-size estimate (about 4 bytes per token for English text).
    pub fn bytes_fed(&self) -> u64 {
        self.bytes_fed
    }

    /// Append the prompt of an OpenAI-style request body: chat `messages` or
    /// completion `prompt`. Returns false when the body has neither.
    pub fn feed_body(&mut self, body: &Value) -> bool {
        self.feed_prompt_fields(body.get("messages"), body.get("prompt"))
    }

    /// [`PromptHasher::feed_body`] from the body's `messages` and `prompt`
    /// fields, of any JSON representation: chat `messages` if an array,
    /// else the completion `prompt`. Returns false when there is neither.
    pub fn feed_prompt_fields<V: PromptValue>(
        &mut self,
        messages: Option<&V>,
        prompt: Option<&V>,
    ) -> bool {
        if let Some(messages) = messages.and_then(V::as_array) {
            for message in messages {
                if self.is_full() {
                    break;
                }
                self.feed_message(message);
            }
            true
        } else if let Some(prompt) = prompt {
            self.feed_prompt(prompt);
            true
        } else {
            false
        }
    }

    fn feed_message<V: PromptValue>(&mut self, message: &V) {
        if let Some(role) = message.get("role").and_then(V::as_str) {
            self.feed(role.as_bytes());
        }
        self.feed(FIELD_SEPARATOR);
        if let Some(content) = message.get("content") {
            if let Some(text) = content.as_str() {
                self.feed(text.as_bytes());
            } else if let Some(parts) = content.as_array() {
                for part in parts {
                    self.feed_content_part(part);
                }
            }
        }
        // Assistant turns that called tools carry their text here; it is
        // part of the conversation the next turn resends.
        if let Some(calls) = message.get("tool_calls").and_then(V::as_array) {
            for call in calls {
                if let Some(function) = call.get("function") {
                    for field in ["name", "arguments"] {
                        if let Some(text) = function.get(field).and_then(V::as_str) {
                            self.feed(FIELD_SEPARATOR);
                            self.feed(text.as_bytes());
                        }
                    }
                }
            }
        }
        self.feed(RECORD_SEPARATOR);
    }

    fn feed_content_part<V: PromptValue>(&mut self, part: &V) {
        let kind = part.get("type").and_then(V::as_str).unwrap_or("");
        if kind == "text" {
            if let Some(text) = part.get("text").and_then(V::as_str) {
                self.feed(text.as_bytes());
            }
            return;
        }
        // Images, audio, files: stand in an 8-byte digest of their payload
        // for the (much larger) tokens the engine makes of them, so equal
        // media still match and a data URL does not flood the stream.
        self.feed(FIELD_SEPARATOR);
        self.feed(kind.as_bytes());
        if let Some(payload) = part.get(kind) {
            match payload.as_str() {
                Some(text) => self.feed_digest(text),
                None => payload.for_each_str_member(|text| self.feed_digest(text)),
            }
        }
    }

    fn feed_digest(&mut self, payload: &str) {
        self.feed(&xxh3_64(payload.as_bytes()).to_le_bytes());
    }

    fn feed_prompt<V: PromptValue>(&mut self, prompt: &V) {
        if let Some(text) = prompt.as_str() {
            self.feed(text.as_bytes());
            return;
        }
        let Some(items) = prompt.as_array() else {
            return;
        };
        for item in items {
            if self.is_full() {
                break;
            }
            if let Some(text) = item.as_str() {
                self.feed(text.as_bytes());
                self.feed(RECORD_SEPARATOR);
            } else if let Some(id) = item.as_u64() {
                self.feed_token(id);
            } else if let Some(tokens) = item.as_array() {
                for id in tokens.iter().filter_map(V::as_u64) {
                    self.feed_token(id);
                }
                self.feed(RECORD_SEPARATOR);
            }
        }
    }

    /// Token ids: 4 bytes each, like ~4 characters of text.
    fn feed_token(&mut self, id: u64) {
        self.feed(&(id as u32).to_le_bytes());
    }

    /// The chained hashes of every complete block, in prompt order.
    pub fn finish(self) -> Vec<u64> {
        self.hashes
    }
}

/// Chained block hashes of a request body's prompt (chat `messages` or
/// completion `prompt`); empty when the body has no prompt or the prompt is
/// shorter than one block.
pub fn prompt_hashes(
    model: &str,
    adapter: Option<&str>,
    body: &Value,
    config: &PrefixConfig,
) -> Vec<u64> {
    let mut hasher = PromptHasher::new(model, adapter, config);
    hasher.feed_body(body);
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config(block_bytes: usize) -> PrefixConfig {
        PrefixConfig {
            block_bytes,
            ..PrefixConfig::default()
        }
    }

    fn chat(system: &str, user: &str) -> Value {
        json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]})
    }

    fn hash_bytes(bytes: &[u8], block_bytes: usize) -> Vec<u64> {
        let mut h = PromptHasher::new("m", None, &config(block_bytes));
        h.feed(bytes);
        h.finish()
    }

    #[test]
    fn shared_prefix_gives_shared_leading_hashes() {
        let system = "You are a helpful assistant. ".repeat(20);
        let a = prompt_hashes(
            "m",
            None,
            &chat(&system, &"What is Rust? ".repeat(20)),
            &config(64),
        );
        let b = prompt_hashes(
            "m",
            None,
            &chat(&system, &"Tell me a joke. ".repeat(20)),
            &config(64),
        );
        let shared = system.len() / 64;
        assert!(shared >= 8);
        assert_eq!(a[..shared], b[..shared]);
        // Once the prompts differ, every later hash differs (chaining).
        let first_diff = a.iter().zip(&b).position(|(x, y)| x != y).unwrap();
        assert!(first_diff >= shared);
        assert!(
            a[first_diff..]
                .iter()
                .zip(&b[first_diff..])
                .all(|(x, y)| x != y)
        );
    }

    #[test]
    fn model_and_adapter_seed_the_chain() {
        let body = chat(&"x".repeat(200), "hi");
        let base = prompt_hashes("m", None, &body, &config(64));
        let other_model = prompt_hashes("m2", None, &body, &config(64));
        let adapter = prompt_hashes("m", Some("sql"), &body, &config(64));
        let empty_adapter = prompt_hashes("m", Some(""), &body, &config(64));
        assert!(!base.is_empty());
        assert_ne!(base[0], other_model[0]);
        assert_ne!(base[0], adapter[0]);
        assert_ne!(base[0], empty_adapter[0]);
        assert_eq!(base, prompt_hashes("m", None, &body, &config(64)));
    }

    #[test]
    fn trailing_partial_block_is_not_hashed() {
        assert_eq!(hash_bytes(&[7; 63], 64).len(), 0);
        assert_eq!(hash_bytes(&[7; 64], 64).len(), 1);
        assert_eq!(hash_bytes(&[7; 191], 64).len(), 2);
        // The partial tail does not change the complete blocks' hashes.
        assert_eq!(hash_bytes(&[7; 191], 64), hash_bytes(&[7; 128], 64));
    }

    #[test]
    fn split_points_do_not_matter() {
        let text: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let whole = hash_bytes(&text, 64);
        let mut h = PromptHasher::new("m", None, &config(64));
        for piece in text.chunks(7) {
            h.feed(piece);
        }
        assert_eq!(h.bytes_fed(), 1000);
        assert_eq!(h.finish(), whole);
    }

    #[test]
    fn content_parts_hash_like_the_same_text_as_a_string() {
        let as_string = json!({"messages": [{"role": "user", "content": "abc".repeat(50)}]});
        let as_parts = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "abc".repeat(20)},
            {"type": "text", "text": "abc".repeat(30)},
        ]}]});
        let a = prompt_hashes("m", None, &as_string, &config(16));
        assert!(a.len() >= 8);
        assert_eq!(a, prompt_hashes("m", None, &as_parts, &config(16)));
    }

    #[test]
    fn images_are_digested_and_distinguish_prompts() {
        let with_image = |url: &str| {
            json!({"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "describe this picture in detail please"},
            ]}]})
        };
        let cat = prompt_hashes("m", None, &with_image("data:cat"), &config(16));
        let dog = prompt_hashes("m", None, &with_image("data:dog"), &config(16));
        assert!(!cat.is_empty());
        assert_ne!(cat[0], dog[0]);
        assert_eq!(
            cat,
            prompt_hashes("m", None, &with_image("data:cat"), &config(16))
        );
    }

    #[test]
    fn role_is_part_of_the_stream() {
        let text = "same words ".repeat(10);
        let user = json!({"messages": [{"role": "user", "content": text}]});
        let system = json!({"messages": [{"role": "system", "content": text}]});
        assert_ne!(
            prompt_hashes("m", None, &user, &config(16)),
            prompt_hashes("m", None, &system, &config(16))
        );
    }

    #[test]
    fn completion_prompts_strings_and_token_ids() {
        let text = "z".repeat(130);
        let single = json!({"prompt": text});
        assert_eq!(prompt_hashes("m", None, &single, &config(64)).len(), 2);
        let batch = json!({"prompt": [text, text]});
        assert_eq!(prompt_hashes("m", None, &batch, &config(64)).len(), 4);
        let tokens: Vec<u32> = (0..40).collect();
        let ids = json!({"prompt": tokens});
        assert_eq!(prompt_hashes("m", None, &ids, &config(64)).len(), 2);
        let nested = json!({"prompt": [tokens]});
        assert_eq!(prompt_hashes("m", None, &nested, &config(64)).len(), 2);
    }

    #[test]
    fn no_prompt_no_hashes() {
        let mut h = PromptHasher::new("m", None, &config(64));
        assert!(!h.feed_body(&json!({"input": "embedding text".repeat(20)})));
        assert!(h.finish().is_empty());
    }

    #[test]
    fn stops_at_max_blocks_but_counts_all_bytes() {
        let cfg = PrefixConfig {
            block_bytes: 64,
            max_blocks: 3,
            ..PrefixConfig::default()
        };
        let mut h = PromptHasher::new("m", None, &cfg);
        h.feed(&[1; 1000]);
        assert_eq!(h.bytes_fed(), 1000);
        let hashes = h.finish();
        assert_eq!(hashes, hash_bytes(&[1; 192], 64));
    }
}
