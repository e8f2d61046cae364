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
    /// Snapshot positions of a sampled pick, and which are in it.
    sample: Vec<usize>,
    marked: Vec<bool>,
    /// Endpoint indexes from the prefix index.
    holders: Vec<usize>,
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

/// Pools with more replicas than this are scored over a sample of them.
/// Scoring every replica costs O(replicas) per pick (about 50 µs at
/// 1,000), while the best of a few dozen random replicas is very likely
/// among the least loaded few percent of the pool (the "power of d
/// choices"). Up to this size a full scan costs a few microseconds and
/// stays exact.
pub const SAMPLE_ABOVE: usize = 128;
/// Random replicas in a sample.
pub const SAMPLE_RANDOM: usize = 32;
/// Replicas holding the prompt's longest cached prefix added to a sample,
/// so affinity survives sampling.
pub const SAMPLE_PREFIX: usize = 8;

/// Whether this pick scores a sample rather than the whole pool. Adapter
/// requests score the whole pool (no index of adapter residency to sample
/// from), as do explained picks (they report every candidate).
fn sampled(replicas: usize, config: &PickerConfig, req: &PickRequest<'_>) -> bool {
    replicas > SAMPLE_ABOVE && req.adapter.is_none() && !req.explain && config.weights.sum() > 0.0
}

/// Fill `scratch.sample` with distinct snapshot positions: the holders of
/// the prompt's longest cached prefix, then random replicas.
fn sample<R: Rng + ?Sized>(
    pool: &Pool,
    snapshot: &[Arc<Endpoint>],
    config: &PickerConfig,
    req: &PickRequest<'_>,
    rng: &mut R,
    scratch: &mut Scratch,
) {
    let Scratch {
        sample,
        marked,
        holders,
        ..
    } = scratch;
    sample.clear();
    marked.resize(snapshot.len(), false);
    let mut add = |position: usize, sample: &mut Vec<usize>| {
        if !marked[position] {
            marked[position] = true;
            sample.push(position);
        }
    };
    if config.weights.prefix > 0.0 && !req.prefix_hashes.is_empty() {
        holders.clear();
        pool.prefix.deepest_holders(
            req.prefix_hashes,
            SAMPLE_PREFIX,
            rng.gen_range(0..usize::MAX),
            holders,
        );
        for &index in holders.iter() {
            if let Some(position) = position_of(snapshot, index) {
                add(position, sample);
            }
        }
    }
    for _ in 0..SAMPLE_RANDOM {
        add(rng.gen_range(0..snapshot.len()), sample);
    }
    for &position in sample.iter() {
        marked[position] = false;
    }
}

/// The snapshot position of endpoint `index`: its own position unless
/// membership has changed since the pool was built.
fn position_of(snapshot: &[Arc<Endpoint>], index: usize) -> Option<usize> {
    match snapshot.get(index) {
        Some(endpoint) if endpoint.index == index => Some(index),
        _ => snapshot.iter().position(|endpoint| endpoint.index == index),
    }
}

/// What the filter saw of the replicas it considered.
#[derive(Default)]
struct Census {
    reachable: usize,
    saturated: usize,
    /// Requests waiting on the saturated replicas.
    saturated_waiting: u64,
}

impl Census {
    /// Filter one replica (reachable, not excluded, healthy, unsaturated)
    /// and, if it passes, add it to the candidates with its signals.
    #[allow(clippy::too_many_arguments)]
    fn consider(
        &mut self,
        position: usize,
        endpoint: &Arc<Endpoint>,
        config: &PickerConfig,
        req: &PickRequest<'_>,
        now: Instant,
        exclude: &[usize],
        scratch: &mut Scratch,
    ) {
        if !is_candidate(endpoint, exclude) {
            return;
        }
        self.reachable += 1;
        let glance = endpoint.glance();
        if glance.health(now, config.stale_after) != Health::Healthy {
            return;
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
            self.saturated += 1;
            self.saturated_waiting += waiting.unwrap_or(0);
            return;
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
    let mut census = Census::default();
    if sampled(snapshot.len(), config, req) {
        sample(pool, snapshot, config, req, rng, scratch);
        // Taken out while `consider` fills the rest of the scratch; put
        // back so its buffer is reused.
        let positions = std::mem::take(&mut scratch.sample);
        for &position in &positions {
            census.consider(
                position,
                &snapshot[position],
                config,
                req,
                now,
                exclude,
                scratch,
            );
        }
        scratch.sample = positions;
        if scratch.signals.is_empty() {
            // Nothing usable in the sample: decide on the whole pool, so
            // the pool is only called saturated when all of it is.
            scratch.clear();
            census = Census::default();
        }
    }
    if scratch.signals.is_empty() {
        for (position, endpoint) in snapshot.iter().enumerate() {
            census.consider(position, endpoint, config, req, now, exclude, scratch);
        }
    }
    let Census {
        reachable,
        saturated,
        saturated_waiting,
    } = census;

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
