//! Reading a message: frames, then the msgpack payload (decoded by rmpv into
//! borrowed values), then the batch in either encoding.

use rmpv::ValueRef;

use super::types::{
    BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent, KvEventMessage, Value,
};

/// Why a message could not be read. A batch that fails is lost whole: the
/// subscriber treats it as a gap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("expected 3 frames (topic, sequence, payload), got {0}")]
    FrameCount(usize),
    #[error("the sequence frame has {0} bytes, expected 8")]
    SequenceLength(usize),
    #[error("the payload ends inside a msgpack value")]
    Truncated,
    #[error("the payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("{0} bytes follow the payload's value")]
    TrailingBytes(usize),
    #[error("{}{field}: expected {expected}", event_prefix(*.event))]
    Malformed {
        /// Index of the event in the batch; `None` for the batch itself.
        event: Option<usize>,
        field: &'static str,
        expected: &'static str,
    },
}

fn event_prefix(event: Option<usize>) -> String {
    event.map_or_else(String::new, |i| format!("event {i}: "))
}

/// Decode the three frames of a published message.
pub fn decode_message<F: AsRef<[u8]>>(frames: &[F]) -> Result<KvEventMessage, WireError> {
    let [topic, seq, payload] = frames else {
        return Err(WireError::FrameCount(frames.len()));
    };
    Ok(KvEventMessage {
        topic: topic.as_ref().to_vec(),
        seq: decode_sequence(seq.as_ref())?,
        batch: decode_batch(payload.as_ref())?,
    })
}

/// A sequence frame: 8 bytes, big-endian.
pub fn decode_sequence(frame: &[u8]) -> Result<u64, WireError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| WireError::SequenceLength(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decode a batch payload, in either encoding.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, WireError> {
    let mut rest = payload;
    let value = rmpv::decode::read_value_ref(&mut rest).map_err(|error| {
        if error.kind() == std::io::ErrorKind::UnexpectedEof {
            WireError::Truncated
        } else {
            WireError::Msgpack(error.to_string())
        }
    })?;
    if !rest.is_empty() {
        return Err(WireError::TrailingBytes(rest.len()));
    }
    let batch = Fields::of(&value).ok_or(malformed(None, "batch", "an array or a map"))?;
    let ts = batch
        .get(0, "ts")
        .and_then(as_f64)
        .ok_or(malformed(None, "ts", "a number"))?;
    let events = match batch.get(1, "events") {
        Some(ValueRef::Array(events)) => events,
        _ => return Err(malformed(None, "events", "an array")),
    };
    let data_parallel_rank = optional(batch.get(2, "data_parallel_rank"), as_i64)
        .ok_or(malformed(None, "data_parallel_rank", "an integer"))?;
    let events = events
        .iter()
        .enumerate()
        .map(|(i, event)| decode_event(event).map_err(|e| e.at(i)))
        .collect::<Result<_, _>>()?;
    Ok(EventBatch {
        ts,
        events,
        data_parallel_rank,
    })
}

fn decode_event(value: &ValueRef<'_>) -> Result<KvEvent, Bad> {
    let (kind, fields) = match value {
        ValueRef::Array(items) => match items.split_first() {
            Some((tag, rest)) => (tag, Fields::Positional(rest)),
            None => return Err(bad("type", "a tag")),
        },
        ValueRef::Map(entries) => {
            let fields = Fields::Named(entries);
            match fields.named("type") {
                Some(tag) => (tag, fields),
                None => return Err(bad("type", "a tag")),
            }
        }
        _ => return Err(bad("event", "an array or a map")),
    };
    let kind = as_str(kind).ok_or(bad("type", "a string"))?;
    Ok(match kind {
        "BlockStored" => KvEvent::BlockStored(block_stored(&fields)?),
        "BlockRemoved" => KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes(fields.get(0, "block_hashes"), "block_hashes")?,
            medium: optional(fields.get(1, "medium"), as_string)
                .ok_or(bad("medium", "a string"))?,
            group_idx: optional(fields.get(2, "group_idx"), as_i64)
                .ok_or(bad("group_idx", "an integer"))?,
        }),
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        other => KvEvent::Unknown {
            kind: other.to_owned(),
        },
    })
}

fn block_stored(fields: &Fields<'_, '_>) -> Result<BlockStored, Bad> {
    let parent_block_hash = match fields.get(1, "parent_block_hash") {
        None => None,
        Some(value) => Some(hash(value).ok_or(bad("parent_block_hash", "bytes or an integer"))?),
    };
    let token_ids = match fields.get(2, "token_ids") {
        Some(ValueRef::Array(ids)) => ids
            .iter()
            .map(|id| as_u64(id).and_then(|id| u32::try_from(id).ok()))
            .collect::<Option<Vec<u32>>>()
            .ok_or(bad("token_ids", "token ids below 2^32"))?,
        _ => return Err(bad("token_ids", "an array")),
    };
    let block_size = fields
        .get(3, "block_size")
        .and_then(as_u64)
        .and_then(|size| u32::try_from(size).ok())
        .ok_or(bad("block_size", "a block size"))?;
    let extra_keys = match fields.get(7, "extra_keys") {
        None => None,
        Some(ValueRef::Array(keys)) => Some(
            keys.iter()
                .map(|key| match key {
                    ValueRef::Nil => None,
                    key => Some(key.to_owned()),
                })
                .collect::<Vec<Option<Value>>>(),
        ),
        Some(_) => return Err(bad("extra_keys", "an array")),
    };
    Ok(BlockStored {
        block_hashes: hashes(fields.get(0, "block_hashes"), "block_hashes")?,
        parent_block_hash,
        token_ids,
        block_size,
        lora_id: optional(fields.get(4, "lora_id"), as_i64).ok_or(bad("lora_id", "an integer"))?,
        medium: optional(fields.get(5, "medium"), as_string).ok_or(bad("medium", "a string"))?,
        lora_name: optional(fields.get(6, "lora_name"), as_string)
            .ok_or(bad("lora_name", "a string"))?,
        extra_keys,
        group_idx: optional(fields.get(8, "group_idx"), as_i64)
            .ok_or(bad("group_idx", "an integer"))?,
        kv_cache_spec_kind: optional(fields.get(9, "kv_cache_spec_kind"), as_string)
            .ok_or(bad("kv_cache_spec_kind", "a string"))?,
        kv_cache_spec_sliding_window: optional(
            fields.get(10, "kv_cache_spec_sliding_window"),
            as_i64,
        )
        .ok_or(bad("kv_cache_spec_sliding_window", "an integer"))?,
    })
}

/// A struct's fields in either encoding: by position (array form, the tag
/// already split off) or by name (map form).
enum Fields<'v, 'a> {
    Positional(&'v [ValueRef<'a>]),
    Named(&'v [(ValueRef<'a>, ValueRef<'a>)]),
}

impl<'v, 'a> Fields<'v, 'a> {
    fn of(value: &'v ValueRef<'a>) -> Option<Self> {
        match value {
            ValueRef::Array(items) => Some(Fields::Positional(items)),
            ValueRef::Map(entries) => Some(Fields::Named(entries)),
            _ => None,
        }
    }

    /// The field at `position` or named `name`; `None` when absent or nil
    /// (writers omit fields at their default, and every default is nil).
    fn get(&self, position: usize, name: &str) -> Option<&'v ValueRef<'a>> {
        let value = match self {
            Fields::Positional(items) => items.get(position),
            Fields::Named(_) => self.named(name),
        };
        value.filter(|v| !matches!(v, ValueRef::Nil))
    }

    fn named(&self, name: &str) -> Option<&'v ValueRef<'a>> {
        match self {
            Fields::Named(entries) => entries
                .iter()
                .find(|(key, _)| as_str(key) == Some(name))
                .map(|(_, value)| value),
            Fields::Positional(_) => None,
        }
    }
}

/// A malformed field inside an event, before the event's index is known.
struct Bad {
    field: &'static str,
    expected: &'static str,
}

impl Bad {
    fn at(self, event: usize) -> WireError {
        malformed(Some(event), self.field, self.expected)
    }
}

fn bad(field: &'static str, expected: &'static str) -> Bad {
    Bad { field, expected }
}

fn malformed(event: Option<usize>, field: &'static str, expected: &'static str) -> WireError {
    WireError::Malformed {
        event,
        field,
        expected,
    }
}

/// `Some(None)` for an absent field, `Some(Some(v))` for a good one, `None`
/// for one of the wrong type.
fn optional<'v, 'a, T>(
    value: Option<&'v ValueRef<'a>>,
    read: impl Fn(&'v ValueRef<'a>) -> Option<T>,
) -> Option<Option<T>> {
    match value {
        None => Some(None),
        Some(value) => read(value).map(Some),
    }
}

fn hashes(value: Option<&ValueRef<'_>>, field: &'static str) -> Result<Vec<BlockHash>, Bad> {
    match value {
        Some(ValueRef::Array(items)) => items
            .iter()
            .map(hash)
            .collect::<Option<_>>()
            .ok_or(bad(field, "hashes as bytes or integers")),
        _ => Err(bad(field, "an array")),
    }
}

fn hash(value: &ValueRef<'_>) -> Option<BlockHash> {
    match value {
        ValueRef::Binary(bytes) => Some(BlockHash::Bytes(bytes.to_vec())),
        ValueRef::Integer(int) => match int.as_u64() {
            Some(unsigned) => Some(BlockHash::Unsigned(unsigned)),
            None => int.as_i64().map(BlockHash::Signed),
        },
        _ => None,
    }
}

fn as_str<'v>(value: &'v ValueRef<'_>) -> Option<&'v str> {
    match value {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

fn as_string(value: &ValueRef<'_>) -> Option<String> {
    as_str(value).map(str::to_owned)
}

fn as_u64(value: &ValueRef<'_>) -> Option<u64> {
    match value {
        ValueRef::Integer(int) => int.as_u64(),
        _ => None,
    }
}

fn as_i64(value: &ValueRef<'_>) -> Option<i64> {
    match value {
        ValueRef::Integer(int) => int.as_i64(),
        _ => None,
    }
}

fn as_f64(value: &ValueRef<'_>) -> Option<f64> {
    match value {
        ValueRef::F64(f) => Some(*f),
        ValueRef::F32(f) => Some(f64::from(*f)),
        ValueRef::Integer(int) => int.as_f64(),
        _ => None,
    }
}
