//! What goes into an engine and what comes out of it: requests, events and
//! snapshots of its state. A leaf, shared by the scheduler and the engine's
//! callers.

/// One generation request as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRequest {
    /// Caller-chosen id, unique among the requests in flight.
    pub id: u64,
    /// Prompt token ids (they drive prefix caching).
    pub prompt: Vec<u32>,
    /// Tokens to generate; the request always generates exactly this many.
    pub max_tokens: u32,
    /// LoRA adapter name, or `None` for the base model.
    pub adapter: Option<String>,
    /// vLLM's request `priority`: lower is served first under priority
    /// scheduling; ignored under first come, first served.
    pub priority: i64,
}

/// Why a request stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// Generated `max_tokens` tokens.
    Length,
    /// Aborted by the caller.
    Aborted,
}

impl FinishReason {
    /// The OpenAI / vLLM spelling ("length", "abort").
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Aborted => "abort",
        }
    }
}

/// What the engine reports, in time order.
#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// The first output token; `cached_tokens` prompt tokens came from the
    /// prefix cache.
    FirstToken {
        id: u64,
        at: f64,
        cached_tokens: u32,
    },
    /// Every output token after the first (can be switched off with
    /// [`Engine::set_token_events`](super::Engine::set_token_events)).
    Token { id: u64, at: f64 },
    Finished {
        id: u64,
        at: f64,
        prompt_tokens: u32,
        completion_tokens: u32,
        cached_tokens: u32,
        reason: FinishReason,
    },
    /// Refused at submission (too long, unknown adapter, duplicate id, ...).
    Rejected { id: u64, at: f64, reason: String },
}

impl EngineEvent {
    pub fn id(&self) -> u64 {
        match self {
            EngineEvent::FirstToken { id, .. }
            | EngineEvent::Token { id, .. }
            | EngineEvent::Finished { id, .. }
            | EngineEvent::Rejected { id, .. } => *id,
        }
    }

    pub fn at(&self) -> f64 {
        match self {
            EngineEvent::FirstToken { at, .. }
            | EngineEvent::Token { at, .. }
            | EngineEvent::Finished { at, .. }
            | EngineEvent::Rejected { at, .. } => *at,
        }
    }
}

/// A change to the prefix cache, as vLLM's KV events report it (see
/// [`Engine::set_kv_events`](super::Engine::set_kv_events)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// Consecutive full blocks of one request became findable: their
    /// chained hashes, the hash of the block before the first (`None` at the
    /// start of a prompt), their tokens (`block_size` per block), and the
    /// adapter they were computed with.
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        adapter: Option<String>,
    },
    /// Cached blocks were evicted: their memory went to new blocks.
    Removed { hashes: Vec<u64> },
}

/// A snapshot of the engine's state and counters, in the units of vLLM's
/// `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct EngineStats {
    /// Requests waiting to be scheduled (`vllm:num_requests_waiting`).
    pub waiting: u64,
    /// Requests in the running batch (`vllm:num_requests_running`).
    pub running: u64,
    /// Fraction of KV blocks in use, 0..=1 (`vllm:kv_cache_usage_perc`).
    pub kv_usage: f64,
    pub num_gpu_blocks: u64,
    pub block_size: u32,
    /// Adapters used by running requests (`vllm:lora_requests_info`).
    pub running_adapters: Vec<String>,
    /// Adapters requested by waiting requests.
    pub waiting_adapters: Vec<String>,
    pub max_loras: u32,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Prompt tokens found in the prefix cache.
    pub prefix_cache_hits: u64,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub preemptions_total: u64,
    /// Requests that finished by length.
    pub requests_finished_total: u64,
}

/// Counters beyond [`EngineStats`] (kept separate so that struct stays the
/// shape the HTTP front relies on).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineCounters {
    pub requests_aborted_total: u64,
    pub requests_rejected_total: u64,
    /// Adapter loads into GPU slots (swaps).
    pub lora_loads_total: u64,
    /// Engine steps run.
    pub steps_total: u64,
    /// Adapters resident in GPU slots.
    pub resident_adapters: Vec<String>,
}
