//! Flow control end to end: a pool driven into saturation through the
//! metrics its replicas report, and requests of every band against it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::support::exposition::scrape;
use crate::support::{
    Behaviour, CHAT, FakeReplica, client, config, idle_vllm_metrics, poll_until, until_debug_pools,
    vllm_metrics, within,
};
use gateway::Gateway;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};

const DEADLINE: Duration = Duration::from_secs(20);

/// One replica, scored, scraped every 20 ms. `queueDepth: 1` makes the
/// dispatcher hand out one request per freed slot, so dispatch order is
/// observable at the replica. The last scrape stays in force however long
/// the next one hangs ([`release_for_one_scrape`]): with the default scrape
/// timeout (500 ms) or a short `staleAfter`, a slow run would see the
/// replica turn unhealthy or stale, and the picker's fallback would then
/// send every waiting request at once, whatever the saturation.
fn saturable(replica: &FakeReplica, flow: &str) -> config::InferenceGatewayConfig {
    config(
        &format!("  admin: {{address: \"127.0.0.1:0\"}}\n{flow}"),
        &format!(
            "    - {{name: p, models: [m], endpoints: [\"{}\"], scheduling: {{saturation: {{queueDepth: 1}}, metrics: {{interval: 20ms, staleAfter: 10m, timeout: 10m}}}}}}\n",
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
    replica.set_metrics_once(&idle_vllm_metrics());
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
    // With room, the next one goes straight through. Its client may read
    // the answer before the gateway lets go of the request's place at the
    // replica; until then the replica has no room.
    debug_shows(&gw, "inflightRequests", json!(0)).await;
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

/// A full line refuses at once, and a wait that expires ends in a 429.
/// Each on its own gateway: with one short wait for both, the third
/// request had to arrive before the first two expired, which a slow
/// machine need not manage.
#[tokio::test]
async fn wait_expires_with_429_and_queue_full_is_refused() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    // The waits outlast the test: both places stay taken until released.
    let flow = "  flowControl: {standard: {maxWait: 10m, maxQueued: 2}}\n";
    let gw = Gateway::start(&saturable(&replica, flow)).await.unwrap();
    saturate(&gw, &replica).await;
    let first = send(&gw, "s0", None, None);
    let second = send(&gw, "s1", None, None);
    queued(&gw, [0, 2, 0]).await;
    let full = send(&gw, "s2", None, None).await.unwrap();
    assert_eq!(full.status(), 429);
    assert_eq!(dropped_reason(&full), Some("queue-full"));
    // The refusal at once is not in the queue-wait histogram (and the two
    // waiting are not yet).
    let waits = |m: &crate::support::exposition::Exposition| {
        m.get(
            "infergate_queue_wait_seconds_count",
            &[("pool", "p"), ("priority", "standard")],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(waits(&scrape(&gw).await), 0.0);
    release(&replica);
    for waited in [first, second] {
        assert_eq!(waited.await.unwrap().status(), 200);
    }
    assert_eq!(waits(&scrape(&gw).await), 2.0);

    let replica = FakeReplica::start("b", Behaviour::Echo).await;
    let flow = "  flowControl: {standard: {maxWait: 300ms}}\n";
    let gw = Gateway::start(&saturable(&replica, flow)).await.unwrap();
    saturate(&gw, &replica).await;
    let first = send(&gw, "s0", None, None);
    let second = send(&gw, "s1", None, None);
    for waited in [first, second] {
        let resp = waited.await.unwrap();
        assert_eq!(resp.status(), 429);
        assert_eq!(dropped_reason(&resp), Some("wait-expired"));
        assert!(resp.headers().contains_key("retry-after"));
    }
    queued(&gw, [0, 0, 0]).await;
    assert_eq!(replica.count(), 0);
    // The expired waits are in the queue-wait histogram, each at least
    // its bound.
    let m = scrape(&gw).await;
    let value = |name: &str| m.value(name, &[("pool", "p"), ("priority", "standard")]);
    assert_eq!(value("infergate_queue_wait_seconds_count"), 2.0);
    assert!(value("infergate_queue_wait_seconds_sum") >= 0.6);
}

/// A pool in front of `addr`, scraped often, its `coldStart` settings
/// `cold` (a YAML flow mapping's fields).
fn cold_pool(addr: &str, cold: &str) -> config::InferenceGatewayConfig {
    config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: p, models: [m], endpoints: [\"{addr}\"], scheduling: {{metrics: {{interval: 20ms}}}}, coldStart: {{{cold}}}}}\n"
        ),
    )
}

/// An address nothing listens on (yet).
async fn free_addr() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// A cold pool (its one replica not started yet) holds 200 requests of
/// every band, wakes its webhook once, drops a client that leaves, and
/// answers every other request, once, when the replica is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_pool_holds_requests_wakes_once_and_answers_all_when_ready() {
    let addr = free_addr().await;
    let hook = FakeReplica::start("hook", Behaviour::Echo).await;
    let cold = format!(
        "timeout: 60s, wake: {{webhook: \"http://{}/wake\"}}",
        hook.addr
    );
    let gw = Gateway::start(&cold_pool(&addr.to_string(), &cold))
        .await
        .unwrap();
    debug_shows(&gw, "reachable", json!(false)).await;
    const REQUESTS: usize = 200;
    let bands = [Some("critical"), None, Some("sheddable")];
    let waiting: Vec<_> = (0..REQUESTS)
        .map(|i| send(&gw, &format!("cold-{i}"), bands[i % 3], None))
        .collect();
    let leaver = send(&gw, "gone", Some("sheddable"), None);
    let cold_waiting = |want: usize| {
        let gw = &gw;
        move || async move {
            let m = scrape(gw).await;
            let n = m.value("infergate_cold_waiting_requests", &[("pool", "p")]);
            if n == want as f64 {
                Ok(())
            } else {
                Err(format!("{n} waiting"))
            }
        }
    };
    poll_until(
        DEADLINE,
        "every request waiting for the cold pool",
        cold_waiting(REQUESTS + 1),
    )
    .await;
    leaver.abort();
    poll_until(DEADLINE, "the leaver out of line", cold_waiting(REQUESTS)).await;
    let m = scrape(&gw).await;
    assert_eq!(m.value("inference_pool_ready_pods", &[("name", "p")]), 0.0);
    assert_eq!(
        m.value(
            "inference_extension_flow_control_pool_saturation",
            &[("name", "p")]
        ),
        1.0
    );
    assert_eq!(
        m.value("infergate_cold_starts_total", &[("pool", "p")]),
        1.0
    );
    poll_until(DEADLINE, "the webhook called", || async {
        match hook.count() {
            1 => Ok(()),
            n => Err(format!("{n} calls")),
        }
    })
    .await;
    let replica = FakeReplica::start_at(addr, "a", Behaviour::Echo).await;
    for resp in waiting {
        let resp = resp.await.unwrap();
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(replica.count(), REQUESTS, "each answered once");
    assert!(!arrival_order(&replica).contains(&"gone".to_owned()));
    assert_eq!(hook.count(), 1, "woken once");
    let m = scrape(&gw).await;
    assert_eq!(
        m.value("infergate_cold_waiting_requests", &[("pool", "p")]),
        0.0
    );
    assert_eq!(m.value("inference_pool_ready_pods", &[("name", "p")]), 1.0);
    // The cold start took from the first request to the replica's start.
    let took = m.value("infergate_cold_start_last_seconds", &[("pool", "p")]);
    assert!(took > 0.0, "{took}");
    assert_eq!(
        m.value("infergate_cold_start_seconds_total", &[("pool", "p")]),
        took
    );
}

/// A pool that stays cold past its timeout: 503, with `Retry-After` and
/// the reason.
#[tokio::test]
async fn a_pool_cold_past_its_timeout_answers_503_cold_start_timeout() {
    let addr = free_addr().await;
    let gw = Gateway::start(&cold_pool(&addr.to_string(), "timeout: 300ms"))
        .await
        .unwrap();
    debug_shows(&gw, "reachable", json!(false)).await;
    let resp = send(&gw, "late", None, None).await.unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(dropped_reason(&resp), Some("cold-start-timeout"));
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "cold_start_timeout");
}

/// With `coldStart.timeout: 0s`, a pool with no reachable replica answers
/// 503 at once.
#[tokio::test]
async fn a_pool_with_no_reachable_replica_and_no_cold_wait_answers_503() {
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&cold_pool(&replica.addr.to_string(), "timeout: 0s"))
        .await
        .unwrap();
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

/// 2,000 concurrent requests of all bands against a saturated replica:
/// every request gets exactly one answer, a success or a documented
/// refusal, and every success is one request the replica received once.
/// Critical requests go first and none is refused while lower bands are;
/// within a band, fairness keys take turns.
///
/// Every count is exact. The replica reports no room until all 2,000 have
/// been admitted or refused, so who waits and who is refused is decided
/// by the flow-control rules alone: sheddable never waits, standard's line
/// holds 500, critical's all of its own; the waits outlast the test, so
/// none expires. Then the replica reports room for one scrape and holds
/// its answers behind a gate the test opens; with `queueDepth: 1` the
/// dispatcher sends one request at a time, each after the previous one was
/// answered, so the replica sees them in dispatch order. (Against a
/// simulated replica on its own clock, which requests got through, waited
/// out their time or found room depended on the machine's speed: only
/// inequalities between the bands' successes could be asserted, and even
/// those failed on a loaded machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_gets_exactly_one_answer_per_request() {
    const N: usize = 2000;
    const KEYS: usize = 7;
    const STANDARD_PLACES: usize = 500;
    const BANDS: [&str; 3] = ["critical", "standard", "sheddable"];
    let per_band = |band: usize| (0..N).filter(|i| i % 3 == band).count();
    let (critical, standard, sheddable) = (per_band(0), per_band(1), per_band(2));
    let band_of = |id: usize| BANDS[id % 3];

    let gate = Arc::new(Semaphore::new(0));
    let replica = FakeReplica::start("a", Behaviour::Held(Arc::clone(&gate))).await;
    let flow = format!(
        "  flowControl: {{headerMayRaise: true, critical: {{maxWait: 10m}}, standard: {{maxWait: 10m, maxQueued: {STANDARD_PLACES}}}}}\n"
    );
    let gw = Gateway::start(&saturable(&replica, &flow)).await.unwrap();
    saturate(&gw, &replica).await;

    let http = client();
    let (answered, mut answers) = mpsc::unbounded_channel();
    for id in 0..N {
        let req = http
            .post(format!("http://{}{CHAT}", gw.addr()))
            .header("x-request-id", id.to_string())
            .header("x-infergate-priority", band_of(id))
            .header("x-infergate-fairness-id", format!("tenant-{}", id % KEYS))
            .body(
                json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": format!("question {id}")}]})
                    .to_string(),
            );
        let answered = answered.clone();
        tokio::spawn(async move {
            let outcome = async {
                let resp = req
                    .send()
                    .await
                    .map_err(|e| format!("no HTTP answer: {e}"))?;
                let status = resp.status().as_u16();
                let reason = dropped_reason(&resp).map(str::to_owned);
                let body: Value = resp.json().await.map_err(|e| format!("not JSON: {e}"))?;
                Ok::<_, String>((status, reason, body))
            };
            let _ = answered.send((id, outcome.await));
        });
    }
    drop(answered);

    // Every request admitted or refused: the refusals first, while the
    // replica has no room; nothing else is answered meanwhile.
    queued(&gw, [critical, STANDARD_PLACES, 0]).await;
    let mut refused: HashMap<&str, usize> = HashMap::new();
    let mut ids = HashSet::new();
    for _ in 0..sheddable + standard - STANDARD_PLACES {
        let (id, status, reason, body) = next_answer(&mut answers, "the refusals").await;
        let band = band_of(id);
        let want = match band {
            "sheddable" => "saturated",
            "standard" => "queue-full",
            _ => panic!("critical request {id} refused: {status} {body}"),
        };
        assert_eq!(status, 429, "{band} request {id}: {body}");
        assert_eq!(reason.as_deref(), Some(want), "{band} request {id}: {body}");
        assert!(body["error"]["message"].is_string(), "{body}");
        assert!(ids.insert(id), "request {id} answered twice");
        *refused.entry(band).or_default() += 1;
    }
    assert_eq!(refused["sheddable"], sheddable, "{refused:?}");
    assert_eq!(
        refused["standard"],
        standard - STANDARD_PLACES,
        "{refused:?}"
    );
    assert!(
        answers.try_recv().is_err(),
        "a waiting request was answered"
    );
    assert_eq!(replica.count(), 0);

    // Room for one: the head of the line (a critical request) goes, and
    // the rest wait while the replica holds it.
    release_for_one_scrape(&replica);
    within(DEADLINE, "the first dispatch", replica.wait_for(1)).await;
    assert_eq!(gw.queued("p"), Some([critical - 1, STANDARD_PLACES, 0]));
    gate.add_permits(N);
    for _ in 0..critical + STANDARD_PLACES {
        let (id, status, _, body) =
            next_answer(&mut answers, "the waiting requests' answers").await;
        assert_eq!(status, 200, "{} request {id}: {body}", band_of(id));
        assert_eq!(body["object"], "chat.completion", "{body}");
        assert!(ids.insert(id), "request {id} answered twice");
    }
    assert_eq!(ids.len(), N);
    assert!(answers.recv().await.is_none(), "an answer too many");
    assert_eq!(gw.queued("p"), Some([0, 0, 0]));

    // Each success reached the replica once; critical requests all before
    // any standard one; within each band the keys took turns.
    let order: Vec<usize> = arrival_order(&replica)
        .iter()
        .map(|id| id.parse().unwrap())
        .collect();
    assert_eq!(order.len(), critical + STANDARD_PLACES);
    assert_eq!(order.iter().collect::<HashSet<_>>().len(), order.len());
    let (first, then) = order.split_at(critical);
    assert!(
        first.iter().all(|&id| band_of(id) == "critical"),
        "{order:?}"
    );
    assert!(
        then.iter().all(|&id| band_of(id) == "standard"),
        "{order:?}"
    );
    for (band, ids) in [("critical", first), ("standard", then)] {
        let keys: Vec<usize> = ids.iter().map(|id| id % KEYS).collect();
        assert_took_turns(band, &keys);
    }

    // The gateway's own counts agree.
    let m = scrape(&gw).await;
    let refusals = |reason: &str| {
        m.value(
            "infergate_refused_total",
            &[("pool", "p"), ("reason", reason)],
        )
    };
    assert_eq!(refusals("saturated"), sheddable as f64);
    assert_eq!(refusals("queue-full"), (standard - STANDARD_PLACES) as f64);
    let pool = [("pool", "p")];
    assert_eq!(
        m.value("infergate_queue_dispatched_total", &pool),
        (critical + STANDARD_PLACES) as f64
    );
    assert_eq!(m.value("infergate_queue_abandoned_total", &pool), 0.0);
}

/// A storm request's answer (status, dropped reason, JSON body), or why
/// there was none, by the request's id.
type Answered = (usize, Result<(u16, Option<String>, Value), String>);

/// The next storm request to be answered, waited for as `what`: its id,
/// status, dropped reason and body.
async fn next_answer(
    answers: &mut mpsc::UnboundedReceiver<Answered>,
    what: &str,
) -> (usize, u16, Option<String>, Value) {
    let (id, outcome) = within(DEADLINE, what, answers.recv())
        .await
        .expect("a request's task ended without an answer");
    let (status, reason, body) = outcome.unwrap_or_else(|e| panic!("request {id}: {e}"));
    (id, status, reason, body)
}

/// `keys`, the fairness keys of one band's requests in dispatch order (all
/// of them waiting before the first went), took turns: no key was served
/// an n+1th time while another with requests left had not had its nth.
fn assert_took_turns(band: &str, keys: &[usize]) {
    let mut left: HashMap<usize, usize> = HashMap::new();
    for &key in keys {
        *left.entry(key).or_default() += 1;
    }
    let mut served: HashMap<usize, usize> = left.keys().map(|&k| (k, 0)).collect();
    for (at, &key) in keys.iter().enumerate() {
        for (&other, &n) in &served {
            assert!(
                n >= served[&key] || left[&other] == 0,
                "{band}: key {key} served for the {}th time (dispatch {at}) before key {other} had its {}th turn: {keys:?}",
                served[&key] + 1,
                n + 1,
            );
        }
        *served.get_mut(&key).unwrap() += 1;
        *left.get_mut(&key).unwrap() -= 1;
    }
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

/// A streaming request held for a cold pool with `heartbeat` set: after a
/// heartbeat of waiting its head goes out (200, server-sent events) and a
/// comment line every heartbeat, then the answer's events once a replica
/// is ready; a non-streaming request just waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_held_for_a_cold_pool_hears_heartbeats_then_its_answer() {
    let addr = free_addr().await;
    let gw = Gateway::start(&cold_pool(
        &addr.to_string(),
        "timeout: 60s, heartbeat: 100ms",
    ))
    .await
    .unwrap();
    debug_shows(&gw, "reachable", json!(false)).await;
    let stream = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#)
        .send();
    let plain = send(&gw, "plain", None, None);
    let mut response = tokio::time::timeout(DEADLINE, stream)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    // Two heartbeats before any replica exists.
    let mut seen = String::new();
    while seen.matches(": waiting").count() < 2 {
        let chunk = tokio::time::timeout(DEADLINE, response.chunk())
            .await
            .unwrap()
            .unwrap()
            .expect("the held stream goes on");
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(!seen.contains("data:"), "{seen}");
    let _replica = sim::start_replica(
        addr,
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale: 20.0,
            ..sim::ReplicaSpec::default()
        },
    )
    .await
    .unwrap();
    while let Some(chunk) = tokio::time::timeout(DEADLINE, response.chunk())
        .await
        .unwrap()
        .unwrap()
    {
        seen.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(seen.ends_with("data: [DONE]\n\n"), "{seen}");
    assert_eq!(
        seen.matches("\"finish_reason\":\"length\"").count(),
        1,
        "{seen}"
    );
    let plain = plain.await.unwrap();
    assert_eq!(plain.status(), 200);
    assert_eq!(plain.headers()["content-type"], "application/json");
}

/// A held stream whose pool stays cold past its timeout ends with the
/// refusal as an error event: its status went out as 200.
#[tokio::test]
async fn a_held_stream_past_the_cold_timeout_ends_with_an_error_event() {
    let addr = free_addr().await;
    let gw = Gateway::start(&cold_pool(
        &addr.to_string(),
        "timeout: 500ms, heartbeat: 100ms",
    ))
    .await
    .unwrap();
    debug_shows(&gw, "reachable", json!(false)).await;
    let response = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    assert!(body.starts_with(": waiting"), "{body}");
    let event = body
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .expect("an error event");
    let error: Value = serde_json::from_str(event).unwrap();
    assert_eq!(error["error"]["code"], "cold_start_timeout", "{body}");
}
