//! Metric-aware picking end to end: the real gateway scrapes fake vLLM
//! replicas whose `/metrics` each test sets, and every assertion is about
//! where requests actually went. Signals are awaited on the admin
//! listener's `/debug/pools`, never slept for.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::support::{
    Behaviour, CHAT, FakeReplica, MetricsFault, client, config, debug_pools, emit, poll_until,
    until_debug_pools, vllm_metrics, within,
};
use gateway::Gateway;
use serde_json::{Value, json};

/// Scrape interval and staleness threshold of every pool here: short, so
/// staleness tests take well under a second.
const INTERVAL: Duration = Duration::from_millis(20);
const STALE_AFTER: Duration = Duration::from_millis(300);
/// Longest wait for anything the gateway should do.
const DEADLINE: Duration = Duration::from_secs(10);
/// Scheduling noise allowed on top of a promised delay (two busy cores).
/// Still well below the 1 s default staleness, so a pool that ignored its
/// configured `staleAfter` would fail.
const SLACK: Duration = Duration::from_millis(300);

// ---------------------------------------------------------------------------
// Setup

async fn replicas<const N: usize>() -> [FakeReplica; N] {
    replicas_as(Behaviour::Echo).await
}

/// Replicas `a`, `b`, … behaving alike.
async fn replicas_as<const N: usize>(behaviour: Behaviour) -> [FakeReplica; N] {
    let mut out = Vec::with_capacity(N);
    for i in 0..N {
        let name = ((b'a' + i as u8) as char).to_string();
        out.push(FakeReplica::start(&name, behaviour.clone()).await);
    }
    out.try_into().unwrap_or_else(|_| unreachable!())
}

/// The gateway-wide part of every config here: an admin listener for
/// `/debug/pools` and the decision headers.
const SPEC: &str = "  admin: {address: \"127.0.0.1:0\"}\n  debug: {decisionHeaders: true}\n";

/// A gateway in front of one vLLM pool `p` (model `m`, default `scored`
/// policy) over `replicas`. `scheduling` adds fields to the pool's
/// `scheduling` section.
async fn gateway(replicas: &[FakeReplica], adapters: &str, scheduling: &str) -> Gateway {
    gateway_with(replicas, adapters, scheduling, SPEC).await
}

/// As [`gateway`], with `spec` as the gateway-wide fields (which must
/// include an admin listener).
async fn gateway_with(
    replicas: &[FakeReplica],
    adapters: &str,
    scheduling: &str,
    spec: &str,
) -> Gateway {
    let endpoints: Vec<String> = replicas.iter().map(|r| format!("\"{}\"", r.addr)).collect();
    // A long scrape timeout: a hanging `/metrics` makes a replica stale
    // (the rule under test), not unhealthy by timeout.
    let pool = format!(
        "    - {{name: p, models: [m], adapters: [{adapters}], endpoints: [{}], scheduling: {{metrics: {{interval: {}ms, staleAfter: {}ms, timeout: 5s}}{scheduling}}}}}\n",
        endpoints.join(", "),
        INTERVAL.as_millis(),
        STALE_AFTER.as_millis(),
    );
    let gw = Gateway::start(&config(spec, &pool)).await.unwrap();
    let document = debug_pools(&gw).await;
    let pools = &document["pools"];
    assert_eq!(pools[0]["engine"], "vllm", "{pools}");
    assert!(
        pools[0]["policy"]
            .as_str()
            .is_some_and(|p| p.eq_ignore_ascii_case("scored")),
        "{pools}"
    );
    gw
}

// ---------------------------------------------------------------------------
// Observing the gateway

/// The replica's entry in `/debug/pools`.
fn entry<'a>(pools: &'a Value, r: &FakeReplica) -> &'a Value {
    let addr = r.addr.to_string();
    pools["pools"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["address"] == addr.as_str())
        .unwrap_or_else(|| panic!("{} not in {pools}", r.name))
}

/// Poll `/debug/pools` until `ready` holds for `r`'s entry.
async fn await_replica(gw: &Gateway, r: &FakeReplica, what: &str, ready: impl Fn(&Value) -> bool) {
    let what = format!("replica {} {what}", r.name);
    until_debug_pools(gw, DEADLINE, &what, |pools| ready(entry(pools, r))).await;
}

async fn await_health(gw: &Gateway, r: &FakeReplica, health: &str) {
    await_replica(gw, r, health, |e| e["health"] == health).await;
}

/// Serve these signals from `r` and wait until the gateway has scraped
/// them.
async fn signal(gw: &Gateway, r: &FakeReplica, waiting: u64, kv: f64, resident: &[&str]) {
    r.set_metrics(&vllm_metrics(waiting, 4, kv, resident));
    let what = format!("healthy with waiting={waiting} kv={kv} adapters={resident:?}");
    await_replica(gw, r, &what, |e| {
        e["health"] == "healthy"
            && e["waiting"] == waiting
            && e["kvUsage"]
                .as_f64()
                .is_some_and(|seen| (seen - kv).abs() < 1e-9)
            && e["residentAdapters"] == json!(resident)
    })
    .await;
}

async fn idle(gw: &Gateway, r: &FakeReplica) {
    signal(gw, r, 0, 0.0, &[]).await;
}

// ---------------------------------------------------------------------------
// Requests

/// What the client saw of one request.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Value,
}

impl Answer {
    fn endpoint(&self) -> String {
        self.headers
            .get("x-infergate-endpoint")
            .unwrap_or_else(|| panic!("no x-infergate-endpoint on {self:?}"))
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// The replica that answered, by name (and checked against the header).
    fn replica(&self) -> String {
        assert_eq!(self.status, 200, "{self:?}");
        let name = self.body["replica"].as_str().unwrap().to_owned();
        assert!(!self.endpoint().is_empty());
        name
    }

    fn scores(&self) -> Vec<Scored> {
        let header = self
            .headers
            .get("x-infergate-scores")
            .unwrap_or_else(|| panic!("no x-infergate-scores on {self:?}"));
        parse_scores(header.to_str().unwrap())
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

async fn ask(gw: &Gateway, model: &str, messages: Value) -> Answer {
    let resp = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(json!({"model": model, "messages": messages}).to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.json().await.unwrap();
    Answer {
        status,
        headers,
        body,
    }
}

/// A short chat turn (under one prefix block: no prefix affinity).
async fn chat(gw: &Gateway, model: &str, i: usize) -> Answer {
    ask(
        gw,
        model,
        json!([{"role": "user", "content": format!("hi {i}")}]),
    )
    .await
}

/// A turn behind a long shared system prompt.
async fn chat_behind(gw: &Gateway, system: &str, i: usize) -> Answer {
    let messages = json!([
        {"role": "system", "content": system},
        {"role": "user", "content": format!("Question number {i}: what is next?")},
    ]);
    ask(gw, "m", messages).await
}

/// `n` short sequential requests; the replica names that answered them.
async fn picks(gw: &Gateway, model: &str, n: usize) -> Vec<String> {
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        names.push(chat(gw, model, i).await.replica());
    }
    names
}

fn tally(names: &[String]) -> HashMap<&str, usize> {
    let mut counts = HashMap::new();
    for name in names {
        *counts.entry(name.as_str()).or_insert(0) += 1;
    }
    counts
}

/// A system prompt of about 2 KB (some thirty prefix blocks).
fn system_prompt(topic: &str) -> String {
    (0..40)
        .map(|i| format!("Rule {i} about {topic}: answer briefly. "))
        .collect()
}

// ---------------------------------------------------------------------------
// The `x-infergate-scores` header

/// One candidate in `x-infergate-scores`:
/// `addr=total(q=..,kv=..,if=..,px=..,lora=..,sp=..,ss=..)`.
#[derive(Debug, Clone)]
struct Scored {
    addr: String,
    total: f64,
    parts: Vec<(String, f64)>,
}

impl Scored {
    fn part(&self, label: &str) -> f64 {
        self.parts
            .iter()
            .find(|(l, _)| l == label)
            .unwrap_or_else(|| panic!("no {label} in {self:?}"))
            .1
    }
}

/// The listed candidates; a trailing `+N` (candidates left out) is skipped.
fn parse_scores(header: &str) -> Vec<Scored> {
    header
        .split(';')
        .filter(|item| !item.starts_with('+'))
        .map(|item| {
            let (addr, rest) = item
                .split_once('=')
                .unwrap_or_else(|| panic!("candidate without `=`: {item:?} in {header}"));
            let (total, parts) = rest
                .strip_suffix(')')
                .and_then(|r| r.split_once('('))
                .unwrap_or_else(|| panic!("candidate without parts: {item:?} in {header}"));
            let parts = parts
                .split(',')
                .map(|p| {
                    let (label, value) = p
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad part {p:?} in {header}"));
                    (label.to_owned(), value.parse().unwrap())
                })
                .collect();
            Scored {
                addr: addr.to_owned(),
                total: total.parse().unwrap(),
                parts,
            }
        })
        .collect()
}

fn find<'a>(scores: &'a [Scored], r: &FakeReplica) -> Option<&'a Scored> {
    let addr = r.addr.to_string();
    scores.iter().find(|s| s.addr == addr)
}

// ---------------------------------------------------------------------------
// 1. Load

#[tokio::test]
async fn traffic_avoids_a_replica_with_a_long_queue_and_full_kv() {
    let fleet = replicas::<3>().await;
    let [a, b, c] = &fleet;
    let gw = gateway(&fleet, "", "").await;
    signal(&gw, a, 20, 0.95, &[]).await;
    idle(&gw, b).await;
    idle(&gw, c).await;

    // A burst: however b and c fill up with requests in flight, the
    // saturated replica gets none of it.
    let burst = (0..30).map(|i| chat(&gw, "m", i));
    let names: Vec<String> = futures_util::future::join_all(burst)
        .await
        .iter()
        .map(Answer::replica)
        .collect();
    let counts = tally(&names);
    assert_eq!(a.count(), 0, "{counts:?}");
    assert_eq!(b.count() + c.count(), 30, "{counts:?}");
    assert!(b.count() > 0 && c.count() > 0, "{counts:?}");

    // Busier than its peers but under both saturation thresholds (queue 5,
    // KV 1.0): still a candidate, and it loses on its score every time.
    signal(&gw, a, 3, 0.7, &[]).await;
    for i in 0..20 {
        let answer = chat(&gw, "m", i).await;
        assert_ne!(answer.replica(), "a");
        let scores = answer.scores();
        let busy = find(&scores, a).expect("a is a candidate");
        assert_close(busy.part("q"), 1.0 - 3.0 / 5.0);
        assert_close(busy.part("kv"), 0.3);
        assert!(busy.total < scores[0].total, "{scores:?}");
    }
    assert_eq!(a.count(), 0);
}

/// A streamed request counts as unanswered on its replica until the first
/// event reaches the client, and as in flight until the stream ends; the
/// queue scorer ranks by it between scrapes.
#[tokio::test]
async fn a_request_is_unanswered_until_its_first_event() {
    let fleet = [
        FakeReplica::start("a", Behaviour::Stream).await,
        FakeReplica::start("b", Behaviour::Stream).await,
    ];
    let gw = gateway(&fleet, "", "").await;
    for r in &fleet {
        idle(&gw, r).await;
    }
    let load = |unanswered: u64, inflight: u64| {
        move |e: &Value| e["inflightUnanswered"] == unanswered && e["inflightRequests"] == inflight
    };

    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let resp = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let name = resp.headers()["x-infergate-endpoint"]
        .to_str()
        .unwrap()
        .to_owned();
    let (busy, other) = if name == fleet[0].addr.to_string() {
        (&fleet[0], &fleet[1])
    } else {
        (&fleet[1], &fleet[0])
    };
    let events = busy.next_stream().await;
    await_replica(&gw, busy, "one unanswered", load(1, 1)).await;
    // Scraped queues are both 0: only the unanswered request tells them apart.
    let pools = debug_pools(&gw).await;
    let queue = |r| {
        entry(&pools, r)["scores"]["parts"]["queue"]
            .as_f64()
            .unwrap()
    };
    assert_close(queue(busy), 0.8);
    assert_close(queue(other), 1.0);

    use futures_util::StreamExt;
    let mut stream = resp.bytes_stream();
    emit(&events, "data: {}\n\n").await;
    within(DEADLINE, "the first event", stream.next())
        .await
        .unwrap()
        .unwrap();
    await_replica(&gw, busy, "answered, still streaming", load(0, 1)).await;

    drop(events);
    assert!(
        within(DEADLINE, "the end of the stream", stream.next())
            .await
            .is_none()
    );
    await_replica(&gw, busy, "released", load(0, 0)).await;
}

// ---------------------------------------------------------------------------
// 2 and 9. LoRA residency

#[tokio::test]
async fn adapter_requests_go_to_the_replica_holding_the_adapter() {
    let fleet = replicas::<3>().await;
    let [a, b, c] = &fleet;
    let gw = gateway(&fleet, "sql-lora, chat-lora", "").await;
    signal(&gw, a, 0, 0.2, &["sql-lora"]).await;
    signal(&gw, b, 0, 0.2, &["chat-lora"]).await;
    signal(&gw, c, 0, 0.2, &[]).await;

    for i in 0..10 {
        let sql = chat(&gw, "sql-lora", i).await;
        assert_eq!(sql.replica(), "a");
        // Resident scores 1; the others have a free adapter slot.
        let scores = sql.scores();
        assert_close(find(&scores, a).unwrap().part("lora"), 1.0);
        for other in [b, c] {
            assert_close(find(&scores, other).unwrap().part("lora"), 0.8);
        }
        assert_eq!(chat(&gw, "chat-lora", i).await.replica(), "b");
    }
    assert_eq!(c.count(), 0);
    // The adapter reaches the replica in the body, untouched.
    let last: Value = serde_json::from_slice(&a.received().last().unwrap().body).unwrap();
    assert_eq!(last["model"], "sql-lora");
}

#[tokio::test]
async fn adapter_resident_nowhere_goes_to_the_replica_with_most_free_capacity() {
    let fleet = replicas::<3>().await;
    let [a, b, c] = &fleet;
    let gw = gateway(&fleet, "sql-lora, chat-lora", "").await;
    // Every replica has a free slot for sql-lora; b is the least loaded.
    signal(&gw, a, 2, 0.5, &[]).await;
    signal(&gw, b, 0, 0.1, &[]).await;
    signal(&gw, c, 1, 0.3, &["chat-lora"]).await;

    for i in 0..10 {
        let answer = chat(&gw, "sql-lora", i).await;
        assert_eq!(answer.replica(), "b");
        let scores = answer.scores();
        assert_eq!(scores.len(), 3, "{scores:?}");
        for s in &scores {
            assert_close(s.part("lora"), 0.8);
        }
    }
    assert_eq!(a.count() + c.count(), 0);
}

// ---------------------------------------------------------------------------
// 3. Prefix affinity, balanced by load

/// Send turns behind `system` and check they all go to one replica, which
/// is returned. After the first turn, that replica matches nearly the
/// whole prompt and the others nothing.
async fn sticks<'a>(
    gw: &Gateway,
    fleet: &'a [FakeReplica],
    system: &str,
    turns: std::ops::Range<usize>,
) -> &'a FakeReplica {
    let mut holder: Option<&FakeReplica> = None;
    for i in turns {
        let answer = chat_behind(gw, system, i).await;
        let name = answer.replica();
        let Some(h) = holder else {
            holder = fleet.iter().find(|r| r.name == name);
            continue;
        };
        assert_eq!(name, h.name, "turn {i} left the replica holding the prompt");
        for s in answer.scores() {
            if s.addr == h.addr.to_string() {
                assert!(s.part("px") > 0.9, "{s:?}");
            } else {
                assert_close(s.part("px"), 0.0);
            }
        }
    }
    holder.expect("at least one turn")
}

#[tokio::test]
async fn shared_prompt_sticks_to_one_replica_until_it_is_overloaded() {
    let fleet = replicas::<3>().await;
    let gw = gateway(&fleet, "", "").await;
    for r in &fleet {
        idle(&gw, r).await;
    }

    // Busy, though under the saturation thresholds: affinity weighs as
    // much as load, so the turns stay where the prompt is cached (moving
    // one costs a whole prefill), though the holder scores worse on load.
    let billing = system_prompt("billing");
    let holder = sticks(&gw, &fleet, &billing, 0..10).await;
    signal(&gw, holder, 4, 0.75, &[]).await;
    for i in 10..20 {
        let answer = chat_behind(&gw, &billing, i).await;
        assert_eq!(answer.replica(), holder.name, "turn {i}");
        let scores = answer.scores();
        let busy = find(&scores, holder).expect("a busy replica is a candidate");
        assert!(busy.part("px") > 0.9, "{busy:?}");
        for other in scores.iter().filter(|s| s.addr != busy.addr) {
            assert!(busy.part("q") < other.part("q"), "{scores:?}");
            assert!(busy.part("kv") < other.part("kv"), "{scores:?}");
            assert!(busy.total > other.total, "{scores:?}");
        }
    }

    // Overloaded (long queue, full KV): not even a candidate.
    for r in &fleet {
        idle(&gw, r).await;
    }
    let shipping = system_prompt("shipping");
    let holder = sticks(&gw, &fleet, &shipping, 0..10).await;
    let held = holder.count();
    signal(&gw, holder, 20, 0.95, &[]).await;
    for i in 10..20 {
        let answer = chat_behind(&gw, &shipping, i).await;
        assert_ne!(answer.replica(), holder.name, "turn {i}");
        assert!(find(&answer.scores(), holder).is_none());
    }
    assert_eq!(holder.count(), held);
}

// ---------------------------------------------------------------------------
// 4 and 5. Failing metrics

/// `a` is the best replica while its metrics are trusted; when its
/// `/metrics` fails with `fault` it loses its traffic within the staleness
/// threshold and one scrape interval (the gateway shows it as `health`),
/// and it wins it back when `/metrics` recovers.
async fn metrics_outage(fault: MetricsFault, health: &str) {
    let fleet = replicas::<3>().await;
    let [a, b, c] = &fleet;
    let gw = gateway(&fleet, "", "").await;
    idle(&gw, a).await;
    signal(&gw, b, 2, 0.1, &[]).await;
    signal(&gw, c, 2, 0.1, &[]).await;
    let names = picks(&gw, "m", 10).await;
    assert!(names.iter().all(|n| n == "a"), "{names:?}");

    a.set_metrics_fault(fault);
    let failed = Instant::now();
    let mut i = 0;
    within(DEADLINE, "traffic leaving a", async {
        while chat(&gw, "m", i).await.replica() == "a" {
            i += 1;
        }
    })
    .await;
    let left = failed.elapsed();
    assert!(
        left <= STALE_AFTER + INTERVAL + SLACK,
        "a kept traffic for {left:?} after its metrics failed"
    );
    if fault == MetricsFault::Hang {
        // A scrape that is merely slow does not drop a replica at once: it
        // keeps its traffic until its last good signals are stale.
        assert!(
            left >= STALE_AFTER / 2,
            "a lost its traffic {left:?} after its metrics started hanging"
        );
    }
    await_health(&gw, a, health).await;
    // Its serving port is fine: it is set aside, not unreachable.
    assert_eq!(entry(&debug_pools(&gw).await, a)["reachable"], true);
    let before = a.count();
    let names = picks(&gw, "m", 20).await;
    assert_eq!(a.count(), before, "{names:?}");

    a.set_metrics_fault(MetricsFault::None);
    await_health(&gw, a, "healthy").await;
    let names = picks(&gw, "m", 10).await;
    assert!(names.iter().all(|n| n == "a"), "{names:?}");
}

#[tokio::test]
async fn hanging_metrics_make_a_replica_stale_until_they_answer_again() {
    metrics_outage(MetricsFault::Hang, "stale").await;
}

#[tokio::test]
async fn failing_metrics_make_a_replica_unhealthy_until_they_recover() {
    metrics_outage(MetricsFault::Unavailable, "unhealthy").await;
}

#[tokio::test]
async fn garbage_metrics_mark_a_replica_unhealthy_not_idle() {
    let fleet = replicas::<3>().await;
    let [a, b, c] = &fleet;
    let gw = gateway(&fleet, "", "").await;
    // Were garbage read as "idle", a would win every pick.
    idle(&gw, a).await;
    signal(&gw, b, 2, 0.1, &[]).await;
    signal(&gw, c, 2, 0.1, &[]).await;

    let html = "<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>\n<body><h1>502 Bad Gateway</h1></body></html>\n";
    let json = "{\"detail\": \"Not Found\"}\n";
    for garbage in [html, json] {
        a.set_metrics(garbage);
        await_replica(&gw, a, "unhealthy after garbage", |e| {
            e["health"] == "unhealthy"
                && e["reachable"] == true
                && e["lastError"].as_str().is_some_and(|m| !m.is_empty())
        })
        .await;
        let before = a.count();
        let names = picks(&gw, "m", 20).await;
        assert_eq!(a.count(), before, "{garbage:?}: {names:?}");

        idle(&gw, a).await;
        let names = picks(&gw, "m", 5).await;
        assert!(names.iter().all(|n| n == "a"), "{names:?}");
    }
}

// ---------------------------------------------------------------------------
// 6. Saturation

fn assert_openai_error(answer: &Answer) {
    for field in ["message", "type", "param", "code"] {
        assert!(
            answer.body["error"].get(field).is_some(),
            "no error.{field} in {answer:?}"
        );
    }
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`p`"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn saturated_pool_answers_429_with_retry_after_until_it_drains() {
    let fleet = replicas::<3>().await;
    let [a, b, c] = &fleet;
    // Requests refused at once rather than queued by flow control.
    let spec = format!("{SPEC}  flowControl: {{standard: {{maxWait: 0s}}}}\n");
    let gw = gateway_with(&fleet, "", "", &spec).await;
    // Saturated by its queue, by its KV cache, and exactly at the queue
    // threshold.
    signal(&gw, a, 20, 0.1, &[]).await;
    signal(&gw, b, 0, 1.0, &[]).await;
    signal(&gw, c, 5, 0.1, &[]).await;

    for i in 0..3 {
        let answer = chat(&gw, "m", i).await;
        assert_eq!(answer.status, 429, "{answer:?}");
        let secs: u64 = answer
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .expect("Retry-After in whole seconds");
        let ms: u64 = answer
            .header("retry-after-ms")
            .expect("retry-after-ms")
            .parse()
            .expect("retry-after-ms in milliseconds");
        assert!((1..=60).contains(&secs), "Retry-After: {secs}");
        assert!(ms >= 1);
        assert_eq!(
            secs,
            ms.div_ceil(1000),
            "Retry-After rounds retry-after-ms up"
        );
        assert_openai_error(&answer);
        assert_eq!(answer.body["error"]["type"], "rate_limit_error");
        assert_eq!(answer.body["error"]["code"], "pool_saturated");
    }
    assert_eq!(a.count() + b.count() + c.count(), 0);

    // b drains: the pool serves again, on b only.
    signal(&gw, b, 0, 0.3, &[]).await;
    let names = picks(&gw, "m", 10).await;
    assert!(names.iter().all(|n| n == "b"), "{names:?}");
    assert_eq!(a.count() + c.count(), 0);
}

// ---------------------------------------------------------------------------
// 7. Every replica stale

/// Every replica serves, but every `/metrics` hangs: all stale, all
/// reachable.
async fn stale_pool(behaviour: Behaviour, fallback: &str) -> ([FakeReplica; 3], Gateway) {
    let fleet = replicas_as::<3>(behaviour).await;
    let gw = gateway(&fleet, "", &format!(", fallback: {fallback}")).await;
    for r in &fleet {
        idle(&gw, r).await;
    }
    for r in &fleet {
        r.set_metrics_fault(MetricsFault::Hang);
    }
    for r in &fleet {
        await_replica(&gw, r, "stale and reachable", |e| {
            e["health"] == "stale" && e["reachable"] == true
        })
        .await;
    }
    (fleet, gw)
}

fn received(fleet: &[FakeReplica]) -> usize {
    fleet.iter().map(FakeReplica::count).sum()
}

#[tokio::test]
async fn stale_pool_falls_back_to_least_request() {
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let (fleet, gw) = stale_pool(Behaviour::Held(gate.clone()), "least-request").await;
    let gw = std::sync::Arc::new(gw);

    // Three requests held by the replicas, sent one after another: least
    // request puts each on a replica with nothing in flight.
    let mut held = Vec::new();
    for i in 0..3 {
        let gw = std::sync::Arc::clone(&gw);
        held.push(tokio::spawn(async move { chat(&gw, "m", i).await }));
        let fleet = &fleet;
        poll_until(
            DEADLINE,
            "the request reaching a replica",
            move || async move {
                match received(fleet) {
                    n if n > i => Ok(()),
                    n => Err(format!("{n} received")),
                }
            },
        )
        .await;
    }
    for r in &fleet {
        assert_eq!(r.count(), 1, "replica {}", r.name);
    }
    gate.add_permits(3);
    for request in held {
        let answer = request.await.unwrap();
        assert_eq!(answer.status, 200, "{answer:?}");
        // Nothing fresh to score: picked without scores.
        assert!(answer.header("x-infergate-scores").is_none(), "{answer:?}");
    }

    // Metrics resume: scored picks again.
    for r in &fleet {
        r.set_metrics_fault(MetricsFault::None);
    }
    for r in &fleet {
        await_health(&gw, r, "healthy").await;
    }
    gate.add_permits(1);
    let answer = chat(&gw, "m", 3).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.scores().len(), 3);
}

#[tokio::test]
async fn stale_pool_refuses_when_configured_to() {
    let (fleet, gw) = stale_pool(Behaviour::Echo, "refuse").await;
    let answer = chat(&gw, "m", 0).await;
    assert_eq!(answer.status, 503, "{answer:?}");
    assert_openai_error(&answer);
    assert_eq!(answer.body["error"]["code"], "no_replicas");
    assert!(answer.header("retry-after").is_some(), "{answer:?}");
    assert_eq!(received(&fleet), 0);

    for r in &fleet {
        r.set_metrics_fault(MetricsFault::None);
    }
    for r in &fleet {
        await_health(&gw, r, "healthy").await;
    }
    let answer = chat(&gw, "m", 1).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(received(&fleet), 1);
}

// ---------------------------------------------------------------------------
// 8. Explaining decisions

#[tokio::test]
async fn scores_header_lists_every_candidate_with_its_parts() {
    let fleet = replicas::<3>().await;
    let [a, b, c] = &fleet;
    let gw = gateway(&fleet, "", "").await;
    signal(&gw, a, 1, 0.5, &[]).await;
    idle(&gw, b).await;
    signal(&gw, c, 20, 0.1, &[]).await;

    let answer = chat(&gw, "m", 0).await;
    assert_eq!(answer.replica(), "b");
    let scores = answer.scores();
    // Saturated c is no candidate; the winner comes first.
    assert_eq!(scores.len(), 2, "{scores:?}");
    assert!(find(&scores, c).is_none());
    assert_eq!(scores[0].addr, answer.endpoint());
    assert_eq!(scores[0].addr, b.addr.to_string());
    assert!(scores[0].total >= scores[1].total, "{scores:?}");

    let w = picker::Weights::CHAT;
    let weights = [
        ("q", w.queue),
        ("kv", w.kv_cache),
        ("if", w.inflight),
        ("px", w.prefix),
        ("lora", w.lora),
        ("sp", w.speed),
    ];
    for s in &scores {
        let labels: Vec<&str> = s.parts.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["q", "kv", "if", "px", "lora", "sp", "ss"], "{s:?}");
        assert!(
            s.parts.iter().all(|(_, v)| (0.0..=1.0).contains(v)),
            "{s:?}"
        );
        // The total is the weighted mean of the parts (all rounded to 0.01);
        // without a session the session scorer takes no part in it.
        let mean = weights.iter().map(|(l, w)| w * s.part(l)).sum::<f64>()
            / weights.iter().map(|(_, w)| w).sum::<f64>();
        assert!((s.total - mean).abs() <= 0.011, "{s:?}: mean {mean}");
    }
    let busy = find(&scores, a).unwrap();
    let expected = [
        ("q", 0.8),
        ("kv", 0.5),
        ("if", 1.0),
        ("px", 1.0),
        ("lora", 1.0),
    ];
    for (label, value) in expected {
        assert_close(busy.part(label), value);
        assert_close(scores[0].part(label), 1.0);
    }

    // Without `debug.decisionHeaders` nothing about the decision leaks.
    let quiet = gateway_with(&fleet, "", "", "  admin: {address: \"127.0.0.1:0\"}\n").await;
    await_health(&quiet, b, "healthy").await;
    let answer = chat(&quiet, "m", 1).await;
    assert_eq!(answer.status, 200);
    let leaked: BTreeSet<&str> = answer
        .headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with("x-infergate-"))
        .collect();
    assert!(leaked.is_empty(), "{leaked:?}");
}

fn assert_close(got: f64, want: f64) {
    // Header values carry two decimals.
    assert!((got - want).abs() <= 0.005 + 1e-9, "got {got}, want {want}");
}
