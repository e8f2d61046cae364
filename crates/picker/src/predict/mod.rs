//! Predicted latency: per replica, an online model of the time to first
//! token (TTFT) and the time per output token (ITL) a request will see,
//! learned from the gateway's own observations of finished requests.
//!
//! - [`features`]: what the model reads at pick time and what it predicts.
//! - `rls`: recursive least squares with a forgetting factor.
//! - `error`: the recent error that decides whether a model is trusted.
//! - [`model`]: one replica's model: learn, predict, summarise.
//! - [`slo`]: a request's latency objectives.
//!
//! A leaf below [`crate::endpoint`]: each endpoint holds its model, and
//! [`crate::Policy::Predicted`] (in `pool`) reads them. No clock: a model
//! learns per observation, not per second, so it runs unchanged in virtual
//! time. docs/picker.md, "Predicted latency", says why this family and what
//! was measured.

mod error;
pub mod features;
pub mod model;
mod rls;
pub mod slo;
#[cfg(test)]
pub(crate) mod synthetic;
#[cfg(test)]
mod variants;

pub use features::{LatencyFeatures, LatencyPrediction};
pub use model::{Coefficients, LatencyModel, LatencyModelSummary, TargetSummary};
pub use slo::Slo;
