//! How fast the engine model runs in virtual time: drives many independent
//! replicas with Poisson arrivals and reports wall-clock cost per request.
//!
//! cargo run -p infergate-sim --release --example engine_speed -- [replicas] [requests-per-replica] [keep]
//!
//! With `keep`, every engine stays alive to the end, so the process's peak
//! memory is that of a whole fleet (replicas run one after another either way).
//!
//! Defaults: 1,000 replicas x 1,000 requests (Llama-3.1-8B on H100, ~60%
//! load, prompts of 300-900 tokens sharing a 256-token system prompt,
//! 50-250 output tokens, per-token events off as in the fleet benchmark).

use std::time::Instant;

use sim::engine::calibration::synthetic_prompt;
use sim::engine::{Engine, EngineConfig, EngineEvent, SimRequest};

/// Small deterministic generator (xorshift64*), so runs are repeatable.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn range(&mut self, low: u32, high: u32) -> u32 {
        low + (self.next_u64() % u64::from(high - low + 1)) as u32
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let replicas: u64 = args.next().map_or(1000, |a| a.parse().expect("replicas"));
    let per_replica: u64 = args.next().map_or(1000, |a| a.parse().expect("requests"));
    let keep = args.next().is_some_and(|a| a == "keep");
    let mut kept = Vec::new();
    let cfg = EngineConfig::new("h100", "llama-3.1-8b", None).expect("profile");
    let system = synthetic_prompt(u64::MAX, 256);
    let arrival_rate = 12.0; // requests/s per replica

    let started = Instant::now();
    let mut events = Vec::new();
    let (mut steps, mut tokens, mut finished, mut first_token_sum) = (0u64, 0u64, 0u64, 0.0);
    for replica in 0..replicas {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (replica + 1));
        let mut engine = Engine::new(cfg.clone());
        engine.set_token_events(false);
        let mut arrivals = Vec::with_capacity(per_replica as usize);
        let mut t = 0.0;
        for _ in 0..per_replica {
            t += -(1.0 - rng.unit()).ln() / arrival_rate;
            arrivals.push(t);
        }
        let mut next = 0usize;
        loop {
            let arrival = arrivals.get(next).copied();
            let event = engine.next_event_at();
            // Arrivals at the same time as a step boundary go first, so they
            // can join the step that starts there.
            if let Some(a) = arrival.filter(|a| event.is_none_or(|e| *a <= e)) {
                let id = replica * per_replica + next as u64;
                let mut prompt = system.clone();
                prompt.extend(synthetic_prompt(id, rng.range(44, 644)));
                engine.submit(
                    a,
                    SimRequest {
                        id,
                        prompt,
                        max_tokens: rng.range(50, 250),
                        adapter: None,
                        priority: 0,
                    },
                );
                next += 1;
            } else if let Some(e) = event {
                engine.advance(e, &mut events);
                for event in events.drain(..) {
                    match event {
                        EngineEvent::FirstToken { id, at, .. } => {
                            let i = (id - replica * per_replica) as usize;
                            first_token_sum += at - arrivals[i];
                        }
                        EngineEvent::Finished { .. } => finished += 1,
                        _ => {}
                    }
                }
            } else {
                break;
            }
        }
        let stats = engine.stats();
        steps += engine.counters().steps_total;
        tokens += stats.generation_tokens_total;
        if keep {
            kept.push(engine);
        }
    }
    let wall = started.elapsed().as_secs_f64();
    println!("replicas:            {replicas}");
    println!("requests finished:   {finished}");
    println!("engine steps:        {steps}");
    println!("output tokens:       {tokens}");
    println!(
        "mean TTFT (virtual): {:.1} ms",
        first_token_sum / finished.max(1) as f64 * 1e3
    );
    println!("wall time:           {wall:.2} s (one thread)");
    println!(
        "per request:         {:.2} us",
        wall / finished.max(1) as f64 * 1e6
    );
    println!(
        "per step:            {:.3} us",
        wall / steps.max(1) as f64 * 1e6
    );
    println!("engines kept alive:  {}", kept.len());
}
