//! `--scenario disaggregation`: aggregated against prefill/decode
//! disaggregated fleets at an equal number of simulated GPUs, in virtual
//! time, on long-prompt RAG, chat, and a mix of the two.
//!
//! What is modelled:
//! - **Replicas**: one simulator [`Engine`] per GPU (an 8B model on an
//!   H100), exactly as a simulated replica runs it; prefill replicas answer
//!   one token and hold the prompt's KV until the decode replica has it,
//!   decode replicas take the prompt's KV over the link
//!   ([`Engine::submit_with_remote_kv`]: only the blocks their prefix cache
//!   lacks cross it, then one step computes the last prompt token).
//! - **Picking** (the gateway's order): the decode replica first, by the
//!   least work outstanding (uncached prompt tokens and output tokens of
//!   its requests in flight); then, unless the decider keeps the request
//!   local, the prefill replica with the least prompt work outstanding. The
//!   aggregated fleet picks every request by the same rule.
//! - **Decider**: a request whose uncached prompt at the chosen decode
//!   replica (what its prefix cache holds, as the gateway's index knows it)
//!   is shorter than the threshold is prefilled by the decode replica.
//! - **Clients**: Poisson arrivals, seeded; every request runs to its end.
//!
//! Figures: time to first token (arrival to the decode replica's first
//! token), inter-token latency (each request's mean gap between its
//! tokens), and output tokens per second per GPU over the run.

mod run;

use std::fmt::Write as _;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sim::engine::KvLink;
use sim::engine::kv_transfer::{RDMA_400G, TCP_100G};

use crate::stats::percentile;
use crate::workload::LengthDist;
pub use run::{Fleet, Request, Results, run};

/// The scenario's name on the command line.
pub const NAME: &str = "disaggregation";

/// GPUs in every fleet compared.
pub const GPUS: usize = 4;

/// The decider's threshold in the runs that use it: the gateway's default.
pub const DECIDER_THRESHOLD: u32 = config::defaults::DISAGGREGATION_MIN_UNCACHED_TOKENS;

/// A workload: how prompts and answers are drawn.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub name: &'static str,
    /// Share of requests that are RAG (long retrieved context).
    pub rag_share: f64,
    /// Requests per second, for the 4-GPU fleet.
    pub rate: f64,
}

/// Retrieved passages and the question: 4k–12k tokens, unique per request.
const RAG_PROMPT: LengthDist = LengthDist {
    median: 7000.0,
    sigma: 0.3,
    min: 4000,
    max: 12000,
};
const RAG_OUTPUT: LengthDist = LengthDist {
    median: 200.0,
    sigma: 0.4,
    min: 32,
    max: 600,
};
/// ShareGPT-like chat turns.
const CHAT_PROMPT: LengthDist = LengthDist {
    median: 250.0,
    sigma: 0.8,
    min: 16,
    max: 2000,
};
const CHAT_OUTPUT: LengthDist = LengthDist {
    median: 250.0,
    sigma: 0.6,
    min: 16,
    max: 1000,
};

pub const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "rag",
        rag_share: 1.0,
        rate: 6.0,
    },
    Workload {
        name: "chat",
        rag_share: 0.0,
        rate: 40.0,
    },
    Workload {
        name: "mix",
        rag_share: 0.3,
        rate: 14.0,
    },
];

impl Workload {
    /// `count` requests, seeded.
    pub fn requests(&self, count: usize, seed: u64) -> Vec<Request> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut at = 0.0;
        (0..count as u64)
            .map(|id| {
                at += -rng.gen_range(f64::EPSILON..1.0f64).ln() / self.rate;
                let rag = rng.r#gen::<f64>() < self.rag_share;
                let (prompt, output) = if rag {
                    (RAG_PROMPT, RAG_OUTPUT)
                } else {
                    (CHAT_PROMPT, CHAT_OUTPUT)
                };
                Request {
                    id,
                    at,
                    prompt_tokens: prompt.sample(&mut rng),
                    max_tokens: output.sample(&mut rng),
                }
            })
            .collect()
    }
}

/// One fleet layout compared.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub name: &'static str,
    pub prefill: usize,
    /// Uncached prompt tokens below which the decode replica prefills.
    pub threshold: u32,
    pub link: KvLink,
}

/// The layouts, all of [`GPUS`] GPUs.
pub fn layouts() -> Vec<Layout> {
    let disaggregated = |name, prefill, threshold, link| Layout {
        name,
        prefill,
        threshold,
        link,
    };
    vec![
        disaggregated("4 aggregated", 0, 0, RDMA_400G),
        disaggregated("1P:3D always", 1, 0, RDMA_400G),
        disaggregated("1P:3D decider", 1, DECIDER_THRESHOLD, RDMA_400G),
        disaggregated("2P:2D always", 2, 0, RDMA_400G),
        disaggregated("2P:2D decider", 2, DECIDER_THRESHOLD, RDMA_400G),
        disaggregated("1P:3D decider, TCP", 1, DECIDER_THRESHOLD, TCP_100G),
    ]
}

/// One line of the report.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: &'static str,
    pub layout: &'static str,
    pub ttft_p50: f64,
    pub ttft_p95: f64,
    pub itl_p50: f64,
    pub itl_p99: f64,
    pub tokens_per_gpu: f64,
    /// Share of requests that went through a prefill replica.
    pub remote_share: f64,
}

/// Every workload on every layout; `count` requests each.
pub fn rows(count: usize, seed: u64) -> Vec<Row> {
    let mut rows = Vec::new();
    for workload in WORKLOADS {
        let requests = workload.requests(count, seed);
        for layout in layouts() {
            let fleet = Fleet {
                gpus: GPUS,
                prefill: layout.prefill,
                threshold: layout.threshold,
                link: layout.link,
            };
            let results = run(&fleet, &requests);
            rows.push(row(workload.name, layout.name, &results));
        }
    }
    rows
}

fn row(workload: &'static str, layout: &'static str, results: &Results) -> Row {
    let mut ttft: Vec<f64> = results.requests.iter().filter_map(|r| r.ttft).collect();
    let mut itl: Vec<f64> = results.requests.iter().filter_map(|r| r.itl).collect();
    let remote = results.requests.iter().filter(|r| r.remote).count();
    Row {
        workload,
        layout,
        ttft_p50: percentile(&mut ttft, 50.0).unwrap_or(f64::NAN),
        ttft_p95: percentile(&mut ttft, 95.0).unwrap_or(f64::NAN),
        itl_p50: percentile(&mut itl, 50.0).unwrap_or(f64::NAN),
        itl_p99: percentile(&mut itl, 99.0).unwrap_or(f64::NAN),
        tokens_per_gpu: results.output_tokens as f64 / results.makespan / GPUS as f64,
        remote_share: remote as f64 / results.requests.len().max(1) as f64,
    }
}

/// The report as a markdown table per workload.
pub fn markdown(rows: &[Row], count: usize, seed: u64) -> String {
    let mut out = format!(
        "Prefill/decode disaggregation, {GPUS} simulated H100s, Llama-3.1-8B, {count} requests per run, seed {seed} (virtual time)\n"
    );
    for workload in WORKLOADS {
        let _ = write!(
            out,
            "\n**{}** ({:.0} req/s)\n\n| fleet | TTFT p50 (ms) | TTFT p95 (ms) | ITL p50 (ms) | ITL p99 (ms) | output tok/s per GPU | via prefill |\n|---|---:|---:|---:|---:|---:|---:|\n",
            workload.name, workload.rate
        );
        for r in rows.iter().filter(|r| r.workload == workload.name) {
            let _ = writeln!(
                out,
                "| {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} | {:.0} % |",
                r.layout,
                r.ttft_p50 * 1e3,
                r.ttft_p95 * 1e3,
                r.itl_p50 * 1e3,
                r.itl_p99 * 1e3,
                r.tokens_per_gpu,
                r.remote_share * 100.0
            );
        }
    }
    out
}
