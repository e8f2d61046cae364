//! The predicted policy through the pool: what it picks against the scored
//! policy, when it falls back, how it explores, and latency objectives.

use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::*;
use crate::observation::{EngineState, Observation};
use crate::policy::PredictConfig;
use crate::predict::synthetic::{self, Truth};
use crate::predict::{LatencyFeatures, LatencyPrediction, Slo};

fn state(waiting: u64, running: u64, kv_usage: f64) -> EngineState {
    EngineState {
        waiting: Some(waiting),
        running: Some(running),
        kv_usage: Some(kv_usage),
        ..EngineState::default()
    }
}

fn observe(endpoint: &Endpoint, state: EngineState, at: Instant) {
    endpoint.observe(Observation {
        state: Some(Arc::new(state)),
        last_good: Some(at),
        last_error: None,
    });
}

fn fleet(policy: Policy, states: Vec<EngineState>, now: Instant) -> Picker {
    let endpoints = states
        .into_iter()
        .enumerate()
        .map(|(i, state)| {
            let endpoint = Endpoint::new(i, format!("10.0.0.{i}:8000"));
            observe(&endpoint, state, now);
            endpoint
        })
        .collect();
    let config = PickerConfig {
        policy,
        ..PickerConfig::default()
    };
    Picker::new(config, endpoints)
}

/// Teach `endpoint`'s model `count` finished requests of `truth`.
fn teach(endpoint: &Endpoint, truth: &Truth, count: usize, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..count {
        let f = synthetic::request(&mut rng);
        let (ttft, itl) = truth.sample(&f, &mut rng);
        endpoint.latency().observe(&f, Some(ttft), Some(itl));
    }
}

fn rng() -> StdRng {
    StdRng::seed_from_u64(3)
}

/// A chat request of 1,000 prompt tokens and 128 expected output tokens.
fn request() -> PickRequest<'static> {
    PickRequest {
        prompt_tokens: 1_000,
        expected_output_tokens: 128,
        ..PickRequest::default()
    }
}

/// The predicted cost the policy ranks by, from the replica's model.
fn predicted(
    pool: &Picker,
    index: usize,
    req: &PickRequest<'_>,
    now: Instant,
) -> LatencyPrediction {
    let features = features_of(pool, index, req, now);
    pool.endpoints()[index]
        .latency()
        .predict(&features)
        .expect("trusted")
}

/// The features a pick sees for replica `index`: the pick excluding the
/// others.
fn features_of(
    pool: &Picker,
    index: usize,
    req: &PickRequest<'_>,
    now: Instant,
) -> LatencyFeatures {
    let others: Vec<usize> = (0..pool.endpoints().len())
        .filter(|&i| i != index)
        .collect();
    let decision = pool.pick(req, now, &others, &mut rng()).unwrap();
    assert_eq!(decision.index(), index);
    decision.latency.unwrap().0
}

/// A GPU replica running ten requests beside a CPU replica running two:
/// the scored policy sees the GPU replica's fuller cache and sends the
/// request to the CPU, where each request in the batch slows every other
/// and prefill is slow; the predictions know better.
#[test]
fn the_predicted_policy_takes_the_lower_predicted_cost_where_scores_disagree() {
    let now = Instant::now();
    let states = || vec![state(0, 10, 0.6), state(0, 2, 0.1)];
    let scored = fleet(Policy::Scored, states(), now);
    let pool = fleet(Policy::Predicted, states(), now);
    for p in [&scored, &pool] {
        teach(&p.endpoints()[0], &Truth::gpu(), 300, 1);
        teach(&p.endpoints()[1], &Truth::cpu(), 300, 2);
    }
    let req = request();
    let by_scores = scored.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!((by_scores.index(), by_scores.policy), (1, Policy::Scored));

    let (gpu, cpu) = (
        predicted(&pool, 0, &req, now),
        predicted(&pool, 1, &req, now),
    );
    assert!(
        gpu.end_to_end(128.0) < cpu.end_to_end(128.0),
        "{gpu:?} {cpu:?}"
    );
    for _ in 0..20 {
        let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
        assert_eq!((decision.index(), decision.policy), (0, Policy::Predicted));
        assert!(!decision.fallback);
        let (features, prediction) = decision.latency.unwrap();
        assert_eq!(
            features,
            LatencyFeatures {
                waiting: 0.0,
                running: 10.0,
                kv_usage: 0.6,
                new_prompt_tokens: 1_000.0,
                cached_prompt_tokens: 0.0,
            }
        );
        assert_eq!(prediction, Some(gpu));
    }
}

/// Two replicas whose own end-to-end times are alike: the one whose
/// batch a request slows more, counted over the requests already on it,
/// costs more.
#[test]
fn a_request_counts_what_it_does_to_the_others_on_a_replica() {
    let now = Instant::now();
    // The same CPU replica, idle, against a GPU replica slowed so that a
    // request alone there takes a bit longer than on the idle CPU.
    let pool = fleet(
        Policy::Predicted,
        vec![state(0, 4, 0.2), state(0, 0, 0.0)],
        now,
    );
    teach(&pool.endpoints()[0], &Truth::cpu(), 300, 3);
    teach(&pool.endpoints()[1], &Truth::gpu().slower(20.0), 300, 4);
    let req = request();
    let busy_cpu = predicted(&pool, 0, &req, now).end_to_end(128.0);
    let idle_gpu = predicted(&pool, 1, &req, now).end_to_end(128.0);
    // The CPU replica is faster for this request alone...
    assert!(busy_cpu < idle_gpu, "{busy_cpu} {idle_gpu}");
    // ...but its four running requests would each lose more than that.
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!((decision.index(), decision.policy), (1, Policy::Predicted));
}

#[test]
fn while_a_model_is_untrusted_the_scored_policy_decides() {
    let now = Instant::now();
    let states = || vec![state(0, 10, 0.6), state(0, 2, 0.1)];
    let pool = fleet(Policy::Predicted, states(), now);
    pool.set_config(PickerConfig {
        policy: Policy::Predicted,
        predict: PredictConfig {
            explore_share: 0.0,
            ..PredictConfig::default()
        },
        ..PickerConfig::default()
    });
    let [gpu, cpu] = &pool.endpoints()[..] else {
        unreachable!()
    };
    teach(gpu, &Truth::gpu(), 300, 5);
    // Measured, but the latencies do not follow the features at all.
    let mut noise = StdRng::seed_from_u64(6);
    for _ in 0..300 {
        let f = synthetic::request(&mut noise);
        let ttft = (synthetic::normal(&mut noise) * 1.5).exp();
        cpu.latency().observe(&f, Some(ttft), Some(0.05));
    }
    assert!(!cpu.latency().summary().trusted);
    let req = request();
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    // As the scored policy would: the emptier cache.
    assert_eq!((decision.index(), decision.policy), (1, Policy::Scored));
    assert!(decision.top.is_some());
    let (features, prediction) = decision.latency.unwrap();
    assert_eq!(features.running, 2.0);
    assert_eq!(prediction, None, "the chosen model is not trusted");

    // Once it is, the predictions decide.
    // (Relative weights hold on to the smallest of the unexplained
    // latencies for a while: docs/picker.md.)
    teach(cpu, &Truth::cpu(), 600, 7);
    assert!(cpu.latency().summary().trusted);
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!((decision.index(), decision.policy), (0, Policy::Predicted));
    assert_eq!(decision.top, None);
}

/// A replica that has just joined looks worse to the scored policy than
/// two measured ones; the predicted policy still sends it about its
/// exploration share, and never more, so it gets measured.
#[test]
fn a_newcomer_is_explored_for_a_bounded_share_of_picks() {
    let now = Instant::now();
    let pool = fleet(
        Policy::Predicted,
        vec![state(0, 4, 0.2), state(0, 4, 0.2), state(3, 8, 0.8)],
        now,
    );
    let endpoints = pool.endpoints();
    teach(&endpoints[0], &Truth::gpu(), 300, 8);
    teach(&endpoints[1], &Truth::gpu(), 300, 9);
    let req = request();
    let share = PredictConfig::DEFAULT_EXPLORE_SHARE;
    const PICKS: usize = 1_000;
    let count = |pool: &Picker, rng: &mut StdRng| {
        let mut counts = [0usize; 3];
        for _ in 0..PICKS {
            counts[pool.pick(&req, now, &[], rng).unwrap().index()] += 1;
        }
        counts
    };
    let mut rng = StdRng::seed_from_u64(10);
    let mut counts = [0usize; 3];
    for _ in 0..PICKS {
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        counts[decision.index()] += 1;
        let (_, prediction) = decision.latency.unwrap();
        if decision.index() == 2 {
            assert_eq!(decision.policy, Policy::Predicted, "explored");
            assert_eq!(prediction, None);
        } else {
            assert_eq!(decision.policy, Policy::Scored, "a model is untrusted");
        }
    }
    // Binomial(1000, 0.1): 100 expected, 3 standard deviations ≈ 28.
    let explored = counts[2];
    assert!(explored > 0, "{counts:?}");
    assert!(
        explored as f64 <= PICKS as f64 * share + 30.0,
        "{explored} of {PICKS} explored at share {share}"
    );
    assert!(explored as f64 >= PICKS as f64 * share - 30.0, "{counts:?}");
    // The scored policy alone never picks it.
    let scored = fleet(
        Policy::Scored,
        vec![state(0, 4, 0.2), state(0, 4, 0.2), state(3, 8, 0.8)],
        now,
    );
    for _ in 0..100 {
        assert_ne!(scored.pick(&req, now, &[], &mut rng).unwrap().index(), 2);
    }

    // Saturated or stale, a newcomer is not explored.
    observe(&endpoints[2], state(5, 8, 0.8), now);
    assert_eq!(count(&pool, &mut rng)[2], 0, "saturated");
    observe(
        &endpoints[2],
        state(0, 0, 0.0),
        now - Duration::from_secs(10),
    );
    assert_eq!(count(&pool, &mut rng)[2], 0, "stale");

    // Measured, it is no longer explored: the predictions decide.
    observe(&endpoints[2], state(3, 8, 0.8), now);
    teach(&endpoints[2], &Truth::gpu(), 300, 11);
    for _ in 0..PICKS {
        let decision = pool.pick(&req, now, &[], &mut rng).unwrap();
        assert_eq!(decision.policy, Policy::Predicted);
        assert!(decision.latency.unwrap().1.is_some());
    }
}

/// A queue makes replica 0 the fastest to the last token (short batch)
/// but slow to the first; replica 1 is the other way round.
fn queue_against_batch(now: Instant) -> Picker {
    let pool = fleet(
        Policy::Predicted,
        vec![state(3, 10, 0.3), state(0, 30, 0.5)],
        now,
    );
    teach(&pool.endpoints()[0], &Truth::gpu(), 300, 12);
    teach(&pool.endpoints()[1], &Truth::gpu(), 300, 13);
    pool
}

#[test]
fn replicas_predicted_to_miss_the_objectives_are_avoided() {
    let now = Instant::now();
    let pool = queue_against_batch(now);
    let req = request();
    let (queued, batched) = (
        predicted(&pool, 0, &req, now),
        predicted(&pool, 1, &req, now),
    );
    assert!(
        queued.ttft > batched.ttft && queued.itl < batched.itl,
        "{queued:?} {batched:?}"
    );
    assert_eq!(pool.pick(&req, now, &[], &mut rng()).unwrap().index(), 0);

    let between = |a: f64, b: f64| Some(Duration::from_secs_f64((a + b) / 2.0));
    let first_token_soon = PickRequest {
        slo: Some(Slo {
            ttft: between(queued.ttft, batched.ttft),
            itl: None,
        }),
        ..req
    };
    let decision = pool.pick(&first_token_soon, now, &[], &mut rng()).unwrap();
    assert_eq!((decision.index(), decision.policy), (1, Policy::Predicted));
    assert_eq!(decision.latency.unwrap().1, Some(batched));

    let fast_tokens = PickRequest {
        slo: Some(Slo {
            ttft: None,
            itl: between(queued.itl, batched.itl),
        }),
        ..req
    };
    assert_eq!(
        pool.pick(&fast_tokens, now, &[], &mut rng())
            .unwrap()
            .index(),
        0
    );
}

#[test]
fn when_no_replica_is_predicted_to_meet_the_objectives_the_pick_says_so() {
    let now = Instant::now();
    let pool = queue_against_batch(now);
    let req = request();
    let best = predicted(&pool, 0, &req, now);
    let impossible = PickRequest {
        slo: Some(Slo {
            ttft: Some(Duration::from_millis(1)),
            itl: Some(Duration::from_millis(1)),
        }),
        ..req
    };
    match pool.pick(&impossible, now, &[], &mut rng()) {
        Err(PickError::SloUnmet {
            retry_after,
            best: got,
        }) => {
            assert_eq!(got, best, "the least-cost candidate's prediction");
            assert!(retry_after >= Duration::from_secs(1));
            assert!(retry_after <= Duration::from_secs(60));
            let message = PickError::SloUnmet { retry_after, best }.to_string();
            assert!(message.contains("latency objectives"), "{message}");
        }
        other => panic!("expected SloUnmet, got {other:?}"),
    }
    // The scored policy has no predictions to hold an objective against.
    pool.set_config(PickerConfig::default());
    assert!(pool.pick(&impossible, now, &[], &mut rng()).is_ok());
}

#[test]
fn adapter_requests_are_decided_by_the_scored_policy() {
    let now = Instant::now();
    let pool = fleet(
        Policy::Predicted,
        vec![state(0, 10, 0.6), state(0, 2, 0.1)],
        now,
    );
    teach(&pool.endpoints()[0], &Truth::gpu(), 300, 14);
    teach(&pool.endpoints()[1], &Truth::cpu(), 300, 15);
    let req = PickRequest {
        adapter: Some("sql"),
        ..request()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!(decision.policy, Policy::Scored);
    assert!(
        decision.latency.unwrap().1.is_some(),
        "its prediction still rides along"
    );
}

#[test]
fn an_explained_predicted_pick_lists_the_scores_with_its_choice_first() {
    let now = Instant::now();
    let pool = fleet(
        Policy::Predicted,
        vec![state(0, 10, 0.6), state(0, 2, 0.1)],
        now,
    );
    teach(&pool.endpoints()[0], &Truth::gpu(), 300, 16);
    teach(&pool.endpoints()[1], &Truth::cpu(), 300, 17);
    let req = PickRequest {
        explain: true,
        ..request()
    };
    let decision = pool.pick(&req, now, &[], &mut rng()).unwrap();
    assert_eq!((decision.index(), decision.policy), (0, Policy::Predicted));
    let order: Vec<usize> = decision.scores.iter().map(|s| s.endpoint.index).collect();
    assert_eq!(order, [0, 1], "the choice first, though it scores lower");
    assert!(decision.scores[0].total < decision.scores[1].total);
}

#[test]
fn the_features_carry_the_share_of_the_prompt_a_replica_holds() {
    let now = Instant::now();
    for policy in [Policy::Scored, Policy::Predicted] {
        let pool = fleet(policy, vec![state(0, 0, 0.1), state(0, 0, 0.1)], now);
        let hashes: Vec<u64> = (1..=100).collect();
        // The first 60 blocks went to replica 1 (recorded even without a
        // prefix weight under the predicted policy).
        let mut config = PickerConfig {
            policy,
            ..PickerConfig::default()
        };
        if policy == Policy::Predicted {
            config.weights.prefix = 0.0;
        }
        pool.set_config(config);
        pool.record(1, &hashes[..60]);
        let req = PickRequest {
            prefix_hashes: &hashes,
            ..request()
        };
        let on_1 = pool.pick(&req, now, &[0], &mut rng()).unwrap();
        let (features, _) = on_1.latency.unwrap();
        assert_eq!(
            (features.cached_prompt_tokens, features.new_prompt_tokens),
            (600.0, 400.0),
            "{policy}"
        );
        let on_0 = pool.pick(&req, now, &[1], &mut rng()).unwrap();
        let (features, _) = on_0.latency.unwrap();
        assert_eq!(
            (features.cached_prompt_tokens, features.new_prompt_tokens),
            (0.0, 1_000.0),
            "{policy}"
        );
    }
}

#[test]
fn waiting_counts_requests_sent_since_the_scrape_and_running_falls_back_to_in_flight() {
    let now = Instant::now();
    let pool = fleet(Policy::Scored, vec![state(1, 5, 0.4)], now);
    let endpoint = &pool.endpoints()[0];
    let req = request();
    // The first pick after a scrape sees it; then three requests go out.
    pool.pick(&req, now, &[], &mut rng()).unwrap();
    let _guards: Vec<_> = (0..3).map(|_| endpoint.acquire(10)).collect();
    let (features, _) = pool
        .pick(&req, now, &[], &mut rng())
        .unwrap()
        .latency
        .unwrap();
    assert_eq!((features.waiting, features.running), (4.0, 5.0));
    // An engine that reports no batch: this gateway's requests in flight.
    observe(
        endpoint,
        EngineState {
            running: None,
            ..state(0, 0, 0.4)
        },
        now,
    );
    let (features, _) = pool
        .pick(&req, now, &[], &mut rng())
        .unwrap()
        .latency
        .unwrap();
    // Three unanswered: at least that many are queued or in prefill.
    assert_eq!((features.waiting, features.running), (3.0, 3.0));
}

#[test]
fn policies_without_fresh_signals_carry_no_features() {
    let now = Instant::now();
    for policy in [Policy::RoundRobin, Policy::LeastRequest, Policy::Random] {
        let pool = fleet(policy, vec![state(0, 0, 0.1)], now);
        assert_eq!(
            pool.pick(&request(), now, &[], &mut rng()).unwrap().latency,
            None
        );
    }
    // The scored fallback when no metrics are fresh.
    let pool = fleet(Policy::Predicted, vec![state(0, 0, 0.1)], now);
    let later = now + Duration::from_secs(30);
    let decision = pool.pick(&request(), later, &[], &mut rng()).unwrap();
    assert!(decision.fallback);
    assert_eq!(decision.latency, None);
}
