//! The engines' wire format: what one ZMQ message of vLLM's (or SGLang's)
//! KV-event publisher holds, decoded into plain Rust values, and the same
//! format written back (for the simulator and tests).
//!
//! A message is three frames: the topic, the batch's sequence number as 8
//! bytes big-endian, and a msgpack payload, the `EventBatch`
//! `[ts, events, data_parallel_rank]`. vLLM encodes the batch and its events
//! as msgpack **arrays** in older releases (`array_like`, an event's tag
//! first) and as **maps** on main (an event's tag under `"type"`); both are
//! in the field, so both are read ([`decode_batch`]) and both can be written
//! ([`encode_batch`], [`Encoding`]). Fields with a default that are absent are
//! `None`, fields nobody knows yet are ignored, and events of an unknown
//! kind decode to [`KvEvent::Unknown`] so the caller can count them.

mod decode;
mod encode;
mod types;

pub use decode::{WireError, decode_batch, decode_message, decode_sequence};
pub use encode::{Encoding, encode_batch, encode_message};
pub use types::{
    BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent, KvEventMessage, MEDIUM_GPU, Value,
};
