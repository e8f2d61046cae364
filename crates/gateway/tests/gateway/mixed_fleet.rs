//! A pool that mixes GPUs: Llama-3.1-8B on an H100 and on an A10G. The
//! H100 holds the model's whole 128k context, the A10G's KV memory far
//! less: a prompt goes where it fits, and only a prompt no replica can
//! hold is refused, in OpenAI's `context_length_exceeded` shape. The H100
//! is also several times faster per token, which the gateway measures: at
//! equal (idle) load it wins.

use gateway::Gateway;
use serde_json::{Value, json};

use crate::support::{CHAT, client, config, poll_until};

async fn replica(hardware: &str) -> sim::ReplicaHandle {
    replica_at(hardware, 1000.0).await
}

async fn replica_at(hardware: &str, time_scale: f64) -> sim::ReplicaHandle {
    sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale,
            ..sim::ReplicaSpec::new(hardware, "llama-3.1-8b")
        },
    )
    .await
    .unwrap()
}

/// The context length a replica lists in `/v1/models`.
async fn listed_context(addr: std::net::SocketAddr) -> u64 {
    let models: Value = client()
        .get(format!("http://{addr}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    models["data"][0]["max_model_len"].as_u64().unwrap()
}

/// A prompt of about `tokens` tokens, as both the gateway's estimate and
/// the simulator's tokenizer count it (" abc" is one token of four bytes).
fn chat_body(tokens: u64) -> Value {
    json!({"model": "m", "max_tokens": 8,
        "messages": [{"role": "user", "content": " abc".repeat(tokens as usize)}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_where_it_fits_and_is_refused_only_when_none_can_hold_it() {
    let big = replica("h100").await;
    let small = replica("a10g").await;
    let (big_limit, small_limit) = (
        listed_context(big.local_addr()).await,
        listed_context(small.local_addr()).await,
    );
    assert!(
        small_limit + 2000 < big_limit,
        "{small_limit} vs {big_limit}"
    );
    let pools = format!(
        "    - {{name: p, engine: vllm, models: [m], endpoints: [\"{}\", \"{}\"]}}\n",
        big.local_addr(),
        small.local_addr()
    );
    let gw = Gateway::start(&config(
        "  admin: {address: \"127.0.0.1:0\"}\n  debug: {decisionHeaders: true}\n",
        &pools,
    ))
    .await
    .unwrap();
    // The gateway reads each replica's model list after its first scrape.
    let pools_url = format!("http://{}/debug/pools", gw.admin_addr().unwrap());
    poll_until(
        std::time::Duration::from_secs(10),
        "both context lengths known",
        || {
            let url = pools_url.clone();
            async move {
                let v: Value = client()
                    .get(url)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                let known: Vec<Value> = v["pools"][0]["endpoints"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["contextLength"].clone())
                    .collect();
                if known.iter().all(Value::is_u64) {
                    Ok(())
                } else {
                    Err(format!("{known:?}"))
                }
            }
        },
    )
    .await;

    let url = format!("http://{}{CHAT}", gw.addr());
    // Longer than the A10G holds: every one goes to the H100.
    for _ in 0..6 {
        let r = client()
            .post(&url)
            .json(&chat_body(small_limit + 1000))
            .send()
            .await
            .unwrap();
        let served_by = r.headers()["x-infergate-endpoint"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(r.status(), 200, "{:?}", r.text().await);
        assert_eq!(served_by, big.local_addr().to_string());
    }
    // Longer than any replica holds: the largest refuses, in OpenAI's shape.
    let r = client()
        .post(&url)
        .json(&chat_body(big_limit + 1000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let e: Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "context_length_exceeded", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
}

/// An engine that does not list its context length: the first prompt too
/// long for a replica is refused by it, and from then on the gateway
/// knows and sends such prompts elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_teaches_the_gateway_the_replica_context_length() {
    let big = replica("h100").await;
    let small = replica("a10g").await;
    let small_limit = listed_context(small.local_addr()).await;
    // engine: none reads no model list; round-robin alternates.
    let pools = crate::support::plain_pool(
        &[
            &small.local_addr().to_string(),
            &big.local_addr().to_string(),
        ],
        "",
    );
    let admin = "  admin: {address: \"127.0.0.1:0\"}\n";
    let gw = Gateway::start(&config(admin, &pools)).await.unwrap();
    let url = format!("http://{}{CHAT}", gw.addr());
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let r = client()
            .post(&url)
            .json(&chat_body(small_limit + 1000))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
    }
    // Round-robin sends the first to the A10G, which refuses it: a refusal
    // another replica may not make, so the H100 is asked and answers;
    // after that every one goes where it fits.
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200]);
    let metrics = crate::support::admin_get(&gw, "/metrics").await;
    let retried = crate::support::sample(
        &metrics,
        "infergate_migrations_total{pool=\"p\",reason=\"not_here\",outcome=\"resent\"}",
    );
    assert_eq!(retried, Some(1.0));
}

/// At idle every load signal ties, so only measured speed separates an
/// H100 from an A10G: once the gateway has timed both, sequential requests
/// all go to the H100.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_equal_load_the_measured_faster_replica_wins() {
    // Slowed to a twentieth of real speed, so that per-token times are
    // milliseconds, well above the noise of a busy test machine.
    let fast = replica_at("h100", 20.0).await;
    let slow = replica_at("a10g", 20.0).await;
    let pools = format!(
        "    - {{name: p, engine: vllm, models: [m], endpoints: [\"{}\", \"{}\"]}}\n",
        fast.local_addr(),
        slow.local_addr()
    );
    let gw = Gateway::start(&config("  debug: {decisionHeaders: true}\n", &pools))
        .await
        .unwrap();
    let url = format!("http://{}{CHAT}", gw.addr());
    let mut served_by = Vec::new();
    for n in 0..30 {
        let r = client()
            .post(&url)
            .json(&json!({"model": "m", "max_tokens": 48, "messages": [{"role": "user", "content": format!("Hello {n}")}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        served_by.push(
            r.headers()["x-infergate-endpoint"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        r.bytes().await.unwrap();
    }
    let slow = slow.local_addr().to_string();
    // Until both are measured they tie, and each is tried; after that the
    // slow one gets nothing while the fast one is idle.
    let last_slow = served_by.iter().rposition(|a| *a == slow);
    assert!(
        last_slow.is_some_and(|i| i < 20),
        "the slow replica was never tried, or still chosen late: {served_by:?}"
    );
}
