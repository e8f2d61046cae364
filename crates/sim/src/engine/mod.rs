//! The engine model of a simulated vLLM (V1) server.
//!
//! A pure, deterministic state machine: time is an `f64` seconds input and
//! is never read from a clock, so the same engine runs behind the HTTP front
//! in (scaled) real time and inside the fleet benchmark in virtual time.
//!
//! - [`profiles`]: GPU and model data (the roofline's inputs).
//! - [`EngineConfig`]: vLLM defaults for a GPU × model pair and the memory
//!   plan (does it fit, how many KV blocks remain).
//! - [`Engine`]: continuous batching with chunked prefill, a paged KV cache
//!   with prefix caching, preemption by recompute and LoRA slots.
//! - [`timing`]: the roofline step-time model.
//! - [`calibration`]: load drivers that compare the model with published
//!   benchmark figures (`cargo run -p infergate-sim --release --example calibrate`).
//!
//! Driving an engine: call [`Engine::submit`] / [`Engine::abort`] as
//! requests arrive, and [`Engine::advance`] up to the current time whenever
//! [`Engine::next_event_at`] has passed; `advance` returns the token events.
//!
//! The model is documented, with every number and its source, in
//! `docs/simulator.md`.

pub mod calibration;
mod config;
mod interface;
mod kv_cache;
pub mod kv_transfer;
mod lora;
pub mod profiles;
mod request;
mod scheduler;
pub mod timing;
mod waiting;

#[cfg(test)]
mod tests;

pub use config::{
    ACTIVATION_RESERVE_BYTES, DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_LORA_LOAD_SECONDS, DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS,
    DEFAULT_STEP_OVERHEAD_SECONDS, EngineConfig, MAX_TENSOR_PARALLEL, MemoryPlan, ProfileError,
    SchedulingPolicy,
};
pub use interface::{
    EngineCounters, EngineEvent, EngineStats, FinishReason, KvCacheEvent, SimRequest,
};
pub use kv_transfer::KvLink;
pub use profiles::{
    HardwareProfile, Interconnect, ModelProfile, hardware, hardware_names, model, model_names,
};
pub use scheduler::{Engine, StepInfo};
