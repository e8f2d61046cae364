//! What matching a prompt against the engines' KV-cache events costs a
//! request, at 1k, 8k and 32k prompt tokens: the engine's `/tokenize`
//! round trip (a simulated replica on loopback, which tokenizes as fast
//! as Rust does: a real engine's API server takes longer, milliseconds
//! for 32k tokens), the prompt's block keys, and one match against a
//! 16-replica pool whose every replica holds a quarter of the prompt as a
//! shared system prompt and one holds the whole conversation. For scale:
//! the prefill this saves on a cache hit is tens of milliseconds at 1k
//! tokens and seconds at 32k on an H100.
//!
//! `cargo bench -p infergate-gateway --bench prefix_match`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kv_events::index::{PoolIndex, PublisherId, PublisherIndex};
use kv_events::keys::prompt_keys;
use kv_events::wire::{BlockHash, BlockStored, EventBatch, KvEvent};
use serde_json::{Value, json};

const BLOCK: u32 = 16;
const REPLICAS: u64 = 16;
const SIZES: [usize; 3] = [1_024, 8_192, 32_768];

/// A chat body of about `tokens` tokens for the simulator's tokenizer
/// (" abc" is one token).
fn body(tokens: usize) -> Value {
    json!({"model": "m", "messages": [
        {"role": "system", "content": " abc".repeat(tokens / 4)},
        {"role": "user", "content": " xyz".repeat(tokens - tokens / 4)},
    ]})
}

fn store(p: &PublisherIndex, seq: u64, base: u64, tokens: &[u32]) {
    let blocks = tokens.len() / BLOCK as usize;
    let stored = BlockStored::new(
        (0..blocks as u64)
            .map(|i| BlockHash::Unsigned(base + i))
            .collect(),
        None,
        tokens[..blocks * BLOCK as usize].to_vec(),
        BLOCK,
        None,
    );
    p.apply(
        seq,
        &EventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored(stored)],
            data_parallel_rank: None,
        },
    );
}

/// Every replica holds the system prompt; replica 0 the whole prompt.
fn pool(prompt: &[u32]) -> (Arc<PoolIndex>, Vec<PublisherIndex>) {
    let pool = PoolIndex::new();
    let system = &prompt[..prompt.len() / 4];
    let publishers = (0..REPLICAS)
        .map(|replica| {
            let p = pool.attach(PublisherId { replica, rank: 0 });
            store(&p, 0, replica << 40, system);
            if replica == 0 {
                store(&p, 1, 1 << 60, prompt);
            }
            p
        })
        .collect();
    (pool, publishers)
}

fn prefix_match(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let replica = runtime.block_on(async {
        sim::start_replica(
            "127.0.0.1:0".parse().unwrap(),
            sim::ReplicaSpec {
                served_model_name: Some("m".into()),
                ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
            },
        )
        .await
        .unwrap()
    });
    let url = format!("http://{}/tokenize", replica.local_addr());
    let client = reqwest::Client::new();
    let tokenize = |tokens: usize| {
        let mut request = body(tokens);
        request["add_generation_prompt"] = Value::Bool(true);
        let (client, url) = (client.clone(), url.clone());
        async move {
            let answer: Value = client
                .post(url)
                .json(&request)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            serde_json::from_value::<Vec<u32>>(answer["tokens"].clone()).unwrap()
        }
    };
    let mut group = c.benchmark_group("prefix_match");
    for size in SIZES {
        let tokens = runtime.block_on(tokenize(size));
        group.bench_with_input(BenchmarkId::new("tokenize", size), &size, |b, &size| {
            b.to_async(&runtime).iter(|| tokenize(size));
        });
        group.bench_with_input(BenchmarkId::new("keys", size), &tokens, |b, tokens| {
            b.iter(|| prompt_keys(black_box(tokens), None, BLOCK));
        });
        let (index, _publishers) = pool(&tokens);
        let keys = prompt_keys(&tokens, None, BLOCK);
        group.bench_with_input(BenchmarkId::new("match", size), &keys, |b, keys| {
            b.iter(|| index.match_prefix(black_box(keys)));
        });
    }
    group.finish();
}

criterion_group!(benches, prefix_match);
criterion_main!(benches);
