//! What one render reads: the replica's identity and one scrape's inputs,
//! with the figures several engines derive from them. A leaf, shared by
//! the exporter and every engine's renderer.

use super::requests::RequestTotals;
use crate::engine::EngineStats;

/// What does not change while a replica runs: labels and configuration
/// values that appear in `/metrics`.
#[derive(Debug, Clone)]
pub struct ReplicaIdentity {
    /// The served model name (the `model_name` label).
    pub model_name: String,
    pub max_model_len: u32,
    pub gpu_memory_utilization: f64,
    pub enable_prefix_caching: bool,
    /// Unix time the replica started (the `_created` series).
    pub started_unix: f64,
}

/// One scrape's inputs.
pub struct Scrape<'a> {
    pub identity: &'a ReplicaIdentity,
    pub stats: &'a EngineStats,
    pub requests: &'a RequestTotals,
    /// Wall-clock unix time of the scrape (vLLM's `lora_requests_info` value).
    pub now_unix: f64,
}

/// Cumulative prefix-cache hit rate in [0, 1] (0 before any query).
pub(super) fn prefix_hit_rate(stats: &EngineStats) -> f64 {
    if stats.prefix_cache_queries == 0 {
        0.0
    } else {
        stats.prefix_cache_hits as f64 / stats.prefix_cache_queries as f64
    }
}

/// KV-cache capacity in tokens.
pub(super) fn kv_capacity_tokens(stats: &EngineStats) -> u64 {
    stats.num_gpu_blocks * u64::from(stats.block_size)
}
