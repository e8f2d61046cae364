//! What the gateway tells operators, end to end: exact metric values after
//! a known sequence of requests, the access log, `/debug/pools` following a
//! replica going stale and coming back, `traceparent` at the replica, and
//! the Grafana dashboard querying only metrics that exist.
//!
//! Tests run on the current-thread runtime so that a per-test `tracing`
//! subscriber sees every event the gateway's tasks emit.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::support::exposition::scrape;
use crate::support::logs::Logs;
use crate::support::{
    Behaviour, CHAT, FakeReplica, HEALTHZ, MetricsFault, client, closed_port, config, debug_pools,
    emit, healthz_answered, plain_pool, poll_until, until_debug_pools, vllm_metrics,
};
use futures_util::StreamExt;
use gateway::Gateway;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const USAGE_REPLY: &str = r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
/// One streamed answer: role, two tokens, the usage event, the end.
const STREAM_EVENTS: [&str; 5] = [
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}],\"usage\":null}\n\n",
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":3,\"total_tokens\":5}}\n\n",
    "data: [DONE]\n\n",
];

// ---------------------------------------------------------------------
// Gateway helpers

fn endpoint<'a>(pools: &'a Value, pool: &str) -> &'a Value {
    let pool = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == pool)
        .unwrap_or_else(|| panic!("no pool {pool} in {pools}"));
    &pool["endpoints"][0]
}

/// Poll `/debug/pools` until `condition` holds for the first replica of
/// `pool`.
async fn until_endpoint(gw: &Gateway, pool: &str, what: &str, condition: impl Fn(&Value) -> bool) {
    let what = format!("{pool}: {what}");
    until_debug_pools(gw, DEADLINE, &what, |pools| {
        condition(endpoint(pools, pool))
    })
    .await;
}

fn chat_body(model: &str, stream: bool) -> String {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
        .to_string()
}

async fn post(gw: &Gateway, id: &str, body: String, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .header("x-request-id", id)
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// A streamed chat through `replica`, event by event: each event is sent
/// only after the client has received the previous one, so every event
/// reaches the gateway as a frame of its own.
async fn streamed_chat(gw: &Gateway, replica: &FakeReplica, id: &str) {
    let resp = post(gw, id, chat_body("qwen", true), &[]).await;
    assert_eq!(resp.status(), 200);
    let events = replica.next_stream().await;
    let mut body = resp.bytes_stream();
    for event in STREAM_EVENTS {
        emit(&events, event).await;
        let mut seen = Vec::new();
        while seen.len() < event.len() {
            seen.extend_from_slice(&body.next().await.unwrap().unwrap());
        }
        assert_eq!(seen, event.as_bytes());
    }
    drop(events);
    assert!(body.next().await.is_none());
}

// ---------------------------------------------------------------------
// The known sequence

struct Fleet {
    /// Pool `llama` (scored, vLLM metrics): JSON answers with usage.
    json: FakeReplica,
    /// Pool `stream` (round-robin, no metrics): SSE answers.
    sse: FakeReplica,
    gw: Gateway,
}

async fn fleet() -> Fleet {
    let json = FakeReplica::start(
        "json",
        Behaviour::Reply(http::StatusCode::OK, USAGE_REPLY.into()),
    )
    .await;
    json.set_metrics(&vllm_metrics(1, 2, 0.25, &["sql-lora"]));
    let sse = FakeReplica::start("sse", Behaviour::Stream).await;
    let dead = closed_port().await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: llama, engine: vllm, models: [llama-8b], adapters: [sql-lora], endpoints: [\"{}\"], scheduling: {{metrics: {{interval: 20ms, staleAfter: 5s}}}}}}\n\
             \x20   - {{name: stream, engine: none, models: [qwen], endpoints: [\"{}\"], scheduling: {{policy: round-robin}}}}\n\
             \x20   - {{name: dead, engine: none, models: [ghost], endpoints: [\"{dead}\"], retry: {{maxRetries: 0}}, coldStart: {{timeout: 0s}}, scheduling: {{policy: round-robin, metrics: {{interval: 20ms}}}}}}\n",
            json.addr, sse.addr
        ),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    until_endpoint(&gw, "llama", "healthy", |e| e["health"] == "healthy").await;
    until_endpoint(&gw, "dead", "unreachable", |e| e["reachable"] == false).await;
    Fleet { json, sse, gw }
}

/// 3 JSON answers, 2 unknown models, 1 malformed body, 2 streams, 1 pool
/// with no reachable replica: 9 requests, 8 of which reach routing.
async fn known_sequence(f: &Fleet) {
    for i in 1..=3 {
        let resp = post(
            &f.gw,
            &format!("json-{i}"),
            chat_body("llama-8b", false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), USAGE_REPLY);
    }
    for i in 1..=2 {
        let resp = post(
            &f.gw,
            &format!("unknown-{i}"),
            chat_body("nope", false),
            &[],
        )
        .await;
        assert_eq!(resp.status(), 404);
    }
    let resp = post(&f.gw, "malformed", "{\"model\":".into(), &[]).await;
    assert_eq!(resp.status(), 400);
    for i in 1..=2 {
        streamed_chat(&f.gw, &f.sse, &format!("stream-{i}")).await;
    }
    let resp = post(&f.gw, "ghost", chat_body("ghost", false), &[]).await;
    assert_eq!(resp.status(), 503);
}

const SEQUENCE_REQUESTS: usize = 9;

#[tokio::test]
async fn a_known_sequence_gives_exact_counters() {
    let (logs, _guard) = Logs::capture();
    let f = fleet().await;
    known_sequence(&f).await;
    logs.wait_for_access(SEQUENCE_REQUESTS).await;
    let m = scrape(&f.gw).await;
    let json_addr = f.json.addr.to_string();
    let sse_addr = f.sse.addr.to_string();
    let llama = [("pool", "llama"), ("model", "llama-8b")];
    let qwen = [("pool", "stream"), ("model", "qwen")];

    // Requests by final status; the malformed one never reached routing.
    // Authentication is off: every caller is anonymous.
    let requests = |pool, model, code| {
        m.value(
            "infergate_requests_total",
            &[
                ("pool", pool),
                ("model", model),
                ("tenant", "anonymous"),
                ("code", code),
            ],
        )
    };
    assert_eq!(requests("llama", "llama-8b", "200"), 3.0);
    assert_eq!(requests("", "", "404"), 2.0);
    assert_eq!(requests("stream", "qwen", "200"), 2.0);
    assert_eq!(requests("dead", "ghost", "503"), 1.0);
    let total: f64 = m
        .series("infergate_requests_total")
        .iter()
        .map(|s| s.value)
        .sum();
    assert_eq!(total, 8.0);

    // Latency histograms: TTFT for every successful answer (streamed or
    // not), inter-token gaps only between streamed events.
    assert_eq!(m.value("infergate_ttft_seconds_count", &llama), 3.0);
    assert_eq!(m.value("infergate_ttft_seconds_count", &qwen), 2.0);
    // 4 data events per stream ([DONE] is not one): 3 gaps each.
    assert_eq!(m.value("infergate_inter_token_seconds_count", &qwen), 6.0);
    assert_eq!(m.value("infergate_inter_token_seconds_count", &llama), 0.0);
    assert_eq!(
        m.value("infergate_request_duration_seconds_count", &llama),
        3.0
    );
    assert_eq!(
        m.value("infergate_request_duration_seconds_count", &qwen),
        2.0
    );
    assert_eq!(
        m.value(
            "infergate_request_duration_seconds_count",
            &[("pool", ""), ("model", "")]
        ),
        2.0
    );

    // Tokens from the usage the replicas reported, by tenant.
    let anonymous =
        |route: [(&'static str, &'static str); 2]| [route[0], route[1], ("tenant", "anonymous")];
    assert_eq!(
        m.value("infergate_prompt_tokens_total", &anonymous(llama)),
        15.0
    );
    assert_eq!(
        m.value("infergate_completion_tokens_total", &anonymous(llama)),
        21.0
    );
    assert_eq!(
        m.value("infergate_prompt_tokens_total", &anonymous(qwen)),
        4.0
    );
    assert_eq!(
        m.value("infergate_completion_tokens_total", &anonymous(qwen)),
        6.0
    );

    // Decisions and refusals.
    assert_eq!(
        m.value(
            "infergate_routing_decisions_total",
            &[("pool", "llama"), ("endpoint", &json_addr)]
        ),
        3.0
    );
    assert_eq!(
        m.value(
            "infergate_routing_decisions_total",
            &[("pool", "stream"), ("endpoint", &sse_addr)]
        ),
        2.0
    );
    let refused = m.series("infergate_refused_total");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(
        m.value(
            "infergate_refused_total",
            &[("pool", "dead"), ("reason", "no-replicas")]
        ),
        1.0
    );
    assert_eq!(
        m.value("infergate_retries_total", &[("pool", "llama")]),
        0.0
    );
    assert_eq!(
        m.value("infergate_pick_fallbacks_total", &[("pool", "llama")]),
        0.0
    );
    assert_eq!(
        m.value(
            "infergate_pick_duration_seconds_count",
            &[("pool", "llama")]
        ),
        3.0
    );
    assert_eq!(
        m.value(
            "infergate_queue_wait_seconds_count",
            &[("pool", "llama"), ("priority", "standard")]
        ),
        3.0
    );

    // The replica's own signals, read at scrape time.
    let replica = [("pool", "llama"), ("endpoint", json_addr.as_str())];
    assert_eq!(m.value("infergate_endpoint_kv_usage", &replica), 0.25);
    assert_eq!(m.value("infergate_endpoint_waiting", &replica), 1.0);
    assert_eq!(m.value("infergate_endpoint_running", &replica), 2.0);
    assert_eq!(m.value("infergate_endpoint_stale", &replica), 0.0);
    assert_eq!(m.value("infergate_endpoint_inflight", &replica), 0.0);
    assert_eq!(
        m.value(
            "infergate_endpoint_adapter_info",
            &[
                ("pool", "llama"),
                ("endpoint", &json_addr),
                ("adapter", "sql-lora")
            ]
        ),
        1.0
    );
    assert!(m.value("infergate_endpoint_scrape_duration_seconds_count", &replica) >= 1.0);
    assert_eq!(
        m.value("infergate_pool_ready_endpoints", &[("pool", "llama")]),
        1.0
    );
    assert_eq!(
        m.value("infergate_pool_ready_endpoints", &[("pool", "dead")]),
        0.0
    );
    assert_eq!(
        m.value("infergate_pool_kv_usage_avg", &[("pool", "llama")]),
        0.25
    );
    assert_eq!(
        m.value("infergate_pool_waiting_avg", &[("pool", "llama")]),
        1.0
    );
    assert_eq!(
        m.value(
            "infergate_queue_requests",
            &[("pool", "llama"), ("priority", "critical")]
        ),
        0.0
    );
    assert!(
        m.value(
            "infergate_endpoint_scrape_errors_total",
            &[
                ("pool", "dead"),
                (
                    "endpoint",
                    endpoint(&debug_pools(&f.gw).await, "dead")["address"]
                        .as_str()
                        .unwrap()
                )
            ]
        ) >= 1.0
    );
}

#[tokio::test]
async fn the_access_log_has_one_line_per_request_with_its_fields() {
    let (logs, _guard) = Logs::capture();
    let f = fleet().await;
    known_sequence(&f).await;
    let lines = logs.wait_for_access(SEQUENCE_REQUESTS).await;
    assert_eq!(lines.len(), SEQUENCE_REQUESTS, "{lines:#?}");
    let by_id: BTreeMap<&str, &Value> = lines
        .iter()
        .map(|l| (l["request_id"].as_str().unwrap(), l))
        .collect();
    assert_eq!(by_id.len(), SEQUENCE_REQUESTS, "one line per request id");

    let ok = by_id["json-2"];
    for field in [
        "request_id",
        "model",
        "pool",
        "endpoint",
        "status",
        "stream",
        "priority",
        "ttft_ms",
        "duration_ms",
        "prompt_tokens",
        "completion_tokens",
        "queue_wait_ms",
        "retries",
        "decision",
        "prefix_source",
        "trace_id",
    ] {
        assert!(ok.get(field).is_some(), "no {field} in {ok}");
    }
    assert_eq!(ok["model"], "llama-8b");
    assert_eq!(ok["pool"], "llama");
    assert_eq!(ok["endpoint"], f.json.addr.to_string());
    assert_eq!(ok["status"], 200);
    assert_eq!(ok["stream"], false);
    assert_eq!(ok["prompt_tokens"], 5);
    assert_eq!(ok["completion_tokens"], 7);
    assert_eq!(ok["queue_wait_ms"], 0.0);
    assert_eq!(ok["retries"], 0);
    assert_eq!(ok["priority"], "standard");
    // One scored candidate: its score, and no runner-up.
    assert!(ok["decision"].as_str().unwrap().ends_with(" alone"), "{ok}");
    assert_eq!(ok["prefix_source"], "approximate", "the pool guesses");
    assert_eq!(ok["trace_id"].as_str().unwrap().len(), 32);
    assert!(ok.get("error").is_none(), "{ok}");
    let ttft = ok["ttft_ms"].as_f64().unwrap();
    assert!(ttft > 0.0 && ttft <= ok["duration_ms"].as_f64().unwrap());

    let streamed = by_id["stream-1"];
    assert_eq!(streamed["stream"], true);
    assert_eq!(streamed["pool"], "stream");
    assert_eq!(streamed["prompt_tokens"], 2);
    assert_eq!(streamed["completion_tokens"], 3);
    assert!(streamed["ttft_ms"].as_f64().unwrap() < streamed["duration_ms"].as_f64().unwrap());
    assert!(
        streamed.get("decision").is_none(),
        "round-robin does not score"
    );

    let unknown = by_id["unknown-1"];
    assert_eq!(unknown["status"], 404);
    assert_eq!(unknown["model"], "nope");
    assert!(unknown.get("pool").is_none());
    assert!(unknown["error"].as_str().unwrap().contains("nope"));

    let malformed = by_id["malformed"];
    assert_eq!(malformed["status"], 400);
    assert!(malformed.get("model").is_none());

    let ghost = by_id["ghost"];
    assert_eq!(ghost["status"], 503);
    assert_eq!(ghost["pool"], "dead");
    assert!(ghost.get("endpoint").is_none());
    assert!(ghost.get("ttft_ms").is_none());
}

#[tokio::test]
async fn every_metric_the_dashboard_queries_is_exported() {
    let (logs, _guard) = Logs::capture();
    let f = fleet().await;
    known_sequence(&f).await;
    logs.wait_for_access(SEQUENCE_REQUESTS).await;
    let exported = scrape(&f.gw).await;
    let exported = exported.names();

    let dashboard: Value =
        serde_json::from_str(include_str!("../../../../deploy/grafana/infergate.json")).unwrap();
    let mut queries = Vec::new();
    collect_queries(&dashboard, &mut queries);
    let queried: BTreeSet<String> = queries.iter().flat_map(|q| metric_names(q)).collect();
    assert!(queried.len() >= 20, "the dashboard queries {queried:?}");
    let missing: Vec<&String> = queried
        .iter()
        .filter(|name| !exported.contains(name.as_str()))
        .collect();
    assert!(missing.is_empty(), "queried but not exported: {missing:?}");
    // The issue's panels are all there.
    for name in [
        "infergate_ttft_seconds_bucket",
        "infergate_requests_total",
        "infergate_endpoint_kv_usage",
        "infergate_endpoint_waiting",
        "infergate_routing_decisions_total",
        "infergate_refused_total",
        "infergate_queue_requests",
    ] {
        assert!(queried.contains(name), "no panel queries {name}");
    }
}

/// Every PromQL string in the dashboard: panel targets and template
/// variable queries.
fn collect_queries(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition" | "query", Value::String(q)) => out.push(q.clone()),
                    _ => collect_queries(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_queries(i, out)),
        _ => {}
    }
}

fn metric_names(query: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = query;
    while let Some(at) = rest.find("infergate_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

#[tokio::test]
async fn debug_pools_and_metrics_follow_a_replica_going_stale_and_back() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: llama, engine: vllm, models: [m], endpoints: [\"{}\"], scheduling: {{metrics: {{interval: 20ms, staleAfter: 150ms, timeout: 30s}}}}}}\n",
            replica.addr
        ),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let addr = replica.addr.to_string();
    let series = [("pool", "llama"), ("endpoint", addr.as_str())];

    until_endpoint(&gw, "llama", "healthy", |e| e["health"] == "healthy").await;
    let pools = debug_pools(&gw).await;
    let e = endpoint(&pools, "llama");
    assert_eq!(e["stale"], false);
    assert!(e["lastGoodScrapeAgeMs"].as_f64().unwrap() < 5_000.0);
    // Scores for a typical request: every scorer, and a total in [0, 1].
    let total = e["scores"]["total"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&total), "{e}");
    for scorer in ["queue", "kv-cache", "inflight", "prefix", "lora"] {
        assert!(e["scores"]["parts"][scorer].is_number(), "{scorer} in {e}");
    }
    assert_eq!(pools["pools"][0]["typicalRequest"]["outcome"], addr);
    assert_eq!(
        scrape(&gw).await.value("infergate_endpoint_stale", &series),
        0.0
    );

    // Metrics stop: scrapes hang, the last good one ages past staleAfter.
    replica.set_metrics_fault(MetricsFault::Hang);
    until_endpoint(&gw, "llama", "stale", |e| e["health"] == "stale").await;
    let pools = debug_pools(&gw).await;
    let e = endpoint(&pools, "llama");
    assert_eq!(e["stale"], true);
    assert!(e["lastGoodScrapeAgeMs"].as_f64().unwrap() > 150.0);
    assert!(
        e["scores"].is_null(),
        "a stale replica is no candidate: {e}"
    );
    let m = scrape(&gw).await;
    assert_eq!(m.value("infergate_endpoint_stale", &series), 1.0);
    assert!(m.value("infergate_endpoint_metrics_age_seconds", &series) > 0.15);
    // Still ready: the pool picks without signals (`fallback:
    // least-request`), and every view of readiness says so.
    ready_everywhere(&gw, "llama", 1).await;
    // Traffic still flows, picked without signals, and that is counted.
    let resp = post(&gw, "blind", chat_body("m", false), &[]).await;
    assert_eq!(resp.status(), 200);
    let m = scrape(&gw).await;
    assert_eq!(
        m.value("infergate_pick_fallbacks_total", &[("pool", "llama")]),
        1.0
    );

    // Metrics resume: the hanging scrape is answered, the replica is back.
    replica.set_metrics_fault(MetricsFault::None);
    until_endpoint(&gw, "llama", "healthy again", |e| e["health"] == "healthy").await;
    let pools = debug_pools(&gw).await;
    assert_eq!(endpoint(&pools, "llama")["stale"], false);
    assert!(endpoint(&pools, "llama")["scores"]["total"].is_number());
    let m = scrape(&gw).await;
    assert_eq!(m.value("infergate_endpoint_stale", &series), 0.0);
    ready_everywhere(&gw, "llama", 1).await;
}

/// `/readyz`, the pool and its replicas in `/debug/pools`, the ready
/// metrics and what the custom resource's status is written from
/// ([`Gateway::ready_endpoints`]) give the same count, read together.
async fn ready_everywhere(gw: &Gateway, pool: &str, want: usize) {
    let readyz = client()
        .get(format!("http://{}/readyz", gw.addr()))
        .send()
        .await
        .unwrap()
        .status();
    let pools = debug_pools(gw).await;
    let shown = pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == pool)
        .unwrap()
        .clone();
    let m = scrape(gw).await;
    let status: Vec<(String, usize)> = gw.ready_endpoints();
    let replicas_ready = shown["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ready"] == true)
        .count();
    let views = (
        readyz.is_success(),
        shown["ready"] == true,
        replicas_ready,
        m.value("infergate_pool_ready_endpoints", &[("pool", pool)]) as usize,
        m.value("inference_pool_ready_pods", &[("name", pool)]) as usize,
        status.iter().find(|(p, _)| p == pool).unwrap().1,
    );
    assert_eq!(
        views,
        (want > 0, want > 0, want, want, want, want),
        "(/readyz, pool ready, replicas ready, ready metric, ready pods, status)"
    );
}

/// With `fallback: refuse` a replica whose metrics went stale takes no
/// request, and every view of readiness drops it at once.
#[tokio::test]
async fn a_stale_replica_of_a_pool_that_refuses_without_metrics_is_ready_nowhere() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: llama, engine: vllm, models: [m], endpoints: [\"{}\"], scheduling: {{fallback: refuse, metrics: {{interval: 20ms, staleAfter: 150ms, timeout: 30s}}}}}}\n",
            replica.addr
        ),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    until_endpoint(&gw, "llama", "healthy", |e| e["health"] == "healthy").await;
    ready_everywhere(&gw, "llama", 1).await;
    replica.set_metrics_fault(MetricsFault::Hang);
    until_endpoint(&gw, "llama", "stale", |e| e["health"] == "stale").await;
    ready_everywhere(&gw, "llama", 0).await;
    replica.set_metrics_fault(MetricsFault::None);
    until_endpoint(&gw, "llama", "healthy again", |e| e["health"] == "healthy").await;
    ready_everywhere(&gw, "llama", 1).await;
}

#[tokio::test]
async fn traceparent_reaches_the_replica_forwarded_or_generated() {
    let (logs, _guard) = Logs::capture();
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config("", &plain_pool(&[&replica.addr.to_string()], ""));
    let gw = Gateway::start(&cfg).await.unwrap();

    let resp = post(
        &gw,
        "with",
        chat_body("m", false),
        &[("traceparent", TRACEPARENT)],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let resp = post(&gw, "without", chat_body("m", false), &[]).await;
    assert_eq!(resp.status(), 200);
    let received = replica.received();
    assert_eq!(received.len(), 2);

    // The caller's context goes on unchanged.
    assert_eq!(received[0].headers["traceparent"], TRACEPARENT);
    // A new one, valid and sampled, when the caller sent none.
    let generated = received[1].headers["traceparent"].to_str().unwrap();
    let fields: Vec<&str> = generated.split('-').collect();
    assert_eq!(fields.len(), 4, "{generated}");
    assert_eq!(fields[0], "00");
    assert_eq!(fields[1].len(), 32);
    assert_eq!(fields[2].len(), 16);
    assert_eq!(fields[3], "01");
    assert!(
        generated
            .chars()
            .all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    );
    assert_ne!(fields[1], "0".repeat(32));
    assert_ne!(fields[1], "4bf92f3577b34da6a3ce929d0e0e4736");

    // The access log carries the same trace ids.
    let lines = logs.wait_for_access(2).await;
    let trace_of = |id: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id)
            .map(|l| l["trace_id"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(trace_of("with"), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(trace_of("without"), fields[1]);
}

#[tokio::test]
async fn decision_scores_are_logged_at_debug_level() {
    let (logs, _guard) = Logs::capture_with("info,infergate::decision=debug");
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let pools = format!(
        "    - {{name: p, models: [m], endpoints: [\"{}\", \"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n",
        a.addr, b.addr
    );
    let cfg = config("  admin: {address: \"127.0.0.1:0\"}\n", &pools);
    let gw = gateway::Gateway::start(&cfg).await.unwrap();
    // Wait for both replicas' first scrape: until then nothing is scored.
    until_debug_pools(&gw, DEADLINE, "both replicas healthy", |pools| {
        let endpoints = pools["pools"][0]["endpoints"].as_array().unwrap();
        endpoints.iter().all(|e| e["health"] == "healthy")
    })
    .await;
    let resp = client()
        .post(format!("http://{}/v1/completions", gw.addr()))
        .body(r#"{"model":"m","prompt":"hello"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = logs.text();
    let line = text
        .lines()
        .find(|l| l.contains("infergate::decision") && l.contains("picked"))
        .unwrap_or_else(|| panic!("no decision line in:\n{text}"));
    // Both candidates with their per-scorer parts.
    for addr in [a.addr, b.addr] {
        assert!(line.contains(&format!("{addr}=")), "{line}");
    }
    assert!(
        line.contains("q=") && line.contains("px=") && line.contains("lora="),
        "{line}"
    );
}

#[tokio::test]
async fn the_servers_own_gauges_count_open_connections_and_come_back_to_idle() {
    use tokio::io::AsyncWriteExt;
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let addr = replica.addr.to_string();
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &plain_pool(&[&addr], ""),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let connections =
        |m: &crate::support::exposition::Exposition| m.value("infergate_client_connections", &[]);
    let idle = scrape(&gw).await;
    // The accept loop's waiting slot is not a connection.
    assert_eq!(connections(&idle), 0.0);
    assert!(idle.value("infergate_runtime_alive_tasks", &[]) > 0.0);
    assert_eq!(idle.value("infergate_buffered_body_bytes", &[]), 0.0);

    let mut open = Vec::new();
    for _ in 0..3 {
        let mut conn = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
        conn.write_all(HEALTHZ).await.unwrap();
        healthz_answered(&mut conn).await;
        open.push(conn);
    }
    assert_eq!(connections(&scrape(&gw).await), 3.0);
    drop(open);
    // The server sees the clients leave when it next reads: bounded polling.
    let gw = &gw;
    let connections = &connections;
    poll_until(
        Duration::from_secs(10),
        "connections closed",
        move || async move {
            let open = connections(&scrape(gw).await);
            if open == 0.0 {
                Ok(())
            } else {
                Err(format!("{open} open"))
            }
        },
    )
    .await;
}
