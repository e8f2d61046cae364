//! Endpoint picking: which replica of a pool should serve a request.
//!
//! Pure and synchronous: no I/O, no clock reads (time comes in as an
//! argument), so the same code runs in the gateway and in the virtual-time
//! benchmark.
//!
//! - [`policy`]: configuration and every default, with reasons, and
//!   the scorer table every list of scorers follows.
//! - [`observation`]: what the scraper last saw of a replica's engine.
//! - [`health`](mod@health): when a replica's metrics can be trusted.
//! - [`summary`]: the figures of an observation every pick reads, kept in
//!   a sequence lock so reading them is cheap.
//! - [`predict`]: each replica's online model of its latency.
//! - [`endpoint`]: a replica, its in-flight load, its observation and its
//!   latency model.
//! - [`prefix`]: prompt hashing and the prefix-cache affinity index.
//! - [`scorers`]: one score in `[0, 1]` per candidate and signal.
//! - [`session`]: session affinity, bounded-load rendezvous hashing.
//! - [`retry_after`]: the `Retry-After` estimate for a saturated pool.
//! - [`Picker`]: membership snapshot, the pick, and the prefix record.
//! - [`explain`]: per-candidate scores for logs and headers.
//! - [`flow`]: flow control's priority bands and waiting queue (a leaf).
//!
//! Modules depend one way, never back: `observation` ← `health` ←
//! `summary` (over the leaf `seqlock`) ← `endpoint` ← `explain` ← `pool`,
//! with `predict` (over `seqlock` and `policy`) below `endpoint`, and
//! `policy`, `prefix`, `scorers` and `retry_after` below `pool`.

pub mod endpoint;
pub mod explain;
pub mod flow;
pub mod health;
pub mod observation;
pub mod policy;
pub mod pool;
pub mod predict;
pub mod prefix;
pub mod retry_after;
pub mod scorers;
mod seqlock;
pub mod session;
pub mod summary;

pub use endpoint::{Endpoint, Load, LoadGuard, is_ready};
pub use explain::{CandidateScore, ScoresHeader, TopScores};
pub use health::{Health, health};
pub use observation::{EngineState, Observation};
pub use policy::{
    Fallback, InflightTolerance, PickerConfig, Policy, PredictConfig, PrefixConfig, Saturation,
    Weights,
};
pub use pool::{Decision, PickError, PickRequest, Picker};
pub use predict::{LatencyFeatures, LatencyModel, LatencyModelSummary, LatencyPrediction, Slo};
pub use prefix::{
    ExactPrefix, PrefixIndex, PrefixSource, PromptHasher, PromptValue, prompt_hashes,
};
pub use retry_after::estimate_retry_after;
pub use scorers::{Features, LoraFit, Scorer};
pub use session::{SessionFit, session_key};
