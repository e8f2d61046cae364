//! The simulator's KV events against its own cache: an index built from
//! nothing but the published events (through the wire format) holds
//! exactly the blocks the engine's prefix cache holds, and predicts every
//! prefix hit the engine then finds, under traffic that evicts.

#[allow(dead_code)] // The helpers are shared with tests/http.rs, which uses the rest.
mod support;

use std::time::Duration;

use kv_events::index::{PoolIndex, PublisherId, Source, Tier};
use kv_events::subscriber::{SubscriberConfig, subscribe};
use kv_events::wire::{BlockHash, Encoding, EventBatch, KvEvent, decode_message, encode_message};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use sim::engine::{Engine, EngineConfig, EngineEvent, KvCacheEvent, SimRequest};
use sim::{KvEventsSpec, ReplicaSpec, kv_cache_events, tokenizer};
use support::{Http, MODEL, replica};

const BLOCKS: u64 = 96;
const ID: PublisherId = PublisherId {
    replica: 1,
    rank: 0,
};

fn small_engine() -> Engine {
    let mut cfg = EngineConfig::new("h100", "llama-3.1-8b", None).unwrap();
    cfg.num_gpu_blocks_override = Some(BLOCKS);
    cfg.max_model_len = 1024;
    // Chunked prefill: prompts are cached over several steps.
    cfg.max_num_batched_tokens = 256;
    cfg.max_loras = 2;
    let mut engine = Engine::new(cfg);
    engine.set_kv_events(true);
    engine.register_adapter("sql");
    engine.register_adapter("chat");
    engine
}

/// Carries an engine's records to an index over the wire, as a
/// subscriber would, alternating the encodings.
struct Wire {
    /// Hashes as 8 bytes rather than integers (one form per engine).
    bytes: bool,
    seq: u64,
    records: Vec<KvCacheEvent>,
    stored: u64,
    removed: u64,
}

impl Wire {
    fn pump(&mut self, engine: &mut Engine, index: &kv_events::index::PublisherIndex) {
        engine.drain_kv_events(&mut self.records);
        if self.records.is_empty() {
            return;
        }
        let encoding = if self.seq.is_multiple_of(2) {
            Encoding::Array
        } else {
            Encoding::Map
        };
        let events = kv_cache_events::to_wire(self.records.drain(..), 16, self.bytes);
        for event in &events {
            match event {
                KvEvent::BlockStored(s) => self.stored += s.block_hashes.len() as u64,
                KvEvent::BlockRemoved(r) => self.removed += r.block_hashes.len() as u64,
                _ => {}
            }
        }
        let batch = EventBatch {
            ts: 0.0,
            events,
            data_parallel_rank: Some(0),
        };
        let frames = encode_message(b"", self.seq, &batch, encoding);
        let message = decode_message(&frames).unwrap();
        index.apply(message.seq, &message.batch);
        self.seq += 1;
    }
}

/// The index holds exactly the engine's cached blocks (named as the wire
/// named them).
fn same_blocks(pool: &PoolIndex, engine: &Engine, bytes: bool) {
    let mut cached: Vec<u64> = engine
        .cached_block_hashes()
        .into_iter()
        .map(|h| match bytes {
            true => BlockHash::Bytes(h.to_be_bytes().to_vec()).id(),
            false => h,
        })
        .collect();
    cached.sort_unstable();
    assert_eq!(pool.block_ids(ID, Tier::Gpu), cached, "index vs cache");
}

#[test]
fn the_events_rebuild_the_engines_cache_under_evictions() {
    for bytes in [false, true] {
        rebuild_under_evictions(bytes);
    }
}

fn rebuild_under_evictions(bytes: bool) {
    let mut engine = small_engine();
    let pool = PoolIndex::new();
    let index = pool.attach(ID);
    let mut wire = Wire {
        bytes,
        seq: 0,
        records: Vec::new(),
        stored: 0,
        removed: 0,
    };
    let mut rng = SmallRng::seed_from_u64(7);
    let systems: Vec<Vec<u32>> = (0..4)
        .map(|i| (0..48 + 40 * i).map(|t| 1000 * (i + 1) + t).collect())
        .collect();
    let prompt = |rng: &mut SmallRng| {
        let mut p = systems[rng.gen_range(0..systems.len())].clone();
        let suffix = rng.gen_range(1..200);
        p.extend((0..suffix).map(|_| rng.gen_range(0..128_000)));
        p
    };
    let adapter = |rng: &mut SmallRng| match rng.gen_range(0..4) {
        0 => Some("sql".to_owned()),
        1 => Some("chat".to_owned()),
        _ => None,
    };

    let mut id = 0;
    let mut predicted_hits = 0;
    let mut now = 0.0;
    for wave in 0..30 {
        // One request to the idle engine: the index predicts its hit.
        id += 1;
        let (p, a) = (prompt(&mut rng), adapter(&mut rng));
        let max_hit = (p.len() as u32 - 1) / 16;
        let predicted = index.matched_blocks(&p, a.as_deref(), 16).gpu.min(max_hit);
        predicted_hits += predicted;
        engine.submit(now, request(id, p, a));
        let events = run(&mut engine, &mut wire, &index, &mut now);
        let cached = events.iter().find_map(|e| match e {
            EngineEvent::FirstToken {
                id: i,
                cached_tokens,
                ..
            } if *i == id => Some(*cached_tokens),
            _ => None,
        });
        assert_eq!(cached, Some(predicted * 16), "wave {wave}: request {id}");
        same_blocks(&pool, &engine, bytes);

        // Then a burst that competes for the cache.
        for _ in 0..rng.gen_range(2..8) {
            id += 1;
            engine.submit(now, request(id, prompt(&mut rng), adapter(&mut rng)));
        }
        run(&mut engine, &mut wire, &index, &mut now);
        same_blocks(&pool, &engine, bytes);
    }
    let status = index.status().unwrap();
    assert!(wire.removed > 100, "evictions: {}", wire.removed);
    assert!(predicted_hits > 50, "hits predicted: {predicted_hits}");
    assert_eq!(status.orphaned_blocks, 0);
    assert_eq!(status.missing_removals, 0);
    assert_eq!(status.gpu_blocks as u64, wire.stored - wire.removed);
}

fn request(id: u64, prompt: Vec<u32>, adapter: Option<String>) -> SimRequest {
    SimRequest {
        id,
        prompt,
        max_tokens: 24,
        adapter,
        priority: 0,
    }
}

/// Run until idle, carrying the records after every step.
fn run(
    engine: &mut Engine,
    wire: &mut Wire,
    index: &kv_events::index::PublisherIndex,
    now: &mut f64,
) -> Vec<EngineEvent> {
    let mut events = Vec::new();
    wire.pump(engine, index);
    while let Some(t) = engine.next_event_at() {
        engine.advance(t, &mut events);
        wire.pump(engine, index);
        *now = t;
    }
    events
}

#[tokio::test]
async fn a_replica_publishes_its_cache_over_zmq_and_replays_what_it_dropped() {
    let spec = ReplicaSpec {
        time_scale: 200.0,
        num_gpu_blocks_override: Some(32),
        kv_events: Some(KvEventsSpec {
            topic: "kv@sim@llama".into(),
            drop_fraction: 0.5,
            encoding: Encoding::Array,
            ..KvEventsSpec::default()
        }),
        ..ReplicaSpec::new("h100", "llama-3.1-8b")
    };
    let replica = replica(spec).await;
    let info = replica.info().clone();
    let pool = PoolIndex::new();
    let subscription = subscribe(
        &pool,
        1,
        SubscriberConfig {
            replay_endpoint: info.kv_events_replay_endpoint.clone(),
            topic: "kv@sim@llama".into(),
            // The last batches may be the dropped ones.
            idle_replay: Some(Duration::from_millis(100)),
            ..SubscriberConfig::new(info.kv_events_endpoint.clone().unwrap())
        },
    )
    .unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        subscription.wait_until(|s| s[0].source == Source::Events),
    )
    .await
    .expect("the subscriber syncs with the replica");

    // Conversations over a few shared system prompts, more than 32 blocks
    // of 16 tokens hold.
    let http = Http::new(replica.local_addr());
    let mut rng = SmallRng::seed_from_u64(3);
    let systems = [
        "You are a terse assistant for a logistics company. ".repeat(12),
        "Answer in French and cite the manual, chapter and verse. ".repeat(15),
        "You review SQL queries for correctness and speed. ".repeat(9),
    ];
    let mut last_prompt = Vec::new();
    for round in 0..24 {
        let system = &systems[rng.gen_range(0..systems.len())];
        let question = format!("Question {round}: {}", rng.r#gen::<u64>());
        let body = json!({
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": question},
            ],
            "max_tokens": 8,
        });
        assert_eq!(
            http.post_json("/v1/chat/completions", &body).await.status,
            200
        );
        last_prompt = tokenizer::encode_chat([
            tokenizer::ChatTurn {
                role: "system",
                content: system,
            },
            tokenizer::ChatTurn {
                role: "user",
                content: &question,
            },
        ]);
    }

    let cached = replica.cached_blocks().await;
    let last = replica
        .kv_events_published()
        .await
        .expect("batches were published");
    tokio::time::timeout(
        Duration::from_secs(20),
        subscription.wait_until(|s| s[0].last_sequence == Some(last)),
    )
    .await
    .unwrap_or_else(|_| {
        panic!(
            "the subscriber reaches batch {last}: {:#?}",
            subscription.statuses()
        )
    });

    let status = &subscription.statuses()[0];
    assert_eq!(status.source, Source::Events, "{status:#?}");
    assert!(status.gaps > 0, "dropped batches make gaps: {status:#?}");
    assert!(status.replayed_batches > 0, "{status:#?}");
    assert_eq!(status.orphaned_blocks, 0, "{status:#?}");
    assert!(status.missing_removals == 0, "{status:#?}");
    assert_eq!(pool.block_ids(ID, Tier::Gpu), cached, "index vs cache");
    assert!(cached.len() <= 32);
    assert!(status.removed_blocks > 0, "evictions: {status:#?}");
    assert_eq!(
        status.stored_blocks - status.removed_blocks,
        cached.len() as u64
    );
    // The gateway's question, with the simulator's tokenizer: the last
    // conversation is cached, at least its system prompt's blocks.
    let matched = pool.matched_blocks(1, &last_prompt, None, 16);
    assert!(matched.gpu >= 8, "{matched:?}");
    replica.crash().await;
}

/// The token ids `/tokenize` answers for a body are the ones the engine
/// runs for the same body: its blocks, as published, carry exactly them,
/// and the answer's `usage` counts as many.
#[tokio::test]
async fn tokenize_answers_the_ids_whose_blocks_the_engine_stores() {
    let spec = ReplicaSpec {
        time_scale: 200.0,
        kv_events: Some(KvEventsSpec::default()),
        ..ReplicaSpec::new("h100", "llama-3.1-8b")
    };
    let replica = replica(spec).await;
    let http = Http::new(replica.local_addr());
    let max_model_len = http.get("/v1/models").await.json()["data"][0]["max_model_len"].clone();
    let chat = json!({
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You keep the harbour's ferry timetable. ".repeat(8)},
            {"role": "user", "content": [{"type": "text", "text": "When does the last ferry leave?"}]},
        ],
        "max_tokens": 1,
    });
    let completion = json!({
        "model": MODEL,
        "prompt": "The lighthouse keeper counted the ships at dusk, ".repeat(9),
        "max_tokens": 1,
    });
    for (path, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", completion),
    ] {
        let tokenized = http.post_json("/tokenize", &body).await;
        assert_eq!(tokenized.status, 200, "{}", tokenized.text());
        let tokenized = tokenized.json();
        let ids: Vec<u32> = serde_json::from_value(tokenized["tokens"].clone()).unwrap();
        assert_eq!(tokenized["count"], ids.len(), "{path}");
        assert_eq!(tokenized["max_model_len"], max_model_len, "{path}");

        let answer = http.post_json(path, &body).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["usage"]["prompt_tokens"], ids.len(), "{path}");

        // The full blocks of the prompt are stored; its partial last block
        // is not, and output blocks only on preemption.
        let full = ids.len() / 16 * 16;
        assert!(full >= 64, "{path}: a prompt of {} tokens", ids.len());
        let chains = stored_chains(&replica).await;
        let longest = chains
            .iter()
            .filter(|chain| chain[..16] == ids[..16])
            .max_by_key(|chain| chain.len())
            .unwrap_or_else(|| panic!("{path}: no stored block starts the prompt"));
        assert_eq!(longest[..], ids[..full], "{path}");
    }
    replica.crash().await;
}

/// Every block the replica has published as stored, as the tokens from the
/// start of its sequence to its end (read back through the replay socket,
/// so none can be missed).
async fn stored_chains(replica: &sim::ReplicaHandle) -> Vec<Vec<u32>> {
    // Publishes every change up to now, then waits until it is buffered.
    replica.cached_blocks().await;
    replica.kv_events_published().await;
    let endpoint = replica.info().kv_events_replay_endpoint.clone().unwrap();
    let batches = kv_events::subscriber::replay::replay(&endpoint, 0, Duration::from_secs(10))
        .await
        .expect("the replay answers");
    let mut chains: std::collections::HashMap<u64, Vec<u32>> = Default::default();
    for (_, payload) in batches {
        for event in kv_events::wire::decode_batch(&payload).unwrap().events {
            let KvEvent::BlockStored(stored) = event else {
                continue;
            };
            let mut chain = match &stored.parent_block_hash {
                None => Vec::new(),
                Some(parent) => chains[&parent.id()].clone(),
            };
            let size = stored.block_size as usize;
            for (hash, tokens) in stored
                .block_hashes
                .iter()
                .zip(stored.token_ids.chunks_exact(size))
            {
                chain.extend_from_slice(tokens);
                chains.insert(hash.id(), chain.clone());
            }
        }
    }
    chains.into_values().collect()
}
