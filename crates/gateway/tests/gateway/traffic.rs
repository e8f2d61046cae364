//! Traffic management end to end: rewrites that split a model's traffic
//! by weight and keep sessions on their target, a slow canary rolled back
//! by its guard while load runs, a healthy one promoted step by step, and
//! mirrors whose copies never hold up the client.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use gateway::Gateway;
use serde_json::{Value, json};

use crate::support::{
    Behaviour, CHAT, FakeReplica, admin_get, client, config, poll_until, sample, within,
};

/// Two pools of fake replicas: `stable` serving `m`, `canary` serving
/// `m-v2`, no engine metrics.
fn two_pools(stable: &FakeReplica, canary: &FakeReplica) -> String {
    format!(
        "    - {{name: stable, engine: none, models: [m], endpoints: [\"{}\"]}}\n    - {{name: canary, engine: none, models: [m-v2], endpoints: [\"{}\"]}}\n",
        stable.addr, canary.addr
    )
}

fn chat(model: &str, i: usize) -> String {
    json!({"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": format!("question {i}")}]})
        .to_string()
}

async fn rewrites(gw: &Gateway) -> Value {
    serde_json::from_str(&admin_get(gw, "/debug/rewrites").await).unwrap()
}

/// The model each request a replica received asked for.
fn models_received(replica: &FakeReplica) -> Vec<String> {
    replica
        .received()
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            body["model"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// A canary at 10 % of 2,000 requests serves 10 % (± 2 %), with the body's
/// `model` rewritten to the canary's name and nothing else of it changed;
/// the decision headers and the metrics name both models.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_at_ten_percent_serves_ten_percent() {
    let stable = FakeReplica::start("stable", Behaviour::Echo).await;
    let canary = FakeReplica::start("canary", Behaviour::Echo).await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n  debug: {decisionHeaders: true}\n  rewrites:\n    - name: m-rollout\n      model: m\n      targets: [{model: m, weight: 90}, {model: m-v2, weight: 10}]\n",
        &two_pools(&stable, &canary),
    );
    let gw = Arc::new(Gateway::start(&cfg).await.unwrap());
    const N: usize = 2000;
    let http = client();
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let (http, gw) = (http.clone(), Arc::clone(&gw));
        tasks.push(tokio::spawn(async move {
            let mut served = HashMap::<String, usize>::new();
            for i in (worker..N).step_by(16) {
                let resp = http
                    .post(format!("http://{}{CHAT}", gw.addr()))
                    .body(chat("m", i))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                let h = resp.headers();
                assert_eq!(h["x-infergate-requested-model"], "m");
                assert_eq!(h["x-infergate-rewrite"], "m-rollout");
                let model = h["x-infergate-model"].to_str().unwrap().to_owned();
                let pool = if model == "m" { "stable" } else { "canary" };
                assert_eq!(h["x-infergate-pool"], pool);
                *served.entry(model).or_default() += 1;
            }
            served
        }));
    }
    let mut served = HashMap::<String, usize>::new();
    for t in tasks {
        for (model, n) in within(Duration::from_secs(120), "2,000 requests", t)
            .await
            .unwrap()
        {
            *served.entry(model).or_default() += n;
        }
    }
    let to_canary = served.get("m-v2").copied().unwrap_or(0);
    assert!(
        (160..=240).contains(&to_canary),
        "the canary served {to_canary} of {N}: {served:?}"
    );
    assert_eq!(served.get("m").copied().unwrap_or(0) + to_canary, N);
    // Each pool's replica got its own model name, and only that.
    let canary_models = models_received(&canary);
    assert_eq!(canary_models.len(), to_canary);
    assert!(canary_models.iter().all(|m| m == "m-v2"));
    assert!(models_received(&stable).iter().all(|m| m == "m"));
    // Only the value changed: the body is byte for byte what the client
    // sent (serde_json's own rendering) but for the model's name.
    for r in canary.received().iter().take(20) {
        let got = String::from_utf8(r.body.to_vec()).unwrap();
        let sent = got.replacen("\"model\":\"m-v2\"", "\"model\":\"m\"", 1);
        let parsed: Value = serde_json::from_str(&sent).unwrap();
        assert_eq!(sent, parsed.to_string());
    }
    let metrics = admin_get(&gw, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "infergate_rewrite_requests_total{rewrite=\"m-rollout\",target=\"m-v2\"}"
        ),
        Some(to_canary as f64),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            "infergate_rewrite_weight{rewrite=\"m-rollout\",target=\"m-v2\"}"
        ),
        Some(10.0)
    );
}

/// Every request of a session goes to the target its first request got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_target() {
    let stable = FakeReplica::start("stable", Behaviour::Echo).await;
    let canary = FakeReplica::start("canary", Behaviour::Echo).await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n  debug: {decisionHeaders: true}\n  sessions: {header: x-session-id}\n  rewrites:\n    - name: half\n      model: m\n      targets: [{model: m, weight: 50}, {model: m-v2, weight: 50}]\n",
        &two_pools(&stable, &canary),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let http = client();
    let mut by_session: HashMap<usize, Vec<String>> = HashMap::new();
    for turn in 0..5 {
        for session in 0..40 {
            let resp = http
                .post(format!("http://{}{CHAT}", gw.addr()))
                .header("x-session-id", format!("chat-{session}"))
                .body(chat("m", turn))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            let model = resp.headers()["x-infergate-model"]
                .to_str()
                .unwrap()
                .to_owned();
            by_session.entry(session).or_default().push(model);
        }
    }
    let mut on_canary = 0;
    for (session, models) in &by_session {
        assert!(
            models.iter().all(|m| m == &models[0]),
            "session {session} flipped: {models:?}"
        );
        on_canary += usize::from(models[0] == "m-v2");
    }
    assert!(
        (5..=35).contains(&on_canary),
        "{on_canary} of 40 sessions on the canary"
    );
    assert_eq!(rewrites(&gw).await["rewrites"][0]["sessions"], 40);
}

/// A healthy canary is promoted step by step to 100 %, and then serves
/// every request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_canary_is_promoted_step_by_step() {
    let stable = FakeReplica::start("stable", Behaviour::Echo).await;
    let canary = FakeReplica::start("canary", Behaviour::Echo).await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n  rewrites:\n    - name: up\n      model: m\n      targets:\n        - {model: m, weight: 90}\n        - model: m-v2\n          weight: 10\n          guard: {errorRate: 0.05, minRequests: 5, window: 1m, baseline: absolute}\n          promote: {step: 30, every: 100ms}\n",
        &two_pools(&stable, &canary),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let http = client();
    let mut i = 0;
    let state = poll_until(Duration::from_secs(30), "the canary fully promoted", || {
        i += 1;
        let req = http
            .post(format!("http://{}{CHAT}", gw.addr()))
            .body(chat("m", i));
        let gw = &gw;
        async move {
            assert_eq!(req.send().await.unwrap().status(), 200);
            let state = rewrites(gw).await;
            let target = &state["rewrites"][0]["targets"][1];
            if target["status"] == "promoted" {
                Ok(state)
            } else {
                Err(target.to_string())
            }
        }
    })
    .await;
    let targets = &state["rewrites"][0]["targets"];
    assert_eq!(targets[1]["weight"], 100);
    assert_eq!(targets[0]["weight"], 0);
    let events: Vec<&str> = state["rewrites"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        events,
        [
            "promoted to 40 %",
            "promoted to 70 %",
            "promoted to 100 %: fully promoted"
        ]
    );
    let before = canary.count();
    for i in 0..20 {
        let resp = http
            .post(format!("http://{}{CHAT}", gw.addr()))
            .body(chat("m", i))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(
        canary.count(),
        before + 20,
        "a promoted canary serves everything"
    );
    let metrics = admin_get(&gw, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "infergate_rewrite_promotions_total{rewrite=\"up\",target=\"m-v2\"}"
        ),
        Some(3.0)
    );
}

/// A canary pool made slow with the simulator's fault options is rolled
/// back by its TTFT guard while the load runs, well within its window,
/// and no request fails: the slow answers still arrive, and later
/// requests all go to the stable target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_canary_is_rolled_back_under_load_without_a_failed_request() {
    let replica = |name: &str, slowdown: f64| {
        sim::start_replica(
            "127.0.0.1:0".parse().unwrap(),
            sim::ReplicaSpec {
                served_model_name: Some(name.into()),
                time_scale: 4.0,
                faults: sim::Faults {
                    slowdown,
                    ..sim::Faults::default()
                },
                ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
            },
        )
    };
    let stable = replica("m", 1.0).await.unwrap();
    let canary = replica("m-v2", 40.0).await.unwrap();
    let pools = format!(
        "    - {{name: stable, models: [m], endpoints: [\"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n    - {{name: canary, models: [m-v2], endpoints: [\"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n",
        stable.local_addr(),
        canary.local_addr()
    );
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n  rewrites:\n    - name: slow\n      model: m\n      targets:\n        - {model: m, weight: 70}\n        - model: m-v2\n          weight: 30\n          guard: {ttftP95: 50ms, minRequests: 8, window: 10m}\n",
        &pools,
    );
    let gw = Arc::new(Gateway::start(&cfg).await.unwrap());
    let http = client();
    const N: usize = 240;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let (http, gw) = (http.clone(), Arc::clone(&gw));
        tasks.push(tokio::spawn(async move {
            let mut served = Vec::new();
            for i in (worker..N).step_by(8) {
                let resp = http
                    .post(format!("http://{}{CHAT}", gw.addr()))
                    .body(
                        json!({"model": "m", "stream": true, "max_tokens": 2,
                            "messages": [{"role": "user", "content": format!("question {i}")}]})
                        .to_string(),
                    )
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200, "request {i}");
                let text = resp.text().await.unwrap();
                assert!(
                    text.trim_end().ends_with("data: [DONE]"),
                    "request {i}: {text}"
                );
                let model = if text.contains("\"model\":\"m-v2\"") {
                    "m-v2"
                } else {
                    "m"
                };
                served.push((i, model));
            }
            served
        }));
    }
    let mut served = Vec::new();
    for t in tasks {
        served.extend(
            within(Duration::from_secs(180), "the load", t)
                .await
                .unwrap(),
        );
    }
    assert_eq!(served.len(), N, "every request answered 200");
    let state = rewrites(&gw).await;
    let target = &state["rewrites"][0]["targets"][1];
    assert_eq!(target["status"], "rolled-back", "{state}");
    assert_eq!(target["weight"], 0);
    assert_eq!(state["rewrites"][0]["targets"][0]["weight"], 100);
    let reason = target["reason"].as_str().unwrap();
    assert!(reason.starts_with("TTFT p95"), "{reason}");
    // The rollback came early in the load: the canary served only about
    // the answers its guard needed (plus those already in flight), and
    // none of the last half of the requests.
    let on_canary: Vec<usize> = served
        .iter()
        .filter(|(_, m)| *m == "m-v2")
        .map(|(i, _)| *i)
        .collect();
    assert!(on_canary.len() >= 8, "{on_canary:?}");
    assert!(
        on_canary.iter().all(|&i| i < N / 2),
        "the canary still served late requests: {on_canary:?}"
    );
    let metrics = admin_get(&gw, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            "infergate_rewrite_rollbacks_total{rewrite=\"slow\",target=\"m-v2\"}"
        ),
        Some(1.0)
    );
}

/// Copies go to the shadow pool and never hold up the client: with the
/// shadow replica holding every request, the primary answers at once;
/// copies beyond `maxInFlight` are dropped and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_shadow_never_holds_up_the_client() {
    let primary = FakeReplica::start("primary", Behaviour::Echo).await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let shadow = FakeReplica::start("shadow", Behaviour::Held(Arc::clone(&gate))).await;
    let pools = format!(
        "    - {{name: main, engine: none, models: [m], endpoints: [\"{}\"]}}\n    - {{name: shadow, engine: none, models: [m-next], endpoints: [\"{}\"]}}\n",
        primary.addr, shadow.addr
    );
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n  mirrors:\n    - {model: m, targetModel: m-next, fraction: 1.0, maxInFlight: 2}\n",
        &pools,
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let http = client();
    for i in 0..5 {
        let resp = within(
            Duration::from_secs(10),
            "the primary answer",
            http.post(format!("http://{}{CHAT}", gw.addr()))
                .body(chat("m", i))
                .send(),
        )
        .await
        .unwrap();
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["replica"], "primary");
    }
    within(
        Duration::from_secs(10),
        "two copies at the shadow",
        shadow.wait_for(2),
    )
    .await;
    assert!(models_received(&shadow).iter().all(|m| m == "m-next"));
    assert_eq!(primary.count(), 5);
    let metrics = admin_get(&gw, "/metrics").await;
    let copies = |outcome: &str| {
        sample(
            &metrics,
            &format!("infergate_mirror_copies_total{{mirror=\"m->m-next\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(copies("sent"), Some(2.0), "{metrics}");
    assert_eq!(copies("dropped-saturated"), Some(3.0));
    // Released, the copies are read to their end and their room freed.
    gate.add_permits(2);
    poll_until(Duration::from_secs(10), "the copies done", || {
        let gw = &gw;
        async move {
            let m = admin_get(gw, "/metrics").await;
            match sample(&m, "infergate_mirror_in_flight{mirror=\"m->m-next\"}") {
                Some(0.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
}
