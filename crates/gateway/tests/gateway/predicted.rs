//! The predicted policy through the gateway: the streams it proxies teach
//! each replica's latency model, `/debug/pools` shows it, picks are
//! counted by the policy that decided, and a request's latency objectives
//! follow its band once the predictions are trusted.

use serde_json::{Value, json};

use super::support::*;
use gateway::Gateway;

const CHAT: &str = "/v1/chat/completions";

async fn replica() -> sim::ReplicaHandle {
    sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale: 20.0,
            ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
        },
    )
    .await
    .unwrap()
}

async fn stream(gw: &Gateway, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .json(&json!({"model": "m", "stream": true, "max_tokens": 16,
            "messages": [{"role": "user", "content": "teach the model"}]}));
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

fn models(pools: &Value) -> Vec<Value> {
    pools["pools"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["latencyModel"].clone())
        .collect()
}

/// Until `n` replicas of the pool are scraped and ready.
async fn until_ready(gw: &Gateway, n: usize) {
    poll_until(
        std::time::Duration::from_secs(10),
        "the replicas scraped",
        || async {
            let pools: Value = serde_json::from_str(&admin_get(gw, "/debug/pools").await).unwrap();
            let ready = pools["pools"][0]["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ready"] == true)
                .count();
            if ready == n {
                Ok(())
            } else {
                Err(format!("{ready} ready"))
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_teach_the_latency_models_and_objectives_follow_the_band() {
    let a = replica().await;
    let b = replica().await;
    let addrs = [a.local_addr().to_string(), b.local_addr().to_string()];
    let pool = format!(
        "    - {{name: p, engine: vllm, models: [m], endpoints: [\"{}\", \"{}\"], scheduling: {{policy: predicted}}}}\n",
        addrs[0], addrs[1]
    );
    let gw = Gateway::start(&config("  admin: {address: \"127.0.0.1:0\"}\n", &pool))
        .await
        .unwrap();
    until_ready(&gw, 2).await;

    // A malformed objective is the client's error.
    let (status, body) = stream(&gw, &[("x-infergate-slo-ttft-ms", "soon")]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("x-infergate-slo-ttft-ms"), "{body}");

    // At low load the scored fallback favours one replica; the other is
    // explored on purpose until it is measured. Streams until both models
    // are trusted, within a bound.
    const MAX_STREAMS: u64 = 400;
    let mut sent = 0;
    let learned = loop {
        for _ in 0..20 {
            let (status, _) = stream(&gw, &[]).await;
            assert_eq!(status, 200);
        }
        sent += 20;
        let pools: Value = serde_json::from_str(&admin_get(&gw, "/debug/pools").await).unwrap();
        let learned = models(&pools);
        if learned.iter().all(|m| m["trusted"] == true) || sent >= MAX_STREAMS {
            break learned;
        }
    };
    let observed: u64 = learned
        .iter()
        .map(|m| m["observations"].as_u64().unwrap())
        .sum();
    assert_eq!(
        observed, sent,
        "every stream taught its replica: {learned:?}"
    );
    assert!(
        learned.iter().all(|m| m["trusted"] == true),
        "{sent} steady streams make both models trusted: {learned:?}"
    );
    let metrics = admin_get(&gw, "/metrics").await;
    let picks = |policy: &str| {
        sample(
            &metrics,
            &format!("infergate_picks_by_policy_total{{pool=\"p\",policy=\"{policy}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(picks("predicted") + picks("scored"), sent as f64);
    assert!(picks("predicted") > 0.0, "{metrics}");

    // An objective no replica can meet: sheddable work is refused before
    // anything is spent on it.
    let impossible = ("x-infergate-slo-ttft-ms", "0.001");
    let (status, body) = stream(&gw, &[impossible, ("x-infergate-priority", "sheddable")]).await;
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("slo_unmet"), "{body}");
    // A reachable one changes nothing.
    let (status, _) = stream(&gw, &[("x-infergate-slo-ttft-ms", "60000")]).await;
    assert_eq!(status, 200);

    // Attainment is counted per band and tenant: the refused sheddable
    // request missed, the reachable one met its objective.
    let metrics = admin_get(&gw, "/metrics").await;
    let slo = |band: &str, outcome: &str| {
        sample(
            &metrics,
            &format!(
                "infergate_slo_requests_total{{pool=\"p\",model=\"m\",tenant=\"anonymous\",band=\"{band}\",objective=\"ttft\",outcome=\"{outcome}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(slo("sheddable", "missed"), 1.0, "{metrics}");
    assert_eq!(slo("standard", "met"), 1.0, "{metrics}");
    // Each replica's prediction error, and whether it is trusted.
    for addr in &addrs {
        for target in ["ttft", "itl"] {
            let mape = sample(
                &metrics,
                &format!(
                    "infergate_latency_prediction_error{{pool=\"p\",endpoint=\"{addr}\",target=\"{target}\"}}"
                ),
            )
            .unwrap_or_else(|| panic!("no {target} error for {addr}: {metrics}"));
            assert!((0.0..0.35).contains(&mape), "{addr} {target}: {mape}");
        }
        assert_eq!(
            sample(
                &metrics,
                &format!("infergate_latency_model_trusted{{pool=\"p\",endpoint=\"{addr}\"}}")
            ),
            Some(1.0)
        );
    }
}

/// A tenant's configured objectives apply to its requests that send none;
/// a header overrides them.
#[tokio::test]
async fn a_tenants_objectives_apply_unless_the_request_sends_its_own() {
    let a = replica().await;
    let pool = format!(
        "    - {{name: p, engine: vllm, models: [m], endpoints: [\"{}\"]}}\n",
        a.local_addr()
    );
    let top = format!(
        "  admin: {{address: \"127.0.0.1:0\"}}\n  auth: {{apiKeys: {{keys: [{{tenant: fast, sha256: {}}}]}}}}\n  tenants: [{{name: fast, slo: {{ttft: 1ms}}}}]\n",
        gateway::auth::api_keys::sha256_hex("sk-fast")
    );
    let gw = Gateway::start(&config(&top, &pool)).await.unwrap();
    until_ready(&gw, 1).await;
    let key = ("authorization", "Bearer sk-fast");
    // A 1 ms time to first token is beyond this replica: missed.
    let (status, body) = stream(&gw, &[key]).await;
    assert_eq!(status, 200, "{body}");
    // The header's own objective replaces the tenant's: met.
    let (status, _) = stream(&gw, &[key, ("x-infergate-slo-ttft-ms", "60000")]).await;
    assert_eq!(status, 200);
    let metrics = admin_get(&gw, "/metrics").await;
    let slo = |outcome: &str| {
        sample(
            &metrics,
            &format!(
                "infergate_slo_requests_total{{pool=\"p\",model=\"m\",tenant=\"fast\",band=\"standard\",objective=\"ttft\",outcome=\"{outcome}\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!((slo("met"), slo("missed")), (1.0, 1.0), "{metrics}");
}
