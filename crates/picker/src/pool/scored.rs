//! The scored pick, in the steps docs/picker.md names: the candidates
//! (reachable, not draining, not excluded, healthy, unsaturated; over a
//! sample in large pools), their prefix matches and latency features, the
//! predicted pick when the policy is [`Policy::Predicted`] and its models
//! decide, then the scores, the choice (highest weighted total, random
//! among ties) and, when asked, the explanation.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use super::decision::{Decision, PickError, PickRequest};
use super::predicted::{self, Verdict};
use super::simple::{self, is_candidate};
use crate::endpoint::Endpoint;
use crate::explain::{CandidateScore, TopScores};
use crate::health::Health;
use crate::policy::{Fallback, PickerConfig, Policy, Weights};
use crate::predict::{LatencyFeatures, LatencyPrediction};
use crate::prefix::{ExactPrefix, MatchScratch, PrefixIndex, PrefixSource};
use crate::scorers::{Features, LoraFit, ScoreContext, Scorer};
use crate::session::{self, SessionFit};

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
    signals: Vec<Features>,
    /// Candidates' latency features, for the predicted pick and the
    /// decision.
    latency: Vec<LatencyFeatures>,
    matched: Vec<usize>,
    /// Candidates' exact shares of the prompt, where events say.
    exact: Vec<Option<f64>>,
    /// `Scorer::COUNT` columns of one score per candidate.
    columns: Vec<f64>,
    matching: MatchScratch,
    /// Snapshot positions of a sampled pick, and which are in it.
    sample: Vec<usize>,
    marked: Vec<bool>,
    /// Endpoint indexes from the prefix index.
    holders: Vec<usize>,
    /// Candidates' in-flight requests and session fits, for the session's
    /// home.
    inflight: Vec<u64>,
    fits: Vec<SessionFit>,
}

impl Scratch {
    fn clear(&mut self) {
        self.positions.clear();
        self.indexes.clear();
        self.signals.clear();
        self.latency.clear();
        self.matched.clear();
        self.exact.clear();
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

/// One scored pick's inputs, shared by its steps: the request, the clock,
/// and what the pool lends it for the pick (borrowed, not copied).
pub(super) struct ScoredPick<'a> {
    /// The pool's membership snapshot.
    pub(super) snapshot: &'a [Arc<Endpoint>],
    pub(super) config: &'a PickerConfig,
    pub(super) req: &'a PickRequest<'a>,
    pub(super) now: Instant,
    /// Endpoint indexes this request already tried.
    pub(super) exclude: &'a [usize],
    /// The pool's memory of where prompts went.
    pub(super) prefix: &'a PrefixIndex,
    /// `Retry-After` for `waiting` requests queued across `replicas`
    /// saturated replicas; called only when every healthy replica is
    /// saturated.
    pub(super) retry_after: &'a dyn Fn(u64, usize) -> Duration,
}

impl ScoredPick<'_> {
    /// Run the pick over this thread's scratch buffers.
    pub(super) fn pick<R: Rng + ?Sized>(&self, rng: &mut R) -> Result<Decision, PickError> {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => self.run(rng, &mut scratch),
            // Only if a pick re-entered from inside another (a custom Rng).
            Err(_) => self.run(rng, &mut Scratch::default()),
        })
    }

    /// The steps of docs/picker.md, "A pick, step by step".
    fn run<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        scratch: &mut Scratch,
    ) -> Result<Decision, PickError> {
        let census = self.candidates(rng, scratch);
        if scratch.signals.is_empty() {
            return self.without_candidates(&census, rng);
        }
        self.prefix_matches(scratch);
        self.latency_features(scratch);
        if self.predicts()
            && let Some(decided) = self.predicted(rng, scratch)
        {
            return decided;
        }
        self.session_home(scratch);
        self.score(scratch);
        let weights = self.weights();
        let totals = self.totals(&weights, scratch);
        let choice = choose(&totals, rng);
        let scores = if self.req.explain {
            self.explain(&totals, &scratch.positions, choice.winner)
        } else {
            Vec::new()
        };
        let winner = choice.winner;
        let prediction = self.snapshot[scratch.positions[winner]]
            .latency()
            .predict(&scratch.latency[winner]);
        Ok(self.decision(
            Policy::Scored,
            winner,
            prediction,
            scratch,
            Some(choice.top),
            scores,
        ))
    }

    /// The predicted pick ([`Policy::Predicted`]): its decision or its
    /// refusal, or `None` when a model is untrusted and the scored steps
    /// decide.
    fn predicted<R: Rng + ?Sized>(
        &self,
        rng: &mut R,
        scratch: &mut Scratch,
    ) -> Option<Result<Decision, PickError>> {
        let candidates = predicted::Candidates {
            snapshot: self.snapshot,
            positions: &scratch.positions,
            features: &scratch.latency,
        };
        match predicted::decide(&candidates, self.req, &self.config.predict, rng) {
            Verdict::Chosen {
                candidate,
                prediction,
            } => {
                // An explanation lists the scores, with the choice first.
                let scores = if self.req.explain {
                    self.session_home(scratch);
                    self.score(scratch);
                    let weights = self.weights();
                    let totals = self.totals(&weights, scratch);
                    self.explain(&totals, &scratch.positions, candidate)
                } else {
                    Vec::new()
                };
                Some(Ok(self.decision(
                    Policy::Predicted,
                    candidate,
                    prediction,
                    scratch,
                    None,
                    scores,
                )))
            }
            Verdict::Unmet { best, waiting } => Some(Err(PickError::SloUnmet {
                retry_after: (self.retry_after)(waiting.round() as u64, scratch.signals.len()),
                best,
            })),
            Verdict::Untrusted => None,
        }
    }

    /// Whether the predictions may decide this pick: under the predicted
    /// policy, for requests that name no LoRA adapter (adapter residency
    /// is not among the models' features, so the scored policy, which
    /// weighs it, decides those).
    fn predicts(&self) -> bool {
        self.config.policy == Policy::Predicted && self.req.adapter.is_none()
    }

    /// The weights in force. Without a session the session scorer does
    /// not take part, so sessionless picks total exactly as they would
    /// without it.
    fn weights(&self) -> Weights {
        let mut weights = self.config.weights;
        if self.req.session.is_none() {
            weights.session = 0.0;
        }
        weights
    }

    fn totals<'w>(&self, weights: &'w Weights, scratch: &'w Scratch) -> Totals<'w> {
        Totals {
            weights,
            weight_sum: weights.sum(),
            columns: &scratch.columns,
            count: scratch.signals.len(),
        }
    }

    /// The decision for `candidate`, chosen by `policy`.
    fn decision(
        &self,
        policy: Policy,
        candidate: usize,
        prediction: Option<LatencyPrediction>,
        scratch: &Scratch,
        top: Option<TopScores>,
        scores: Vec<CandidateScore>,
    ) -> Decision {
        Decision {
            endpoint: Arc::clone(&self.snapshot[scratch.positions[candidate]]),
            policy,
            fallback: false,
            top,
            scores,
            estimated_tokens: self.req.estimated_tokens,
            prefix_source: scratch.signals[candidate].prefix_source,
            latency: Some((scratch.latency[candidate], prediction)),
        }
    }

    /// Fill the scratch with the candidates and their signals: reachable,
    /// not draining, not excluded, healthy and unsaturated replicas. A large pool is
    /// filtered over a sample, and whole only when no sampled replica
    /// passes, so the pool is only called saturated when all of it is.
    fn candidates<R: Rng + ?Sized>(&self, rng: &mut R, scratch: &mut Scratch) -> Census {
        scratch.clear();
        if self.sampled() {
            self.sample(rng, scratch);
            let mut census = Census::default();
            // Taken out while `consider` fills the rest of the scratch; put
            // back so its buffer is reused.
            let positions = std::mem::take(&mut scratch.sample);
            for &position in &positions {
                self.consider(&mut census, position, &self.snapshot[position], scratch);
            }
            scratch.sample = positions;
            if !scratch.signals.is_empty() {
                return census;
            }
            scratch.clear();
        }
        let mut census = Census::default();
        for (position, endpoint) in self.snapshot.iter().enumerate() {
            self.consider(&mut census, position, endpoint, scratch);
        }
        census
    }

    /// Whether this pick scores a sample rather than the whole pool.
    /// Adapter requests score the whole pool (no index of adapter residency
    /// to sample from), as do explained picks (they report every
    /// candidate).
    fn sampled(&self) -> bool {
        self.snapshot.len() > SAMPLE_ABOVE
            && self.req.adapter.is_none()
            && !self.req.explain
            && self.config.weights.sum() > 0.0
    }

    /// Fill `scratch.sample` with distinct snapshot positions: the holders
    /// of the prompt's longest cached prefix, then random replicas.
    fn sample<R: Rng + ?Sized>(&self, rng: &mut R, scratch: &mut Scratch) {
        let snapshot = self.snapshot;
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
        if self.config.weights.prefix > 0.0 && !self.req.prefix_hashes.is_empty() {
            holders.clear();
            self.prefix.deepest_holders(
                self.req.prefix_hashes,
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

    /// Filter one replica (reachable, not draining, not excluded, healthy,
    /// unsaturated), count it in the census, and if it passes add it to the
    /// candidates with its signals.
    fn consider(
        &self,
        census: &mut Census,
        position: usize,
        endpoint: &Arc<Endpoint>,
        scratch: &mut Scratch,
    ) {
        if !is_candidate(endpoint, self.exclude) {
            return;
        }
        census.reachable += 1;
        let summary = endpoint.summary();
        if summary.health(self.now, self.config.stale_after) != Health::Healthy {
            return;
        }
        let waiting = summary.waiting;
        let kv_usage = summary.kv_usage.filter(|kv| kv.is_finite());
        // Requests sent since the scrape count as waiting, so a burst
        // between scrapes cannot overfill a replica that looked idle. A
        // queue of requests waiting for a LoRA slot says nothing about
        // capacity, so it does not saturate (KV usage still does).
        let arrived = endpoint.inflight_since_observation(summary.generation);
        let projected_waiting = waiting
            .filter(|_| !summary.adapter_bound)
            .map(|w| w + arrived);
        if self
            .config
            .saturation
            .for_share(self.req.queue_share)
            .is_saturated(projected_waiting, kv_usage)
        {
            census.saturated += 1;
            census.saturated_waiting += waiting.unwrap_or(0);
            return;
        }
        let inflight = endpoint.load.requests();
        let unanswered = endpoint.load.unanswered();
        scratch.positions.push(position);
        scratch.indexes.push(endpoint.index);
        // The prompt's split between prefill and cache comes with the
        // prefix matches (`latency_features`).
        scratch.latency.push(LatencyFeatures {
            waiting: (waiting.unwrap_or(0) + arrived).max(unanswered) as f64,
            running: summary.running.unwrap_or(inflight) as f64,
            kv_usage: kv_usage.unwrap_or(0.0).clamp(0.0, 1.0),
            new_prompt_tokens: 0.0,
            cached_prompt_tokens: 0.0,
        });
        scratch.signals.push(Features {
            waiting,
            kv_usage,
            inflight_requests: inflight,
            inflight_tokens: endpoint.load.tokens(),
            unanswered,
            prefix_blocks: 0,
            prefix_source: PrefixSource::Approximate,
            // Only an adapter request needs the adapter lists.
            lora: match self.req.adapter {
                None => LoraFit::NotRequested,
                adapter => LoraFit::classify(adapter, endpoint.observation().state.as_deref()),
            },
            token_time: endpoint.token_time(),
            session: SessionFit::NoSession,
        });
    }

    /// No candidate: no replica to try (503), every healthy one saturated
    /// (429 with `Retry-After`), or none healthy (the fallback decides).
    fn without_candidates<R: Rng + ?Sized>(
        &self,
        census: &Census,
        rng: &mut R,
    ) -> Result<Decision, PickError> {
        if census.reachable == 0 {
            return Err(PickError::NoReplicas);
        }
        if census.saturated > 0 {
            return Err(PickError::Saturated {
                retry_after: (self.retry_after)(census.saturated_waiting, census.saturated),
                waiting: census.saturated_waiting,
            });
        }
        match self.config.fallback {
            Fallback::LeastRequest => simple::least_request(self.snapshot, self.exclude, rng)
                .map(|endpoint| Decision {
                    endpoint: Arc::clone(endpoint),
                    policy: Policy::Scored,
                    fallback: true,
                    top: None,
                    scores: Vec::new(),
                    estimated_tokens: self.req.estimated_tokens,
                    prefix_source: PrefixSource::Approximate,
                    // Without fresh metrics there are no features to
                    // learn from.
                    latency: None,
                })
                .ok_or(PickError::NoReplicas),
            Fallback::Refuse => Err(PickError::NoHealthyReplicas {
                reachable: census.reachable,
            }),
        }
    }

    /// Each candidate's leading prompt blocks in the prefix index, into its
    /// signals. Skipped when nothing reads them: the prefix scorer, an
    /// explanation, or the predicted policy's latency features.
    fn prefix_matches(&self, scratch: &mut Scratch) {
        let req = self.req;
        let read = self.config.weights.prefix > 0.0
            || req.explain
            || self.config.policy == Policy::Predicted;
        if !req.prefix_hashes.is_empty() && read {
            scratch.matched.resize(scratch.signals.len(), 0);
            self.prefix.match_lengths_with(
                req.prefix_hashes,
                &scratch.indexes,
                &mut scratch.matched,
                &mut scratch.matching,
            );
            for (signals, &matched) in scratch.signals.iter_mut().zip(&scratch.matched) {
                signals.prefix_blocks = matched;
            }
            if let Some(exact) = req.exact_prefix {
                self.exact_matches(exact, scratch);
            }
        }
    }

    /// The engines' own word, where they have one, in place of the
    /// approximate index's: their share of the prompt, in the same blocks.
    fn exact_matches(&self, exact: &dyn ExactPrefix, scratch: &mut Scratch) {
        let prompt_blocks = self.req.prefix_hashes.len() as f64;
        scratch.exact.clear();
        scratch.exact.resize(scratch.signals.len(), None);
        exact.shares(&scratch.indexes, &mut scratch.exact);
        for (signals, share) in scratch.signals.iter_mut().zip(&scratch.exact) {
            if let Some(share) = share {
                signals.prefix_blocks = (share.clamp(0.0, 1.0) * prompt_blocks).round() as usize;
                signals.prefix_source = PrefixSource::Events;
            }
        }
    }

    /// Each candidate's share of the prompt it is believed to hold (its
    /// prefix matches), as cached and new prompt tokens in its latency
    /// features.
    fn latency_features(&self, scratch: &mut Scratch) {
        let prompt = self.req.prompt_tokens as f64;
        let blocks = self.req.prefix_hashes.len();
        for (latency, signals) in scratch.latency.iter_mut().zip(&scratch.signals) {
            let held = match blocks {
                0 => 0.0,
                blocks => (signals.prefix_blocks as f64 / blocks as f64).min(1.0),
            };
            latency.cached_prompt_tokens = (prompt * held).round();
            latency.new_prompt_tokens = prompt - latency.cached_prompt_tokens;
        }
    }

    /// The session's home among the candidates, into their signals.
    /// Skipped without a session, or when nothing reads it.
    fn session_home(&self, scratch: &mut Scratch) {
        let Some(key) = self.req.session else {
            return;
        };
        if self.config.weights.session <= 0.0 && !self.req.explain {
            return;
        }
        let Scratch {
            positions,
            signals,
            inflight,
            fits,
            ..
        } = scratch;
        inflight.clear();
        inflight.extend(signals.iter().map(|s| s.inflight_requests));
        fits.clear();
        fits.resize(signals.len(), SessionFit::NoSession);
        let addrs = positions.iter().map(|&p| &*self.snapshot[p].addr);
        session::assign(key, addrs, inflight, fits);
        for (signals, &fit) in signals.iter_mut().zip(fits.iter()) {
            signals.session = fit;
        }
    }

    /// One column of scores per scorer, one score per candidate. A scorer
    /// with no weight is skipped unless the pick is explained.
    fn score(&self, scratch: &mut Scratch) {
        let count = scratch.signals.len();
        let ctx = ScoreContext {
            prompt_blocks: self.req.prefix_hashes.len(),
            queue_depth: self.config.saturation.queue_depth,
            inflight_tolerance: self.config.inflight_tolerance,
        };
        scratch.columns.resize(Scorer::COUNT * count, 0.0);
        for (scorer, column) in Scorer::ALL
            .into_iter()
            .zip(scratch.columns.chunks_exact_mut(count))
        {
            if scorer.weight(&self.config.weights) > 0.0 || self.req.explain {
                scorer.score(&scratch.signals, &ctx, column);
            }
        }
    }

    /// Every candidate's scores, best first: the winner heads the list
    /// even when others tie with it.
    fn explain(
        &self,
        totals: &Totals<'_>,
        positions: &[usize],
        winner: usize,
    ) -> Vec<CandidateScore> {
        let mut order: Vec<usize> = (0..totals.count).collect();
        order.sort_by(|&a, &b| {
            (b == winner)
                .cmp(&(a == winner))
                .then(totals.of(b).total_cmp(&totals.of(a)))
        });
        order
            .into_iter()
            .map(|candidate| CandidateScore {
                endpoint: Arc::clone(&self.snapshot[positions[candidate]]),
                total: totals.of(candidate),
                parts: std::array::from_fn(|k| totals.part(k, candidate)),
            })
            .collect()
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

/// The snapshot position of endpoint `index`: its own position unless
/// membership has changed since the pool was built.
fn position_of(snapshot: &[Arc<Endpoint>], index: usize) -> Option<usize> {
    match snapshot.get(index) {
        Some(endpoint) if endpoint.index == index => Some(index),
        _ => snapshot.iter().position(|endpoint| endpoint.index == index),
    }
}

/// The weighted mean of each candidate's scores.
struct Totals<'a> {
    weights: &'a Weights,
    weight_sum: f64,
    /// `Scorer::COUNT` columns of `count` scores.
    columns: &'a [f64],
    count: usize,
}

impl Totals<'_> {
    fn of(&self, candidate: usize) -> f64 {
        if self.weight_sum <= 0.0 {
            return 0.0;
        }
        Scorer::ALL
            .into_iter()
            .enumerate()
            .map(|(k, scorer)| scorer.weight(self.weights) * self.part(k, candidate))
            .sum::<f64>()
            / self.weight_sum
    }

    /// Scorer `k`'s score of `candidate`.
    fn part(&self, k: usize, candidate: usize) -> f64 {
        self.columns[k * self.count + candidate]
    }
}

/// The winner, and the totals the decision reports.
struct Choice {
    /// Candidate number.
    winner: usize,
    top: TopScores,
}

/// The highest total, uniformly at random among ties.
fn choose<R: Rng + ?Sized>(totals: &Totals<'_>, rng: &mut R) -> Choice {
    let mut winner = 0;
    let mut best = f64::NEG_INFINITY;
    let mut runner_up = f64::NEG_INFINITY;
    let mut ties = 0u32;
    for candidate in 0..totals.count {
        let total = totals.of(candidate);
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
    Choice {
        winner,
        top: TopScores {
            winner: best,
            runner_up: (totals.count > 1).then_some(runner_up),
        },
    }
}
