//! Cost of one scored pick for an 8k-token chat prompt against a warmed
//! prefix index, at 10, 100 and 1,000 replicas; prompt hashing and the
//! index update after a pick are measured on their own, and the predicted
//! policy's pick beside the scored one (while its models are being
//! measured, when the scored policy decides, and once they are trusted).
//!
//! Run: `cargo bench -p infergate-picker --bench pick`. Criterion writes the
//! medians to `target/criterion/<group>/<id>/new/estimates.json`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use picker::{
    Endpoint, EngineState, LatencyFeatures, Observation, PickRequest, Picker, PickerConfig, Policy,
    PrefixConfig, prompt_hashes,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde_json::{Value, json};

const MODEL: &str = "llama-3.1-8b";
const FLEETS: [usize; 3] = [10, 100, 1_000];
/// Other conversations remembered per replica, so the index has the size
/// (and the cache misses) of a pool that has been serving for a while.
const BACKGROUND_PROMPTS_PER_REPLICA: usize = 16;

/// About 2k tokens of system prompt shared by every conversation.
fn system_prompt() -> String {
    "You are the assistant of a support desk. Follow the policies below. ".repeat(120)
}

/// A chat of about 8k tokens (~32 KB): the shared system prompt, then a
/// conversation whose earlier turns are specific to `conversation`.
fn chat_body(conversation: usize, turns: usize) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system_prompt()})];
    for turn in 0..turns {
        messages.push(json!({
            "role": "user",
            "content": format!("Conversation {conversation}, question {turn}: ")
                + &"please explain the billing details again. ".repeat(22),
        }));
        messages.push(json!({
            "role": "assistant",
            "content": "Here is the explanation of the billing details you asked for. ".repeat(20),
        }));
    }
    json!({"model": MODEL, "messages": messages})
}

fn hashes_of(body: &Value) -> Vec<u64> {
    prompt_hashes(MODEL, None, body, &PrefixConfig::default())
}

/// `replicas` fresh, unsaturated replicas with varied load, and a prefix
/// index holding the shared system prompt everywhere, background traffic,
/// and the benchmarked conversation's earlier turns on one replica.
fn warmed_pool(replicas: usize, now: Instant, prompt: &[u64]) -> Picker {
    let endpoints: Vec<Arc<Endpoint>> = (0..replicas)
        .map(|i| {
            let endpoint = Endpoint::new(i, format!("10.0.{}.{}:8000", i / 250, i % 250));
            endpoint.observe(Observation {
                state: Some(Arc::new(EngineState {
                    waiting: Some((i % 4) as u64),
                    running: Some(8 + (i % 16) as u64),
                    kv_usage: Some(0.1 + (i % 7) as f64 * 0.1),
                    block_size: Some(16),
                    kv_capacity_blocks: Some(30_000),
                    ..EngineState::default()
                })),
                last_good: Some(now),
                last_error: None,
            });
            endpoint
        })
        .collect();
    let pool = Picker::new(PickerConfig::default(), endpoints.clone());
    for (replica, endpoint) in endpoints.iter().enumerate() {
        for k in 0..BACKGROUND_PROMPTS_PER_REPLICA {
            let background = hashes_of(&chat_body(1_000_000 + replica * 100 + k, 3));
            pool.record(replica, &background);
        }
        // A few requests in flight from this gateway (never released here).
        std::mem::forget(endpoint.acquire(1_000 * (replica % 3) as u64));
    }
    // The previous turn of this conversation went to one replica.
    let previous_turn = &prompt[..prompt.len() * 3 / 4];
    pool.record(replicas / 2, previous_turn);
    pool
}

/// Teach every replica's latency model until it is trusted: latencies
/// that follow the features exactly, each replica a little slower than
/// the one before.
fn teach(pool: &Picker) {
    for endpoint in pool.endpoints().iter() {
        let slower = 1.0 + (endpoint.index % 10) as f64 * 0.1;
        for k in 0..60u32 {
            let f = LatencyFeatures {
                waiting: f64::from(k % 4),
                running: f64::from(k % 16),
                kv_usage: f64::from(k % 7) * 0.1,
                new_prompt_tokens: f64::from(k % 9) * 900.0,
                cached_prompt_tokens: f64::from(k % 5) * 400.0,
            };
            let ttft = slower * (0.03 + 0.25 * f.waiting + 1e-4 * f.new_prompt_tokens);
            let itl = slower * (0.012 + 6e-4 * f.running + 0.008 * f.kv_usage);
            endpoint.latency().observe(&f, Some(ttft), Some(itl));
        }
        assert!(endpoint.latency().summary().trusted);
    }
}

fn bench_hash(c: &mut Criterion) {
    let body = chat_body(7, 11);
    let blocks = hashes_of(&body).len();
    assert!(blocks >= 480, "prompt is ~8k tokens ({blocks} blocks)");
    c.bench_function("hash/chat_8k_tokens", |b| {
        b.iter(|| hashes_of(black_box(&body)))
    });
}

fn bench_pick(c: &mut Criterion) {
    let now = Instant::now();
    let body = chat_body(7, 11);
    let prompt = hashes_of(&body);
    let mut group = c.benchmark_group("pick");
    for replicas in FLEETS {
        let pool = warmed_pool(replicas, now, &prompt);
        let mut rng = SmallRng::seed_from_u64(1);
        let req = PickRequest {
            prefix_hashes: &prompt,
            estimated_tokens: 8_000,
            context_tokens: 0,
            ..PickRequest::default()
        };
        let cached = pool.prefix_index().longest_match(replicas / 2, &prompt);
        assert_eq!(cached, prompt.len() * 3 / 4, "index is warm");
        pool.pick(&req, now, &[], &mut rng).unwrap();

        group.bench_with_input(BenchmarkId::new("scored", replicas), &replicas, |b, _| {
            b.iter(|| pool.pick(black_box(&req), now, &[], &mut rng).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("hash+scored", replicas),
            &replicas,
            |b, _| {
                b.iter(|| {
                    let hashes = hashes_of(black_box(&body));
                    let req = PickRequest {
                        prefix_hashes: &hashes,
                        estimated_tokens: 8_000,
                        context_tokens: 0,
                        ..PickRequest::default()
                    };
                    pool.pick(&req, now, &[], &mut rng).unwrap()
                })
            },
        );
        group.bench_with_input(BenchmarkId::new("record", replicas), &replicas, |b, _| {
            b.iter(|| pool.record(replicas / 2, black_box(&prompt)))
        });

        pool.set_config(PickerConfig {
            policy: Policy::LeastRequest,
            ..PickerConfig::default()
        });
        group.bench_with_input(
            BenchmarkId::new("least-request", replicas),
            &replicas,
            |b, _| b.iter(|| pool.pick(black_box(&req), now, &[], &mut rng).unwrap()),
        );

        let req = PickRequest {
            prompt_tokens: 8_000,
            expected_output_tokens: 256,
            ..req
        };
        pool.set_config(PickerConfig {
            policy: Policy::Predicted,
            ..PickerConfig::default()
        });
        group.bench_with_input(
            BenchmarkId::new("predicted-measuring", replicas),
            &replicas,
            |b, _| b.iter(|| pool.pick(black_box(&req), now, &[], &mut rng).unwrap()),
        );
        teach(&pool);
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        assert_eq!(decision.policy, Policy::Predicted, "the models decide");
        group.bench_with_input(
            BenchmarkId::new("predicted", replicas),
            &replicas,
            |b, _| b.iter(|| pool.pick(black_box(&req), now, &[], &mut rng).unwrap()),
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = bench_hash, bench_pick
}
criterion_main!(benches);
