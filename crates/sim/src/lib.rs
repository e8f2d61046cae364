//! Simulated model servers for testing and benchmarking the gateway without
//! GPUs.
//!
//! A replica is an [`engine`] model of a vLLM-style server (continuous
//! batching, paged KV cache with prefix caching, LoRA slots, roofline timing)
//! driven in scaled real time behind an HTTP front that speaks the OpenAI API
//! and exposes `/metrics` with the exact names of vLLM, SGLang, TGI or
//! llama.cpp. Faults (errors, hangs, dead or frozen metrics, slow-downs,
//! answers cut or stalled mid-stream, crashes) can be switched on at start
//! or at run time, and a replica can be stopped gracefully. A prompt that
//! carries the beginning of an answer (a gateway resuming a stream a dead
//! replica started) gets exactly the rest of it.
//!
//! - [`start_replica`] / [`start_fleet`]: run replicas in-process (tests, bench).
//! - [`cli`]: `infergate sim`, a fleet on consecutive ports until Ctrl-C.
//! - [`tokenizer`]: the deterministic approximate tokenizer prompts go through.
//! - [`metrics`]: the `/metrics` renderers, one per engine dialect.
//! - [`faults`]: what can go wrong, and the admin API's request shapes.
//! - [`disaggregation`]: prefill and decode roles, vLLM's and SGLang's
//!   hand-offs between them.
//! - [`kv_cache_events`]: the engine's prefix-cache changes published as
//!   vLLM's KV events (off unless a replica's spec turns them on).

pub mod cli;
pub mod disaggregation;
pub mod engine;
pub mod faults;
pub mod fleet;
mod http;
pub mod kv_cache_events;
pub mod metrics;
mod replica;

/// The deterministic approximate tokenizer prompts go through (shared with
/// the KV-events crate, whose index needs the same token ids).
pub use kv_events::tokenizer;

pub use disaggregation::{DisaggregationSpec, Role};
pub use engine::{KvLink, SchedulingPolicy};
pub use faults::{Faults, FaultsUpdate, MetricsFault};
pub use fleet::{
    Fleet, FleetSpec, LoadTime, ReplicaHandle, ReplicaInfo, ReplicaSpec, calibrated_load_time,
    start_fleet, start_replica,
};
pub use kv_cache_events::KvEventsSpec;
pub use metrics::Dialect;
