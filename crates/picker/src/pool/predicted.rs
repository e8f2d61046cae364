//! The predicted pick: among the scored policy's candidates, the replica
//! with the least predicted cost of the request, where the cost is its
//! own end-to-end time plus the time it adds to the requests already on
//! that replica. It decides only when every candidate's model is trusted;
//! otherwise the scored policy does, except for a bounded share of picks
//! that explore a replica still being measured.

use std::sync::Arc;

use rand::Rng;

use super::decision::PickRequest;
use crate::endpoint::Endpoint;
use crate::policy::PredictConfig;
use crate::predict::{LatencyFeatures, LatencyPrediction};

/// Costs this close (seconds) are a tie.
const TIE_EPSILON: f64 = 1e-9;

/// The candidates as the scored filter left them: their places in the
/// snapshot and their latency features, candidate by candidate.
pub(super) struct Candidates<'a> {
    pub(super) snapshot: &'a [Arc<Endpoint>],
    pub(super) positions: &'a [usize],
    pub(super) features: &'a [LatencyFeatures],
}

impl Candidates<'_> {
    fn endpoint(&self, candidate: usize) -> &Endpoint {
        &self.snapshot[self.positions[candidate]]
    }
}

/// What the predictions decided.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// This candidate; `prediction` is `None` when it was explored.
    Chosen {
        candidate: usize,
        prediction: Option<LatencyPrediction>,
    },
    /// A candidate's model is not trusted: the scored policy decides.
    Untrusted,
    /// Every model is trusted and none meets the request's objectives.
    Unmet {
        /// The least-cost candidate's prediction.
        best: LatencyPrediction,
        /// Requests queued across the candidates.
        waiting: f64,
    },
}

/// Decide among `candidates` (at least one) for `req`.
pub(super) fn decide<R: Rng + ?Sized>(
    candidates: &Candidates<'_>,
    req: &PickRequest<'_>,
    config: &PredictConfig,
    rng: &mut R,
) -> Verdict {
    let output = match req.expected_output_tokens {
        0 => PredictConfig::DEFAULT_OUTPUT_TOKENS,
        n => n,
    } as f64;
    let newcomer = |status_observations: u64| status_observations < config.min_observations;
    let mut newcomers = 0u32;
    let mut untrusted = false;
    let mut best = Best::default();
    let mut best_met = Best::default();
    for (candidate, features) in candidates.features.iter().enumerate() {
        let status = candidates.endpoint(candidate).latency().status();
        newcomers += u32::from(newcomer(status.observations));
        let Some(fitted) = status.fitted.filter(|_| !untrusted) else {
            untrusted = true;
            continue;
        };
        let prediction = fitted.predict(features);
        let cost = cost(
            &prediction,
            fitted.itl_per_request(features),
            features,
            output,
        );
        best.offer(candidate, cost, prediction, rng);
        if req.slo.is_none_or(|slo| slo.met_by(&prediction)) {
            best_met.offer(candidate, cost, prediction, rng);
        }
    }
    // A comparison with NaN is false: an invalid share explores nothing.
    if newcomers > 0 && rng.r#gen::<f64>() < config.explore_share {
        let nth = rng.gen_range(0..newcomers) as usize;
        // A model that learned meanwhile may have left the newcomers; then
        // the pick goes on as if it had not explored.
        let explored = (0..candidates.features.len())
            .filter(|&c| newcomer(candidates.endpoint(c).latency().status().observations))
            .nth(nth);
        if let Some(candidate) = explored {
            return Verdict::Chosen {
                candidate,
                prediction: None,
            };
        }
    }
    if untrusted {
        return Verdict::Untrusted;
    }
    match (best_met.winner, best.winner) {
        (Some((candidate, _, prediction)), _) => Verdict::Chosen {
            candidate,
            prediction: Some(prediction),
        },
        (None, Some((_, _, best))) => Verdict::Unmet {
            best,
            waiting: candidates.features.iter().map(|f| f.waiting).sum(),
        },
        // No candidate at all: not called so.
        (None, None) => Verdict::Untrusted,
    }
}

/// The request's cost on a replica, in seconds: its own predicted time
/// to its last token, plus what it adds to the others. Each request queued
/// or running there is slowed by the ITL one more running request adds,
/// for as long as both generate: with answers of this request's expected
/// length, at every stage of their own, that is half of it on average.
fn cost(
    prediction: &LatencyPrediction,
    itl_per_request: f64,
    features: &LatencyFeatures,
    output: f64,
) -> f64 {
    let others = features.waiting + features.running;
    prediction.end_to_end(output) + itl_per_request * others * output / 2.0
}

/// The least cost so far, uniformly at random among ties.
#[derive(Default)]
struct Best {
    winner: Option<(usize, f64, LatencyPrediction)>,
    ties: u32,
}

impl Best {
    fn offer<R: Rng + ?Sized>(
        &mut self,
        candidate: usize,
        cost: f64,
        prediction: LatencyPrediction,
        rng: &mut R,
    ) {
        match self.winner {
            Some((_, best, _)) if cost > best + TIE_EPSILON => {}
            Some((_, best, _)) if cost >= best - TIE_EPSILON => {
                // Reservoir sampling keeps each tied candidate with equal odds.
                self.ties += 1;
                if rng.gen_range(0..self.ties) == 0 {
                    self.winner = Some((candidate, cost, prediction));
                }
            }
            _ => {
                self.winner = Some((candidate, cost, prediction));
                self.ties = 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_counts_the_others_slowed_for_half_an_answer() {
        let prediction = LatencyPrediction {
            ttft: 0.2,
            itl: 0.05,
        };
        let features = LatencyFeatures {
            waiting: 1.0,
            running: 3.0,
            ..LatencyFeatures::default()
        };
        // Own: 0.2 + 100 × 0.05 = 5.2 s; others: 4 × 0.01 × 50 = 2 s.
        let cost = cost(&prediction, 0.01, &features, 100.0);
        assert!((cost - 7.2).abs() < 1e-9, "{cost}");
    }
}
