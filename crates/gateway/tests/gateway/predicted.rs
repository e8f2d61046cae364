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
    poll_until(
        std::time::Duration::from_secs(10),
        "both replicas scraped",
        || async {
            let pools: Value = serde_json::from_str(&admin_get(&gw, "/debug/pools").await).unwrap();
            let ready = pools["pools"][0]["endpoints"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ready"] == true)
                .count();
            if ready == 2 {
                Ok(())
            } else {
                Err(format!("{ready} ready"))
            }
        },
    )
    .await;

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
}
