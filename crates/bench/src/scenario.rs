//! The benchmark scenarios: a fleet, a workload, the load levels and how
//! long each run offers traffic.
//!
//! Five reproduce the situations of the AWS HyperPod benchmark
//! (`mixed-fleet`, `bursty`, `shared-prefix`, `lora`, `uniform`);
//! `fleet-scale` is a thousand-replica fleet for virtual mode only;
//! `flow-control` sends bursts of three priority bands and compares the
//! gateway's admission queue on and off, live only; `agent` runs agent
//! loops (growing per-session context) with session affinity off and on.
//! Five more separate
//! good routers from adequate ones when compared with the peer routers
//! (`--scenario peers`): `prefix-pressure` (shared prompts that do not fit
//! one replica's cache), `heterogeneous` (fast and slow replicas at 75 %),
//! `multi-turn` (conversations whose context grows), `bursty-uneven`
//! (bursts of long prompts mixed with short ones) and `agent-loop` (the
//! agent loops at one load, every router on the same footing).

use std::fmt::Write as _;

use anyhow::{Context, bail};
use sim::engine::EngineConfig;

use crate::workload::{BandMix, LengthDist, Mix, Range, Traffic, WorkloadSpec};

/// Replicas of one model on (possibly) different GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetPlan {
    pub replicas: usize,
    /// GPU profile of each replica, cycled over the replicas.
    pub hardware: Vec<String>,
    /// Model profile name.
    pub model: String,
    pub tensor_parallel: Option<u32>,
    /// LoRA adapters every replica serves.
    pub adapters: Vec<String>,
    pub max_loras: Option<u32>,
}

impl FleetPlan {
    /// The simulator's description of this fleet.
    pub fn sim_spec(&self, time_scale: f64, seed: u64) -> sim::FleetSpec {
        sim::FleetSpec {
            replicas: self.replicas,
            hardware: self.hardware.clone(),
            model: self.model.clone(),
            tensor_parallel: self.tensor_parallel,
            adapters: self.adapters.clone(),
            max_loras: self.max_loras,
            time_scale,
            seed,
            ..sim::FleetSpec::default()
        }
    }

    /// The engine configuration of every replica, exactly as a simulated
    /// replica of [`FleetPlan::sim_spec`] builds it.
    pub fn engine_configs(&self) -> anyhow::Result<Vec<EngineConfig>> {
        let spec = self.sim_spec(1.0, 0);
        (0..self.replicas)
            .map(|i| spec.replica(i).engine_config())
            .collect()
    }

    /// The name clients send as `model` (the model's Hugging Face id, as
    /// the simulator serves it).
    pub fn served_model(&self) -> anyhow::Result<String> {
        sim::engine::model(&self.model)
            .map(|m| m.hf_id.to_owned())
            .with_context(|| format!("unknown model profile {:?}", self.model))
    }

    /// GPU profile of each replica, in order.
    pub fn replica_hardware(&self) -> Vec<String> {
        (0..self.replicas)
            .map(|i| self.hardware[i % self.hardware.len()].clone())
            .collect()
    }

    /// "4 × h100 + 4 × a10g, llama-3.1-8b (TP 1)".
    pub fn describe(&self) -> String {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for hw in self.replica_hardware() {
            match counts.iter_mut().find(|(name, _)| *name == hw) {
                Some((_, n)) => *n += 1,
                None => counts.push((hw, 1)),
            }
        }
        let mut out = counts
            .iter()
            .map(|(hw, n)| format!("{n} × {hw}"))
            .collect::<Vec<_>>()
            .join(" + ");
        let _ = write!(out, ", {}", self.model);
        if let Some(tp) = self.tensor_parallel {
            let _ = write!(out, " (TP {tp})");
        }
        if !self.adapters.is_empty() {
            let _ = write!(
                out,
                ", {} LoRA adapters, max_loras {}",
                self.adapters.len(),
                self.max_loras
                    .map_or_else(|| "default".to_owned(), |n| n.to_string())
            );
        }
        out
    }
}

/// How big a run is: the full benchmark, or the smoke-sized `--quick`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    Full,
    Quick,
}

/// One benchmark scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub name: &'static str,
    /// What it reproduces, in one sentence.
    pub about: &'static str,
    pub fleet: FleetPlan,
    pub workload: WorkloadSpec,
    /// Offered loads, fractions of the fleet's estimated capacity.
    pub loads: Vec<f64>,
    /// How long each run offers traffic in virtual mode.
    pub length: RunLength,
    /// How long each run offers traffic in live mode (shorter: live runs
    /// stream every token through real sockets).
    pub live_length: RunLength,
    /// Whether live mode can run it (a thousand replicas cannot).
    pub live: bool,
    /// Whether virtual mode can run it (it models one band's queue only).
    pub virtual_time: bool,
    /// What the runs of each load differ in.
    pub compare: Compare,
    /// Simulated seconds a client waits for a complete answer, when the
    /// scenario needs longer than the default (`--client-timeout` still
    /// wins).
    pub client_timeout: Option<f64>,
    /// Report the best static allocation of each load, computed from the
    /// engine profiles, beside the measured figures.
    pub static_allocation: bool,
}

/// What a scenario's runs compare, on identical arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compare {
    /// Every policy of `--policies`, under the gateway's default flow
    /// control.
    Policies,
    /// Each scored policy of `--policies` (only the scored policy reports
    /// a pool saturated, so only it ever queues) with the gateway's
    /// admission queue on, then off.
    FlowControl,
    /// Every policy of `--policies`, then each scored one again with
    /// session affinity (`+sessions`).
    Sessions,
}

/// How long a run offers traffic.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RunLength {
    /// Simulated seconds of arrivals, at every load.
    Seconds(f64),
    /// About this many requests, at every load (the time span shrinks as
    /// the load grows).
    Requests(u64),
}

impl RunLength {
    /// Simulated seconds of arrivals at `rate` requests per second.
    pub fn seconds_at(&self, rate: f64) -> f64 {
        match *self {
            RunLength::Seconds(s) => s,
            RunLength::Requests(n) => n as f64 / rate,
        }
    }
}

impl std::fmt::Display for RunLength {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunLength::Seconds(s) => write!(f, "{s} s of arrivals"),
            RunLength::Requests(n) => write!(f, "{n} requests"),
        }
    }
}

/// The scenarios `--scenario all` runs, in report order (those of them
/// the mode can run).
pub const ALL: [&str; 6] = [
    "mixed-fleet",
    "bursty",
    "shared-prefix",
    "lora",
    "uniform",
    "flow-control",
];
/// The scenarios `--scenario peers` runs: those written to tell the peer
/// routers apart, one load each (not part of `all`, whose length the
/// benchmark docs quote).
pub const PEERS: [&str; 5] = [
    "prefix-pressure",
    "heterogeneous",
    "multi-turn",
    "bursty-uneven",
    "agent-loop",
];
/// Every scenario name, `all` and `peers` excluded. `agent` is run by
/// name: it compares session affinity on and off rather than the policies;
/// so is `batch-cost`, whose fleet is of CPUs.
pub const NAMES: [&str; 14] = [
    "mixed-fleet",
    "bursty",
    "shared-prefix",
    "lora",
    "uniform",
    "fleet-scale",
    "flow-control",
    "agent",
    "prefix-pressure",
    "heterogeneous",
    "multi-turn",
    "bursty-uneven",
    "agent-loop",
    "batch-cost",
];

const LOADS: [f64; 4] = [0.5, 0.8, 1.0, 1.2];
/// Requests per run in virtual mode: enough for a stable p99 (50 samples
/// above it).
const REQUESTS: u64 = 5000;
/// Requests per run in live mode: about a minute of wall time per run.
const LIVE_REQUESTS: u64 = 1000;
/// Requests per live run with `--quick` (virtual runs get a fiftieth of
/// their full size): a smoke test of every path, not a measurement.
const QUICK_REQUESTS: u64 = 100;
const QUICK_LOADS: [f64; 2] = [0.5, 1.0];

/// Bands of the flow-control scenario. Critical is the interactive,
/// paying minority; sheddable (batch jobs, prefetches, retries that can
/// come back later) is large enough that shedding it frees real room in
/// a burst; standard is the bulk.
pub const FLOW_BANDS: BandMix = BandMix {
    critical: 0.2,
    standard: 0.5,
    sheddable: 0.3,
};
/// Burst cycles per flow-control run: enough peaks for stable per-band
/// tails (about 3,000 requests), under a minute and a half of wall time
/// per run.
const FLOW_CYCLES: f64 = 8.0;

/// The `bursty` scenario's arrivals: a quiet period, then a peak at 3-5x
/// the mean rate, every 12 s.
fn bursts() -> Traffic {
    Traffic::Bursty {
        cycle_seconds: 12.0,
        peak_seconds: 2.0,
        peak_factor: (3.0, 5.0),
    }
}

/// The `bursty` scenario's fleet: four H100 nodes serving a 70B model.
fn tp4_70b(replicas: usize) -> FleetPlan {
    FleetPlan {
        tensor_parallel: Some(4),
        ..fleet(replicas, &["h100"], "llama-3.1-70b")
    }
}

/// Chat lengths: prompts log-normal around 1,000 tokens (about a third of
/// them above 1,500), answers around 200 tokens with a long tail, as in
/// ShareGPT-style chat traces.
fn chat_prompt() -> LengthDist {
    LengthDist {
        median: 1000.0,
        sigma: 0.8,
        min: 16,
        max: 8000,
    }
}

fn chat_output() -> LengthDist {
    LengthDist {
        median: 200.0,
        sigma: 0.7,
        min: 8,
        max: 2000,
    }
}

fn chat() -> Mix {
    Mix::Chat {
        system_tokens: 0,
        prompt: chat_prompt(),
        output: chat_output(),
    }
}

/// Lighter chat for the thousand-replica fleet: a 256-token system prompt
/// every request shares, questions around 400 tokens and answers around
/// 128, so a million requests fit the machine's time budget.
fn light_chat() -> Mix {
    Mix::Chat {
        system_tokens: 256,
        prompt: LengthDist {
            median: 400.0,
            sigma: 0.6,
            min: 16,
            max: 4000,
        },
        output: LengthDist {
            median: 128.0,
            sigma: 0.6,
            min: 8,
            max: 1000,
        },
    }
}

/// `prefix-pressure`: 128 system prompts of 1,500-3,030 tokens (about
/// 290k tokens in all), each request one of them and a short question.
/// One replica's KV cache (about 140k tokens on the simulator's A100 40GB
/// profile) holds under half of them; the fleet's holds them all if the
/// router partitions them.
fn pressured_prompts() -> Mix {
    Mix::SharedPrefix {
        documents: 128,
        document_tokens: Range {
            min: 1500,
            max: 3030,
        },
        question_tokens: Range { min: 50, max: 300 },
        turns: Range { min: 1, max: 1 },
        think_seconds: 0.0,
        output: LengthDist {
            median: 120.0,
            sigma: 0.6,
            min: 8,
            max: 800,
        },
    }
}

/// `multi-turn`: conversations of 3-10 turns, each with a system prompt
/// of its own (4,096 distinct ones, so sessions rarely share one), each
/// turn resending the whole conversation: the context grows by the
/// question and the answer every turn, and only the replica that served
/// the previous turn holds it.
fn conversations() -> Mix {
    Mix::SharedPrefix {
        documents: 4096,
        document_tokens: Range {
            min: 300,
            max: 1500,
        },
        question_tokens: Range { min: 50, max: 400 },
        turns: Range { min: 3, max: 10 },
        think_seconds: 5.0,
        output: LengthDist {
            median: 200.0,
            sigma: 0.6,
            min: 8,
            max: 1000,
        },
    }
}

/// `bursty-uneven`: prompts log-normal around 700 tokens with a wide
/// spread (one in six above 3,000 tokens, one in twenty above 8,000), so
/// a burst mixes a few long prefills with many short requests.
fn uneven_chat() -> Mix {
    Mix::Chat {
        system_tokens: 0,
        prompt: LengthDist {
            median: 700.0,
            sigma: 1.3,
            min: 32,
            max: 16_000,
        },
        output: LengthDist {
            median: 150.0,
            sigma: 1.0,
            min: 8,
            max: 2000,
        },
    }
}

/// `batch-cost`: short chat, prompts log-normal around 160 tokens and
/// answers around 80 (means about 190 and 96), so a 0.5B model on one or
/// two CPU threads answers in seconds (6–12 s alone).
fn short_chat() -> Mix {
    Mix::Chat {
        system_tokens: 0,
        prompt: LengthDist {
            median: 160.0,
            sigma: 0.6,
            min: 16,
            max: 1500,
        },
        output: LengthDist {
            median: 80.0,
            sigma: 0.6,
            min: 8,
            max: 600,
        },
    }
}

/// Loads of `batch-cost`: at 40 % every policy keeps up; round-robin's
/// third of the traffic fills the one-thread replica at about 64 % (two
/// threads are 1.85 times as fast as one), so at 60 % it is nearly
/// saturated and at 80 % it falls behind.
const BATCH_COST_LOADS: [f64; 3] = [0.4, 0.6, 0.8];
/// A client of `batch-cost` waits ten minutes: answers take seconds, and a
/// shorter wait would cut the queue behind a slow replica out of the mean.
const BATCH_COST_CLIENT_TIMEOUT: f64 = 600.0;

fn fleet(replicas: usize, hardware: &[&str], model: &str) -> FleetPlan {
    FleetPlan {
        replicas,
        hardware: hardware.iter().map(|h| (*h).to_owned()).collect(),
        model: model.to_owned(),
        tensor_parallel: None,
        adapters: Vec::new(),
        max_loras: None,
    }
}

impl Scenario {
    /// What most scenarios are: the policies compared over [`REQUESTS`]
    /// requests a run ([`LIVE_REQUESTS`] live), in both modes.
    fn standard(
        name: &'static str,
        about: &'static str,
        fleet: FleetPlan,
        workload: WorkloadSpec,
        loads: Vec<f64>,
    ) -> Scenario {
        Scenario {
            name,
            about,
            fleet,
            workload,
            loads,
            length: RunLength::Requests(REQUESTS),
            live_length: RunLength::Requests(LIVE_REQUESTS),
            live: true,
            virtual_time: true,
            compare: Compare::Policies,
            client_timeout: None,
            static_allocation: false,
        }
    }

    /// The scenario called `name`, sized for `size`.
    pub fn named(name: &str, size: Size) -> anyhow::Result<Scenario> {
        let quick = size == Size::Quick;
        let loads = if quick {
            QUICK_LOADS.to_vec()
        } else {
            LOADS.to_vec()
        };
        let mut scenario = match name {
            "mixed-fleet" => Scenario::standard(
                "mixed-fleet",
                "A mixed-generation fleet: the same model on fast and slow GPUs, chat traffic.",
                fleet(8, &["h100", "a10g"], "llama-3.1-8b"),
                workload(Traffic::Poisson, chat()),
                loads,
            ),
            "bursty" => Scenario::standard(
                "bursty",
                "Bursty chat traffic on a large tensor-parallel model: quiet periods, then peaks at 3-5x the mean rate.",
                tp4_70b(4),
                workload(bursts(), chat()),
                loads,
            ),
            "flow-control" => {
                let Traffic::Bursty { cycle_seconds, .. } = bursts() else {
                    unreachable!("bursts are bursty")
                };
                Scenario {
                    name: "flow-control",
                    about: "The bursty scenario's fleet and bursts at a mean load of 100 %, each request marked critical (20 %), standard (50 %) or sheddable (30 %) with `x-infergate-priority`; the scored policy with the gateway's admission queue on (its defaults) and off (every band refused at once while the pool is saturated). Live mode only.",
                    // One replica with --quick: one burst saturates it at
                    // little cost.
                    fleet: tp4_70b(if quick { 1 } else { 4 }),
                    workload: WorkloadSpec {
                        bands: Some(FLOW_BANDS),
                        ..workload(bursts(), chat())
                    },
                    loads: vec![1.0],
                    length: RunLength::Seconds(FLOW_CYCLES * cycle_seconds),
                    // With --quick: the first quiet period, the first peak
                    // and a little after it.
                    live_length: RunLength::Seconds(
                        if quick { 1.25 } else { FLOW_CYCLES } * cycle_seconds,
                    ),
                    live: true,
                    virtual_time: false,
                    compare: Compare::FlowControl,
                    client_timeout: None,
                    static_allocation: false,
                }
            }
            "shared-prefix" => Scenario::standard(
                "shared-prefix",
                "Users asking about 8 shared documents of 2-6k tokens in multi-turn conversations.",
                fleet(8, &["a10g"], "llama-3.1-8b"),
                workload(
                    Traffic::Poisson,
                    Mix::SharedPrefix {
                        documents: 8,
                        document_tokens: Range {
                            min: 2000,
                            max: 6000,
                        },
                        question_tokens: Range { min: 100, max: 500 },
                        turns: Range { min: 1, max: 5 },
                        think_seconds: 10.0,
                        output: LengthDist {
                            median: 150.0,
                            sigma: 0.6,
                            min: 8,
                            max: 1000,
                        },
                    },
                ),
                loads,
            ),
            "lora" => {
                let adapters: Vec<String> = (0..12).map(|i| format!("lora-{i:02}")).collect();
                Scenario::standard(
                    "lora",
                    "12 LoRA adapters of one base model with Zipf popularity, 4 adapter slots per replica.",
                    FleetPlan {
                        adapters: adapters.clone(),
                        max_loras: Some(4),
                        ..fleet(4, &["h100"], "llama-3.1-8b")
                    },
                    workload(
                        Traffic::Poisson,
                        Mix::Lora {
                            adapters,
                            zipf_exponent: 1.0,
                            prompt: LengthDist {
                                median: 600.0,
                                ..chat_prompt()
                            },
                            output: LengthDist {
                                median: 150.0,
                                ..chat_output()
                            },
                        },
                    ),
                    loads,
                )
            }
            "agent" => Scenario {
                compare: Compare::Sessions,
                ..Scenario::standard(
                    "agent",
                    "Agent loops: every loop shares a 1.5k-token system prompt, then resends its growing transcript (a tool output of 200-800 tokens a turn, 4-10 turns, 2 s between turns); scored picking with and without session affinity (`+sessions`).",
                    fleet(8, &["a10g"], "llama-3.1-8b"),
                    workload(Traffic::Poisson, crate::workload::agent::agent_loops()),
                    loads,
                )
            },
            // The routers compared as they are: a peer has no session
            // affinity to turn on, so one run per router, at one load. At
            // 70 % the transcripts' growth saturates the fleet (every
            // router queues for tens of seconds, and compares only how it
            // queues); 50 % is the moderate load the other peer scenarios
            // run at.
            "agent-loop" => Scenario::standard(
                "agent-loop",
                "The agent scenario's loops (a shared 1.5k-token system prompt, then a growing transcript resent every turn: 200-1000 tokens of tool output a turn, 4-10 turns, 2 s between turns) over 8 A10G replicas at 50 % load, every router as it is.",
                fleet(8, &["a10g"], "llama-3.1-8b"),
                workload(Traffic::Poisson, crate::workload::agent::agent_loops()),
                vec![0.5],
            ),
            "uniform" => Scenario::standard(
                "uniform",
                "Identical replicas and steady Poisson chat traffic: nothing for smart routing to exploit.",
                fleet(4, &["h100"], "llama-3.1-8b"),
                workload(Traffic::Poisson, chat()),
                loads,
            ),
            "prefix-pressure" => Scenario::standard(
                "prefix-pressure",
                "128 shared system prompts (about 290k tokens) over 4 identical replicas whose prefix caches hold about 140k tokens each, at moderate load: cache affinity and load balance pull against each other.",
                fleet(4, &["a100-40gb"], "llama-3.1-8b"),
                workload(Traffic::Poisson, pressured_prompts()),
                vec![0.6],
            ),
            "heterogeneous" => Scenario::standard(
                "heterogeneous",
                "Fast and about 4-5x slower replicas of one model (H100 and A10G) at 75 % of the fleet's capacity, unique prompts: where least-connections is already strong.",
                fleet(8, &["h100", "a10g"], "llama-3.1-8b"),
                workload(Traffic::Poisson, chat()),
                vec![0.75],
            ),
            "multi-turn" => Scenario::standard(
                "multi-turn",
                "Conversations of 3-10 turns, each with its own system prompt, resending a context that grows every turn, over 4 identical replicas at 70 % load.",
                fleet(4, &["a100-40gb"], "llama-3.1-8b"),
                workload(Traffic::Poisson, conversations()),
                vec![0.7],
            ),
            "bursty-uneven" => Scenario::standard(
                "bursty-uneven",
                "The bursty scenario's bursts with uneven requests: long prompts (up to 16k tokens) mixed with short ones, so a metric-blind router piles new requests onto replicas still busy with long prefills.",
                tp4_70b(4),
                workload(bursts(), uneven_chat()),
                vec![0.7],
            ),
            "batch-cost" => Scenario {
                client_timeout: Some(BATCH_COST_CLIENT_TIMEOUT),
                static_allocation: true,
                ..Scenario::standard(
                    "batch-cost",
                    "Batching is not free: Qwen2.5-0.5B on llama.cpp CPU replicas, two on two threads and one on one thread (1.85 times slower), where a batch of four costs nearly four times one; short chat requests (6-12 s alone). Beside the measured figures, the best static allocation computed from the engine profiles: the split of the arrivals that minimises the mean end-to-end time.",
                    fleet(3, &["cpu-2t", "cpu-2t", "cpu-1t"], "qwen2.5-0.5b"),
                    workload(Traffic::Poisson, short_chat()),
                    BATCH_COST_LOADS.to_vec(),
                )
            },
            "fleet-scale" => Scenario {
                length: RunLength::Requests(1_000_000),
                live_length: RunLength::Requests(0),
                live: false,
                ..Scenario::standard(
                    "fleet-scale",
                    "A thousand H100 replicas and a million light chat requests, in virtual time.",
                    fleet(1000, &["h100"], "llama-3.1-8b"),
                    workload(Traffic::Poisson, light_chat()),
                    vec![0.8],
                )
            },
            other => bail!(
                "unknown scenario {other:?} (expected all, {})",
                NAMES.join(", ")
            ),
        };
        // flow-control sizes its quick run itself: it must reach a peak.
        if quick && matches!(scenario.compare, Compare::Policies | Compare::Sessions) {
            scenario.length = match scenario.length {
                RunLength::Requests(n) => RunLength::Requests(n / 50),
                seconds => seconds,
            };
            scenario.live_length = RunLength::Requests(QUICK_REQUESTS);
        }
        scenario.workload.model = scenario.fleet.served_model()?;
        if let Traffic::Bursty { .. } = scenario.workload.traffic {
            scenario
                .workload
                .traffic
                .validate()
                .map_err(anyhow::Error::msg)?;
        }
        Ok(scenario)
    }
}

fn workload(traffic: Traffic, mix: Mix) -> WorkloadSpec {
    WorkloadSpec {
        traffic,
        mix,
        // Set from the fleet once the scenario is assembled.
        model: String::new(),
        bands: None,
    }
}

/// Scenario names from `--scenario`: `all` (those of [`ALL`] that can run
/// `live` or in virtual time), `peers` ([`PEERS`]) or one name.
pub fn expand(name: &str, live: bool) -> anyhow::Result<Vec<&'static str>> {
    if name == "peers" {
        return Ok(PEERS.to_vec());
    }
    if name == "all" {
        return ALL
            .into_iter()
            .filter_map(|n| match Scenario::named(n, Size::Full) {
                Ok(s) if (if live { s.live } else { s.virtual_time }) => Some(Ok(n)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect();
    }
    NAMES
        .into_iter()
        .find(|n| *n == name)
        .map(|n| vec![n])
        .with_context(|| {
            format!(
                "unknown scenario {name:?} (expected all, peers, {}, global-failover)",
                NAMES.join(", ")
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_builds_and_fits_its_fleet() {
        for name in NAMES {
            for size in [Size::Full, Size::Quick] {
                let s = Scenario::named(name, size).unwrap();
                assert_eq!(s.name, name);
                assert!(!s.loads.is_empty());
                let configs = s.fleet.engine_configs().unwrap();
                assert_eq!(configs.len(), s.fleet.replicas);
                assert!(s.workload.model.contains('/'), "{}", s.workload.model);
            }
        }
        assert!(Scenario::named("nope", Size::Full).is_err());
    }

    #[test]
    fn mixed_fleet_alternates_gpus() {
        let s = Scenario::named("mixed-fleet", Size::Full).unwrap();
        assert_eq!(s.fleet.describe(), "4 × h100 + 4 × a10g, llama-3.1-8b");
        assert_eq!(s.loads, LOADS);
    }

    #[test]
    fn all_expands_to_what_the_mode_can_run() {
        assert_eq!(expand("all", true).unwrap(), ALL);
        assert_eq!(
            expand("all", false).unwrap(),
            ["mixed-fleet", "bursty", "shared-prefix", "lora", "uniform"]
        );
        assert_eq!(expand("peers", true).unwrap(), PEERS);
        assert_eq!(expand("lora", true).unwrap(), ["lora"]);
        assert_eq!(expand("fleet-scale", false).unwrap(), ["fleet-scale"]);
        assert!(expand("everything", true).is_err());
    }

    #[test]
    fn prefix_pressure_prompts_outgrow_one_replica_but_fit_the_fleet() {
        let s = Scenario::named("prefix-pressure", Size::Full).unwrap();
        let Mix::SharedPrefix {
            documents,
            document_tokens,
            ..
        } = s.workload.mix
        else {
            panic!("shared prompts")
        };
        let mean = f64::from(document_tokens.min + document_tokens.max) / 2.0;
        let total = f64::from(documents) * mean;
        assert!((280_000.0..300_000.0).contains(&total), "{total}");
        let configs = s.fleet.engine_configs().unwrap();
        assert!(
            configs
                .iter()
                .all(|c| c.hardware.name == configs[0].hardware.name
                    && c.kv_capacity_tokens() == configs[0].kv_capacity_tokens()),
            "identical replicas"
        );
        let per_replica = f64::from(configs[0].kv_capacity_tokens());
        assert!(per_replica < total / 2.0, "{per_replica} of {total}");
        assert!(per_replica * configs.len() as f64 > total);
    }

    #[test]
    fn batch_cost_runs_cpus_of_two_speeds_and_asks_for_the_allocation() {
        let s = Scenario::named("batch-cost", Size::Full).unwrap();
        assert_eq!(s.fleet.describe(), "2 × cpu-2t + 1 × cpu-1t, qwen2.5-0.5b");
        assert!(s.static_allocation);
        assert_eq!(s.client_timeout, Some(BATCH_COST_CLIENT_TIMEOUT));
        assert_eq!(s.workload.model, "Qwen/Qwen2.5-0.5B-Instruct");
        assert_eq!(s.loads, BATCH_COST_LOADS);
        assert_eq!(expand("batch-cost", false).unwrap(), ["batch-cost"]);
        // Not in `all`: its fleet is not a GPU fleet like the others'.
        assert!(!ALL.contains(&"batch-cost"));
        let configs = s.fleet.engine_configs().unwrap();
        let decode = |c: &EngineConfig, batch| {
            sim::engine::timing::Roofline::new(c).decode_seconds(batch, 250)
        };
        for c in &configs {
            assert!(decode(c, 4) > 3.5 * decode(c, 1), "{}", c.hardware.name);
        }
        let speed = decode(&configs[2], 1) / decode(&configs[0], 1);
        assert!((1.7..2.0).contains(&speed), "{speed}");
    }

    #[test]
    fn uneven_bursts_mix_long_and_short_prompts() {
        use rand::SeedableRng;
        let s = Scenario::named("bursty-uneven", Size::Full).unwrap();
        let Mix::Chat { prompt, .. } = s.workload.mix else {
            panic!("chat")
        };
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let lengths: Vec<u32> = (0..10_000).map(|_| prompt.sample(&mut rng)).collect();
        let share = |f: &dyn Fn(u32) -> bool| {
            lengths.iter().filter(|l| f(**l)).count() as f64 / lengths.len() as f64
        };
        assert!(share(&|l| l > 3000) > 0.1, "long prompts");
        assert!(share(&|l| l < 300) > 0.2, "short prompts");
        assert_eq!(s.workload.traffic, bursts());
    }

    #[test]
    fn flow_control_marks_bands_on_the_bursty_fleet() {
        let full = Scenario::named("flow-control", Size::Full).unwrap();
        let bursty = Scenario::named("bursty", Size::Full).unwrap();
        assert_eq!(full.fleet, bursty.fleet);
        assert_eq!(full.workload.traffic, bursty.workload.traffic);
        assert_eq!(full.workload.mix, bursty.workload.mix);
        assert_eq!(full.workload.bands, Some(FLOW_BANDS));
        let shares = FLOW_BANDS.critical + FLOW_BANDS.standard + FLOW_BANDS.sheddable;
        assert!((shares - 1.0).abs() < 1e-12);
        assert_eq!(full.compare, Compare::FlowControl);
        assert!(full.live && !full.virtual_time);
        let quick = Scenario::named("flow-control", Size::Quick).unwrap();
        // The quick run reaches the end of the first peak.
        let Traffic::Bursty { cycle_seconds, .. } = quick.workload.traffic else {
            panic!("bursty traffic")
        };
        assert!(quick.live_length.seconds_at(1.0) > cycle_seconds);
    }
}
