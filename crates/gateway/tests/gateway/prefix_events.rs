//! A pool that follows its engines' KV-cache events: simulated replicas
//! publish them on vLLM's wire format, two gateways subscribe to the same
//! replicas, and a conversation one gateway sent is found by the other
//! where the engine holds it — a prefix the second gateway never saw, so
//! only the events can have told it.

use std::time::Duration;

use gateway::Gateway;
use serde_json::{Value, json};

use crate::support::{CHAT, client, config, poll_until};

async fn publishing_replica() -> sim::ReplicaHandle {
    sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale: 1000.0,
            kv_events: Some(sim::KvEventsSpec {
                port: 0,
                replay_port: Some(0),
                ..sim::KvEventsSpec::default()
            }),
            ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
        },
    )
    .await
    .unwrap()
}

/// A pool `p` over `replicas`, following their events.
fn events_pool(replicas: &[sim::ReplicaHandle]) -> String {
    let endpoints: Vec<String> = replicas
        .iter()
        .map(|r| format!("\"{}\"", r.local_addr()))
        .collect();
    let publishers: Vec<String> = replicas
        .iter()
        .map(|r| {
            let info = r.info();
            format!(
                "\"{}\": {{endpoint: \"{}\", replayEndpoint: \"{}\"}}",
                r.local_addr(),
                info.kv_events_endpoint.as_deref().unwrap(),
                info.kv_events_replay_endpoint.as_deref().unwrap(),
            )
        })
        .collect();
    format!(
        "    - {{name: p, engine: vllm, models: [m], endpoints: [{}], prefixCache: {{source: events, publishers: {{{}}}}}}}\n",
        endpoints.join(", "),
        publishers.join(", ")
    )
}

async fn start_gateway(replicas: &[sim::ReplicaHandle]) -> Gateway {
    Gateway::start(&config(
        "  admin: {address: \"127.0.0.1:0\"}\n  debug: {decisionHeaders: true}\n",
        &events_pool(replicas),
    ))
    .await
    .unwrap()
}

async fn debug_pool(gw: &Gateway) -> Value {
    let url = format!("http://{}/debug/pools", gw.admin_addr().unwrap());
    let pools: Value = client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    pools["pools"][0].clone()
}

/// Blocks the gateway's index holds for the replica at `addr`, once its
/// stream is in step.
async fn indexed_blocks(gw: &Gateway, addr: &str) -> Option<u64> {
    let pool = debug_pool(gw).await;
    let replica = pool["endpoints"]
        .as_array()?
        .iter()
        .find(|e| e["address"] == addr)?
        .clone();
    (replica["prefixSource"] == "events").then(|| {
        replica["kvEvents"].as_array().map_or(0, |ranks| {
            ranks
                .iter()
                .map(|r| r["gpuBlocks"].as_u64().unwrap_or(0))
                .sum()
        })
    })
}

/// Sends a chat and returns the replica that answered it.
async fn chat(gw: &Gateway, system: &str, question: &str) -> String {
    let answer = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .json(&json!({"model": "m", "max_tokens": 4, "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ]}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    answer.headers()["x-infergate-endpoint"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// The value of the series of `family` whose labels include every one of
/// `labels`, from the gateway's `/metrics`; 0 when there is none.
async fn metric(gw: &Gateway, family: &str, labels: &[&str]) -> f64 {
    let url = format!("http://{}/metrics", gw.admin_addr().unwrap());
    let text = client()
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| {
            l.starts_with(&format!("{family}{{")) && labels.iter().all(|label| l.contains(label))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn prefix_picks_by_events(gw: &Gateway) -> f64 {
    let labels = ["pool=\"p\"", "source=\"events\""];
    metric(gw, "infergate_prefix_source_total", &labels).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_find_a_conversation_where_the_engine_holds_it() {
    let replicas = [
        publishing_replica().await,
        publishing_replica().await,
        publishing_replica().await,
    ];
    let (a, b) = (
        start_gateway(&replicas).await,
        start_gateway(&replicas).await,
    );
    let addrs: Vec<String> = replicas
        .iter()
        .map(|r| r.local_addr().to_string())
        .collect();
    for gw in [&a, &b] {
        poll_until(Duration::from_secs(20), "every stream in step", || async {
            let mut in_step = 0;
            for addr in &addrs {
                in_step += usize::from(indexed_blocks(gw, addr).await.is_some());
            }
            if in_step == addrs.len() {
                Ok(())
            } else {
                Err(format!("{in_step} of {} streams in step", addrs.len()))
            }
        })
        .await;
    }

    // Gateway A sends a long conversation; the engine that served it
    // publishes the blocks it now holds.
    let system = "You are the support assistant of a large hardware store. ".repeat(60);
    let holder = chat(&a, &system, "Where are the screws?").await;
    // Nothing was stored anywhere before it: its prefix was guessed.
    let no_events = ["pool=\"p\"", "reason=\"no-events\""];
    assert_eq!(
        metric(&a, "infergate_prefix_unmatched_total", &no_events).await,
        1.0
    );
    for gw in [&a, &b] {
        poll_until(
            Duration::from_secs(20),
            "the prompt's blocks indexed",
            || async {
                match indexed_blocks(gw, &holder).await {
                    Some(blocks) if blocks >= 30 => Ok(()),
                    seen => Err(format!("{seen:?} blocks for {holder}")),
                }
            },
        )
        .await;
    }

    // The stored blocks are events lately applied: the holder's stream
    // shows a rate.
    let pool = debug_pool(&a).await;
    let rate: f64 = pool["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["address"] == holder)
        .flat_map(|e| e["kvEvents"].as_array().unwrap().clone())
        .map(|rank| rank["eventsPerSecond"].as_f64().unwrap())
        .sum();
    assert!(rate > 0.0, "{pool}");

    // Gateway B never saw the conversation: its guess knows nothing, the
    // events say where it is, and its next turns go there.
    let before = prefix_picks_by_events(&b).await;
    for question in ["And the nails?", "Do you sell glue?", "Opening hours?"] {
        assert_eq!(chat(&b, &system, question).await, holder, "{question}");
    }
    assert!(
        prefix_picks_by_events(&b).await >= before + 3.0,
        "B's picks were scored by the events"
    );
    // A, too, sends the conversation where the engine holds it.
    assert_eq!(chat(&a, &system, "Is there parking?").await, holder);

    // A prompt shorter than a block is not matched, and says why.
    chat(&b, "Hi.", "Hello?").await;
    let short = ["pool=\"p\"", "reason=\"short-prompt\""];
    assert_eq!(
        metric(&b, "infergate_prefix_unmatched_total", &short).await,
        1.0
    );

    // The streams, as Prometheus sees them.
    let at_holder = format!("endpoint=\"{holder}\"");
    let labels = ["pool=\"p\"", at_holder.as_str(), "rank=\"0\""];
    assert_eq!(
        metric(&b, "infergate_kv_events_in_step", &labels).await,
        1.0
    );
    assert!(metric(&b, "infergate_kv_events_gpu_blocks", &labels).await >= 30.0);
    assert!(metric(&b, "infergate_kv_events_events_total", &labels).await >= 1.0);
}
