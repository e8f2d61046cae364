//! The scored pick: filter (reachable, not excluded, healthy, unsaturated)
//! → scorers → weighted mean → highest total, random among ties.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;

use rand::Rng;

use super::simple::{self, is_candidate};
use super::{Decision, PickError, PickRequest, Pool};
use crate::endpoint::Endpoint;
use crate::explain::{CandidateScore, TopScores};
use crate::health::Health;
use crate::policy::{Fallback, PickerConfig, Policy};
use crate::prefix::MatchScratch;
use crate::scorers::{LoraFit, ScoreContext, Scorer, Signals};

/// Totals this close are a tie (they differ only by rounding).
const TIE_EPSILON: f64 = 1e-9;

/// Per-candidate working memory, kept per thread so a pick allocates
/// nothing once the buffers have grown to the pool's size.
#[derive(Default)]
struct Scratch {
    /// Candidate → position in the snapshot.
    positions: Vec<usize>,
    /// Candidate → endpoint index.
    indexes: Vec<usize>,
    signals: Vec<Signals>,
    matched: Vec<usize>,
    /// `Scorer::COUNT` columns of one score per candidate.
    columns: Vec<f64>,
    matching: MatchScratch,
}

impl Scratch {
    fn clear(&mut self) {
        self.positions.clear();
        self.indexes.clear();
        self.signals.clear();
        self.matched.clear();
        self.columns.clear();
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

pub(super) fn pick<R: Rng + ?Sized>(
    pool: &Pool,
    snapshot: &[Arc<Endpoint>],
    config: &PickerConfig,
    req: &PickRequest<'_>,
    now: Instant,
    exclude: &[usize],
    rng: &mut R,
) -> Result<Decision, PickError> {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => pick_with(pool, snapshot, config, req, now, exclude, rng, &mut scratch),
        // Only if a pick re-entered from inside another (a custom Rng).
        Err(_) => pick_with(
            pool,
            snapshot,
            config,
            req,
            now,
            exclude,
            rng,
            &mut Scratch::default(),
        ),
    })
}

#[allow(clippy::too_many_arguments)]
fn pick_with<R: Rng + ?Sized>(
    pool: &Pool,
    snapshot: &[Arc<Endpoint>],
    config: &PickerConfig,
    req: &PickRequest<'_>,
    now: Instant,
    exclude: &[usize],
    rng: &mut R,
    scratch: &mut Scratch,
) -> Result<Decision, PickError> {
    scratch.clear();
    let mut reachable = 0usize;
    let mut saturated = 0usize;
    let mut saturated_waiting = 0u64;
    for (position, endpoint) in snapshot.iter().enumerate() {
        if !is_candidate(endpoint, exclude) {
            continue;
        }
        reachable += 1;
        let glance = endpoint.glance();
        if glance.health(now, config.stale_after) != Health::Healthy {
            continue;
        }
        let waiting = glance.waiting;
        let kv_usage = glance.kv_usage.filter(|kv| kv.is_finite());
        // Requests sent since the scrape count as waiting, so a burst
        // between scrapes cannot overfill a replica that looked idle. A
        // queue of requests waiting for a LoRA slot says nothing about
        // capacity, so it does not saturate (KV usage still does).
        let projected_waiting = waiting
            .filter(|_| !glance.adapter_bound)
            .map(|w| w + endpoint.inflight_since_observation(glance.generation));
        if config.saturation.is_saturated(projected_waiting, kv_usage) {
            saturated += 1;
            saturated_waiting += waiting.unwrap_or(0);
            continue;
        }
        scratch.positions.push(position);
        scratch.indexes.push(endpoint.index);
        scratch.signals.push(Signals {
            waiting,
            kv_usage,
            inflight_requests: endpoint.load.requests(),
            inflight_tokens: endpoint.load.tokens(),
            unanswered: endpoint.load.unanswered(),
            prefix_blocks: 0,
            // Only an adapter request needs the adapter lists.
            lora: match req.adapter {
                None => LoraFit::NotRequested,
                adapter => LoraFit::classify(adapter, endpoint.observation().state.as_deref()),
            },
        });
    }

    if reachable == 0 {
        return Err(PickError::NoReplicas);
    }
    if scratch.signals.is_empty() {
        if saturated > 0 {
            return Err(PickError::Saturated {
                retry_after: pool.retry_after(saturated_waiting, saturated),
                waiting: saturated_waiting,
            });
        }
        return match config.fallback {
            Fallback::LeastRequest => simple::least_request(snapshot, exclude, rng)
                .map(|endpoint| Decision {
                    endpoint: Arc::clone(endpoint),
                    policy: Policy::Scored,
                    fallback: true,
                    top: None,
                    scores: Vec::new(),
                    estimated_tokens: req.estimated_tokens,
                })
                .ok_or(PickError::NoReplicas),
            Fallback::Refuse => Err(PickError::NoHealthyReplicas { reachable }),
        };
    }

    let count = scratch.signals.len();
    let weights = &config.weights;
    if !req.prefix_hashes.is_empty() && (weights.prefix > 0.0 || req.explain) {
        scratch.matched.resize(count, 0);
        pool.prefix.match_lengths_with(
            req.prefix_hashes,
            &scratch.indexes,
            &mut scratch.matched,
            &mut scratch.matching,
        );
        for (signals, &matched) in scratch.signals.iter_mut().zip(&scratch.matched) {
            signals.prefix_blocks = matched;
        }
    }

    let ctx = ScoreContext {
        prompt_blocks: req.prefix_hashes.len(),
        queue_depth: config.saturation.queue_depth,
        inflight_tolerance: config.inflight_tolerance,
    };
    scratch.columns.resize(Scorer::COUNT * count, 0.0);
    for (scorer, column) in Scorer::ALL
        .into_iter()
        .zip(scratch.columns.chunks_exact_mut(count))
    {
        if scorer.weight(weights) > 0.0 || req.explain {
            scorer.score(&scratch.signals, &ctx, column);
        }
    }

    let weight_sum = weights.sum();
    let total_of = |candidate: usize| -> f64 {
        if weight_sum <= 0.0 {
            return 0.0;
        }
        Scorer::ALL
            .into_iter()
            .enumerate()
            .map(|(k, scorer)| scorer.weight(weights) * scratch.columns[k * count + candidate])
            .sum::<f64>()
            / weight_sum
    };

    let mut winner = 0;
    let mut best = f64::NEG_INFINITY;
    let mut runner_up = f64::NEG_INFINITY;
    let mut ties = 0u32;
    for candidate in 0..count {
        let total = total_of(candidate);
        if total > best + TIE_EPSILON {
            runner_up = best;
            best = total;
            winner = candidate;
            ties = 1;
        } else if total >= best - TIE_EPSILON {
            runner_up = runner_up.max(total);
            // Reservoir sampling keeps each tied candidate with equal odds.
            ties += 1;
            if rng.gen_range(0..ties) == 0 {
                winner = candidate;
            }
        } else {
            runner_up = runner_up.max(total);
        }
    }

    let scores = if req.explain {
        let mut scores: Vec<CandidateScore> = (0..count)
            .map(|candidate| CandidateScore {
                endpoint: Arc::clone(&snapshot[scratch.positions[candidate]]),
                total: total_of(candidate),
                parts: std::array::from_fn(|k| scratch.columns[k * count + candidate]),
            })
            .collect();
        scores.sort_by(|a, b| b.total.total_cmp(&a.total));
        scores
    } else {
        Vec::new()
    };

    Ok(Decision {
        endpoint: Arc::clone(&snapshot[scratch.positions[winner]]),
        policy: Policy::Scored,
        fallback: false,
        top: Some(TopScores {
            winner: best,
            runner_up: (count > 1).then_some(runner_up),
        }),
        scores,
        estimated_tokens: req.estimated_tokens,
    })
}
