//! What the index costs a request and a batch: the picker's shape of
//! question (an 8k-token chat prompt: a 2k-token system prompt every
//! replica holds, 16 other conversations per replica, this conversation's
//! previous turn on one replica), and applying an engine step's events.
//!
//! `cargo bench -p kv-events --bench index`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use kv_events::index::{PoolIndex, PublisherId, PublisherIndex};
use kv_events::keys::prompt_keys;
use kv_events::wire::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent};

const BS: u32 = 16;

fn tokens(seed: u32, n: usize) -> Vec<u32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            state % 128_000
        })
        .collect()
}

/// Store `prompt`'s blocks on `p`, hashing them `base + i`.
fn store(p: &PublisherIndex, seq: &mut u64, base: u64, prompt: &[u32]) {
    let blocks = prompt.len() / BS as usize;
    let event = BlockStored::new(
        (0..blocks as u64)
            .map(|i| BlockHash::Unsigned(base + i))
            .collect(),
        None,
        prompt[..blocks * BS as usize].to_vec(),
        BS,
        None,
    );
    p.apply(
        *seq,
        &EventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored(event)],
            data_parallel_rank: None,
        },
    );
    *seq += 1;
}

fn pool(
    replicas: u64,
    system: &[u32],
    conversation: &[u32],
) -> (std::sync::Arc<PoolIndex>, Vec<PublisherIndex>) {
    let pool = PoolIndex::new();
    let publishers: Vec<PublisherIndex> = (0..replicas)
        .map(|r| {
            let p = pool.attach(PublisherId {
                replica: r,
                rank: 0,
            });
            let mut seq = 0;
            store(&p, &mut seq, 1 << 40, system);
            for c in 0..16u32 {
                let mut other = system.to_vec();
                other.extend(tokens(1000 + r as u32 * 16 + c, 6144));
                store(&p, &mut seq, (u64::from(c) + 1) << 32 | r << 48, &other);
            }
            if r == 0 {
                store(&p, &mut seq, 7 << 56, conversation);
            }
            p
        })
        .collect();
    (pool, publishers)
}

fn query(c: &mut Criterion) {
    let system = tokens(1, 2048);
    let mut conversation = system.clone();
    conversation.extend(tokens(2, 5120));
    let mut prompt = conversation.clone();
    prompt.extend(tokens(3, 1024));

    c.bench_function("prompt_keys 8k tokens", |b| {
        b.iter(|| prompt_keys(black_box(&prompt), None, BS))
    });
    let mut group = c.benchmark_group("match_prefix 8k tokens");
    for replicas in [8u64, 64, 256] {
        let (pool, _publishers) = pool(replicas, &system, &conversation);
        let keys = prompt_keys(&prompt, None, BS);
        group.bench_with_input(BenchmarkId::from_parameter(replicas), &keys, |b, keys| {
            b.iter(|| pool.match_prefix(black_box(keys)))
        });
    }
    group.finish();
}

fn apply(c: &mut Criterion) {
    // One engine step: 16 blocks stored (a 256-token prefill chunk) and
    // 16 evicted, on a replica already holding about 17k blocks.
    let system = tokens(1, 2048);
    let (_pool, publishers) = pool(4, &system, &system);
    let p = &publishers[1];
    let chunk = tokens(9, 256);
    let mut seq = 1_000;
    let mut base = 9u64 << 56;
    c.bench_function("apply a step (16 stored, 16 removed)", |b| {
        b.iter(|| {
            let stored = BlockStored::new(
                (0..16).map(|i| BlockHash::Unsigned(base + i)).collect(),
                None,
                chunk.clone(),
                BS,
                None,
            );
            let removed =
                BlockRemoved::new((0..16).map(|i| BlockHash::Unsigned(base + i)).collect());
            let batch = EventBatch {
                ts: 0.0,
                events: vec![KvEvent::BlockStored(stored), KvEvent::BlockRemoved(removed)],
                data_parallel_rank: None,
            };
            p.apply(seq, black_box(&batch));
            seq += 1;
            base += 16;
        })
    });
}

criterion_group!(benches, query, apply);
criterion_main!(benches);
