//! Behaviour of the whole engine: scheduling, KV pressure, prefix caching,
//! LoRA slots, timing against the roofline.

use super::calibration::synthetic_prompt;
use super::*;

fn config(hw: &str, model: &str) -> EngineConfig {
    EngineConfig::new(hw, model, None).unwrap()
}

fn request(id: u64, prompt: Vec<u32>, max_tokens: u32) -> SimRequest {
    SimRequest {
        id,
        prompt,
        max_tokens,
        adapter: None,
        priority: 0,
    }
}

fn lora_request(id: u64, prompt_tokens: u32, max_tokens: u32, adapter: &str) -> SimRequest {
    SimRequest {
        adapter: Some(adapter.to_owned()),
        ..request(id, synthetic_prompt(id, prompt_tokens), max_tokens)
    }
}

/// Run until idle, checking `each_step` at every step boundary.
fn drain(engine: &mut Engine, mut each_step: impl FnMut(&Engine)) -> Vec<EngineEvent> {
    let mut events = Vec::new();
    while let Some(t) = engine.next_event_at() {
        engine.advance(t, &mut events);
        each_step(engine);
    }
    events
}

fn first_token_at(events: &[EngineEvent], id: u64) -> f64 {
    events
        .iter()
        .find_map(|e| match e {
            EngineEvent::FirstToken { id: i, at, .. } if *i == id => Some(*at),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no first token for {id}"))
}

fn finished(events: &[EngineEvent], id: u64) -> (f64, u32, u32, FinishReason) {
    events
        .iter()
        .find_map(|e| match e {
            EngineEvent::Finished {
                id: i,
                at,
                completion_tokens,
                cached_tokens,
                reason,
                ..
            } if *i == id => Some((*at, *completion_tokens, *cached_tokens, *reason)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("request {id} did not finish"))
}

#[test]
fn an_idle_engine_has_no_next_event() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    assert_eq!(engine.next_event_at(), None);
    engine.submit(1.0, request(1, synthetic_prompt(1, 100), 3));
    assert_eq!(
        engine.next_event_at(),
        Some(1.0),
        "a step starts at the arrival"
    );
    engine.advance(1.0, &mut Vec::new());
    let step = engine.current_step().expect("a step in flight");
    assert!(step.end > 1.0);
    assert_eq!(engine.next_event_at(), Some(step.end));
    let events = drain(&mut engine, |_| {});
    assert_eq!(engine.next_event_at(), None);
    assert_eq!(engine.current_step(), None);
    assert_eq!(finished(&events, 1).1, 3);
    let stats = engine.stats();
    assert_eq!((stats.running, stats.waiting), (0, 0));
    assert_eq!(stats.kv_usage, 0.0);
}

#[test]
fn every_request_gets_exactly_max_tokens_in_order() {
    let mut engine = Engine::new(config("a100", "llama-3.1-8b"));
    for id in 0..20 {
        engine.submit(
            0.001 * id as f64,
            request(
                id,
                synthetic_prompt(id, 300 + 17 * id as u32),
                5 + id as u32,
            ),
        );
    }
    let events = drain(&mut engine, |_| {});
    for id in 0..20u64 {
        let tokens = events
            .iter()
            .filter(|e| matches!(e, EngineEvent::Token { id: i, .. } | EngineEvent::FirstToken { id: i, .. } if *i == id))
            .count();
        assert_eq!(tokens as u64, 5 + id);
        assert_eq!(finished(&events, id).1 as u64, 5 + id);
    }
    assert!(
        events.windows(2).all(|w| w[0].at() <= w[1].at()),
        "events in time order"
    );
    let stats = engine.stats();
    assert_eq!(stats.requests_finished_total, 20);
    assert_eq!(
        stats.generation_tokens_total,
        (0..20).map(|i| 5 + i).sum::<u64>()
    );
}

#[test]
fn a_prefix_hit_shortens_ttft_by_the_skipped_prefill() {
    let cfg = config("h100", "llama-3.1-8b");
    let mut engine = Engine::new(cfg);
    let shared = synthetic_prompt(1, 4096);
    engine.submit(0.0, request(1, shared.clone(), 1));
    let cold = drain(&mut engine, |_| {});
    let ttft_cold = first_token_at(&cold, 1);

    let mut warm_prompt = shared;
    warm_prompt.extend(synthetic_prompt(2, 16));
    engine.submit(10.0, request(2, warm_prompt, 1));
    let warm = drain(&mut engine, |_| {});
    let ttft_warm = first_token_at(&warm, 2) - 10.0;
    let (_, _, cached, _) = finished(&warm, 2);
    assert_eq!(cached, 4096);

    let r = engine.roofline();
    let expected_saving = r.prefill_seconds(0, 4096) - r.prefill_seconds(4096, 16);
    let saving = ttft_cold - ttft_warm;
    assert!(
        (saving / expected_saving - 1.0).abs() < 0.05,
        "saved {saving} s, the skipped prefill costs {expected_saving} s"
    );
    assert!(ttft_warm < 0.25 * ttft_cold);
    let stats = engine.stats();
    assert_eq!(stats.prefix_cache_queries, 4096 + 4112);
    assert_eq!(stats.prefix_cache_hits, 4096);
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_block() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    let prompt = synthetic_prompt(1, 64);
    engine.submit(0.0, request(1, prompt.clone(), 1));
    drain(&mut engine, |_| {});
    engine.submit(1.0, request(2, prompt, 1));
    let events = drain(&mut engine, |_| {});
    // vLLM caps hits at prompt length - 1: the 4th block is recomputed.
    assert_eq!(finished(&events, 2).2, 48);
}

#[test]
fn the_cached_prefix_query_predicts_the_hit_and_changes_nothing() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    engine.register_adapter("sql");
    let shared = synthetic_prompt(1, 1000);
    engine.submit(0.0, request(1, shared.clone(), 1));
    drain(&mut engine, |_| {});

    let mut prompt = shared[..800].to_vec();
    prompt.extend(synthetic_prompt(2, 300));
    let hashes = Engine::prompt_block_hashes(&prompt, None, 16);
    assert_eq!(hashes.len(), 1100 / 16);
    // 800 shared tokens are 50 whole blocks; the next block differs.
    assert_eq!(engine.cached_prefix_blocks(&hashes), 50);
    assert_eq!(
        engine.cached_prefix_blocks(&hashes),
        50,
        "a read, not a use"
    );
    let sql = Engine::prompt_block_hashes(&prompt, Some("sql"), 16);
    assert_eq!(engine.cached_prefix_blocks(&sql), 0, "another chain");
    // The first request's blocks, as the cache names them.
    let mut cached = engine.cached_block_hashes();
    let mut first = Engine::prompt_block_hashes(&shared, None, 16);
    cached.sort_unstable();
    first.sort_unstable();
    assert_eq!(cached, first);

    engine.submit(1.0, request(2, prompt, 1));
    let events = drain(&mut engine, |_| {});
    assert_eq!(finished(&events, 2).2, 50 * 16);
}

#[test]
fn adapters_do_not_share_prefix_blocks_with_the_base_model() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    engine.register_adapter("sql");
    let prompt = synthetic_prompt(1, 256);
    engine.submit(0.0, request(1, prompt.clone(), 1));
    drain(&mut engine, |_| {});
    engine.submit(
        1.0,
        SimRequest {
            adapter: Some("sql".into()),
            ..request(2, prompt.clone(), 1)
        },
    );
    engine.submit(1.0, request(3, prompt, 1));
    let events = drain(&mut engine, |_| {});
    assert_eq!(finished(&events, 2).2, 0);
    assert_eq!(finished(&events, 3).2, 240);
}

#[test]
fn chunked_prefill_respects_the_token_budget() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.max_num_batched_tokens = 4096;
    let mut engine = Engine::new(cfg);
    for id in 0..3 {
        engine.submit(0.0, request(id, synthetic_prompt(id, 5000), 4));
    }
    engine.advance(0.0, &mut Vec::new());
    let first = engine.current_step().unwrap();
    assert_eq!(
        first.tokens, 4096,
        "the first prompt is chunked to the budget"
    );
    assert_eq!(first.sequences, 1);
    let mut steps = vec![first];
    drain(&mut engine, |e| steps.extend(e.current_step()));
    assert!(steps.iter().all(|s| s.tokens <= 4096));
    // Prefill of 15,000 tokens needs at least four full steps; decodes share
    // steps with prefill chunks (running requests go first).
    assert!(steps.iter().filter(|s| s.tokens == 4096).count() >= 3);
    assert_eq!(steps[1].tokens, 4096);
    assert_eq!(
        steps[1].sequences, 2,
        "rest of prompt 0 plus the start of prompt 1"
    );
}

#[test]
fn max_num_seqs_bounds_the_batch() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.max_num_seqs = 4;
    let mut engine = Engine::new(cfg);
    for id in 0..10 {
        engine.submit(0.0, request(id, synthetic_prompt(id, 32), 20));
    }
    let mut max_running = 0;
    drain(&mut engine, |e| {
        max_running = max_running.max(e.stats().running);
        assert!(e.current_step().is_none_or(|s| s.sequences <= 4));
    });
    assert_eq!(max_running, 4);
}

#[test]
fn kv_exhaustion_queues_new_requests() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.num_gpu_blocks_override = Some(20);
    cfg.max_model_len = 320;
    let mut engine = Engine::new(cfg);
    // Each prompt takes 8 blocks: two fit, the third waits for memory.
    for id in 0..3 {
        engine.submit(0.0, request(id, synthetic_prompt(id, 128), 2));
    }
    engine.advance(0.0, &mut Vec::new());
    let stats = engine.stats();
    assert_eq!((stats.running, stats.waiting), (2, 1));
    assert!(stats.kv_usage > 0.75);
    let events = drain(&mut engine, |_| {});
    let (done, ..) = finished(&events, 0);
    assert!(
        first_token_at(&events, 2) > done,
        "started only after memory was freed"
    );
    assert_eq!(engine.stats().preemptions_total, 0);
}

#[test]
fn kv_exhaustion_during_decode_preempts_the_newest() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.num_gpu_blocks_override = Some(20);
    cfg.max_model_len = 320;
    let mut engine = Engine::new(cfg);
    // Four requests of 3 prompt blocks grow to 10 blocks each: 40 > 20.
    for id in 0..4 {
        engine.submit(0.0, request(id, synthetic_prompt(id, 48), 100));
    }
    let mut max_usage: f64 = 0.0;
    let events = drain(&mut engine, |e| {
        max_usage = max_usage.max(e.stats().kv_usage)
    });
    let stats = engine.stats();
    assert!(stats.preemptions_total > 0);
    assert_eq!(stats.requests_finished_total, 4);
    assert!(max_usage <= 1.0);
    for id in 0..4 {
        assert_eq!(
            finished(&events, id).1,
            100,
            "recomputed requests still finish"
        );
        let firsts = events
            .iter()
            .filter(|e| matches!(e, EngineEvent::FirstToken { id: i, .. } if *i == id))
            .count();
        assert_eq!(
            firsts, 1,
            "a recomputed request does not restart its stream"
        );
    }
    // The newest request is the one pushed back: the oldest finishes first.
    assert!(finished(&events, 0).0 < finished(&events, 3).0);
}

/// Total tokens computed to serve a long request A and a newer request B
/// that is preempted when A's growth exhausts a 20-block cache.
fn tokens_computed_with_preemption(prefix_caching: bool) -> (u64, u64) {
    tokens_computed_with_preemption_of(prefix_caching, 64)
}

/// As above, with B's prompt `b_prompt` tokens long.
fn tokens_computed_with_preemption_of(prefix_caching: bool, b_prompt: u32) -> (u64, u64) {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.num_gpu_blocks_override = Some(20);
    cfg.max_model_len = 320;
    cfg.enable_prefix_caching = prefix_caching;
    let mut engine = Engine::new(cfg);
    engine.submit(0.0, request(1, synthetic_prompt(1, 16), 200));
    engine.submit(0.0, request(2, synthetic_prompt(2, b_prompt), 200));
    let mut tokens = 0;
    drain(&mut engine, |e| {
        tokens += e.current_step().map_or(0, |s| u64::from(s.tokens))
    });
    (tokens, engine.stats().preemptions_total)
}

#[test]
fn a_preempted_request_recovers_its_prefix_from_the_cache() {
    let (with_cache, preempted) = tokens_computed_with_preemption(true);
    let (without_cache, preempted_too) = tokens_computed_with_preemption(false);
    assert!(preempted > 0 && preempted_too > 0);
    // B's first blocks (freed last, evicted last) survive A's growth, so
    // its recompute after A finishes skips them.
    assert!(
        with_cache + 64 <= without_cache,
        "{with_cache} vs {without_cache}"
    );
}

#[test]
fn a_preempted_request_recovers_its_own_output_from_the_cache() {
    // B's prompt is one block; it has generated well over a hundred tokens
    // when A's growth preempts it. Its output blocks that survive A's
    // growth are found again, so the recompute saves more than its prompt.
    let (with_cache, preempted) = tokens_computed_with_preemption_of(true, 16);
    let (without_cache, _) = tokens_computed_with_preemption_of(false, 16);
    assert!(preempted > 0);
    assert!(
        with_cache + 16 + 64 <= without_cache,
        "{with_cache} vs {without_cache}"
    );
}

#[test]
fn abort_frees_blocks_at_once_and_reports_at_the_next_advance() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    engine.submit(0.0, request(1, synthetic_prompt(1, 2000), 1000));
    engine.submit(0.0, request(2, synthetic_prompt(2, 2000), 1000));
    let mut events = Vec::new();
    engine.advance(0.5, &mut events);
    assert!(engine.stats().kv_usage > 0.0);
    let tokens_before = events.len();
    engine.abort(0.5, 1);
    engine.abort(0.5, 2);
    engine.abort(0.5, 99); // unknown: ignored
    let stats = engine.stats();
    assert_eq!(stats.kv_usage, 0.0, "blocks freed at once");
    assert_eq!((stats.running, stats.waiting), (0, 0));
    assert_eq!(engine.next_event_at().map(|t| t <= 0.5), Some(true));
    engine.advance(0.5, &mut events);
    let aborted: Vec<_> = events[tokens_before..]
        .iter()
        .filter(|e| {
            matches!(
                e,
                EngineEvent::Finished {
                    reason: FinishReason::Aborted,
                    ..
                }
            )
        })
        .collect();
    assert_eq!(aborted.len(), 2);
    let (_, completion, _, _) = finished(&events, 1);
    assert!(completion > 0 && completion < 1000);
    // The step that was in flight completes without reporting the aborted.
    let rest = drain(&mut engine, |_| {});
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(engine.counters().requests_aborted_total, 2);
}

#[test]
fn aborting_a_waiting_request_lets_the_queue_move_on() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.max_num_seqs = 1;
    cfg.max_num_batched_tokens = 4096;
    let mut engine = Engine::new(cfg);
    for id in 0..3 {
        engine.submit(0.0, request(id, synthetic_prompt(id, 100), 10));
    }
    engine.advance(0.0, &mut Vec::new());
    assert_eq!(engine.stats().waiting, 2);
    engine.abort(0.001, 1);
    assert_eq!(engine.stats().waiting, 1);
    let events = drain(&mut engine, |_| {});
    assert_eq!(finished(&events, 1).3, FinishReason::Aborted);
    assert!(finished(&events, 0).0 < first_token_at(&events, 2));
    assert_eq!(finished(&events, 2).1, 10);
}

#[test]
fn the_lora_slot_limit_holds_and_waiting_adapters_start_when_a_slot_frees() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.max_loras = 2;
    let load = cfg.lora_load_seconds;
    let mut engine = Engine::new(cfg);
    for name in ["a", "b", "c"] {
        engine.register_adapter(name);
    }
    engine.submit(0.0, lora_request(1, 200, 50, "a"));
    engine.submit(0.0, lora_request(2, 200, 200, "b"));
    engine.submit(0.0, lora_request(3, 200, 50, "c"));
    engine.submit(0.0, request(4, synthetic_prompt(4, 200), 50));
    engine.advance(0.0, &mut Vec::new());
    let stats = engine.stats();
    assert_eq!(stats.running_adapters, vec!["a", "b"]);
    assert_eq!(stats.waiting_adapters, vec!["c"]);
    assert_eq!(
        stats.running, 3,
        "the base-model request is not held up by adapter c"
    );

    let mut max_adapters = 0;
    let events = drain(&mut engine, |e| {
        let s = e.stats();
        max_adapters = max_adapters.max(s.running_adapters.len());
        assert!(e.counters().resident_adapters.len() <= 2);
    });
    assert_eq!(max_adapters, 2);
    let (a_done, ..) = finished(&events, 1);
    let (b_done, ..) = finished(&events, 2);
    let c_first = first_token_at(&events, 3);
    assert!(
        c_first > a_done && c_first < b_done,
        "c starts when a frees its slot"
    );
    // c's first step pays for loading it.
    assert!(c_first - a_done >= load);
    // The two loads at start share one step, which pays for both.
    assert!(first_token_at(&events, 1) >= 2.0 * load);
    assert_eq!(engine.counters().lora_loads_total, 3);
}

#[test]
fn a_resident_adapter_is_not_loaded_again() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.max_loras = 1;
    let mut engine = Engine::new(cfg);
    engine.register_adapter("a");
    engine.submit(0.0, lora_request(1, 100, 5, "a"));
    let first = drain(&mut engine, |_| {});
    engine.submit(5.0, lora_request(2, 100, 5, "a"));
    let second = drain(&mut engine, |_| {});
    let cold = first_token_at(&first, 1);
    let warm = first_token_at(&second, 2) - 5.0;
    assert!(cold - warm > 0.9 * engine.config().lora_load_seconds);
    assert_eq!(engine.counters().lora_loads_total, 1);
    assert_eq!(engine.counters().resident_adapters, vec!["a"]);
}

#[test]
fn bad_requests_are_rejected_with_a_reason() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.max_model_len = 1000;
    let mut engine = Engine::new(cfg);
    engine.register_adapter("known");
    engine.submit(0.0, request(1, synthetic_prompt(1, 900), 101));
    engine.submit(
        0.0,
        SimRequest {
            adapter: Some("unknown".into()),
            ..request(2, vec![1, 2], 5)
        },
    );
    engine.submit(0.0, request(3, Vec::new(), 5));
    engine.submit(0.0, request(4, vec![1], 0));
    engine.submit(0.0, request(5, vec![1, 2], 50));
    engine.submit(0.0, request(5, vec![1, 2], 50));
    let mut events = Vec::new();
    engine.advance(0.0, &mut events);
    let rejected: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::Rejected { id, reason, .. } => Some((*id, reason.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        rejected.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert!(
        rejected[0].1.contains("maximum context length is 1000"),
        "{}",
        rejected[0].1
    );
    assert!(rejected[1].1.contains("unknown"));
    assert!(rejected[4].1.contains("already in flight"));
    assert_eq!(engine.counters().requests_rejected_total, 5);

    assert!(engine.unregister_adapter("known"));
    assert!(engine.known_adapters().is_empty());
    engine.submit(
        0.0,
        SimRequest {
            adapter: Some("known".into()),
            ..request(6, vec![1, 2], 5)
        },
    );
    let mut events = Vec::new();
    engine.advance(0.0, &mut events);
    assert!(matches!(events[0], EngineEvent::Rejected { id: 6, .. }));
}

#[test]
fn lora_disabled_rejects_adapter_requests() {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.max_loras = 0;
    let mut engine = Engine::new(cfg);
    engine.register_adapter("a");
    engine.submit(0.0, lora_request(1, 10, 5, "a"));
    let mut events = Vec::new();
    engine.advance(0.0, &mut events);
    assert!(
        matches!(&events[0], EngineEvent::Rejected { reason, .. } if reason.contains("not enabled"))
    );
}

/// TTFT of one 2,048-token prompt and mean ITL of one request at batch 1.
fn single_request_latencies(hw: &str) -> (f64, f64) {
    let mut engine = Engine::new(config(hw, "llama-3.1-8b"));
    engine.submit(0.0, request(1, synthetic_prompt(1, 2048), 101));
    let events = drain(&mut engine, |_| {});
    let ttft = first_token_at(&events, 1);
    let (done, ..) = finished(&events, 1);
    (ttft, (done - ttft) / 100.0)
}

#[test]
fn an_a10g_is_slower_than_an_h100_by_the_roofline_ratio() {
    let (h100_ttft, h100_itl) = single_request_latencies("h100");
    let (a10g_ttft, a10g_itl) = single_request_latencies("a10g");
    let h100 = hardware("h100").unwrap();
    let a10g = hardware("a10g").unwrap();
    // Prefill is compute-bound: the ratio of achieved FLOP/s.
    let flops_ratio = (h100.peak_bf16_flops * h100.compute_efficiency)
        / (a10g.peak_bf16_flops * a10g.compute_efficiency);
    // Decode is memory-bound: the ratio of achieved bandwidth.
    let bandwidth_ratio = (h100.mem_bandwidth_bytes * h100.bandwidth_efficiency)
        / (a10g.mem_bandwidth_bytes * a10g.bandwidth_efficiency);
    let prefill_ratio = a10g_ttft / h100_ttft;
    let decode_ratio = a10g_itl / h100_itl;
    // The fixed per-step overhead pulls both ratios a little below the
    // pure roofline ratio.
    assert!(
        prefill_ratio < flops_ratio && prefill_ratio > 0.9 * flops_ratio,
        "prefill {prefill_ratio:.2} vs FLOPs ratio {flops_ratio:.2}"
    );
    assert!(
        decode_ratio < bandwidth_ratio && decode_ratio > 0.85 * bandwidth_ratio,
        "decode {decode_ratio:.2} vs bandwidth ratio {bandwidth_ratio:.2}"
    );
}

#[test]
fn slowdown_stretches_steps() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    engine.submit(0.0, request(1, synthetic_prompt(1, 500), 1));
    let normal = first_token_at(&drain(&mut engine, |_| {}), 1);
    engine.set_slowdown(3.0);
    engine.submit(10.0, request(2, synthetic_prompt(2, 500), 1));
    let slow = first_token_at(&drain(&mut engine, |_| {}), 2) - 10.0;
    assert!((slow / normal - 3.0).abs() < 1e-6);
}

#[test]
fn late_advances_replay_steps_at_their_own_times() {
    // The same arrivals give the same event times whether the driver
    // advances step by step or jumps far ahead.
    let run = |jump: bool| {
        let mut engine = Engine::new(config("a100", "llama-3.1-8b"));
        engine.submit(0.0, request(1, synthetic_prompt(1, 700), 30));
        let mut events = Vec::new();
        if jump {
            engine.advance(0.2, &mut events);
        } else {
            while let Some(t) = engine.next_event_at().filter(|t| *t <= 0.2) {
                engine.advance(t, &mut events);
            }
        }
        engine.submit(0.2, request(2, synthetic_prompt(2, 300), 30));
        events.extend(drain(&mut engine, |_| {}));
        events
    };
    assert_eq!(run(true), run(false));
}

fn mixed_workload() -> Vec<EngineEvent> {
    let mut cfg = config("a10g", "llama-3.1-8b");
    cfg.max_loras = 2;
    cfg.num_gpu_blocks_override = Some(400);
    cfg.max_model_len = 4000;
    let mut engine = Engine::new(cfg);
    for name in ["a", "b", "c"] {
        engine.register_adapter(name);
    }
    let system = synthetic_prompt(999, 512);
    let mut events = Vec::new();
    for id in 0..60u64 {
        let now = id as f64 * 0.05;
        let mut prompt = system.clone();
        prompt.extend(synthetic_prompt(id, 64 + (id as u32 * 37) % 700));
        let adapter = ["a", "b", "c", ""][id as usize % 4];
        engine.submit(
            now,
            SimRequest {
                id,
                prompt,
                max_tokens: 20 + (id as u32 * 13) % 200,
                adapter: (!adapter.is_empty()).then(|| adapter.to_owned()),
                priority: 0,
            },
        );
        if id % 7 == 3 {
            engine.abort(now, id - 2);
        }
        engine.advance(now, &mut events);
    }
    events.extend(drain(&mut engine, |_| {}));
    events
}

#[test]
fn the_same_inputs_give_the_same_events() {
    let first = mixed_workload();
    let second = mixed_workload();
    assert!(first.len() > 1000);
    assert_eq!(first, second);
    let preempted_or_aborted = first.iter().any(|e| {
        matches!(
            e,
            EngineEvent::Finished {
                reason: FinishReason::Aborted,
                ..
            }
        )
    });
    assert!(preempted_or_aborted);
}

fn with_priority(mut request: SimRequest, priority: i64) -> SimRequest {
    request.priority = priority;
    request
}

/// Five 8-block prompts on a 12-block cache (one fits at a time),
/// submitted together with priorities 2, 2, 2, 1, 0: the ids in the order
/// of their first tokens.
fn first_token_order(policy: SchedulingPolicy) -> Vec<u64> {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.num_gpu_blocks_override = Some(12);
    cfg.max_model_len = 192;
    cfg.scheduling_policy = policy;
    let mut engine = Engine::new(cfg);
    for (id, priority) in [(0, 2), (1, 2), (2, 2), (3, 1), (4, 0)] {
        let r = request(id, synthetic_prompt(id, 128), 2);
        engine.submit(0.0, with_priority(r, priority));
    }
    let events = drain(&mut engine, |_| {});
    let mut ids: Vec<u64> = (0..5).collect();
    ids.sort_by(|a, b| first_token_at(&events, *a).total_cmp(&first_token_at(&events, *b)));
    ids
}

#[test]
fn priority_scheduling_serves_lower_priority_values_first() {
    assert_eq!(
        first_token_order(SchedulingPolicy::Priority),
        [4, 3, 0, 1, 2]
    );
    // First come, first served ignores the field.
    assert_eq!(first_token_order(SchedulingPolicy::Fcfs), [0, 1, 2, 3, 4]);
}

/// A 16-block prompt that grows to fill a 20-block cache (priority
/// `bulk`), and a 4-block prompt (priority `urgent`) that arrives once the
/// first has generated 20 tokens and no longer leaves it room. Returns the
/// events and the preemptions.
fn urgent_behind_bulk(policy: SchedulingPolicy, bulk: i64, urgent: i64) -> (Vec<EngineEvent>, u64) {
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.num_gpu_blocks_override = Some(20);
    cfg.max_model_len = 320;
    cfg.scheduling_policy = policy;
    let mut engine = Engine::new(cfg);
    engine.submit(
        0.0,
        with_priority(request(1, synthetic_prompt(1, 256), 50), bulk),
    );
    let mut events = Vec::new();
    let tokens_of_bulk = |events: &[EngineEvent]| {
        events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    EngineEvent::FirstToken { id: 1, .. } | EngineEvent::Token { id: 1, .. }
                )
            })
            .count()
    };
    let mut now = 0.0;
    while tokens_of_bulk(&events) < 20 {
        now = engine.next_event_at().expect("the bulk request is running");
        engine.advance(now, &mut events);
    }
    assert!(engine.stats().kv_usage > 0.85, "{:?}", engine.stats());
    engine.submit(
        now,
        with_priority(request(2, synthetic_prompt(2, 64), 2), urgent),
    );
    events.extend(drain(&mut engine, |_| {}));
    for id in [1, 2] {
        let (_, tokens, ..) = finished(&events, id);
        assert_eq!(
            tokens,
            if id == 1 { 50 } else { 2 },
            "request {id} completes"
        );
    }
    (events, engine.stats().preemptions_total)
}

#[test]
fn a_better_priority_that_does_not_fit_preempts_a_worse_running_request() {
    let (events, preemptions) = urgent_behind_bulk(SchedulingPolicy::Priority, 2, 0);
    assert!(preemptions >= 1);
    assert!(
        first_token_at(&events, 2) < finished(&events, 1).0,
        "the urgent request is served before the bulk one ends"
    );
}

#[test]
fn without_priority_or_against_a_better_one_the_newcomer_waits() {
    for (policy, bulk, urgent) in [
        (SchedulingPolicy::Fcfs, 2, 0),
        (SchedulingPolicy::Priority, 0, 2),
        (SchedulingPolicy::Priority, 1, 1),
    ] {
        let (events, preemptions) = urgent_behind_bulk(policy, bulk, urgent);
        let what = format!("{policy}, bulk {bulk}, newcomer {urgent}");
        assert_eq!(preemptions, 0, "{what}");
        assert!(
            first_token_at(&events, 2) > finished(&events, 1).0,
            "{what}: waits for the memory the running request frees"
        );
    }
}

#[test]
fn running_requests_are_kept_in_priority_order() {
    // Growth preemption under priority scheduling takes the worst priority,
    // not the newest: the newest (and best) request finishes first.
    let mut cfg = config("h100", "llama-3.1-8b");
    cfg.num_gpu_blocks_override = Some(20);
    cfg.max_model_len = 320;
    cfg.scheduling_policy = SchedulingPolicy::Priority;
    let mut engine = Engine::new(cfg);
    for (id, priority) in [(0, 3), (1, 2), (2, 1), (3, 0)] {
        let r = request(id, synthetic_prompt(id, 48), 100);
        engine.submit(0.0, with_priority(r, priority));
    }
    let events = drain(&mut engine, |_| {});
    assert!(engine.stats().preemptions_total > 0);
    let done: Vec<f64> = (0..4).map(|id| finished(&events, id).0).collect();
    assert!(done[3] < done[0], "{done:?}");
    assert!(done[2] < done[0], "{done:?}");
}

#[test]
fn a_remote_prefill_replaces_the_prompt_computation_by_the_transfer() {
    let prompt = synthetic_prompt(7, 8000);
    let mut local = Engine::new(config("h100", "llama-3.1-8b"));
    local.submit(0.0, request(1, prompt.clone(), 4));
    let local_events = drain(&mut local, |_| {});
    let local_ttft = first_token_at(&local_events, 1);

    let link = KvLink {
        bandwidth_bytes: 50e9,
        latency_seconds: 1e-3,
    };
    let mut remote = Engine::new(config("h100", "llama-3.1-8b"));
    remote.submit_with_remote_kv(0.0, request(1, prompt.clone(), 4), link);
    assert_eq!(remote.stats().waiting, 0, "still in transit");
    let transfer = link.transfer_seconds(8000, remote.config().model.kv_bytes_per_token());
    assert_eq!(remote.next_event_at(), Some(transfer));
    let events = drain(&mut remote, |_| {});
    let ttft = first_token_at(&events, 1);
    // One decode-sized step after the transfer, far below a local prefill
    // of 8,000 tokens.
    assert!(ttft > transfer, "{ttft} after the transfer {transfer}");
    assert!(ttft < transfer + 0.05, "{ttft}");
    assert!(local_ttft > ttft, "local {local_ttft} vs remote {ttft}");
    assert_eq!(finished(&events, 1).1, 4);

    // The transferred blocks are in this engine's prefix cache now: the
    // same prompt again moves only the last partial block.
    remote.submit_with_remote_kv(10.0, request(2, prompt, 4), link);
    let block = remote.config().block_size;
    let again = link.transfer_seconds(
        8000 % block + block * u32::from(8000 % block == 0),
        remote.config().model.kv_bytes_per_token(),
    );
    assert!((remote.next_event_at().unwrap() - (10.0 + again)).abs() < 1e-9);
}

#[test]
fn a_request_aborted_during_its_transfer_never_runs() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    engine.submit_with_remote_kv(
        0.0,
        request(1, synthetic_prompt(1, 4000), 4),
        KvLink::default(),
    );
    engine.abort(0.001, 1);
    let events = drain(&mut engine, |_| {});
    assert!(matches!(finished(&events, 1).3, FinishReason::Aborted));
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, EngineEvent::FirstToken { .. }))
    );
    assert_eq!(engine.counters().steps_total, 0);
}

#[test]
fn a_prefill_holds_its_kv_until_the_decode_pulls_it() {
    let mut engine = Engine::new(config("h100", "llama-3.1-8b"));
    engine.submit_holding_kv(0.0, request(1, synthetic_prompt(1, 4000), 1));
    let events = drain(&mut engine, |_| {});
    assert_eq!(finished(&events, 1).1, 1);
    let held = engine.stats().kv_usage;
    assert!(held > 0.0, "the finished prefill's blocks stay in use");
    engine.release_held(1.0, 1);
    assert_eq!(engine.stats().kv_usage, 0.0);
    engine.release_held(2.0, 1);
}
