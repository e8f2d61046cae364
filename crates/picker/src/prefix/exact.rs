//! Exact prefix matches, from the engines' own word.
//!
//! Where a pool's replicas publish their KV-cache events, the gateway knows
//! exactly which of a prompt's blocks each replica holds (the `kv-events`
//! crate); the picker stays free of I/O and only asks, per pick, through
//! [`ExactPrefix`]. A replica the events cannot speak for (no stream yet, a
//! lost message not replayed) is answered for by the approximate
//! [`PrefixIndex`](super::PrefixIndex), so one unsure replica never costs
//! the others their exact answer.

use std::fmt;

/// What each replica holds of one request's prompt, as its engine reported.
pub trait ExactPrefix: Send + Sync + fmt::Debug {
    /// For each endpoint of `endpoints` (by [`Endpoint::index`]), the share
    /// of the prompt's blocks it holds, in `0..=1`, into `out`; `None` for
    /// an endpoint whose index cannot say.
    ///
    /// [`Endpoint::index`]: crate::Endpoint::index
    fn shares(&self, endpoints: &[usize], out: &mut [Option<f64>]);
}

/// Which index scored a replica's prefix affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrefixSource {
    /// The gateway's guess: where it sent earlier prompts.
    #[default]
    Approximate,
    /// The engine's own KV-cache events.
    Events,
}

impl PrefixSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PrefixSource::Approximate => "approximate",
            PrefixSource::Events => "events",
        }
    }
}
