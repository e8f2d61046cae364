//! The best static allocation of a scenario's traffic, computed from the
//! engine profiles rather than measured: what a router that knew every
//! replica's cost model, but nothing of its moment-to-moment state, would
//! do.
//!
//! A static allocation sends each replica a fixed share of the arrivals,
//! whatever the replicas hold (a weighted random split), so Poisson
//! arrivals stay Poisson at every replica. The allocation is the split of
//! the arrival rate that minimises the mean end-to-end time.
//!
//! **Each replica is a queue whose completion rate depends on how many
//! requests it holds.** With `b` requests in its batch (at most its slots,
//! `max_num_seqs`, and what its KV cache holds of the mean request), every
//! decode step of the engine gives each of them one token and takes
//! `d(b)`, the roofline's time for `b` sequences at the mean context; a
//! request's prefill adds `p(b)`, the roofline's time for a step that
//! prefills the mean prompt beside `b − 1` decoding sequences less the time
//! those sequences' decode step alone would take. With `O` output tokens,
//! one of them sampled by the prefill step, the replica completes requests
//! at
//!
//! ```text
//! X(b) = b / ((O − 1) · d(b) + b · p(b))
//! ```
//!
//! and beyond its slots, requests wait and the rate stays at `X(slots)`.
//! The timing is the simulator's own ([`sim::engine::timing`]), at the
//! scenario's mean prompt and output lengths.
//!
//! **The queue.** With Poisson arrivals at rate `λ`, the number of requests
//! in the replica is a birth-death chain (up at `λ`, down at `X(min(n,
//! slots))`); its stationary distribution gives the mean number `N(λ)` and,
//! by Little's law, the mean time in the replica `N(λ) / λ`. While the
//! batch has room the replica shares its speed among the requests it
//! holds, as a processor-sharing server whose speed depends on its
//! occupancy; the mean time in such a queue does not depend on how the work
//! of a request is distributed, so the chain is exact there for the means.
//! Queued beyond the slots, requests are served first come, first served,
//! where the chain assumes exponential work: an approximation.
//!
//! **The split.** The fleet's mean e2e is `Σ N_i(λ_i) / Λ`, to be minimised
//! over `Σ λ_i = Λ`, `0 ≤ λ_i < X_i(slots_i)`. Each `N_i` is convex, so the
//! optimum gives every replica that receives traffic the same marginal
//! cost `N_i'(λ_i) = ν` (and a replica whose first request would cost more
//! than `ν` nothing). For a birth-death chain with arrival rate `λ`,
//! `N'(λ) = Var(N) / λ`, exactly. The split is found by bisection on `ν`,
//! with each `λ_i(ν)` found by bisection on `N_i'`.
//!
//! A dynamic policy sees the replicas' state and can do better than any
//! static split (joining the shorter queue beats a random split): a
//! measured mean below the best static allocation's is possible.

use serde::Serialize;
use sim::engine::EngineConfig;
use sim::engine::timing::{Roofline, StepLoad};

use crate::workload::RequestPlan;

/// The mean request of a workload, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RequestShape {
    pub prompt_tokens: f64,
    pub output_tokens: f64,
}

impl RequestShape {
    /// The mean prompt (as the simulated engine counts its tokens) and
    /// answer of `plans`; `None` when there are none.
    pub fn of(plans: &[RequestPlan]) -> Option<Self> {
        if plans.is_empty() {
            return None;
        }
        let n = plans.len() as f64;
        let prompt: usize = plans.iter().map(|p| p.prompt_ids().len()).sum();
        let output: u64 = plans.iter().map(|p| u64::from(p.max_tokens)).sum();
        Some(RequestShape {
            prompt_tokens: prompt as f64 / n,
            output_tokens: output as f64 / n,
        })
    }
}

/// The best static allocation of one load of a scenario, as the report
/// prints it and `NAME.json` keeps it (`static_allocation`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StaticAllocation {
    /// Offered load, a fraction of the fleet's estimated capacity.
    pub load: f64,
    /// Offered requests per second.
    pub requests_per_s: f64,
    /// The mean request the replicas were modelled for.
    pub request: RequestShape,
    /// Each replica's part, in fleet order; empty when no split keeps up.
    pub replicas: Vec<ReplicaShare>,
    /// Mean end-to-end time of the best split; `None` when the fleet
    /// cannot complete the offered rate at all.
    pub mean_e2e_ms: Option<f64>,
    /// The model's mean for an even split (round-robin's shares); `None`
    /// when a replica cannot keep up with its share.
    pub even_split_mean_e2e_ms: Option<f64>,
}

/// One replica's part of a static allocation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReplicaShare {
    pub hardware: String,
    /// Fraction of the arrivals.
    pub share: f64,
    pub requests_per_s: f64,
    /// Mean end-to-end time of its requests; `None` when it gets none.
    pub mean_e2e_ms: Option<f64>,
}

impl StaticAllocation {
    /// The best static split of `requests_per_s` over `engines` for
    /// requests of `shape`.
    pub fn compute(
        engines: &[EngineConfig],
        shape: RequestShape,
        load: f64,
        requests_per_s: f64,
    ) -> Self {
        let models: Vec<ServiceModel> = engines
            .iter()
            .map(|cfg| ServiceModel::from_engine(cfg, shape))
            .collect();
        let best = best_static(&models, requests_per_s);
        let replicas = best
            .as_ref()
            .map(|best| {
                engines
                    .iter()
                    .zip(best.shares())
                    .zip(best.rates.iter().zip(&best.replica_e2e))
                    .map(|((cfg, share), (rate, e2e))| ReplicaShare {
                        hardware: cfg.hardware.name.to_owned(),
                        share,
                        requests_per_s: *rate,
                        mean_e2e_ms: e2e.map(|s| s * 1e3),
                    })
                    .collect()
            })
            .unwrap_or_default();
        StaticAllocation {
            load,
            requests_per_s,
            request: shape,
            replicas,
            mean_e2e_ms: best.map(|b| b.mean_e2e * 1e3),
            even_split_mean_e2e_ms: even_split(&models, requests_per_s).map(|e| e.mean_e2e * 1e3),
        }
    }
}

/// One replica as a queue: its completion rate with `n` requests in it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceModel {
    /// Requests completed per second with `k` requests in the batch, for
    /// `k = 1..=slots` (index `k − 1`); more requests wait and the rate
    /// stays at the last.
    rates: Vec<f64>,
}

/// What the chain gives at one arrival rate.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Moments {
    mean: f64,
    variance: f64,
}

impl ServiceModel {
    /// A replica whose completion rate with `k` requests in it is
    /// `rates[k − 1]`, and the last rate beyond.
    ///
    /// # Panics
    /// If `rates` is empty or holds a rate that is not positive and finite.
    pub fn from_rates(rates: Vec<f64>) -> Self {
        assert!(!rates.is_empty(), "a replica serves at least one request");
        assert!(
            rates.iter().all(|r| r.is_finite() && *r > 0.0),
            "completion rates must be positive: {rates:?}"
        );
        ServiceModel { rates }
    }

    /// The replica `cfg` serving requests of `shape`, from the simulator's
    /// roofline (see the module docs).
    pub fn from_engine(cfg: &EngineConfig, shape: RequestShape) -> Self {
        let roofline = Roofline::new(cfg);
        let slowdown = if cfg.slowdown.is_finite() && cfg.slowdown > 0.0 {
            cfg.slowdown
        } else {
            1.0
        };
        let prompt = shape.prompt_tokens.round().max(1.0) as u32;
        let output = shape.output_tokens.round().max(1.0) as u32;
        let context = prompt + output / 2;
        // The batch is bounded by the slots and by the KV cache's room for
        // whole mean requests.
        let per_request = u64::from(prompt + output);
        let fits = (u64::from(cfg.kv_capacity_tokens()) / per_request.max(1)).max(1);
        let slots = u64::from(cfg.max_num_seqs.max(1)).min(fits) as u32;
        let budget = cfg.max_num_batched_tokens.max(1);
        let decode = |b: u32| {
            if b == 0 {
                0.0
            } else {
                roofline.decode_seconds(b, context) * slowdown
            }
        };
        // The extra time of the steps that prefill one prompt beside
        // `others` decoding sequences, chunk by chunk within the budget.
        let prefill_beside = |others: u32| {
            let mut seconds = 0.0;
            let mut done = 0;
            while done < prompt {
                let room = budget.saturating_sub(others).max(1);
                let chunk = (prompt - done).min(room);
                let mut load = StepLoad::default();
                for _ in 0..others {
                    load.add_chunk(context, 1, true, false);
                }
                load.add_chunk(done, chunk, done + chunk == prompt, false);
                seconds += roofline.step_seconds(&load) * slowdown - decode(others);
                done += chunk;
            }
            seconds
        };
        let rates = (1..=slots)
            .map(|b| {
                let busy = f64::from(output.saturating_sub(1)) * decode(b)
                    + f64::from(b) * prefill_beside(b - 1);
                f64::from(b) / busy
            })
            .collect();
        ServiceModel::from_rates(rates)
    }

    /// Requests the replica can complete per second when kept full: no
    /// static share at or above this is stable.
    pub fn capacity(&self) -> f64 {
        *self.rates.last().expect("at least one rate")
    }

    /// Completion rate with `k` requests in the batch (`k ≥ 1`).
    pub fn rate(&self, k: usize) -> f64 {
        self.rates[k.clamp(1, self.rates.len()) - 1]
    }

    /// Mean number of requests in the replica at arrival rate `lambda`;
    /// `None` when the queue grows without bound.
    pub fn mean_in_system(&self, lambda: f64) -> Option<f64> {
        self.moments(lambda).map(|m| m.mean)
    }

    /// Mean seconds a request spends in the replica at arrival rate
    /// `lambda`; `None` when the queue grows without bound.
    pub fn mean_response(&self, lambda: f64) -> Option<f64> {
        if lambda <= 0.0 {
            return Some(1.0 / self.rate(1));
        }
        self.moments(lambda).map(|m| m.mean / lambda)
    }

    /// `dN/dλ`: what one more request per second adds to the requests in
    /// the replica. Infinite at or beyond capacity.
    pub fn marginal(&self, lambda: f64) -> f64 {
        if lambda <= f64::MIN_POSITIVE {
            return 1.0 / self.rate(1);
        }
        match self.moments(lambda) {
            Some(m) => m.variance / lambda,
            None => f64::INFINITY,
        }
    }

    /// Mean and variance of the number in the replica: the stationary
    /// distribution of the birth-death chain, weights kept as logarithms
    /// (a fast replica's first states can outweigh each other by hundreds
    /// of orders of magnitude), with the geometric tail beyond the slots in
    /// closed form.
    fn moments(&self, lambda: f64) -> Option<Moments> {
        if lambda <= 0.0 {
            return Some(Moments {
                mean: 0.0,
                variance: 0.0,
            });
        }
        let slots = self.rates.len();
        let r = lambda / self.capacity();
        // Also refuses a NaN rate.
        if r.is_nan() || r >= 1.0 {
            return None;
        }
        let mut logs = Vec::with_capacity(slots + 1);
        let mut log = 0.0;
        logs.push(log);
        for rate in &self.rates {
            log += lambda.ln() - rate.ln();
            logs.push(log);
        }
        let peak = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (mut z, mut first, mut second) = (0.0, 0.0, 0.0);
        for (n, log) in logs.iter().enumerate() {
            let w = (log - peak).exp();
            let n = n as f64;
            z += w;
            first += n * w;
            second += n * n * w;
        }
        // States slots + j, j ≥ 1: weight w_S r^j.
        let w_s = (logs[slots] - peak).exp();
        let s = slots as f64;
        let q = 1.0 - r;
        z += w_s * r / q;
        first += w_s * (s * r / q + r / (q * q));
        second += w_s * (s * s * r / q + 2.0 * s * r / (q * q) + r * (1.0 + r) / (q * q * q));
        let mean = first / z;
        let variance = (second / z - mean * mean).max(0.0);
        Some(Moments { mean, variance })
    }
}

/// A split of the arrivals over the replicas and what the model predicts
/// for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Requests per second sent to each replica.
    pub rates: Vec<f64>,
    /// Mean seconds in each replica (`None` for a replica sent nothing).
    pub replica_e2e: Vec<Option<f64>>,
    /// Mean end-to-end seconds over all requests.
    pub mean_e2e: f64,
}

impl Allocation {
    /// Each replica's share of the arrivals.
    pub fn shares(&self) -> Vec<f64> {
        let total: f64 = self.rates.iter().sum();
        self.rates.iter().map(|r| r / total).collect()
    }
}

/// What the model predicts for a given split (`rates` per replica);
/// `None` when a replica's share exceeds what it can complete.
pub fn evaluate(models: &[ServiceModel], rates: &[f64]) -> Option<Allocation> {
    assert_eq!(models.len(), rates.len(), "one rate per replica");
    let total: f64 = rates.iter().sum();
    if total <= 0.0 {
        return None;
    }
    let mut in_system = 0.0;
    let mut replica_e2e = Vec::with_capacity(models.len());
    for (model, &rate) in models.iter().zip(rates) {
        let n = model.mean_in_system(rate)?;
        in_system += n;
        replica_e2e.push((rate > 0.0).then(|| n / rate));
    }
    Some(Allocation {
        rates: rates.to_vec(),
        replica_e2e,
        mean_e2e: in_system / total,
    })
}

/// The same share of `total` for every replica (what round-robin or a
/// uniform random pick sends); `None` when a replica cannot keep up.
pub fn even_split(models: &[ServiceModel], total: f64) -> Option<Allocation> {
    let each = total / models.len() as f64;
    evaluate(models, &vec![each; models.len()])
}

/// The split of `total` requests per second that minimises the mean
/// end-to-end time (see the module docs); `None` when the fleet cannot
/// complete `total` per second at all.
pub fn best_static(models: &[ServiceModel], total: f64) -> Option<Allocation> {
    if models.is_empty() || total.is_nan() || total <= 0.0 {
        return None;
    }
    let capacity: f64 = models.iter().map(ServiceModel::capacity).sum();
    if total >= capacity {
        return None;
    }
    let sum_at = |nu: f64| -> (f64, Vec<f64>) {
        let rates: Vec<f64> = models.iter().map(|m| rate_at_marginal(m, nu)).collect();
        (rates.iter().sum(), rates)
    };
    // ν at which no replica gets traffic, then one at which they get more
    // than `total` between them.
    let mut low = models
        .iter()
        .map(|m| m.marginal(0.0))
        .fold(f64::INFINITY, f64::min);
    let mut high = low.max(f64::MIN_POSITIVE) * 2.0;
    while sum_at(high).0 < total {
        high *= 2.0;
        if !high.is_finite() {
            return None;
        }
    }
    for _ in 0..200 {
        let mid = 0.5 * (low + high);
        if sum_at(mid).0 < total {
            low = mid;
        } else {
            high = mid;
        }
        if high - low <= high * 1e-13 {
            break;
        }
    }
    let (sum, mut rates) = sum_at(high);
    // Bisection leaves the sum a hair above `total`: scale it back.
    for rate in &mut rates {
        *rate *= total / sum;
    }
    evaluate(models, &rates)
}

/// The arrival rate at which `model`'s marginal cost is `nu` (0 when even
/// its first request costs more).
fn rate_at_marginal(model: &ServiceModel, nu: f64) -> f64 {
    if model.marginal(0.0) >= nu {
        return 0.0;
    }
    let (mut low, mut high) = (0.0, model.capacity());
    for _ in 0..200 {
        let mid = 0.5 * (low + high);
        if model.marginal(mid) < nu {
            low = mid;
        } else {
            high = mid;
        }
        if high - low <= high * 1e-13 {
            break;
        }
    }
    low
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tolerance: f64) -> bool {
        (a - b).abs() <= tolerance * b.abs().max(1e-12)
    }

    #[test]
    fn one_slot_at_a_constant_rate_is_an_m_m_1_queue() {
        let m = ServiceModel::from_rates(vec![2.0]);
        for lambda in [0.1, 1.0, 1.9] {
            // T = 1 / (μ − λ), N = ρ / (1 − ρ), Var N = ρ / (1 − ρ)².
            let t = m.mean_response(lambda).unwrap();
            assert!(close(t, 1.0 / (2.0 - lambda), 1e-9), "{lambda}: {t}");
            let rho: f64 = lambda / 2.0;
            let marginal = rho / (1.0 - rho).powi(2) / lambda;
            assert!(close(m.marginal(lambda), marginal, 1e-9));
        }
        assert_eq!(m.mean_response(2.0), None);
        assert_eq!(m.mean_response(0.0), Some(0.5));
    }

    #[test]
    fn sharing_a_constant_speed_costs_what_a_single_server_does() {
        // Four slots that share one speed (a batch of b takes b times as
        // long per step): processor sharing, same mean as M/M/1.
        let m = ServiceModel::from_rates(vec![3.0; 4]);
        let t = m.mean_response(2.4).unwrap();
        assert!(close(t, 1.0 / (3.0 - 2.4), 1e-9), "{t}");
    }

    #[test]
    fn batching_that_speeds_up_helps_under_load_only() {
        // M/M/∞-like up to 8 slots: each request alone at 1 per second.
        let free = ServiceModel::from_rates((1..=8).map(f64::from).collect());
        let paid = ServiceModel::from_rates(vec![1.0; 8]);
        let (light, heavy) = (0.05, 0.9);
        assert!(close(
            free.mean_response(light).unwrap(),
            paid.mean_response(light).unwrap(),
            0.06
        ));
        assert!(free.mean_response(heavy).unwrap() < 0.2 * paid.mean_response(heavy).unwrap());
    }

    #[test]
    fn identical_replicas_split_evenly() {
        let models = vec![ServiceModel::from_rates(vec![1.0, 1.8, 2.4, 2.8]); 3];
        let best = best_static(&models, 5.0).unwrap();
        for share in best.shares() {
            assert!(close(share, 1.0 / 3.0, 1e-6), "{:?}", best.shares());
        }
        let even = even_split(&models, 5.0).unwrap();
        assert!(close(best.mean_e2e, even.mean_e2e, 1e-9));
    }

    #[test]
    fn two_single_servers_split_by_the_square_root_rule() {
        // Two M/M/1 servers, one twice as fast: minimising λ1/(μ1−λ1) +
        // λ2/(μ2−λ2) gives λi = μi − √μi (μ1 + μ2 − Λ) / (√μ1 + √μ2).
        let (fast, slow) = (2.0_f64, 1.0_f64);
        let models = vec![
            ServiceModel::from_rates(vec![fast]),
            ServiceModel::from_rates(vec![slow]),
        ];
        for total in [1.0, 2.0, 2.7] {
            let best = best_static(&models, total).unwrap();
            let spare = (fast + slow - total) / (fast.sqrt() + slow.sqrt());
            let expected = [fast - fast.sqrt() * spare, slow - slow.sqrt() * spare];
            for (got, want) in best.rates.iter().zip(expected) {
                assert!(close(*got, want, 1e-6), "{total}: {:?}", best.rates);
            }
            assert!(
                best.rates[0] > 2.0 * best.rates[1] - 1e-9,
                "the fast one gets more"
            );
        }
        // At a low rate the slow server gets nothing: its first request
        // costs 1 s, more than the fast one's marginal cost.
        let light = best_static(&models, 0.5).unwrap();
        assert_eq!(light.rates[1], 0.0);
        assert!(close(light.rates[0], 0.5, 1e-9));
        assert_eq!(light.replica_e2e[1], None);
        // Beyond the fleet's capacity no split is stable.
        assert!(best_static(&models, 3.0).is_none());
        assert!(even_split(&models, 2.2).is_none(), "the slow one overflows");
    }

    /// Mean arrival-to-last-token seconds of one engine fed `requests`
    /// (prompt, answer length) as a Poisson stream at `lambda`, leaving out
    /// the first tenth (the queue filling from empty).
    fn simulated_mean_e2e(
        cfg: &EngineConfig,
        lambda: f64,
        requests: &[(Vec<u32>, u32)],
        seed: u64,
    ) -> f64 {
        use rand::{Rng, SeedableRng};
        use sim::engine::{Engine, EngineEvent, SimRequest};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let mut engine = Engine::new(cfg.clone());
        engine.set_token_events(false);
        let mut at = 0.0;
        let arrivals: Vec<f64> = requests
            .iter()
            .map(|_| {
                at += -rng.gen_range(f64::EPSILON..1.0f64).ln() / lambda;
                at
            })
            .collect();
        let n = requests.len();
        let (mut next, mut finished, mut sum, mut counted) = (0, 0, 0.0, 0);
        let mut events = Vec::new();
        while finished < n {
            let step = engine.next_event_at();
            match arrivals
                .get(next)
                .copied()
                .filter(|a| step.is_none_or(|s| *a <= s))
            {
                Some(a) => {
                    engine.advance(a, &mut events);
                    let (prompt, max_tokens) = requests[next].clone();
                    engine.submit(
                        a,
                        SimRequest {
                            id: next as u64,
                            prompt,
                            max_tokens,
                            adapter: None,
                            priority: 0,
                        },
                    );
                    next += 1;
                }
                None => {
                    let step = step.expect("an engine with requests outstanding has a next step");
                    engine.advance(step, &mut events);
                }
            }
            for event in events.drain(..) {
                match event {
                    EngineEvent::Finished { id, at, .. } => {
                        finished += 1;
                        if id as usize >= n / 10 {
                            sum += at - arrivals[id as usize];
                            counted += 1;
                        }
                    }
                    EngineEvent::Rejected { reason, .. } => panic!("{reason}"),
                    _ => {}
                }
            }
        }
        sum / f64::from(counted)
    }

    /// `n` requests of random (unshared) prompt tokens, lengths from
    /// `lengths`.
    fn requests(
        n: usize,
        seed: u64,
        mut lengths: impl FnMut(&mut rand::rngs::SmallRng) -> (u32, u32),
    ) -> Vec<(Vec<u32>, u32)> {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let (prompt, output) = lengths(&mut rng);
                let ids = (0..prompt).map(|_| rng.gen_range(0..100_000)).collect();
                (ids, output)
            })
            .collect()
    }

    #[test]
    fn the_queue_model_predicts_a_simulated_replica() {
        // One replica fed Poisson arrivals at 30 % and 60 % of its modelled
        // capacity: the model's mean within 15 % of the simulated one, for
        // fixed lengths and for lengths spread around the same means. (At
        // 85 % the model's mean for a CPU replica is about a third above the
        // simulated one, whose queue beyond its slots is less variable than
        // the model's exponential one, and an H100's simulated mean is about
        // 1.5 times the model's; the batch-cost section of BENCHMARKS.md
        // compares the model with the engine on a whole split.)
        let shape = RequestShape {
            prompt_tokens: 190.0,
            output_tokens: 96.0,
        };
        let fixed = requests(2000, 1, |_| (190, 96));
        let spread = requests(2000, 2, |rng| {
            use rand::Rng;
            (rng.gen_range(40..=340), rng.gen_range(16..=176))
        });
        for (hw, model_name) in [
            ("cpu-2t", "qwen2.5-0.5b"),
            ("cpu-1t", "qwen2.5-0.5b"),
            ("a10g", "llama-3.1-8b"),
        ] {
            let cfg = EngineConfig::new(hw, model_name, None).unwrap();
            let model = ServiceModel::from_engine(&cfg, shape);
            for load in [0.3, 0.6] {
                let lambda = load * model.capacity();
                let predicted = model.mean_response(lambda).unwrap();
                for lengths in [&fixed, &spread] {
                    let simulated = simulated_mean_e2e(&cfg, lambda, lengths, 7);
                    let ratio = simulated / predicted;
                    assert!(
                        (0.87..1.15).contains(&ratio),
                        "{hw} at {load}: simulated {simulated:.2} s, model {predicted:.2} s"
                    );
                }
            }
        }
    }

    #[test]
    fn the_best_split_holds_in_the_engine_itself() {
        // The batch-cost fleet and requests; each replica simulated alone
        // with its share of a Poisson stream (a static split keeps every
        // share Poisson).
        use crate::scenario::{Scenario, Size};
        use crate::workload::Workload;
        let scenario = Scenario::named("batch-cost", Size::Full).unwrap();
        let engines = scenario.fleet.engine_configs().unwrap();
        let plans = Workload::new(scenario.workload.clone(), 1).sample(3 * 5000);
        let shape = RequestShape::of(&plans[..4000]).unwrap();
        let models: Vec<ServiceModel> = engines
            .iter()
            .map(|cfg| ServiceModel::from_engine(cfg, shape))
            .collect();
        let capacity: f64 = models.iter().map(ServiceModel::capacity).sum();
        let simulated = |rates: &[f64]| {
            let total: f64 = rates.iter().sum();
            let in_system: f64 = engines
                .iter()
                .zip(rates)
                .zip(plans.chunks(5000))
                .enumerate()
                .map(|(i, ((cfg, rate), chunk))| {
                    let requests: Vec<(Vec<u32>, u32)> = chunk
                        .iter()
                        .map(|p| (p.prompt_ids(), p.max_tokens))
                        .collect();
                    rate * simulated_mean_e2e(cfg, *rate, &requests, i as u64 + 3)
                })
                .sum();
            in_system / total
        };
        for load in [0.4, 0.8] {
            let total = load * capacity;
            let best = best_static(&models, total).unwrap();
            let engine = simulated(&best.rates);
            // The engine queues a little more than the model (a prefill
            // takes the step from every decoding request): 4-15 % here.
            let ratio = engine / best.mean_e2e;
            assert!((0.95..1.25).contains(&ratio), "load {load}: {ratio:.3}");
            if load < 0.6 {
                let even = simulated(&[total / 3.0; 3]);
                assert!(even > 1.2 * engine, "even {even:.2} s, best {engine:.2} s");
            }
        }
    }

    fn cpu_fleet() -> Vec<ServiceModel> {
        let shape = RequestShape {
            prompt_tokens: 190.0,
            output_tokens: 96.0,
        };
        ["cpu-2t", "cpu-2t", "cpu-1t"]
            .iter()
            .map(|hw| {
                let cfg = EngineConfig::new(hw, "qwen2.5-0.5b", None).unwrap();
                ServiceModel::from_engine(&cfg, shape)
            })
            .collect()
    }

    #[test]
    fn a_cpu_replica_gains_almost_nothing_from_its_slots() {
        let fleet = cpu_fleet();
        for m in &fleet {
            // Four requests at once complete barely faster than one.
            let gain = m.rate(4) / m.rate(1);
            assert!((1.0..1.1).contains(&gain), "{gain}");
        }
        let gpu = ServiceModel::from_engine(
            &EngineConfig::new("h100", "qwen2.5-0.5b", None).unwrap(),
            RequestShape {
                prompt_tokens: 190.0,
                output_tokens: 96.0,
            },
        );
        assert!(
            gpu.rate(4) / gpu.rate(1) > 3.0,
            "a GPU batch is nearly free"
        );
        // Two threads are nearly twice as fast as one.
        let ratio = fleet[0].capacity() / fleet[2].capacity();
        assert!((1.7..1.95).contains(&ratio), "{ratio}");
    }

    #[test]
    fn no_split_of_a_cpu_fleet_beats_the_best_one() {
        let fleet = cpu_fleet();
        let capacity: f64 = fleet.iter().map(ServiceModel::capacity).sum();
        for load in [0.3, 0.6, 0.85] {
            let total = load * capacity;
            let best = best_static(&fleet, total).unwrap();
            assert!(close(best.rates.iter().sum::<f64>(), total, 1e-9));
            // The two identical replicas get the same share, the slow one less.
            assert!(close(best.rates[0], best.rates[1], 1e-6));
            assert!(best.rates[2] < best.rates[0]);
            // A grid of other splits, none better.
            for i in 0..=40 {
                for j in 0..=40 - i {
                    let a = f64::from(i) / 40.0;
                    let b = f64::from(j) / 40.0;
                    let rates = [a * total, b * total, (1.0 - a - b) * total];
                    if let Some(other) = evaluate(&fleet, &rates) {
                        assert!(
                            other.mean_e2e >= best.mean_e2e * (1.0 - 1e-9),
                            "load {load}: {rates:?} gives {} < {}",
                            other.mean_e2e,
                            best.mean_e2e
                        );
                    }
                }
            }
            // Round-robin's even split is worse, and past two thirds of the
            // capacity the slow replica cannot keep up with its third.
            match even_split(&fleet, total) {
                Some(even) => assert!(even.mean_e2e > best.mean_e2e),
                None => assert!(load > 0.6),
            }
        }
    }
}
