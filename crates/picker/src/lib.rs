//! Endpoint picking: which replica of a pool should serve a request.
//!
//! Pure and synchronous: no I/O, no clock reads (time comes in as an
//! argument), so the same code runs in the gateway and in the virtual-time
//! benchmark.
//!
//! - [`policy`]: configuration and every default, with reasons.
//! - [`health`](mod@health): when a replica's metrics can be trusted.
//! - [`glance`]: the figures of an observation every pick reads, cheaply.
//! - [`prefix`]: prompt hashing and the prefix-cache affinity index.
//! - [`scorers`]: one score in `[0, 1]` per candidate and signal.
//! - [`drain`]: the `Retry-After` estimate for a saturated pool.
//! - [`Pool`]: membership snapshot, the pick, and the prefix record.
//! - [`explain`]: per-candidate scores for logs and headers.

pub mod drain;
pub mod endpoint;
pub mod explain;
pub mod glance;
pub mod health;
pub mod policy;
pub mod pool;
pub mod prefix;
pub mod scorers;

pub use drain::estimate_retry_after;
pub use endpoint::{Endpoint, EngineState, Load, LoadGuard, Observation};
pub use explain::{CandidateScore, ScoresHeader, TopScores};
pub use health::{Health, health};
pub use policy::{
    Fallback, InflightTolerance, PickerConfig, Policy, PrefixConfig, Saturation, Weights,
};
pub use pool::{Decision, PickError, PickRequest, Pool};
pub use prefix::{PrefixIndex, PromptHasher, PromptValue, prompt_hashes};
pub use scorers::{LoraFit, Scorer, Signals};
