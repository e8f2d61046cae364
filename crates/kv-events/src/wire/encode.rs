//! Writing the wire format as vLLM's publisher does (msgspec with
//! `omit_defaults`): the array form writes every field, nil or not; the map
//! form leaves out the fields that have a default while they are at it,
//! and writes the others even when nil. (Checked byte for byte against
//! msgspec in the tests.)

use rmpv::Value;

use super::types::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent};

/// Which of vLLM's two encodings to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// Releases with `array_like` structs: `[ts, events, rank]`, each event
    /// `[tag, field, ...]`.
    Array,
    /// vLLM main: maps by field name, each event tagged under `"type"`.
    #[default]
    Map,
}

/// The three frames of a message: topic, sequence (8 bytes big-endian),
/// payload.
pub fn encode_message(
    topic: &[u8],
    seq: u64,
    batch: &EventBatch,
    encoding: Encoding,
) -> [Vec<u8>; 3] {
    [
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        encode_batch(batch, encoding),
    ]
}

/// The msgpack payload of a batch.
pub fn encode_batch(batch: &EventBatch, encoding: Encoding) -> Vec<u8> {
    let events = batch.events.iter().map(|e| event(e, encoding)).collect();
    let value = Struct::new(encoding, None)
        .required("ts", Value::F64(batch.ts))
        .required("events", Value::Array(events))
        .optional(
            "data_parallel_rank",
            batch.data_parallel_rank.map(Value::from),
        )
        .finish();
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).expect("writing to a Vec cannot fail");
    out
}

fn event(event: &KvEvent, encoding: Encoding) -> Value {
    let tagged = Struct::new(encoding, Some(event.kind()));
    match event {
        KvEvent::BlockStored(stored) => block_stored(tagged, stored),
        KvEvent::BlockRemoved(removed) => block_removed(tagged, removed),
        KvEvent::AllBlocksCleared | KvEvent::Unknown { .. } => tagged.finish(),
    }
}

fn block_stored(s: Struct, e: &BlockStored) -> Value {
    let extra_keys = e.extra_keys.as_ref().map(|keys| {
        Value::Array(
            keys.iter()
                .map(|key| key.clone().unwrap_or(Value::Nil))
                .collect(),
        )
    });
    s.required("block_hashes", hashes(&e.block_hashes))
        .required(
            "parent_block_hash",
            nil_or(e.parent_block_hash.as_ref().map(hash)),
        )
        .required(
            "token_ids",
            Value::Array(e.token_ids.iter().map(|&t| Value::from(t)).collect()),
        )
        .required("block_size", Value::from(e.block_size))
        .required("lora_id", nil_or(e.lora_id.map(Value::from)))
        .required("medium", nil_or(e.medium.as_deref().map(Value::from)))
        .required("lora_name", nil_or(e.lora_name.as_deref().map(Value::from)))
        .optional("extra_keys", extra_keys)
        .optional("group_idx", e.group_idx.map(Value::from))
        .optional(
            "kv_cache_spec_kind",
            e.kv_cache_spec_kind.as_deref().map(Value::from),
        )
        .optional(
            "kv_cache_spec_sliding_window",
            e.kv_cache_spec_sliding_window.map(Value::from),
        )
        .finish()
}

fn block_removed(s: Struct, e: &BlockRemoved) -> Value {
    s.required("block_hashes", hashes(&e.block_hashes))
        .required("medium", nil_or(e.medium.as_deref().map(Value::from)))
        .optional("group_idx", e.group_idx.map(Value::from))
        .finish()
}

fn hashes(hashes: &[BlockHash]) -> Value {
    Value::Array(hashes.iter().map(hash).collect())
}

fn hash(hash: &BlockHash) -> Value {
    match hash {
        BlockHash::Unsigned(v) => Value::from(*v),
        BlockHash::Signed(v) => Value::from(*v),
        BlockHash::Bytes(bytes) => Value::Binary(bytes.clone()),
    }
}

fn nil_or(value: Option<Value>) -> Value {
    value.unwrap_or(Value::Nil)
}

/// A msgspec struct being written, field by field in declaration order.
struct Struct {
    encoding: Encoding,
    /// Array form: every field so far, nil for absent ones.
    items: Vec<Value>,
    /// Map form.
    entries: Vec<(Value, Value)>,
}

impl Struct {
    fn new(encoding: Encoding, tag: Option<&str>) -> Self {
        let mut s = Struct {
            encoding,
            items: Vec::new(),
            entries: Vec::new(),
        };
        if let Some(tag) = tag {
            s = s.required("type", Value::from(tag));
        }
        s
    }

    fn required(mut self, name: &str, value: Value) -> Self {
        match self.encoding {
            Encoding::Array => self.items.push(value),
            Encoding::Map => self.entries.push((Value::from(name), value)),
        }
        self
    }

    fn optional(mut self, name: &str, value: Option<Value>) -> Self {
        match value {
            Some(value) => self.required(name, value),
            None => {
                if self.encoding == Encoding::Array {
                    self.items.push(Value::Nil);
                }
                self
            }
        }
    }

    fn finish(self) -> Value {
        match self.encoding {
            Encoding::Array => Value::Array(self.items),
            Encoding::Map => Value::Map(self.entries),
        }
    }
}
