//! What a pick takes and gives back: the request's side of it
//! ([`PickRequest`]), the chosen replica ([`Decision`]) and why there is
//! none ([`PickError`]). A leaf: the pool and its policies build these,
//! and nothing here reaches back into them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::endpoint::{Endpoint, LoadGuard};
use crate::explain::{CandidateScore, ScoresHeader, TopScores};
use crate::policy::Policy;
use crate::predict::{LatencyFeatures, LatencyPrediction, Slo};
use crate::prefix::{ExactPrefix, PrefixSource};

/// What the picker needs to know about a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickRequest<'a> {
    /// LoRA adapter the request asks for, if any.
    pub adapter: Option<&'a str>,
    /// The prompt's chained block hashes
    /// ([`Picker::hash_prompt`](crate::Picker::hash_prompt)).
    pub prefix_hashes: &'a [u64],
    /// Estimated tokens of the request; [`Decision::acquire`] counts them
    /// as in flight on the chosen replica.
    pub estimated_tokens: u64,
    /// Context the request needs (its prompt and the completion it may
    /// ask for, in tokens): a replica known to hold less is not picked
    /// while another can. 0 checks nothing.
    pub context_tokens: u64,
    /// Fill [`Decision::scores`] with every candidate's scores.
    pub explain: bool,
    /// The request's session key, hashed; `None` without a session.
    pub session: Option<u64>,
    /// Share of each replica's saturation queue depth this request may
    /// fill (its priority band's); `None`: all of it
    /// ([`Saturation::for_share`](crate::Saturation::for_share)).
    pub queue_share: Option<f64>,
    /// What the engines' KV-cache events say each replica holds of the
    /// prompt; `None` where the pool has only the approximate index.
    pub exact_prefix: Option<&'a dyn ExactPrefix>,
    /// Estimated prompt length, in tokens: with the share of the prompt a
    /// replica is believed to hold, the prefill a latency model sees.
    pub prompt_tokens: u64,
    /// Output tokens expected (from `max_tokens` or a route's estimate);
    /// 0 when unknown, counted as
    /// [`PredictConfig::DEFAULT_OUTPUT_TOKENS`](crate::PredictConfig::DEFAULT_OUTPUT_TOKENS).
    pub expected_output_tokens: u64,
    /// The request's latency objectives; [`Policy::Predicted`] avoids
    /// replicas predicted to miss them.
    pub slo: Option<Slo>,
}

/// The chosen replica, and why.
#[derive(Debug, Clone)]
pub struct Decision {
    pub endpoint: Arc<Endpoint>,
    /// The policy that chose it.
    pub policy: Policy,
    /// True when no replica had fresh, healthy metrics and the scored
    /// policy fell back to least-request.
    pub fallback: bool,
    /// Winner's and runner-up's totals ([`Policy::Scored`] only).
    pub top: Option<TopScores>,
    /// Every scored candidate, best first; only when
    /// [`PickRequest::explain`] was set.
    pub scores: Vec<CandidateScore>,
    /// From the request, for [`Decision::acquire`].
    pub estimated_tokens: u64,
    /// Which index scored the chosen replica's prefix affinity.
    pub prefix_source: PrefixSource,
    /// The chosen replica's latency features at pick time and, when its
    /// model is trusted, its prediction for them ([`Policy::Scored`] and
    /// [`Policy::Predicted`] picks). When the request ends, hand the
    /// features with the observed latencies to
    /// `decision.endpoint.latency().observe(..)`, so the model learns from
    /// whichever policy picks.
    pub latency: Option<(LatencyFeatures, Option<LatencyPrediction>)>,
}

impl Decision {
    /// The chosen replica's endpoint index (for retries' `exclude` and for
    /// [`Picker::record`](crate::Picker::record)).
    pub fn index(&self) -> usize {
        self.endpoint.index
    }

    /// Count this request against the chosen replica until the guard drops.
    pub fn acquire(&self) -> LoadGuard {
        self.endpoint.acquire(self.estimated_tokens)
    }

    /// The `x-infergate-scores` header value, best `limit` candidates.
    pub fn scores_header(&self, limit: usize) -> ScoresHeader<'_> {
        ScoresHeader {
            scores: &self.scores,
            limit,
        }
    }
}

/// Why no replica was picked.
#[derive(Debug, Clone, PartialEq)]
pub enum PickError {
    /// Every replica is unreachable or was already tried (503).
    NoReplicas,
    /// Replicas are reachable but none has fresh, healthy metrics, and the
    /// fallback is [`crate::Fallback::Refuse`] (503).
    NoHealthyReplicas { reachable: usize },
    /// Every healthy replica is saturated (429 with `Retry-After`).
    Saturated {
        retry_after: Duration,
        /// Requests waiting across the saturated replicas.
        waiting: u64,
    },
    /// Every candidate's model is trusted and none is predicted to meet
    /// the request's [`Slo`]. The request's band decides: `critical` picks
    /// again without the objectives, `standard` waits, `sheddable` is
    /// refused (429 with `Retry-After`).
    SloUnmet {
        /// The pool's `Retry-After` estimate for the requests queued on
        /// the candidates.
        retry_after: Duration,
        /// The prediction of the candidate with the least predicted cost.
        best: LatencyPrediction,
    },
}

impl fmt::Display for PickError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickError::NoReplicas => f.write_str("no reachable replica"),
            PickError::NoHealthyReplicas { reachable } => write!(
                f,
                "none of {reachable} reachable replicas has fresh, healthy metrics"
            ),
            PickError::Saturated {
                retry_after,
                waiting,
            } => write!(
                f,
                "every replica is saturated ({waiting} requests waiting); retry after {} s",
                retry_after.as_secs()
            ),
            PickError::SloUnmet { retry_after, best } => write!(
                f,
                "no replica is predicted to meet the latency objectives (best: {:.0} ms to \
                 first token, {:.1} ms per token); retry after {} s",
                best.ttft * 1e3,
                best.itl * 1e3,
                retry_after.as_secs()
            ),
        }
    }
}

impl std::error::Error for PickError {}
