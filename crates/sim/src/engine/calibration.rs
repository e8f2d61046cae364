//! Load drivers for comparing the engine model with published benchmarks.
//!
//! They run one engine in virtual time with fixed-length synthetic requests
//! (unique prompts, so no prefix-cache hits) and report the figures serving
//! benchmarks publish: TTFT, inter-token latency and output throughput.
//! `examples/calibrate.rs` prints the comparison table of
//! `docs/simulator.md` with them.

use super::{Engine, EngineConfig, EngineEvent, SimRequest};

/// Fixed request shape: input and output lengths in tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    pub prompt_tokens: u32,
    pub output_tokens: u32,
}

/// What one run measured. Latencies in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadReport {
    /// Requests measured (warm-up excluded).
    pub requests: u64,
    pub ttft_mean: f64,
    pub ttft_p50: f64,
    pub ttft_p99: f64,
    /// Mean over requests of (last token − first token) / (output − 1).
    pub itl_mean: f64,
    /// Output tokens of all requests over the whole run's duration.
    pub output_tokens_per_second: f64,
    /// Requests completed per second over the whole run.
    pub requests_per_second: f64,
    /// First submission to last completion.
    pub duration: f64,
    pub preemptions: u64,
}

/// Closed loop, as `genai-perf --concurrency` or `vllm bench serve
/// --max-concurrency` drive a server: `concurrency` clients each send their
/// next request the moment the previous one completes, `rounds` times.
/// Latencies exclude every client's first request (the synchronised start).
///
/// # Panics
/// If the engine rejects the workload (e.g. longer than `max_model_len`).
pub fn closed_loop(
    cfg: &EngineConfig,
    concurrency: u32,
    workload: Workload,
    rounds: u32,
) -> LoadReport {
    let total = u64::from(concurrency) * u64::from(rounds);
    run(cfg, workload, total, concurrency, u64::from(concurrency))
}

/// Offline throughput: every request submitted at time zero, as
/// `benchmark_throughput` or a burst of arrivals. Latencies cover all.
///
/// # Panics
/// If the engine rejects the workload.
pub fn burst(cfg: &EngineConfig, requests: u32, workload: Workload) -> LoadReport {
    run(cfg, workload, u64::from(requests), requests, 0)
}

/// Drive `total` requests with at most `in_flight` outstanding; the first
/// `warmup` completions are left out of the latency statistics.
fn run(
    cfg: &EngineConfig,
    workload: Workload,
    total: u64,
    in_flight: u32,
    warmup: u64,
) -> LoadReport {
    let mut engine = Engine::new(cfg.clone());
    // Per-token events are not needed: ITL follows from first and last token.
    engine.set_token_events(false);
    let mut submitted = 0u64;
    let mut submit_at = Vec::with_capacity(total as usize);
    let mut first_token_at = vec![f64::NAN; total as usize];
    let mut ttfts = Vec::new();
    let mut itl_sum = 0.0;
    let mut measured = 0u64;
    let mut completed = 0u64;
    let mut last_finish = 0.0f64;
    let mut events = Vec::new();

    let send = |engine: &mut Engine, now: f64, submitted: &mut u64, submit_at: &mut Vec<f64>| {
        let id = *submitted;
        engine.submit(
            now,
            SimRequest {
                id,
                prompt: synthetic_prompt(id, workload.prompt_tokens),
                max_tokens: workload.output_tokens,
                adapter: None,
                priority: 0,
            },
        );
        submit_at.push(now);
        *submitted += 1;
    };
    for _ in 0..u64::from(in_flight).min(total) {
        send(&mut engine, 0.0, &mut submitted, &mut submit_at);
    }
    while let Some(t) = engine.next_event_at() {
        engine.advance(t, &mut events);
        for event in events.drain(..) {
            match event {
                EngineEvent::FirstToken { id, at, .. } => first_token_at[id as usize] = at,
                EngineEvent::Finished {
                    id,
                    at,
                    completion_tokens,
                    ..
                } => {
                    completed += 1;
                    last_finish = last_finish.max(at);
                    if completed > warmup {
                        let first = first_token_at[id as usize];
                        ttfts.push(first - submit_at[id as usize]);
                        if completion_tokens > 1 {
                            itl_sum += (at - first) / f64::from(completion_tokens - 1);
                        }
                        measured += 1;
                    }
                    if submitted < total {
                        send(&mut engine, at, &mut submitted, &mut submit_at);
                    }
                }
                EngineEvent::Rejected { reason, .. } => {
                    panic!("calibration workload rejected: {reason}")
                }
                EngineEvent::Token { .. } => {}
            }
        }
    }
    ttfts.sort_by(f64::total_cmp);
    let stats = engine.stats();
    let duration = last_finish;
    LoadReport {
        requests: measured,
        ttft_mean: mean(&ttfts),
        ttft_p50: percentile(&ttfts, 0.50),
        ttft_p99: percentile(&ttfts, 0.99),
        itl_mean: if measured == 0 {
            0.0
        } else {
            itl_sum / measured as f64
        },
        output_tokens_per_second: stats.generation_tokens_total as f64 / duration,
        requests_per_second: completed as f64 / duration,
        duration,
        preemptions: stats.preemptions_total,
    }
}

/// Distinct pseudo-random token ids per request, so requests share no
/// prefix (the published runs use random or varied prompts).
pub fn synthetic_prompt(request: u64, tokens: u32) -> Vec<u32> {
    let mut state = request.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xd1b5_4a32_d192_ed03;
    (0..tokens)
        .map(|_| {
            // xorshift64*: cheap and good enough for token ids.
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            (state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as u32 % 128_000
        })
        .collect()
}

fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturation_shape_matches_published_sweeps() {
        // NIM sweeps: ITL rises slowly then plateaus once the batch is full,
        // while TTFT explodes (queueing in front of a full batch).
        let cfg = EngineConfig::new("h100", "llama-3.1-70b", Some(4)).unwrap();
        let work = Workload {
            prompt_tokens: 5000,
            output_tokens: 500,
        };
        let c1 = closed_loop(&cfg, 1, work, 3);
        let c25 = closed_loop(&cfg, 25, work, 3);
        let c250 = closed_loop(&cfg, 250, work, 3);
        assert!(c25.itl_mean > c1.itl_mean);
        assert!(c25.output_tokens_per_second > 10.0 * c1.output_tokens_per_second);
        assert!(c250.ttft_mean > 20.0 * c25.ttft_mean, "{c250:?} vs {c25:?}");
        // Once saturated, more clients add queueing, not throughput.
        let c100 = closed_loop(&cfg, 100, work, 3);
        assert!(c250.output_tokens_per_second < 1.3 * c100.output_tokens_per_second);
    }

    #[test]
    fn closed_loop_counts_every_request() {
        let cfg = EngineConfig::new("a100", "llama-3.1-8b", None).unwrap();
        let work = Workload {
            prompt_tokens: 100,
            output_tokens: 10,
        };
        let report = closed_loop(&cfg, 4, work, 5);
        assert_eq!(report.requests, 16, "20 requests minus 4 warm-up");
        let expected_rate = 20.0 * 10.0 / report.duration;
        assert!((report.output_tokens_per_second - expected_rate).abs() < 1e-9);
        assert!(report.ttft_p50 <= report.ttft_p99);
    }

    #[test]
    fn synthetic_prompts_differ_between_requests() {
        assert_ne!(synthetic_prompt(1, 32), synthetic_prompt(2, 32));
        assert_eq!(synthetic_prompt(7, 32), synthetic_prompt(7, 32));
        assert_eq!(synthetic_prompt(7, 32).len(), 32);
    }
}
