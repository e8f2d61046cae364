//! Flow control end to end: a pool driven into saturation through the
//! metrics its replicas report, and requests of every band against it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::support::exposition::scrape;
use crate::support::{
    Behaviour, CHAT, FakeReplica, MetricsFault, client, config, idle_vllm_metrics, poll_until,
    until_debug_pools, vllm_metrics,
};
use gateway::Gateway;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);

/// One replica, scored, scraped every 20 ms. `queueDepth: 1` makes the
/// dispatcher hand out one request per freed slot, so dispatch order is
/// observable at the replica.
fn saturable(replica: &FakeReplica, flow: &str) -> config::InferenceGatewayConfig {
    config(
        &format!("  admin: {{address: \"127.0.0.1:0\"}}\n{flow}"),
        &format!(
            "    - {{name: p, models: [m], endpoints: [\"{}\"], scheduling: {{saturation: {{queueDepth: 1}}, metrics: {{interval: 20ms, staleAfter: 2s}}}}}}\n",
            replica.addr
        ),
    )
}

/// Wait until `/debug/pools` shows `value` in the replica's `field`.
async fn debug_shows(gw: &Gateway, field: &str, value: Value) {
    let what = format!("/debug/pools showing {field} = {value}");
    until_debug_pools(gw, DEADLINE, &what, |pools| {
        pools["pools"][0]["endpoints"][0][field] == value
    })
    .await;
}

async fn saturate(gw: &Gateway, replica: &FakeReplica) {
    replica.set_metrics(&vllm_metrics(3, 8, 0.5, &[]));
    debug_shows(gw, "waiting", json!(3)).await;
}

fn release(replica: &FakeReplica) {
    replica.set_metrics(&idle_vllm_metrics());
}

/// [`release`], seen by exactly one scrape. Requests sent since an
/// observation count as waiting, so with `queueDepth: 1` the dispatcher
/// then hands out one request at a time, each after the previous one has
/// been answered, and their arrival order at the replica is the dispatch
/// order. (A later scrape of an idle replica would let requests still in
/// flight be dispatched side by side, and race.)
fn release_for_one_scrape(replica: &FakeReplica) {
    release(replica);
    replica.set_metrics_fault(MetricsFault::OnceThenHang);
}

async fn queued(gw: &Gateway, want: [usize; 3]) {
    let what = format!("queue lengths {want:?}");
    poll_until(DEADLINE, &what, move || async move {
        match gw.queued("p") {
            Some(seen) if seen == want => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
}

/// Send a chat request in the background with the given flow headers.
fn send(
    gw: &Gateway,
    id: &str,
    band: Option<&str>,
    key: Option<&str>,
) -> tokio::task::JoinHandle<reqwest::Response> {
    let mut req = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("x-request-id", id)
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#);
    if let Some(band) = band {
        req = req.header("x-infergate-priority", band);
    }
    if let Some(key) = key {
        req = req.header("x-infergate-fairness-id", key);
    }
    tokio::spawn(async move { req.send().await.unwrap() })
}

fn arrival_order(replica: &FakeReplica) -> Vec<String> {
    replica
        .received()
        .iter()
        .map(|r| r.headers["x-request-id"].to_str().unwrap().to_owned())
        .collect()
}

fn dropped_reason(resp: &reqwest::Response) -> Option<&str> {
    resp.headers()
        .get("x-infergate-dropped-reason")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test]
async fn critical_overtakes_waiting_standard_requests() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    // Clients may ask for critical themselves.
    let flow = "  flowControl: {headerMayRaise: true}\n";
    let gw = Gateway::start(&saturable(&replica, flow)).await.unwrap();
    saturate(&gw, &replica).await;
    let mut waiting = Vec::new();
    for i in 0..3 {
        waiting.push(send(&gw, &format!("s{i}"), None, None));
        queued(&gw, [0, i + 1, 0]).await;
    }
    waiting.push(send(&gw, "c0", Some("critical"), None));
    queued(&gw, [1, 3, 0]).await;
    release_for_one_scrape(&replica);
    for r in waiting {
        assert_eq!(r.await.unwrap().status(), 200);
    }
    assert_eq!(arrival_order(&replica), ["c0", "s0", "s1", "s2"]);
}

/// With the default shares of a queue depth of 5, a replica with 3
/// waiting is full for standard (60 %: 3) and sheddable (40 %: 2) while
/// critical requests arrive, not for critical: a critical request goes
/// straight to it while a standard one waits in the gateway. Before any
/// critical request, standard fills the whole depth.
#[tokio::test]
async fn lower_bands_leave_the_last_places_of_a_replica_queue_to_critical() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&config(
        "  admin: {address: \"127.0.0.1:0\"}\n  flowControl: {headerMayRaise: true}\n",
        &format!(
            "    - {{name: p, models: [m], endpoints: [\"{}\"], scheduling: {{saturation: {{queueDepth: 5}}, metrics: {{interval: 20ms, staleAfter: 2s}}}}}}\n",
            replica.addr
        ),
    ))
    .await
    .unwrap();
    saturate(&gw, &replica).await;
    // No critical traffic yet: standard may fill the replica's queue to 5.
    let alone = send(&gw, "s0", None, None).await.unwrap();
    assert_eq!(alone.status(), 200);
    let first = send(&gw, "c0", Some("critical"), None).await.unwrap();
    assert_eq!(first.status(), 200);
    let standard = send(&gw, "s", None, None);
    queued(&gw, [0, 1, 0]).await;
    let shed = send(&gw, "x", Some("sheddable"), None).await.unwrap();
    assert_eq!(shed.status(), 429);
    assert_eq!(dropped_reason(&shed), Some("saturated"));
    let critical = send(&gw, "c", Some("critical"), None).await.unwrap();
    assert_eq!(critical.status(), 200);
    assert_eq!(
        arrival_order(&replica),
        ["s0", "c0", "c"],
        "standard went ahead of its share"
    );
    queued(&gw, [0, 1, 0]).await;
    release(&replica);
    assert_eq!(standard.await.unwrap().status(), 200);
    assert_eq!(arrival_order(&replica), ["s0", "c0", "c", "s"]);
}

#[tokio::test]
async fn decision_headers_report_the_queue_wait() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&saturable(&replica, "  debug: {decisionHeaders: true}\n"))
        .await
        .unwrap();
    saturate(&gw, &replica).await;
    let waiter = send(&gw, "w", None, None);
    queued(&gw, [0, 1, 0]).await;
    release(&replica);
    let waited = waiter.await.unwrap();
    assert_eq!(waited.status(), 200);
    let ms: f64 = waited.headers()["x-infergate-queue-wait-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // It was in line until the replica reported room again.
    assert!(ms > 0.0 && ms.is_finite(), "{ms}");
    // Both its picks are timed: the one that found the pool saturated and
    // the dispatcher's that sent it.
    let picks = scrape(&gw)
        .await
        .value("infergate_pick_duration_seconds_count", &[("pool", "p")]);
    assert!(picks >= 2.0, "{picks} picks timed");
    // With room, the next one goes straight through.
    let direct = send(&gw, "d", None, None).await.unwrap();
    assert_eq!(direct.headers()["x-infergate-queue-wait-ms"], "0");
    // Refusals carry no decision headers: nothing was decided.
    saturate(&gw, &replica).await;
    let shed = send(&gw, "x", Some("sheddable"), None).await.unwrap();
    assert_eq!(shed.status(), 429);
    assert!(!shed.headers().contains_key("x-infergate-queue-wait-ms"));
}

#[tokio::test]
async fn fairness_keys_alternate_while_both_are_backlogged() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&saturable(&replica, "")).await.unwrap();
    saturate(&gw, &replica).await;
    let mut waiting = Vec::new();
    // Tenant A offers ten times tenant B's load.
    for i in 0..20 {
        waiting.push(send(&gw, &format!("a{i}"), None, Some("tenant-a")));
    }
    queued(&gw, [0, 20, 0]).await;
    for i in 0..2 {
        waiting.push(send(&gw, &format!("b{i}"), None, Some("tenant-b")));
    }
    queued(&gw, [0, 22, 0]).await;
    release_for_one_scrape(&replica);
    for r in waiting {
        assert_eq!(r.await.unwrap().status(), 200);
    }
    let order = arrival_order(&replica);
    // Round-robin between keys: B's two requests are served among the
    // first four, not after A's twenty.
    let first_four = &order[..4];
    assert_eq!(
        first_four.iter().filter(|id| id.starts_with('b')).count(),
        2,
        "{order:?}"
    );
}

#[tokio::test]
async fn sheddable_is_refused_while_standard_waits() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&saturable(&replica, "")).await.unwrap();
    saturate(&gw, &replica).await;
    let standard = send(&gw, "s", None, None);
    queued(&gw, [0, 1, 0]).await;
    let shed = send(&gw, "x", Some("sheddable"), None).await.unwrap();
    assert_eq!(shed.status(), 429);
    assert_eq!(dropped_reason(&shed), Some("saturated"));
    let retry_after: u64 = shed.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    let body: Value = shed.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    release(&replica);
    assert_eq!(standard.await.unwrap().status(), 200);
    assert_eq!(arrival_order(&replica), ["s"]);
}

#[tokio::test]
async fn header_cannot_raise_a_band_unless_allowed() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&saturable(&replica, "  objectives: {m: sheddable}\n"))
        .await
        .unwrap();
    saturate(&gw, &replica).await;
    // The model is sheddable; asking for critical does not help.
    let resp = send(&gw, "x", Some("critical"), None).await.unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(dropped_reason(&resp), Some("saturated"));

    let allowed = saturable(
        &replica,
        "  objectives: {m: sheddable}\n  flowControl: {headerMayRaise: true}\n",
    );
    let gw = Gateway::start(&allowed).await.unwrap();
    saturate(&gw, &replica).await;
    let raised = send(&gw, "c", Some("critical"), None);
    queued(&gw, [1, 0, 0]).await;
    release(&replica);
    assert_eq!(raised.await.unwrap().status(), 200);

    let bad = send(&gw, "bad", Some("urgent"), None).await.unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn wait_expires_with_429_and_queue_full_is_refused() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let flow = "  flowControl: {standard: {maxWait: 300ms, maxQueued: 2}}\n";
    let gw = Gateway::start(&saturable(&replica, flow)).await.unwrap();
    saturate(&gw, &replica).await;
    let first = send(&gw, "s0", None, None);
    let second = send(&gw, "s1", None, None);
    queued(&gw, [0, 2, 0]).await;
    let full = send(&gw, "s2", None, None).await.unwrap();
    assert_eq!(full.status(), 429);
    assert_eq!(dropped_reason(&full), Some("queue-full"));
    for waited in [first, second] {
        let resp = waited.await.unwrap();
        assert_eq!(resp.status(), 429);
        assert_eq!(dropped_reason(&resp), Some("wait-expired"));
        assert!(resp.headers().contains_key("retry-after"));
    }
    queued(&gw, [0, 0, 0]).await;
    assert_eq!(replica.count(), 0);

    // The expired waits are in the queue-wait histogram, each at least
    // its bound; the refusal at once is not.
    let m = scrape(&gw).await;
    let value = |name: &str| m.value(name, &[("pool", "p"), ("priority", "standard")]);
    assert_eq!(value("infergate_queue_wait_seconds_count"), 2.0);
    assert!(value("infergate_queue_wait_seconds_sum") >= 0.6);
}

#[tokio::test]
async fn a_pool_with_no_reachable_replica_answers_503() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&saturable(&replica, "")).await.unwrap();
    saturate(&gw, &replica).await;
    replica.kill();
    debug_shows(&gw, "reachable", json!(false)).await;
    let resp = send(&gw, "s", None, None).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(dropped_reason(&resp), Some("no-replicas"));
}

#[tokio::test]
async fn a_client_that_leaves_the_queue_never_reaches_a_replica() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&saturable(&replica, "")).await.unwrap();
    saturate(&gw, &replica).await;
    let leaver = send(&gw, "gone", None, None);
    queued(&gw, [0, 1, 0]).await;
    leaver.abort();
    // The gateway notices the closed connection and takes it out of line.
    queued(&gw, [0, 0, 0]).await;
    release(&replica);
    let stayer = send(&gw, "stays", None, None).await.unwrap();
    assert_eq!(stayer.status(), 200);
    assert_eq!(arrival_order(&replica), ["stays"]);
}

/// 2,000 concurrent requests of all bands against one small simulated
/// replica whose metrics are real: every request gets exactly one answer,
/// a success or a documented refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_gets_exactly_one_answer_per_request() {
    let replica = sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            max_num_seqs: Some(4),
            time_scale: 50.0,
            ..sim::ReplicaSpec::new("a10g", "llama-3.1-8b")
        },
    )
    .await
    .unwrap();
    let cfg = config(
        "  flowControl: {headerMayRaise: true, standard: {maxWait: 3s}, critical: {maxWait: 6s}}\n",
        &format!(
            "    - {{name: p, models: [m], endpoints: [\"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n",
            replica.local_addr()
        ),
    );
    let gw = Arc::new(Gateway::start(&cfg).await.unwrap());
    const N: usize = 2000;
    let http = client();
    let mut requests = Vec::with_capacity(N);
    for i in 0..N {
        let band = ["critical", "standard", "sheddable"][i % 3];
        let req = http
            .post(format!("http://{}{CHAT}", gw.addr()))
            .header("x-infergate-priority", band)
            .header("x-infergate-fairness-id", format!("tenant-{}", i % 7))
            .body(
                json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": format!("question {i}")}]})
                    .to_string(),
            );
        requests.push(tokio::spawn(async move {
            let resp = req.send().await.expect("every request gets an HTTP answer");
            let status = resp.status().as_u16();
            let reason = dropped_reason(&resp).map(str::to_owned);
            let body: Value = resp.json().await.expect("every answer is JSON");
            (band, status, reason, body)
        }));
    }
    let mut outcomes: HashMap<(&str, u16, Option<String>), usize> = HashMap::new();
    for r in requests {
        let (band, status, reason, body) = r.await.unwrap();
        match status {
            200 => assert_eq!(body["object"], "chat.completion"),
            429 | 503 => {
                let reason = reason
                    .as_deref()
                    .unwrap_or_else(|| panic!("refusals say why: {status} {body}"));
                assert!(
                    ["saturated", "queue-full", "wait-expired", "no-replicas"].contains(&reason),
                    "{reason}"
                );
                assert!(body["error"]["message"].is_string());
            }
            other => panic!("unexpected status {other}: {body}"),
        }
        *outcomes.entry((band, status, reason)).or_default() += 1;
    }
    eprintln!("storm outcomes: {outcomes:?}");
    let total: usize = outcomes.values().sum();
    assert_eq!(total, N, "{outcomes:?}");
    let ok = |band| outcomes.get(&(band, 200, None)).copied().unwrap_or(0);
    assert!(ok("critical") > 0 && ok("standard") > 0, "{outcomes:?}");
    // Critical requests wait longest and go first: none is refused while
    // lower bands are, and more of them succeed than sheddable ones.
    assert!(ok("critical") >= ok("sheddable"), "{outcomes:?}");
    assert_eq!(gw.queued("p"), Some([0, 0, 0]));
}

/// One replica whose model `m` is critical, scraped every 20 ms, with the
/// pool's `enginePriority` as given.
fn engine_priority_pool(replica: &str, engine_priority: bool) -> config::InferenceGatewayConfig {
    config(
        "  admin: {address: \"127.0.0.1:0\"}\n  objectives: {m: critical}\n",
        &format!(
            "    - {{name: p, models: [m], endpoints: [\"{replica}\"], enginePriority: {engine_priority}, scheduling: {{metrics: {{interval: 20ms, staleAfter: 2s}}}}}}\n"
        ),
    )
}

async fn send_body(gw: &Gateway, band: Option<&str>, body: &'static str) -> reqwest::Response {
    let mut req = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(body);
    if let Some(band) = band {
        req = req.header("x-infergate-priority", band);
    }
    req.send().await.unwrap()
}

const WITH_PRIORITY: &str =
    r#"{"model":"m","priority":-100,"messages":[{"role":"user","content":"hi"}]}"#;
const WITHOUT_PRIORITY: &str = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;

#[tokio::test]
async fn engine_priority_sends_the_band_in_place_of_the_clients() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    release(&replica);
    let gw = Gateway::start(&engine_priority_pool(&replica.addr.to_string(), true))
        .await
        .unwrap();
    debug_shows(&gw, "waiting", json!(0)).await;
    // The header may lower the model's band (critical) to any other.
    let sent = [
        (None, WITH_PRIORITY),
        (Some("standard"), WITH_PRIORITY),
        (Some("sheddable"), WITH_PRIORITY),
        (Some("standard"), WITHOUT_PRIORITY),
        (None, WITHOUT_PRIORITY),
    ];
    for (band, body) in sent {
        assert_eq!(send_body(&gw, band, body).await.status(), 200, "{band:?}");
    }
    let seen: Vec<Value> = replica
        .received()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect();
    let priorities: Vec<&Value> = seen.iter().map(|b| &b["priority"]).collect();
    assert_eq!(
        priorities,
        [&json!(0), &json!(1), &json!(2), &json!(1), &json!(0)]
    );
    for (body, (_, sent)) in seen.iter().zip(sent) {
        let mut want: Value = serde_json::from_str(sent).unwrap();
        want["priority"] = body["priority"].clone();
        assert_eq!(body, &want, "nothing else changes");
    }
}

#[tokio::test]
async fn without_engine_priority_the_body_is_forwarded_untouched() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    release(&replica);
    let gw = Gateway::start(&engine_priority_pool(&replica.addr.to_string(), false))
        .await
        .unwrap();
    debug_shows(&gw, "waiting", json!(0)).await;
    for body in [WITH_PRIORITY, WITHOUT_PRIORITY] {
        assert_eq!(send_body(&gw, Some("sheddable"), body).await.status(), 200);
    }
    let bodies: Vec<bytes::Bytes> = replica.received().into_iter().map(|r| r.body).collect();
    assert_eq!(bodies, [WITH_PRIORITY, WITHOUT_PRIORITY]);
}

/// The simulated vLLM reads the band the gateway sends: started with
/// priority scheduling it serves every band; started first-come,
/// first-served it refuses any priority but 0, as vLLM does, which is why
/// `enginePriority` is an opt-in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_replica_takes_the_band_only_when_it_schedules_by_priority() {
    for policy in [sim::SchedulingPolicy::Priority, sim::SchedulingPolicy::Fcfs] {
        let replica = sim::start_replica(
            "127.0.0.1:0".parse().unwrap(),
            sim::ReplicaSpec {
                served_model_name: Some("m".into()),
                time_scale: 50.0,
                scheduling_policy: policy,
                ..sim::ReplicaSpec::new("a10g", "llama-3.1-8b")
            },
        )
        .await
        .unwrap();
        let cfg = engine_priority_pool(&replica.local_addr().to_string(), true);
        let gw = Gateway::start(&cfg).await.unwrap();
        debug_shows(&gw, "waiting", json!(0)).await;
        let critical = send_body(&gw, None, WITH_PRIORITY).await;
        assert_eq!(
            critical.status(),
            200,
            "{policy}: priority 0 is vLLM's default"
        );
        let standard = send_body(&gw, Some("standard"), WITH_PRIORITY).await;
        let status = standard.status();
        let body: Value = standard.json().await.unwrap();
        match policy {
            sim::SchedulingPolicy::Priority => {
                assert_eq!(status, 200, "{body}");
                assert_eq!(body["object"], "chat.completion");
            }
            sim::SchedulingPolicy::Fcfs => {
                assert_eq!(status, 400, "{body}");
                let message = body["error"]["message"].as_str().unwrap();
                assert!(
                    message.contains("Got priority 1 but Priority scheduling is not enabled"),
                    "{message}"
                );
            }
        }
    }
}
