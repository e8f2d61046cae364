//! The decoded values of a message: what the decoder produces and the
//! encoder writes, in a leaf of their own so both can name them.

pub use rmpv::Value;

/// vLLM's name of the GPU tier; any other medium is an offload tier.
pub const MEDIUM_GPU: &str = "GPU";

/// One message from a publisher.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventMessage {
    pub topic: Vec<u8>,
    /// Per publisher, from 0, one more per batch; back to 0 when the engine
    /// restarts.
    pub seq: u64,
    pub batch: EventBatch,
}

/// What an engine step changed in the cache, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    /// The engine's wall clock (seconds since the Unix epoch).
    pub ts: f64,
    pub events: Vec<KvEvent>,
    /// The data-parallel rank that published it (vLLM fills it in).
    pub data_parallel_rank: Option<i64>,
}

/// One event, tagged by its class name on the wire.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    /// The engine emptied its prefix cache (vLLM's `reset_prefix_cache`).
    AllBlocksCleared,
    /// A kind this crate does not know; ignored by the index and counted.
    Unknown {
        kind: String,
    },
}

/// Full blocks entered the cache: consecutive blocks of one sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockStored {
    pub block_hashes: Vec<BlockHash>,
    /// The block before the first one; `None` when the first is the start of
    /// a sequence.
    pub parent_block_hash: Option<BlockHash>,
    /// The tokens of every block, `block_size` per block, concatenated.
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    /// vLLM's deprecated integer LoRA id; `lora_name` replaces it.
    pub lora_id: Option<i64>,
    /// `"GPU"`, or an offload tier (`"CPU"`, ...); `None` in releases that
    /// predate tiers, which means GPU.
    pub medium: Option<String>,
    pub lora_name: Option<String>,
    /// Per block, what else went into the engine's hash (multimodal input
    /// hashes, the LoRA name, the cache salt).
    pub extra_keys: Option<Vec<Option<Value>>>,
    /// The KV-cache group (hybrid models keep one per attention kind).
    pub group_idx: Option<i64>,
    pub kv_cache_spec_kind: Option<String>,
    pub kv_cache_spec_sliding_window: Option<i64>,
}

/// Blocks left the cache (evicted, or moved out of this tier).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<BlockHash>,
    pub medium: Option<String>,
    pub group_idx: Option<i64>,
}

/// An engine's block hash: bytes (vLLM's default, sha256) or a 64-bit
/// integer (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, SGLang).
///
/// Non-negative integers decode as `Unsigned` and negative ones as `Signed`,
/// which is how msgpack writers encode them, so a hash is written back the
/// way it was read.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BlockHash {
    Unsigned(u64),
    Signed(i64),
    Bytes(Vec<u8>),
}

impl BlockHash {
    /// A 64-bit identity for maps: an integer's 64 bits, or a digest of the
    /// bytes (so hashes of any length, sha256 included, fit one word).
    pub fn id(&self) -> u64 {
        match self {
            BlockHash::Unsigned(v) => *v,
            BlockHash::Signed(v) => *v as u64,
            BlockHash::Bytes(bytes) => xxhash_rust::xxh3::xxh3_64(bytes),
        }
    }
}

impl From<u64> for BlockHash {
    fn from(value: u64) -> Self {
        BlockHash::Unsigned(value)
    }
}

impl BlockStored {
    /// A store of GPU blocks in the fields every release has, the optional
    /// ones absent.
    pub fn new(
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: u32,
        lora_name: Option<String>,
    ) -> Self {
        BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id: None,
            medium: Some(MEDIUM_GPU.to_owned()),
            lora_name,
            extra_keys: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
        }
    }
}

impl BlockRemoved {
    /// A removal from the GPU tier.
    pub fn new(block_hashes: Vec<BlockHash>) -> Self {
        BlockRemoved {
            block_hashes,
            medium: Some(MEDIUM_GPU.to_owned()),
            group_idx: None,
        }
    }
}

impl KvEvent {
    /// The class name the wire tags it with.
    pub fn kind(&self) -> &str {
        match self {
            KvEvent::BlockStored(_) => "BlockStored",
            KvEvent::BlockRemoved(_) => "BlockRemoved",
            KvEvent::AllBlocksCleared => "AllBlocksCleared",
            KvEvent::Unknown { kind } => kind,
        }
    }
}
