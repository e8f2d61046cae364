//! What the picker knows of a replica's engine: the latest observation,
//! as the scraper stores it.

use std::sync::Arc;
use std::time::Instant;

/// What a replica's engine reported in its last good `/metrics` scrape.
/// A field is `None` when the engine's dialect does not expose it: unknown
/// is not zero.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineState {
    /// Requests queued in the engine, not yet scheduled.
    pub waiting: Option<u64>,
    /// Requests in the running batch.
    pub running: Option<u64>,
    /// Fraction of the KV cache in use, 0..=1.
    pub kv_usage: Option<f64>,
    /// Tokens per KV block.
    pub block_size: Option<u32>,
    /// KV cache capacity in blocks.
    pub kv_capacity_blocks: Option<u64>,
    /// LoRA adapters loaded in GPU memory.
    pub resident_adapters: Vec<String>,
    /// LoRA adapters that requests are waiting for.
    pub waiting_adapters: Vec<String>,
    /// Adapter slots (`max_loras`).
    pub max_adapters: Option<u32>,
}

/// The latest result of watching one replica. Replaced as a whole on every
/// scrape so readers always see a consistent view.
#[derive(Debug, Clone, Default)]
pub struct Observation {
    /// Engine state from the last good scrape, if there has been one.
    pub state: Option<Arc<EngineState>>,
    /// When the last good scrape completed.
    pub last_good: Option<Instant>,
    /// Why the most recent scrape failed; `None` when it succeeded.
    pub last_error: Option<String>,
}
