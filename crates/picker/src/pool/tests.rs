use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;
use serde_json::json;

use super::*;
use crate::observation::{EngineState, Observation};
use crate::policy::{Fallback, PrefixConfig, Saturation, Weights};
use crate::scorers::Scorer;

fn idle() -> EngineState {
    EngineState {
        waiting: Some(0),
        running: Some(0),
        kv_usage: Some(0.1),
        ..EngineState::default()
    }
}

fn busy(waiting: u64, kv_usage: f64) -> EngineState {
    EngineState {
        waiting: Some(waiting),
        kv_usage: Some(kv_usage),
        ..idle()
    }
}

fn observe(endpoint: &Endpoint, state: EngineState, at: Instant) {
    endpoint.observe(Observation {
        state: Some(Arc::new(state)),
        last_good: Some(at),
        last_error: None,
    });
}

fn fail_scrape(endpoint: &Endpoint, at: Instant) {
    endpoint.observe(Observation {
        state: Some(Arc::new(idle())),
        last_good: Some(at),
        last_error: Some("connection refused".into()),
    });
}

/// A pool of `states.len()` replicas, all scraped at `now`.
fn fleet(config: PickerConfig, states: Vec<EngineState>, now: Instant) -> Picker {
    let endpoints = states
        .into_iter()
        .enumerate()
        .map(|(i, state)| {
            let endpoint = Endpoint::new(i, format!("10.0.0.{i}:8000"));
            observe(&endpoint, state, now);
            endpoint
        })
        .collect();
    Picker::new(config, endpoints)
}

fn scored() -> PickerConfig {
    PickerConfig::default()
}

fn with_policy(policy: Policy) -> PickerConfig {
    PickerConfig {
        policy,
        ..PickerConfig::default()
    }
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(7)
}

fn pick_index(pool: &Picker, req: &PickRequest<'_>, now: Instant, exclude: &[usize]) -> usize {
    pool.pick(req, now, exclude, &mut rng()).unwrap().index()
}

fn chat(system: &str, user: &str) -> serde_json::Value {
    json!({"messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]})
}

#[test]
fn stale_and_unhealthy_replicas_are_excluded() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(), idle(), busy(3, 0.5)], now);
    let endpoints = pool.endpoints();
    observe(&endpoints[0], idle(), now - Duration::from_secs(5));
    fail_scrape(&endpoints[1], now);
    let mut rng = rng();
    for _ in 0..20 {
        let decision = pool
            .pick(&PickRequest::default(), now, &[], &mut rng)
            .unwrap();
        assert_eq!(decision.index(), 2, "only the healthy one, busy as it is");
        assert!(!decision.fallback);
    }
    // Metrics resume: the replica comes back by itself.
    observe(&endpoints[0], idle(), now);
    assert_eq!(pick_index(&pool, &PickRequest::default(), now, &[]), 0);
}

#[test]
fn all_stale_but_reachable_falls_back_to_least_request() {
    let now = Instant::now();
    let later = now + Duration::from_secs(30);
    let pool = fleet(scored(), vec![idle(), idle(), idle()], now);
    let endpoints = pool.endpoints();
    let _a = endpoints[0].acquire(10);
    let _b = endpoints[1].acquire(10);
    let _c = endpoints[1].acquire(10);
    let decision = pool
        .pick(&PickRequest::default(), later, &[], &mut rng())
        .unwrap();
    assert!(decision.fallback);
    assert_eq!(decision.index(), 2);
    assert_eq!(decision.top, None);

    pool.set_config(PickerConfig {
        fallback: Fallback::Refuse,
        ..scored()
    });
    assert_eq!(
        pool.pick(&PickRequest::default(), later, &[], &mut rng())
            .unwrap_err(),
        PickError::NoHealthyReplicas { reachable: 3 }
    );
}

#[test]
fn unreachable_or_all_excluded_is_no_replicas() {
    let now = Instant::now();
    for policy in Policy::ALL {
        let pool = fleet(with_policy(policy), vec![idle(), idle()], now);
        let req = PickRequest::default();
        assert_eq!(
            pool.pick(&req, now, &[0, 1], &mut rng()).unwrap_err(),
            PickError::NoReplicas,
            "{policy}"
        );
        for endpoint in pool.endpoints().iter() {
            endpoint.set_reachable(false);
        }
        assert_eq!(
            pool.pick(&req, now, &[], &mut rng()).unwrap_err(),
            PickError::NoReplicas
        );
    }
    let empty = Picker::new(scored(), Vec::new());
    assert_eq!(
        empty
            .pick(&PickRequest::default(), now, &[], &mut rng())
            .unwrap_err(),
        PickError::NoReplicas
    );
}

#[test]
fn exclusion_list_is_honoured_by_every_policy() {
    let now = Instant::now();
    for policy in Policy::ALL {
        let pool = fleet(with_policy(policy), vec![idle(), idle(), idle()], now);
        let mut rng = rng();
        for _ in 0..30 {
            let decision = pool
                .pick(&PickRequest::default(), now, &[0, 2], &mut rng)
                .unwrap();
            assert_eq!(decision.index(), 1, "{policy}");
        }
    }
}

#[test]
fn unreachable_replica_is_skipped_by_every_policy() {
    let now = Instant::now();
    for policy in Policy::ALL {
        let pool = fleet(with_policy(policy), vec![idle(), idle()], now);
        pool.endpoints()[0].set_reachable(false);
        let mut rng = rng();
        for _ in 0..10 {
            let decision = pool
                .pick(&PickRequest::default(), now, &[], &mut rng)
                .unwrap();
            assert_eq!(decision.index(), 1, "{policy}");
        }
    }
}

#[test]
fn a_draining_replica_is_never_picked_by_any_policy_or_fallback() {
    let now = Instant::now();
    for policy in Policy::ALL {
        // The draining replica is the least loaded and the only healthy
        // one: every preference points at it.
        let pool = fleet(with_policy(policy), vec![idle(), busy(4, 0.9)], now);
        let endpoints = pool.endpoints();
        let _held = endpoints[1].acquire(10);
        endpoints[0].set_draining(true);
        let mut rng = rng();
        for _ in 0..20 {
            let decision = pool
                .pick(&PickRequest::default(), now, &[], &mut rng)
                .unwrap();
            assert_eq!(decision.index(), 1, "{policy}");
        }
        // No metrics anywhere: the least-request fallback skips it too.
        let later = now + Duration::from_secs(60);
        for _ in 0..20 {
            let decision = pool
                .pick(&PickRequest::default(), later, &[], &mut rng)
                .unwrap();
            assert_eq!(decision.index(), 1, "{policy} fallback");
        }
        // Evacuating is draining.
        endpoints[0].evacuate();
        assert_eq!(pick_index(&pool, &PickRequest::default(), now, &[]), 1);
        // Undrained, it is a candidate again.
        endpoints[0].set_draining(false);
        let picked: Vec<usize> = (0..40)
            .map(|_| {
                pool.pick(&PickRequest::default(), now, &[], &mut rng)
                    .unwrap()
                    .index()
            })
            .collect();
        assert!(picked.contains(&0), "{policy}: {picked:?}");
    }
}

#[test]
fn a_pool_with_every_replica_draining_has_no_replica() {
    let now = Instant::now();
    for policy in Policy::ALL {
        let pool = fleet(with_policy(policy), vec![idle(), idle()], now);
        for endpoint in pool.endpoints().iter() {
            endpoint.set_draining(true);
        }
        assert_eq!(
            pool.pick(&PickRequest::default(), now, &[], &mut rng())
                .unwrap_err(),
            PickError::NoReplicas,
            "{policy}"
        );
        let later = now + Duration::from_secs(60);
        assert_eq!(
            pool.pick(&PickRequest::default(), later, &[], &mut rng())
                .unwrap_err(),
            PickError::NoReplicas,
            "{policy}: no fallback to a draining replica"
        );
    }
}

#[test]
fn a_draining_replica_with_the_largest_context_does_not_decide_what_fits() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(), idle()], now);
    let endpoints = pool.endpoints();
    endpoints[0].set_context_limit(131_072);
    endpoints[1].set_context_limit(32_768);
    endpoints[0].set_draining(true);
    // Too long for the one replica left: it is still tried (its refusal is
    // the answer), never the draining one.
    let req = PickRequest {
        context_tokens: 100_000,
        ..PickRequest::default()
    };
    assert_eq!(pick_index(&pool, &req, now, &[]), 1);
}

#[test]
fn saturated_pool_answers_saturated_with_retry_after() {
    let now = Instant::now();
    let pool = fleet(
        scored(),
        vec![busy(7, 0.5), busy(0, 1.0), busy(5, 0.2)],
        now,
    );
    match pool.pick(&PickRequest::default(), now, &[], &mut rng()) {
        Err(PickError::Saturated {
            retry_after,
            waiting,
        }) => {
            assert!(retry_after >= Duration::from_secs(1));
            assert!(retry_after <= Duration::from_secs(60));
            assert_eq!(waiting, 12);
        }
        other => panic!("expected Saturated, got {other:?}"),
    }
    // One replica below both thresholds takes the traffic.
    observe(&pool.endpoints()[1], busy(4, 0.99), now);
    assert_eq!(pick_index(&pool, &PickRequest::default(), now, &[]), 1);
}

#[test]
fn retry_after_follows_the_measured_drain_rate() {
    let t0 = Instant::now();
    let pool = fleet(scored(), vec![idle(), idle()], t0);
    let endpoints = pool.endpoints();
    pool.pick(&PickRequest::default(), t0, &[], &mut rng())
        .unwrap();
    // 20 requests complete over the next 2 s: 10 per second.
    for _ in 0..20 {
        drop(endpoints[0].acquire(1));
    }
    let t2 = t0 + Duration::from_secs(2);
    pool.pick(&PickRequest::default(), t2, &[], &mut rng())
        .unwrap();
    assert_eq!(pool.drain_rate(), Some(10.0));
    observe(&endpoints[0], busy(60, 0.5), t2);
    observe(&endpoints[1], busy(40, 0.5), t2);
    let err = pool
        .pick(&PickRequest::default(), t2, &[], &mut rng())
        .unwrap_err();
    assert_eq!(
        err,
        PickError::Saturated {
            retry_after: Duration::from_secs(10),
            waiting: 100
        }
    );
}

/// Affinity weighs as much as load: a replica holding the whole prompt
/// keeps it though busy (moving it costs a whole prefill), and loses it
/// only when saturated, when it is no longer a candidate.
#[test]
fn cached_and_busy_replica_keeps_the_prompt_until_saturated() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![busy(4, 0.75), idle()], now);
    let body = chat(
        &"You are a careful assistant. ".repeat(40),
        "Summarise the report.",
    );
    let hashes = pool.hash_prompt("m", None, &body);
    assert!(hashes.len() > 10);
    pool.record(0, &hashes);
    let req = PickRequest {
        prefix_hashes: &hashes,
        explain: true,
        ..PickRequest::default()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!(decision.index(), 0, "{}", decision.scores_header(4));
    let [cached, idle] = [0, 1].map(|index| {
        decision
            .scores
            .iter()
            .find(|s| s.endpoint.index == index)
            .unwrap()
    });
    assert_eq!(cached.part(Scorer::Prefix), 1.0);
    assert!(cached.part(Scorer::Queue) < idle.part(Scorer::Queue));
    assert!(cached.part(Scorer::KvCache) < idle.part(Scorer::KvCache));

    // Saturated (queue depth 5): not a candidate, whatever it holds.
    observe(&pool.endpoints()[0], busy(5, 0.75), now);
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!(decision.index(), 1);
    assert!(decision.scores.iter().all(|s| s.endpoint.index != 0));
}

/// The engines' own word, as a test gives it: a share per endpoint index,
/// `None` where the events cannot say.
#[derive(Debug)]
struct Engines(HashMap<usize, Option<f64>>);

impl crate::ExactPrefix for Engines {
    fn shares(&self, endpoints: &[usize], out: &mut [Option<f64>]) {
        for (share, index) in out.iter_mut().zip(endpoints) {
            *share = self.0.get(index).copied().flatten();
        }
    }
}

/// Where the events speak, they overrule the guess: the replica the
/// gateway sent the prompt to has evicted it, another holds it (sent by
/// another gateway); a replica the events cannot speak for keeps the
/// approximate index's answer, and the decision says which source scored.
#[test]
fn exact_prefix_from_events_overrules_the_guess_replica_by_replica() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(); 3], now);
    let body = chat(&"Shared tool instructions. ".repeat(40), "Go.");
    let hashes = pool.hash_prompt("m", None, &body);
    assert!(hashes.len() > 10);
    // The guess: replica 0 holds it all.
    pool.record(0, &hashes);
    let engines = Engines(HashMap::from([(0, Some(0.0)), (1, Some(1.0)), (2, None)]));
    let req = PickRequest {
        prefix_hashes: &hashes,
        explain: true,
        exact_prefix: Some(&engines),
        ..PickRequest::default()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!(decision.index(), 1, "{}", decision.scores_header(4));
    assert_eq!(decision.prefix_source, crate::PrefixSource::Events);
    let prefix = |index| {
        decision
            .scores
            .iter()
            .find(|s| s.endpoint.index == index)
            .unwrap()
            .part(Scorer::Prefix)
    };
    assert_eq!(prefix(0), 0.0, "evicted, though the gateway sent it there");
    assert_eq!(prefix(1), 1.0);
    assert_eq!(prefix(2), 0.0, "unsure: the guess, which has nothing there");

    // Replica 0's events go unsure: the guess answers for it again.
    let engines = Engines(HashMap::from([(0, None), (1, Some(0.5)), (2, None)]));
    let req = PickRequest {
        exact_prefix: Some(&engines),
        ..req
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!(decision.index(), 0, "{}", decision.scores_header(4));
    assert_eq!(decision.prefix_source, crate::PrefixSource::Approximate);
}

#[test]
fn shared_system_prompt_sticks_to_one_replica_while_healthy() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(); 6], now);
    let system = "You are the support bot of ACME. Answer briefly. ".repeat(30);
    let mut rng = rng();
    let mut chosen = Vec::new();
    for turn in 0..25 {
        let body = chat(&system, &format!("question number {turn}"));
        let hashes = pool.hash_prompt("m", None, &body);
        let req = PickRequest {
            prefix_hashes: &hashes,
            estimated_tokens: 500,
            context_tokens: 0,
            ..PickRequest::default()
        };
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        pool.record(decision.index(), &hashes);
        // Sequential traffic: each request finishes before the next.
        drop(decision.acquire());
        chosen.push(decision.index());
    }
    assert!(chosen.iter().all(|&i| i == chosen[0]), "{chosen:?}");

    // Its metrics go stale: traffic moves, and the new home sticks too.
    let home = chosen[0];
    observe(
        &pool.endpoints()[home],
        idle(),
        now - Duration::from_secs(10),
    );
    let mut moved = Vec::new();
    for turn in 0..10 {
        let hashes = pool.hash_prompt("m", None, &chat(&system, &format!("again {turn}")));
        let req = PickRequest {
            prefix_hashes: &hashes,
            ..PickRequest::default()
        };
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        pool.record(decision.index(), &hashes);
        moved.push(decision.index());
    }
    assert!(
        moved.iter().all(|&i| i == moved[0] && i != home),
        "{moved:?}"
    );
}

#[test]
fn a_burst_sharing_a_prefix_spreads_before_the_next_scrape() {
    let now = Instant::now();
    // Deep queues allowed, so only the scorers decide where the burst goes.
    let config = PickerConfig {
        saturation: Saturation {
            queue_depth: 100,
            ..Saturation::default()
        },
        ..scored()
    };
    let pool = fleet(config, vec![idle(); 4], now);
    let system = "Shared instructions for every request in this burst. ".repeat(30);
    let mut rng = rng();
    let mut guards = Vec::new();
    let mut per_replica: HashMap<usize, usize> = HashMap::new();
    for n in 0..64 {
        let hashes = pool.hash_prompt("m", None, &chat(&system, &format!("item {n}")));
        let req = PickRequest {
            prefix_hashes: &hashes,
            estimated_tokens: 1_000,
            context_tokens: 0,
            ..PickRequest::default()
        };
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        pool.record(decision.index(), &hashes);
        *per_replica.entry(decision.index()).or_default() += 1;
        guards.push(decision.acquire()); // still in flight
    }
    assert_eq!(per_replica.len(), 4, "{per_replica:?}");
    let most = *per_replica.values().max().unwrap();
    assert!(most <= 24, "one replica took {most} of 64: {per_replica:?}");
}

/// Affinity must never build a hot spot: a replica that holds the prompt
/// but is close to saturation (4 of this gateway's requests unanswered
/// since the last scrape, which count as 4 waiting of a queue depth of 5,
/// and its KV cache 95 % used) loses to an idle replica that holds
/// nothing, in every preset.
#[test]
fn a_cached_but_busy_replica_loses_to_an_idle_one_in_every_preset() {
    let now = Instant::now();
    for name in Weights::PRESETS {
        let config = PickerConfig {
            weights: Weights::preset(name).unwrap(),
            ..scored()
        };
        let pool = fleet(config, vec![busy(0, 0.95), idle()], now);
        let system = "A long system prompt that replica 0 has cached. ".repeat(30);
        let hashes = pool.hash_prompt("m", None, &chat(&system, "the next question"));
        pool.record(0, &hashes);
        let req = PickRequest {
            prefix_hashes: &hashes,
            estimated_tokens: 1_000,
            context_tokens: 0,
            ..PickRequest::default()
        };
        // Four requests to replica 0 with no answer yet.
        let in_flight: Vec<_> = (0..4)
            .map(|_| pool.pick(&req, now, &[1], &mut rng()).unwrap().acquire())
            .collect();
        assert_eq!(pick_index(&pool, &req, now, &[]), 1, "preset {name}");
        drop(in_flight);
    }
}

#[test]
fn a_burst_between_scrapes_counts_as_waiting() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(); 2], now);
    let mut rng = rng();
    let mut guards = Vec::new();
    let req = PickRequest::default();
    // Each replica looked idle at its last scrape; after queue_depth (5)
    // requests sent since then, it counts as saturated.
    for _ in 0..10 {
        guards.push(pool.pick(&req, now, &[], &mut rng).unwrap().acquire());
    }
    assert!(matches!(
        pool.pick(&req, now, &[], &mut rng),
        Err(PickError::Saturated { .. })
    ));
    // A finished request frees room at once.
    guards.pop();
    guards.push(pool.pick(&req, now, &[], &mut rng).unwrap().acquire());
    // A new scrape that still shows nothing waiting resets the count.
    observe(&pool.endpoints()[0], idle(), now);
    for _ in 0..5 {
        let d = pool.pick(&req, now, &[], &mut rng).unwrap();
        assert_eq!(d.index(), 0);
        guards.push(d.acquire());
    }
}

#[test]
fn lora_resident_replica_wins() {
    let now = Instant::now();
    let lora = |resident: &[&str]| EngineState {
        resident_adapters: resident.iter().map(|s| s.to_string()).collect(),
        max_adapters: Some(4),
        ..idle()
    };
    let pool = fleet(scored(), vec![lora(&["a"]), lora(&["sql"]), lora(&[])], now);
    let req = PickRequest {
        adapter: Some("sql"),
        ..PickRequest::default()
    };
    let mut rng = rng();
    for _ in 0..20 {
        assert_eq!(pool.pick(&req, now, &[], &mut rng).unwrap().index(), 1);
    }
}

#[test]
fn without_a_resident_adapter_the_most_free_capacity_wins() {
    let now = Instant::now();
    let lora = |resident: &[&str], waiting: u64| EngineState {
        resident_adapters: resident.iter().map(|s| s.to_string()).collect(),
        max_adapters: Some(2),
        waiting: Some(waiting),
        ..idle()
    };
    let pool = fleet(
        scored(),
        vec![lora(&["a", "b"], 0), lora(&["a"], 3), lora(&["a"], 0)],
        now,
    );
    let req = PickRequest {
        adapter: Some("sql"),
        explain: true,
        ..PickRequest::default()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    // 0 has no free slot; 1 and 2 have one, and 2 is less loaded.
    assert_eq!(decision.index(), 2, "{}", decision.scores_header(3));
    let full = decision
        .scores
        .iter()
        .find(|s| s.endpoint.index == 0)
        .unwrap();
    assert_eq!(full.part(Scorer::Lora), 0.0);
}

#[test]
fn round_robin_cycles_over_candidates() {
    let now = Instant::now();
    let pool = fleet(with_policy(Policy::RoundRobin), vec![idle(); 3], now);
    let picks: Vec<usize> = (0..6)
        .map(|_| pick_index(&pool, &PickRequest::default(), now, &[]))
        .collect();
    assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    let picks: Vec<usize> = (0..4)
        .map(|_| pick_index(&pool, &PickRequest::default(), now, &[1]))
        .collect();
    let zeros = picks.iter().filter(|&&i| i == 0).count();
    assert_eq!(zeros, 2, "even turns among the remaining two: {picks:?}");
    assert!(picks.iter().all(|&i| i != 1));
}

#[test]
fn least_request_picks_the_least_loaded() {
    let now = Instant::now();
    let pool = fleet(
        with_policy(Policy::LeastRequest),
        vec![busy(9, 0.7); 3],
        now,
    );
    let endpoints = pool.endpoints();
    let mut guards = Vec::new();
    for (i, load) in [3, 1, 2].into_iter().enumerate() {
        for _ in 0..load {
            guards.push(endpoints[i].acquire(1));
        }
    }
    assert_eq!(pick_index(&pool, &PickRequest::default(), now, &[]), 1);
    // Features are ignored: even stale, saturated replicas are used.
    let stale = now + Duration::from_secs(60);
    assert_eq!(pick_index(&pool, &PickRequest::default(), stale, &[1]), 2);
}

#[test]
fn ties_are_broken_at_random_across_all_equals() {
    let now = Instant::now();
    for policy in [Policy::Scored, Policy::Random, Policy::LeastRequest] {
        let pool = fleet(with_policy(policy), vec![idle(); 4], now);
        let mut rng = rng();
        let mut counts = [0usize; 4];
        for _ in 0..400 {
            counts[pool
                .pick(&PickRequest::default(), now, &[], &mut rng)
                .unwrap()
                .index()] += 1;
        }
        assert!(counts.iter().all(|&c| c >= 60), "{policy}: {counts:?}");
    }
}

#[test]
fn explain_lists_every_candidate_best_first() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![busy(2, 0.6), idle(), busy(1, 0.3)], now);
    let req = PickRequest {
        explain: true,
        ..PickRequest::default()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!(decision.index(), 1);
    assert_eq!(decision.scores.len(), 3);
    assert_eq!(decision.scores[0].endpoint.index, 1);
    assert!(decision.scores.windows(2).all(|w| w[0].total >= w[1].total));
    let top = decision.top.unwrap();
    assert_eq!(top.winner, decision.scores[0].total);
    assert_eq!(top.runner_up, Some(decision.scores[1].total));
    assert!(top.winner > top.runner_up.unwrap());
    let header = decision.scores_header(8).to_string();
    assert!(
        header.starts_with(
            "10.0.0.1:8000=0.99(q=1.00,kv=0.90,if=1.00,px=1.00,lora=1.00,sp=1.00,ss=1.00);"
        ),
        "{header}"
    );
    assert_eq!(header.matches(';').count(), 2);

    let quiet = pool
        .pick(&PickRequest::default(), now, &[], &mut rng())
        .unwrap();
    assert!(quiet.scores.is_empty());
    assert_eq!(quiet.top, decision.top);
}

/// On a tie the chosen replica still heads the explanation, whichever of
/// the equals the draw picked.
#[test]
fn explain_lists_the_winner_first_on_ties() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(); 4], now);
    let req = PickRequest {
        explain: true,
        ..PickRequest::default()
    };
    let mut rng = rng();
    let mut winners = std::collections::HashSet::new();
    for _ in 0..64 {
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        assert_eq!(decision.scores[0].endpoint.index, decision.index());
        assert!(decision.scores.windows(2).all(|w| w[0].total >= w[1].total));
        winners.insert(decision.index());
    }
    // The draw did land on other replicas than the first in config order.
    assert!(winners.len() > 1, "{winners:?}");
}

#[test]
fn decision_acquire_counts_the_requests_tokens() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle()], now);
    let req = PickRequest {
        estimated_tokens: 321,
        context_tokens: 0,
        ..PickRequest::default()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    let guard = decision.acquire();
    assert_eq!(decision.endpoint.load.requests(), 1);
    assert_eq!(decision.endpoint.load.tokens(), 321);
    drop(guard);
    assert_eq!(decision.endpoint.load.tokens(), 0);
}

#[test]
fn record_bounds_memory_by_the_replicas_kv_capacity() {
    let now = Instant::now();
    let small = EngineState {
        kv_capacity_blocks: Some(100),
        block_size: Some(16),
        ..idle()
    };
    let pool = fleet(scored(), vec![small, idle()], now);
    let hashes: Vec<u64> = (1..=300).collect();
    pool.record(0, &hashes);
    pool.record(1, &hashes);
    // 100 KV blocks × 16 tokens × 4 bytes / 64-byte blocks = 100 blocks.
    assert_eq!(pool.prefix_index().blocks_held(0), 100);
    assert_eq!(
        pool.prefix_index().blocks_held(1),
        300,
        "default bound is larger"
    );
}

#[test]
fn record_is_a_no_op_without_prefix_scoring() {
    let now = Instant::now();
    let hashes: Vec<u64> = (1..=10).collect();
    let round_robin = fleet(with_policy(Policy::RoundRobin), vec![idle()], now);
    round_robin.record(0, &hashes);
    assert_eq!(round_robin.prefix_index().blocks_held(0), 0);
    let mut config = scored();
    config.weights.prefix = 0.0;
    let no_prefix = fleet(config, vec![idle()], now);
    no_prefix.record(0, &hashes);
    assert_eq!(no_prefix.prefix_index().blocks_held(0), 0);
}

#[test]
fn replacing_endpoints_forgets_departed_replicas() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(), idle()], now);
    let hashes: Vec<u64> = (1..=10).collect();
    pool.record(0, &hashes);
    pool.record(1, &hashes);
    let old = pool.endpoints();
    let replacement = Endpoint::new(1, "10.0.0.99:8000");
    observe(&replacement, idle(), now);
    pool.replace_endpoints(vec![Arc::clone(&old[0]), replacement]);
    assert_eq!(pool.prefix_index().blocks_held(0), 10, "kept");
    assert_eq!(
        pool.prefix_index().blocks_held(1),
        0,
        "index 1 is a new replica"
    );
    assert_eq!(&*pool.endpoints()[1].addr, "10.0.0.99:8000");
}

#[test]
fn unknown_signals_neither_win_nor_lose_outright() {
    let now = Instant::now();
    let unknown = EngineState::default();
    let pool = fleet(scored(), vec![busy(4, 0.7), unknown, idle()], now);
    let req = PickRequest {
        explain: true,
        ..PickRequest::default()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    let order: Vec<usize> = decision.scores.iter().map(|s| s.endpoint.index).collect();
    assert_eq!(order, [2, 1, 0], "{}", decision.scores_header(3));
}

#[test]
fn pool_is_shareable_between_request_threads() {
    fn shareable<T: Send + Sync>() {}
    shareable::<Picker>();
    shareable::<Decision>();
}

#[test]
fn a_queue_waiting_for_adapter_slots_does_not_saturate() {
    let now = Instant::now();
    let blocked = EngineState {
        waiting: Some(20),
        waiting_adapters: vec!["sql".into()],
        max_adapters: Some(2),
        ..idle()
    };
    let pool = fleet(scored(), vec![blocked.clone(), blocked], now);
    let req = PickRequest {
        adapter: Some("sql"),
        ..PickRequest::default()
    };
    assert!(pool.pick(&req, now, &[], &mut rng()).is_ok());
    // The same queue without adapter waits is a saturated replica.
    let full = fleet(scored(), vec![busy(20, 0.1), busy(20, 0.1)], now);
    assert!(matches!(
        full.pick(&req, now, &[], &mut rng()),
        Err(PickError::Saturated { .. })
    ));
}

// ---------------------------------------------------------------------------
// Large pools: a sample of the replicas is scored.

const LARGE: usize = 500;

#[test]
fn a_large_pool_uses_its_one_free_replica() {
    // Every replica but one is saturated: the sample almost surely misses
    // it, and the pick must still find it rather than refuse.
    let now = Instant::now();
    let mut states = vec![busy(9, 0.5); LARGE];
    states[LARGE - 3] = idle();
    let pool = fleet(scored(), states, now);
    let mut rng = rng();
    for _ in 0..20 {
        let decision = pool
            .pick(&PickRequest::default(), now, &[], &mut rng)
            .unwrap();
        assert_eq!(decision.index(), LARGE - 3);
    }
    // And refuses only when all of it is saturated.
    observe(&pool.endpoints()[LARGE - 3], busy(9, 0.5), now);
    match pool.pick(&PickRequest::default(), now, &[], &mut rng) {
        Err(PickError::Saturated { waiting, .. }) => assert_eq!(waiting, 9 * LARGE as u64),
        other => panic!("expected Saturated, got {other:?}"),
    }
}

#[test]
fn a_large_pool_keeps_prefix_affinity() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(); LARGE], now);
    let body = chat(
        &"You answer questions about the attached contract. ".repeat(40),
        "hi",
    );
    let hashes = pool.hash_prompt("m", None, &body);
    assert!(hashes.len() > 10);
    let holder = 311;
    pool.record(holder, &hashes);
    let req = PickRequest {
        prefix_hashes: &hashes,
        ..PickRequest::default()
    };
    let mut rng = rng();
    for _ in 0..20 {
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        assert_eq!(decision.index(), holder);
    }
}

#[test]
fn a_large_pool_sample_avoids_the_busy_replicas() {
    // Half the pool has a queue (below saturation): a sample of 32 holds
    // idle replicas with near certainty, and one of them must win.
    let now = Instant::now();
    let states = (0..LARGE)
        .map(|i| if i % 2 == 0 { busy(3, 0.6) } else { idle() })
        .collect();
    let pool = fleet(scored(), states, now);
    let mut rng = rng();
    let mut chosen = std::collections::HashSet::new();
    for _ in 0..200 {
        let decision = pool
            .pick(&PickRequest::default(), now, &[], &mut rng)
            .unwrap();
        assert_eq!(decision.index() % 2, 1, "picked a busy replica");
        chosen.insert(decision.index());
    }
    assert!(
        chosen.len() > 50,
        "picks spread over the idle replicas: {}",
        chosen.len()
    );
}

#[test]
fn a_large_pool_shares_one_prefix_budget() {
    // 2,048 replicas: the pool budget leaves each 2,048 blocks, fewer than
    // the KV capacity they report, so the index forgets beyond that.
    let replicas = 2048;
    let now = Instant::now();
    let state = EngineState {
        block_size: Some(16),
        kv_capacity_blocks: Some(30_000),
        ..idle()
    };
    let pool = fleet(scored(), vec![state; replicas], now);
    let per_replica = (PrefixConfig::POOL_BUDGET_BLOCKS / replicas as u64) as usize;
    assert!(per_replica < 30_000 * 16 * 4 / 64);
    let hashes: Vec<u64> = (1..=3_000u64).map(|i| i * 0x9e37_79b9).collect();
    pool.record(5, &hashes);
    assert_eq!(pool.prefix_index().blocks_held(5), per_replica);

    // A small pool keeps what the replica's KV capacity holds.
    let small = fleet(scored(), vec![idle(); 4], now);
    small.record(1, &hashes);
    assert_eq!(small.prefix_index().blocks_held(1), 3_000);
}

/// Sessions stay on their replica while it stays; removing one replica
/// moves only the sessions that lived there, through the whole scored
/// pick (filters, every scorer, the weighted sum).
#[test]
fn a_removed_replica_moves_only_its_own_sessions() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(); 6], now);
    let home = |pool: &Picker, s: u64| {
        let req = PickRequest {
            session: Some(crate::session_key(format!("session-{s}").as_bytes())),
            ..PickRequest::default()
        };
        pool.pick(&req, now, &[], &mut rng())
            .unwrap()
            .endpoint
            .addr
            .clone()
    };
    let before: Vec<_> = (0..600).map(|s| home(&pool, s)).collect();
    // Stable: asked again, every session answers the same.
    for (s, addr) in before.iter().enumerate() {
        assert_eq!(&home(&pool, s as u64), addr);
    }
    let old = pool.endpoints();
    let removed = old[3].addr.clone();
    let kept: Vec<_> = old
        .iter()
        .filter(|ep| ep.addr != removed)
        .cloned()
        .collect();
    pool.replace_endpoints(kept);
    let mut moved = 0;
    for (s, addr) in before.iter().enumerate() {
        let now_home = home(&pool, s as u64);
        if *addr == removed {
            moved += 1;
            assert_ne!(now_home, removed);
        } else {
            assert_eq!(
                &now_home, addr,
                "session {s} moved off a replica that stayed"
            );
        }
    }
    assert!(
        (50..=150).contains(&moved),
        "{moved} of 600 sessions lived on one of 6 replicas"
    );
}

/// A saturated home sends its sessions elsewhere; they come back when it
/// recovers.
#[test]
fn a_saturated_home_passes_its_session_on() {
    let now = Instant::now();
    let pool = fleet(scored(), vec![idle(); 4], now);
    let req = PickRequest {
        session: Some(crate::session_key(b"agent-7")),
        ..PickRequest::default()
    };
    let home = pick_index(&pool, &req, now, &[]);
    observe(&pool.endpoints()[home], busy(50, 0.5), now);
    let elsewhere = pick_index(&pool, &req, now, &[]);
    assert_ne!(elsewhere, home);
    observe(&pool.endpoints()[home], idle(), now);
    assert_eq!(pick_index(&pool, &req, now, &[]), home);
}
