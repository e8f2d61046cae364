//! How much traffic a fleet can take: the saturation throughput of each
//! replica on the scenario's own requests, measured with the engine model.
//!
//! Load levels are fractions of this estimate, so "100 %" means the fleet
//! as a whole is offered as many requests per second as its replicas can
//! complete when each is kept permanently busy. A replica is measured
//! alone, in a closed loop that keeps more requests in it than it can run
//! (its waiting queue never empties), and its completion rate is taken
//! after the first wave of requests has finished. The fleet's capacity is
//! the sum over its replicas.

use std::collections::BTreeMap;

use anyhow::bail;
use sim::engine::{Engine, EngineConfig, EngineEvent, SimRequest};

use crate::workload::RequestPlan;

/// Saturation throughput of one replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplicaCapacity {
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
}

/// Capacity of a fleet, with the figure of each kind of replica.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetCapacity {
    pub requests_per_s: f64,
    /// Per GPU profile name.
    pub per_replica: BTreeMap<String, ReplicaCapacity>,
}

/// How many requests a measurement runs: more requests than the replica
/// can hold at once, then `measured` completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Calibration {
    /// Requests kept in the replica beyond its `max_num_seqs`.
    pub extra_population: usize,
    /// Completions the rate is measured over (at least).
    pub measured: usize,
}

impl Calibration {
    pub const FULL: Calibration = Calibration {
        extra_population: 32,
        measured: 600,
    };
    pub const QUICK: Calibration = Calibration {
        extra_population: 16,
        measured: 200,
    };

    fn population(&self, cfg: &EngineConfig) -> usize {
        cfg.max_num_seqs as usize + self.extra_population
    }

    /// Completions counted before the measurement and in it.
    fn completions(&self, cfg: &EngineConfig) -> (usize, usize) {
        let population = self.population(cfg);
        (population, self.measured.max(population))
    }

    /// Distinct requests one measurement of `cfg` needs: the completions,
    /// plus the population still in the replica at the end.
    pub fn requests_needed(&self, cfg: &EngineConfig) -> usize {
        let (warmup, measured) = self.completions(cfg);
        self.population(cfg) + warmup + measured
    }
}

/// Measure every distinct replica configuration of a fleet (by GPU
/// profile) on `requests`, and add them up.
pub fn fleet_capacity(
    replicas: &[EngineConfig],
    adapters: &[String],
    requests: &[RequestPlan],
    calibration: Calibration,
) -> anyhow::Result<FleetCapacity> {
    let mut per_replica = BTreeMap::new();
    let mut total = 0.0;
    for cfg in replicas {
        let name = cfg.hardware.name.to_owned();
        let capacity = match per_replica.get(&name) {
            Some(c) => *c,
            None => {
                let c = replica_capacity(cfg, adapters, requests, calibration)?;
                per_replica.insert(name, c);
                c
            }
        };
        total += capacity.requests_per_s;
    }
    Ok(FleetCapacity {
        requests_per_s: total,
        per_replica,
    })
}

/// Saturation throughput of one replica; see the module docs.
pub fn replica_capacity(
    cfg: &EngineConfig,
    adapters: &[String],
    requests: &[RequestPlan],
    calibration: Calibration,
) -> anyhow::Result<ReplicaCapacity> {
    let population = calibration.population(cfg);
    let (warmup, measured) = calibration.completions(cfg);
    let target = warmup + measured;
    let needed = calibration.requests_needed(cfg);
    if requests.len() < needed {
        bail!(
            "capacity calibration of {} needs {needed} requests, got {}",
            cfg.hardware.name,
            requests.len()
        );
    }
    let mut engine = Engine::new(cfg.clone());
    engine.set_token_events(false);
    for adapter in adapters {
        engine.register_adapter(adapter);
    }
    let mut next = 0usize;
    let submit = |engine: &mut Engine, next: &mut usize, now: f64| {
        // Rejections can use up a few extra requests; start over then.
        let plan = &requests[*next % requests.len()];
        engine.submit(
            now,
            SimRequest {
                id: *next as u64,
                prompt: plan.prompt_ids(),
                max_tokens: plan.max_tokens,
                adapter: plan.adapter.as_deref().map(str::to_owned),
                priority: 0,
            },
        );
        *next += 1;
    };
    for _ in 0..population {
        submit(&mut engine, &mut next, 0.0);
    }
    let mut events = Vec::new();
    let mut finished = 0usize;
    let mut rejected = 0usize;
    let mut window_start = (0.0, 0u64);
    let mut last_finish = 0.0;
    while finished < target {
        let Some(at) = engine.next_event_at() else {
            bail!("the engine went idle during capacity calibration");
        };
        engine.advance(at, &mut events);
        for event in events.drain(..) {
            match event {
                EngineEvent::Finished { at, .. } => {
                    finished += 1;
                    last_finish = at;
                    if finished == warmup {
                        window_start = (at, engine.stats().generation_tokens_total);
                    }
                    submit(&mut engine, &mut next, at);
                }
                EngineEvent::Rejected { at, .. } => {
                    rejected += 1;
                    submit(&mut engine, &mut next, at);
                }
                EngineEvent::FirstToken { .. } | EngineEvent::Token { .. } => {}
            }
        }
    }
    if rejected * 100 > next {
        bail!(
            "{} rejected {rejected} of {next} calibration requests (too long for its context?)",
            cfg.hardware.name
        );
    }
    let (start, tokens_at_start) = window_start;
    let elapsed = last_finish - start;
    let tokens = engine.stats().generation_tokens_total - tokens_at_start;
    Ok(ReplicaCapacity {
        requests_per_s: (finished - warmup) as f64 / elapsed,
        output_tokens_per_s: tokens as f64 / elapsed,
    })
}
