//! The global tier end to end: member gateways on 127.0.0.1, each in
//! front of a simulated replica, and a global router in front of them.
//!
//! - a member killed under steady streaming load: no request fails, the
//!   router stops sending it requests within `unhealthyAfter`, and once
//!   it is back its share rises over `rampUp`, not all at once;
//! - every primary down: requests spill to the fallback tier with the
//!   model name mapped and the fallback's own credential, while a
//!   residency-pinned request never spills (503 naming the reason);
//! - every primary saturated: requests spill, a pinned one waits for its
//!   member;
//! - members behind relays that delay every byte: the router measures
//!   each round trip and, without a region table, prefers the nearest;
//! - two routers sharing a Redis hold one tenant limit.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gateway::Gateway;
use gateway::auth::api_keys::sha256_hex;
use parking_lot::Mutex;
use serde_json::{Value, json};

use support::{Behaviour, CHAT, FakeReplica, client, closed_port, poll_until, within};

const UNHEALTHY_AFTER: Duration = Duration::from_secs(1);
const RAMP_UP: Duration = Duration::from_secs(3);

fn parse(yaml: &str) -> config::InferenceGatewayConfig {
    config::from_yaml(yaml).unwrap_or_else(|e| panic!("test config refused: {e}\n{yaml}"))
}

/// A member gateway: public and admin listeners at the given addresses
/// (port 0 for any), one pool serving `m` from `replica`, with
/// `scheduling` added to the pool's scheduling settings.
fn member_config(
    public: &str,
    admin: &str,
    replica: SocketAddr,
    scheduling: &str,
) -> config::InferenceGatewayConfig {
    parse(&format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"{public}\"}}]
  admin: {{address: \"{admin}\"}}
  shutdown: {{drainTimeout: 5s}}
  pools:
    - {{name: p, engine: vllm, models: [m], endpoints: [\"{replica}\"], scheduling: {{metrics: {{interval: 50ms}}{scheduling}}}}}
"
    ))
}

async fn sim_replica() -> sim::ReplicaHandle {
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

async fn debug_members(router: &Gateway) -> Value {
    let admin = router.admin_addr().unwrap();
    client()
        .get(format!("http://{admin}/debug/members"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn state_of(page: &Value, member: &str) -> String {
    page["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == member)
        .map(|m| m["state"].as_str().unwrap().to_owned())
        .unwrap()
}

/// `infergate_member_requests_total` of `member`, every outcome.
async fn attempts_to(router: &Gateway, member: &str) -> f64 {
    let metrics = support::exposition::scrape(router).await;
    metrics
        .series("infergate_member_requests_total")
        .iter()
        .filter(|s| s.labels.get("member").map(String::as_str) == Some(member))
        .map(|s| s.value)
        .sum()
}

/// `infergate_member_up{member}`, once the router's health tick has set it.
async fn member_up(router: &Gateway, member: &str) -> Option<f64> {
    support::exposition::scrape(router)
        .await
        .get("infergate_member_up", &[("member", member)])
}

/// One streamed chat completion through the router: which member
/// answered, and whether the stream came back whole.
async fn stream_once(router: SocketAddr) -> (Option<String>, Result<(), String>) {
    let response = client()
        .post(format!("http://{router}{CHAT}"))
        .json(&json!({"model": "m", "stream": true, "max_tokens": 16,
            "messages": [{"role": "user", "content": "hello there"}]}))
        .send()
        .await;
    let mut response = match response {
        Ok(r) => r,
        Err(e) => return (None, Err(e.to_string())),
    };
    let member = response
        .headers()
        .get("x-infergate-member")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if response.status() != 200 {
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        return (member, Err(format!("{status}: {body}")));
    }
    let mut text = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(c)) => text.extend_from_slice(&c),
            Ok(None) => break,
            Err(e) => return (member, Err(format!("cut: {e}"))),
        }
    }
    let text = String::from_utf8_lossy(&text);
    if text.contains("data: [DONE]") && !text.contains("\"error\"") {
        (member, Ok(()))
    } else {
        (member, Err(format!("incomplete stream: {text}")))
    }
}

/// Every request answered, by when it was sent and by whom.
type Answers = Arc<Mutex<Vec<(Instant, Option<String>, Result<(), String>)>>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_member_killed_under_streaming_load_loses_nothing_and_ramps_back() {
    let mut replicas = Vec::new();
    let mut members = Vec::new();
    for _ in 0..3 {
        let replica = sim_replica().await;
        let gw = Gateway::start(&member_config(
            "127.0.0.1:0",
            "127.0.0.1:0",
            replica.local_addr(),
            "",
        ))
        .await
        .unwrap();
        replicas.push(replica);
        members.push(Some(gw));
    }
    let addrs: Vec<(SocketAddr, SocketAddr)> = members
        .iter()
        .map(|m| {
            let m = m.as_ref().unwrap();
            (m.addr(), m.admin_addr().unwrap())
        })
        .collect();
    let listed: String = addrs
        .iter()
        .enumerate()
        .map(|(i, (public, admin))| {
            format!(
                "      - {{name: m{i}, url: \"http://{public}\", adminUrl: \"http://{admin}\", region: r}}\n"
            )
        })
        .collect();
    let router = Gateway::start(&parse(&format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  pools: []
  global:
    region: r
    failover: {{unhealthyAfter: {}ms, rampUp: {}ms}}
    members:
{listed}",
        UNHEALTHY_AFTER.as_millis(),
        RAMP_UP.as_millis()
    )))
    .await
    .unwrap();
    poll_until(Duration::from_secs(10), "every member up", || async {
        let page = debug_members(&router).await;
        let states: Vec<String> = (0..3).map(|i| state_of(&page, &format!("m{i}"))).collect();
        if states.iter().all(|s| s == "healthy") && router.readiness().is_ok() {
            Ok(())
        } else {
            Err(format!("{states:?}"))
        }
    })
    .await;

    // Steady streaming load: six clients, each one request after another.
    let answers: Answers = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let public = router.addr();
    let load: Vec<_> = (0..6)
        .map(|_| {
            let (answers, stop) = (Arc::clone(&answers), Arc::clone(&stop));
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let sent = Instant::now();
                    let (member, result) = stream_once(public).await;
                    answers.lock().push((sent, member, result));
                }
            })
        })
        .collect();
    let count = |answers: &Answers| answers.lock().len();
    poll_until(Duration::from_secs(10), "load running", || async {
        let n = count(&answers);
        if n >= 30 {
            Ok(())
        } else {
            Err(format!("{n} answers"))
        }
    })
    .await;

    // Kill m1: it stops listening at once and drains what it has.
    let victim = members[1].take().unwrap();
    let killed = Instant::now();
    let drained = tokio::spawn(victim.shutdown());
    let down_after = poll_until(Duration::from_secs(10), "m1 out of rotation", || async {
        let page = debug_members(&router).await;
        if state_of(&page, "m1") == "unhealthy" {
            Ok(killed.elapsed())
        } else {
            Err(page.to_string())
        }
    })
    .await;
    let attempts_at_down = attempts_to(&router, "m1").await;
    poll_until(
        Duration::from_secs(2),
        "infergate_member_up 0 for m1",
        || async {
            match member_up(&router, "m1").await {
                Some(0.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    // Time for the load to go on without it.
    let outage_from = count(&answers);
    poll_until(Duration::from_secs(10), "traffic without m1", || async {
        let n = count(&answers) - outage_from;
        if n >= 40 {
            Ok(())
        } else {
            Err(format!("{n} answers"))
        }
    })
    .await;
    let attempts_later = attempts_to(&router, "m1").await;
    let failovers = support::exposition::scrape(&router)
        .await
        .get("infergate_member_failovers_total", &[("member", "m1")])
        .unwrap_or(0.0);
    println!(
        "m1 killed: out of rotation after {:.0} ms (unhealthyAfter {} ms); attempts to it after that: {}; requests retried on another member meanwhile: {failovers}",
        down_after.as_secs_f64() * 1e3,
        UNHEALTHY_AFTER.as_millis(),
        attempts_later - attempts_at_down
    );
    assert!(
        down_after <= UNHEALTHY_AFTER + Duration::from_millis(500),
        "out of rotation only after {down_after:?}"
    );
    assert_eq!(
        attempts_later, attempts_at_down,
        "m1 was sent requests while down"
    );
    assert!(
        within(Duration::from_secs(10), "m1 drained", drained)
            .await
            .unwrap()
    );

    // Bring it back on the same addresses.
    let (public1, admin1) = addrs[1];
    let back = Gateway::start(&member_config(
        &public1.to_string(),
        &admin1.to_string(),
        replicas[1].local_addr(),
        "",
    ))
    .await
    .unwrap();
    let ramp_from = poll_until(Duration::from_secs(10), "m1 back", || async {
        let page = debug_members(&router).await;
        match state_of(&page, "m1").as_str() {
            "ramping" => Ok(Instant::now()),
            other => Err(other.to_owned()),
        }
    })
    .await;
    poll_until(
        Duration::from_secs(2),
        "infergate_member_up 1 for m1",
        || async {
            match member_up(&router, "m1").await {
                Some(1.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    poll_until(
        RAMP_UP * 4,
        "ramp-up over and a second of full share",
        || async {
            if ramp_from.elapsed() >= RAMP_UP + Duration::from_secs(1) {
                Ok(())
            } else {
                Err("ramping".to_owned())
            }
        },
    )
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        within(Duration::from_secs(30), "a client to finish", task)
            .await
            .unwrap();
    }

    let answers = std::mem::take(&mut *answers.lock());
    let failed: Vec<_> = answers.iter().filter(|a| a.2.is_err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        answers.len()
    );
    // m1's share of the requests sent in each window after it came back.
    let share = |from: Duration, to: Duration| {
        let window: Vec<_> = answers
            .iter()
            .filter(|(sent, ..)| *sent >= ramp_from + from && *sent < ramp_from + to)
            .collect();
        let to_m1 = window
            .iter()
            .filter(|a| a.1.as_deref() == Some("m1"))
            .count();
        (to_m1 as f64 / window.len().max(1) as f64, window.len())
    };
    let early = share(Duration::ZERO, Duration::from_secs(1));
    let full = share(RAMP_UP, RAMP_UP + Duration::from_secs(1));
    let before: BTreeMap<&str, usize> =
        answers
            .iter()
            .filter(|(sent, ..)| *sent < killed)
            .fold(BTreeMap::new(), |mut by, a| {
                *by.entry(a.1.as_deref().unwrap_or("-")).or_default() += 1;
                by
            });
    println!(
        "requests {}; before the kill by member {before:?}; m1's share in the first second back {:.2} (of {}), after the ramp {:.2} (of {})",
        answers.len(),
        early.0,
        early.1,
        full.0,
        full.1
    );
    assert!(early.1 > 0 && full.1 > 0);
    assert!(early.0 < full.0, "no ramp: {early:?} then {full:?}");
    assert!(early.0 < 0.25, "took too much at once: {early:?}");
    assert!(full.0 > 0.15, "never came back to its share: {full:?}");
    router.shutdown().await;
    back.shutdown().await;
    for m in members.into_iter().flatten() {
        m.shutdown().await;
    }
}

#[tokio::test]
async fn with_every_primary_down_requests_spill_to_the_fallback_but_pinned_ones_never_do() {
    let hosted = FakeReplica::start("hosted", Behaviour::Echo).await;
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "hosted-secret\n").unwrap();
    let (dead_a, dead_a_admin, dead_eu, dead_eu_admin) = (
        closed_port().await,
        closed_port().await,
        closed_port().await,
        closed_port().await,
    );
    let router = Gateway::start(&parse(&format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  auth:
    apiKeys:
      keys:
        - {{tenant: free, sha256: {free}}}
        - {{tenant: acme-eu, sha256: {eu}}}
  tenants:
    - {{name: free, residencyHeader: true}}
    - {{name: acme-eu, residency: [eu]}}
  pools: []
  global:
    region: us
    members:
      - {{name: use1, url: \"http://{dead_a}\", adminUrl: \"http://{dead_a_admin}\", models: {{m: m}}}}
      - {{name: euw1, url: \"http://{dead_eu}\", adminUrl: \"http://{dead_eu_admin}\", models: {{m: m}}, residency: [eu]}}
      - {{name: hosted, url: \"http://{hosted}\", kind: openai, apiKeyFile: \"{key}\", models: {{m: hosted-m}}, tier: fallback}}
",
        free = sha256_hex("free-key"),
        eu = sha256_hex("eu-key"),
        hosted = hosted.addr,
        key = key_file.display(),
    )))
    .await
    .unwrap();
    let public = router.addr();
    let ask = |key: &'static str, residency: Option<&'static str>| {
        let mut request = client()
            .post(format!("http://{public}{CHAT}"))
            .bearer_auth(key)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        if let Some(r) = residency {
            request = request.header("x-infergate-residency", r);
        }
        request.send()
    };

    let spilled = ask("free-key", None).await.unwrap();
    assert_eq!(spilled.status(), 200);
    assert_eq!(spilled.headers()["x-infergate-member"], "hosted");
    assert_eq!(spilled.headers()["x-infergate-tier"], "fallback");
    let got = &hosted.received()[0];
    let body: Value = serde_json::from_slice(&got.body).unwrap();
    assert_eq!(
        body["model"], "hosted-m",
        "the model name is the fallback's"
    );
    assert_eq!(got.headers["authorization"], "Bearer hosted-secret");

    // Pinned by its tenant, or by the header its tenant allows: never
    // sent to the fallback, which is not in the EU.
    for (key, header) in [("eu-key", None), ("free-key", Some("eu"))] {
        let refused = ask(key, header).await.unwrap();
        assert_eq!(refused.status(), 503, "{key} {header:?}");
        let error: Value = refused.json().await.unwrap();
        assert_eq!(error["error"]["code"], "no_member", "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("unhealthy") && message.contains("not sent elsewhere"),
            "{message}"
        );
    }
    assert_eq!(hosted.count(), 1, "a pinned request reached the fallback");

    // A residency no member carries.
    let nowhere = ask("free-key", Some("asia")).await.unwrap();
    assert_eq!(nowhere.status(), 503);
    let error: Value = nowhere.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("residency"),
        "{error}"
    );

    let page = debug_members(&router).await;
    assert_eq!(state_of(&page, "use1"), "unhealthy");
    assert_eq!(state_of(&page, "hosted"), "healthy");
    router.shutdown().await;
}

/// A member gateway in front of one simulated replica, reached through
/// relays that delay every byte by `one_way` each way (its data and admin
/// listeners both): a member that far away.
struct FarMember {
    _replica: sim::ReplicaHandle,
    gateway: Gateway,
    _relays: Vec<support::delay::DelayedRelay>,
    url: SocketAddr,
    admin_url: SocketAddr,
}

async fn far_member(replica: sim::ReplicaHandle, scheduling: &str, one_way: Duration) -> FarMember {
    let gateway = Gateway::start(&member_config(
        "127.0.0.1:0",
        "127.0.0.1:0",
        replica.local_addr(),
        scheduling,
    ))
    .await
    .unwrap();
    let data = support::delay::relay(gateway.addr(), one_way).await;
    let admin = support::delay::relay(gateway.admin_addr().unwrap(), one_way).await;
    FarMember {
        url: data.addr,
        admin_url: admin.addr,
        _replica: replica,
        gateway,
        _relays: vec![data, admin],
    }
}

/// The router's measured round trip to `member`, in ms, once it has one.
fn rtt_ms(page: &Value, member: &str) -> Option<f64> {
    page["members"]
        .as_array()?
        .iter()
        .find(|m| m["name"] == member)?["scoreParts"]["rttMs"]
        .as_f64()
}

/// Members at three distances on the wire and no region table: the
/// router measures each round trip, shows it, and sends requests to the
/// nearest while the others are no less idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_a_region_table_the_nearest_member_by_measured_round_trip_wins() {
    let delays = [
        ("near", Duration::ZERO),
        ("mid", Duration::from_millis(10)),
        ("far", Duration::from_millis(40)),
    ];
    let mut members = Vec::new();
    for (_, one_way) in delays {
        members.push(far_member(sim_replica().await, "", one_way).await);
    }
    let listed: String = delays
        .iter()
        .zip(&members)
        .map(|((name, _), m)| {
            format!(
                "      - {{name: {name}, url: \"http://{}\", adminUrl: \"http://{}\"}}\n",
                m.url, m.admin_url
            )
        })
        .collect();
    let router = Gateway::start(&parse(&format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  pools: []
  global:
    region: here
    weights: {{kvHeadroom: 0, queueDepth: 0.2, regionProximity: 1, errorRate: 0.1}}
    members:
{listed}"
    )))
    .await
    .unwrap();
    let rtts = poll_until(
        Duration::from_secs(10),
        "every round trip measured",
        || async {
            let page = debug_members(&router).await;
            let rtts: Vec<Option<f64>> = delays.iter().map(|(n, _)| rtt_ms(&page, n)).collect();
            let healthy = delays.iter().all(|(n, _)| state_of(&page, n) == "healthy");
            match rtts[..] {
                [Some(a), Some(b), Some(c)] if healthy => Ok([a, b, c]),
                _ => Err(format!("{rtts:?} healthy: {healthy}")),
            }
        },
    )
    .await;
    let [near, mid, far] = rtts;
    println!("measured round trips: near {near:.1} ms, mid {mid:.1} ms, far {far:.1} ms");
    // A round trip crosses each relay twice; the `near` member has none.
    assert!(mid >= 20.0 && far >= 80.0, "{rtts:?}");
    assert!(near < mid && mid < far, "{rtts:?}");
    let exported = support::exposition::scrape(&router)
        .await
        .get("infergate_member_rtt_seconds", &[("member", "far")])
        .expect("infergate_member_rtt_seconds{member=far}");
    assert!(exported >= 0.080, "{exported}");

    let mut chosen = BTreeMap::<String, usize>::new();
    for _ in 0..12 {
        let answer = client()
            .post(format!("http://{}{CHAT}", router.addr()))
            .json(&json!({"model": "m", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        let member = answer.headers()["x-infergate-member"]
            .to_str()
            .unwrap()
            .to_owned();
        *chosen.entry(member).or_default() += 1;
    }
    assert_eq!(chosen.get("near"), Some(&12), "{chosen:?}");
    router.shutdown().await;
    for m in members {
        m.gateway.shutdown().await;
    }
}

/// Every primary saturated by its own word: requests spill to the
/// fallback tier with the mapped model name, a residency-pinned request
/// still goes to its (saturated) member and is answered there, and the
/// fallback is not used once a primary has room again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_every_primary_saturated_requests_spill_but_pinned_ones_wait_for_their_member() {
    // One sequence at a time, at simulated speed: a few long answers keep
    // a queue waiting at the replica for a second or two.
    let slow_replica = || async {
        sim::start_replica(
            "127.0.0.1:0".parse().unwrap(),
            sim::ReplicaSpec {
                served_model_name: Some("m".into()),
                time_scale: 2.0,
                max_num_seqs: Some(1),
                ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
            },
        )
        .await
        .unwrap()
    };
    let saturating = ", saturation: {queueDepth: 1}";
    let use1 = far_member(slow_replica().await, saturating, Duration::ZERO).await;
    let euw1 = far_member(slow_replica().await, saturating, Duration::ZERO).await;
    let hosted = FakeReplica::start("hosted", Behaviour::Echo).await;
    let router = Gateway::start(&parse(&format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  auth:
    apiKeys:
      keys:
        - {{tenant: free, sha256: {free}}}
        - {{tenant: acme-eu, sha256: {eu}}}
  tenants:
    - {{name: free}}
    - {{name: acme-eu, residency: [eu]}}
  pools: []
  global:
    region: us
    members:
      - {{name: use1, url: \"http://{use1}\", adminUrl: \"http://{use1_admin}\"}}
      - {{name: euw1, url: \"http://{euw1}\", adminUrl: \"http://{euw1_admin}\", residency: [eu]}}
      - {{name: hosted, url: \"http://{hosted}\", kind: openai, models: {{m: hosted-m}}, tier: fallback}}
",
        free = sha256_hex("free-key"),
        eu = sha256_hex("eu-key"),
        use1 = use1.url,
        use1_admin = use1.admin_url,
        euw1 = euw1.url,
        euw1_admin = euw1.admin_url,
        hosted = hosted.addr,
    )))
    .await
    .unwrap();
    let public = router.addr();
    let saturated = |member: &'static str| {
        let router = &router;
        async move {
            let page = debug_members(router).await;
            page["members"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == member)
                .and_then(|m| m["scoreParts"]["models"]["m"]["saturated"].as_bool())
        }
    };
    poll_until(
        Duration::from_secs(10),
        "both primaries summarised",
        || async {
            match (saturated("use1").await, saturated("euw1").await) {
                (Some(false), Some(false)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    // Long answers sent to each member gateway directly, until its replica
    // has a queue.
    let long = |addr: SocketAddr| {
        tokio::spawn(async move {
            client()
                .post(format!("http://{addr}{CHAT}"))
                .json(&json!({"model": "m", "max_tokens": 300,
                    "messages": [{"role": "user", "content": "tell me a long story"}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(|e| e.to_string())
        })
    };
    let loaders: Vec<_> = [use1.gateway.addr(), euw1.gateway.addr()]
        .into_iter()
        .flat_map(|addr| (0..3).map(move |_| addr))
        .map(long)
        .collect();
    poll_until(
        Duration::from_secs(10),
        "both primaries saturated",
        || async {
            match (saturated("use1").await, saturated("euw1").await) {
                (Some(true), Some(true)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    let ask = |key: &'static str| {
        client()
            .post(format!("http://{public}{CHAT}"))
            .bearer_auth(key)
            .json(&json!({"model": "m", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let spilled = ask("free-key").await.unwrap();
    assert_eq!(spilled.status(), 200);
    assert_eq!(spilled.headers()["x-infergate-member"], "hosted");
    assert_eq!(spilled.headers()["x-infergate-tier"], "fallback");
    let body: Value = serde_json::from_slice(&hosted.received()[0].body).unwrap();
    assert_eq!(
        body["model"], "hosted-m",
        "the model name is the fallback's"
    );

    // Held to the EU: waits at euw1, saturated or not, and is answered.
    let pinned = ask("eu-key").await.unwrap();
    assert_eq!(pinned.status(), 200);
    assert_eq!(pinned.headers()["x-infergate-member"], "euw1");
    assert_eq!(hosted.count(), 1, "a pinned request reached the fallback");

    for loader in loaders {
        assert_eq!(loader.await.unwrap(), Ok(200), "a long answer failed");
    }
    poll_until(Duration::from_secs(10), "use1 has room again", || async {
        match saturated("use1").await {
            Some(false) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let primary = ask("free-key").await.unwrap();
    assert_eq!(primary.status(), 200);
    assert_ne!(primary.headers()["x-infergate-member"], "hosted");
    assert_eq!(hosted.count(), 1);
    router.shutdown().await;
    use1.gateway.shutdown().await;
    euw1.gateway.shutdown().await;
}

/// Global limits: two global routers sharing one Redis hold a tenant's
/// limit together, for requests they send to members, while another
/// tenant is not held by it.
#[tokio::test]
async fn two_global_routers_sharing_redis_hold_one_tenant_limit() {
    const PER_MINUTE: usize = 4;
    let redis = support::redis::RedisServer::start().await;
    let hosted = FakeReplica::start("hosted", Behaviour::Echo).await;
    let router_config = || {
        parse(&format!(
            "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  auth:
    apiKeys:
      keys:
        - {{tenant: acme, sha256: {acme}}}
        - {{tenant: second, sha256: {other}}}
  tenants:
    - {{name: acme, limits: {{requestsPerMinute: {PER_MINUTE}}}}}
    - {{name: second}}
  rateLimits: {{backend: redis, redis: {{url: \"{redis}\", timeout: 1s}}}}
  pools: []
  global:
    region: us
    members:
      - {{name: hosted, url: \"http://{hosted}\", kind: openai, models: {{m: m}}}}
",
            acme = sha256_hex("acme-key"),
            other = sha256_hex("second-key"),
            redis = redis.url,
            hosted = hosted.addr,
        ))
    };
    let routers = [
        Gateway::start(&router_config()).await.unwrap(),
        Gateway::start(&router_config()).await.unwrap(),
    ];
    let ask = |router: &Gateway, key: &'static str| {
        client()
            .post(format!("http://{}{CHAT}", router.addr()))
            .bearer_auth(key)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };

    // Alternating between the routers: the first PER_MINUTE pass, in all,
    // and every later one is refused in the OpenAI shape.
    let mut statuses = Vec::new();
    for i in 0..2 * PER_MINUTE {
        let answer = ask(&routers[i % 2], "acme-key").await.unwrap();
        let status = answer.status().as_u16();
        if status == 429 {
            let error: Value = answer.json().await.unwrap();
            assert_eq!(error["error"]["code"], "rate_limit_exceeded", "{error}");
        } else {
            assert_eq!(answer.headers()["x-infergate-member"], "hosted");
        }
        statuses.push(status);
    }
    let expected: Vec<u16> = (0..2 * PER_MINUTE)
        .map(|i| if i < PER_MINUTE { 200 } else { 429 })
        .collect();
    assert_eq!(statuses, expected);
    assert_eq!(
        hosted.count(),
        PER_MINUTE,
        "a refused request reached the member"
    );

    // Another tenant is not held by acme's limit.
    for router in &routers {
        assert_eq!(ask(router, "second-key").await.unwrap().status(), 200);
    }
    for router in routers {
        router.shutdown().await;
    }
}
