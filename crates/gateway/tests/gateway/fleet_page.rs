//! The fleet page's side of the admin listener: the page served with its
//! policy, and the JSON it polls — the decision feed, which records only
//! while someone watches, each pool's traffic, and what `/debug/pools`
//! adds for it. The page itself, in a browser, is tested in
//! `tests/blackbox/test_fleet_page.py`.

use std::time::Duration;

use crate::support::{
    Behaviour, CHAT, FakeReplica, client, config, poll_until, until_debug_pools, vllm_metrics,
};
use gateway::Gateway;
use serde_json::{Value, json};

const DEADLINE: Duration = Duration::from_secs(20);

/// Two scored replicas serving `llama`, the admin listener on.
async fn fleet() -> (Gateway, [FakeReplica; 2]) {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    a.set_metrics(&vllm_metrics(0, 1, 0.2, &[]));
    b.set_metrics(&vllm_metrics(3, 2, 0.6, &["sql-lora"]));
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: llama, engine: vllm, models: [llama], endpoints: [\"{}\", \"{}\"], scheduling: {{metrics: {{interval: 20ms, staleAfter: 5s}}}}}}\n",
            a.addr, b.addr
        ),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    until_debug_pools(&gw, DEADLINE, "both replicas healthy", |p| {
        p["pools"][0]["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["health"] == "healthy")
    })
    .await;
    (gw, [a, b])
}

fn admin(gw: &Gateway, path: &str) -> String {
    format!("http://{}{path}", gw.admin_addr().unwrap())
}

async fn get_json(gw: &Gateway, path: &str) -> (u16, Value) {
    let resp = client().get(admin(gw, path)).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

async fn chat(gw: &Gateway, id: &str, model: &str) -> u16 {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let resp = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("x-request-id", id)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    resp.bytes().await.unwrap();
    status
}

fn ids(feed: &Value) -> Vec<&str> {
    feed["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["requestId"].as_str().unwrap())
        .collect()
}

/// The feed once it lists `want` (a record is kept when its response body
/// is dropped, just after the client has read it).
async fn feed_listing(gw: &Gateway, query: &str, want: &[&str]) -> Value {
    let what = format!("/debug/decisions?{query} listing {want:?}");
    poll_until(DEADLINE, &what, || async {
        let (_, feed) = get_json(gw, &format!("/debug/decisions?{query}")).await;
        if ids(&feed) == want {
            Ok(feed)
        } else {
            Err(feed.to_string())
        }
    })
    .await
}

#[tokio::test]
async fn the_page_is_served_with_a_strict_policy() {
    let (gw, _replicas) = fleet().await;
    // `/` leads to the page (reqwest follows the redirect).
    let page = client().get(admin(&gw, "/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.url().path(), "/ui/");
    let csp = page.headers()["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let html = page.text().await.unwrap();
    assert!(
        html.contains("<script src=\"app.js\" defer></script>"),
        "{html}"
    );

    let js = client().get(admin(&gw, "/ui/app.js")).send().await.unwrap();
    assert_eq!(js.status(), 200);
    assert_eq!(
        js.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert!(js.text().await.unwrap().contains("../debug/decisions"));

    let post = client().post(admin(&gw, "/ui/")).send().await.unwrap();
    assert_eq!(post.status(), 405);
    let missing = client()
        .get(admin(&gw, "/ui/nope.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    // The public listener serves none of it.
    let public = client()
        .get(format!("http://{}/ui/", gw.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(public.status(), 404);
}

#[tokio::test]
async fn the_decision_feed_records_requests_only_while_watched() {
    let (gw, [a, b]) = fleet().await;
    assert_eq!(chat(&gw, "before", "llama").await, 200);
    // The first look finds nothing: nobody was watching.
    let (_, first) = get_json(&gw, "/debug/decisions").await;
    assert_eq!(ids(&first), Vec::<&str>::new());
    assert_eq!(first["next"], 0);
    assert_eq!(first["sampling"]["perSecond"], 50);

    assert_eq!(chat(&gw, "w-1", "llama").await, 200);
    assert_eq!(chat(&gw, "w-2", "llama").await, 200);
    assert_eq!(chat(&gw, "w-3", "ghost").await, 404);
    let feed = feed_listing(&gw, "after=0", &["w-1", "w-2", "w-3"]).await;
    let addrs = [a.addr.to_string(), b.addr.to_string()];
    let first = &feed["decisions"][0];
    assert_eq!(first["model"], "llama");
    assert_eq!(first["pool"], "llama");
    assert_eq!(first["band"], "standard");
    assert_eq!(first["status"], 200);
    assert_eq!(first["queueWaitMs"], 0.0);
    let chosen = first["endpoint"].as_str().unwrap();
    let runner_up = first["runnerUp"].as_str().unwrap();
    assert!(addrs.contains(&chosen.to_owned()), "{first}");
    assert!(
        addrs.contains(&runner_up.to_owned()) && runner_up != chosen,
        "{first}"
    );
    let gap = first["gap"].as_f64().unwrap();
    let (score, runner_up_score) = (
        first["score"].as_f64().unwrap(),
        first["runnerUpScore"].as_f64().unwrap(),
    );
    assert!(
        (gap - (score - runner_up_score)).abs() < 1e-9 && gap >= 0.0,
        "{first}"
    );
    assert!(first["ttftMs"].as_f64().unwrap() > 0.0, "{first}");
    let unknown = &feed["decisions"][2];
    assert_eq!(unknown["status"], 404);
    assert_eq!(unknown["endpoint"], Value::Null);

    // Filters, and reading on from where the last answer ended.
    let by_model = feed_listing(&gw, "model=llama", &["w-1", "w-2"]).await;
    assert_eq!(by_model["next"], feed["next"]);
    feed_listing(&gw, "pool=llama&limit=1", &["w-2"]).await;
    feed_listing(&gw, &format!("after={}", feed["next"]), &[]).await;

    // One request's whole record: every candidate, each scorer's part.
    let (status, record) = get_json(&gw, "/debug/decisions/w-1").await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["requestId"], "w-1");
    assert_eq!(record["policy"], "scored");
    assert_eq!(record["candidatesScored"], 2);
    let candidates = record["candidates"].as_array().unwrap();
    assert_eq!(candidates[0]["address"], chosen, "best first: {record}");
    assert_eq!(candidates[1]["address"], runner_up, "{record}");
    for scorer in ["queue", "kv-cache", "inflight", "prefix", "lora"] {
        let part = candidates[1]["parts"][scorer].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&part), "{scorer}: {record}");
    }
    assert_eq!(record["traceId"].as_str().unwrap().len(), 32);
    let (status, gone) = get_json(&gw, "/debug/decisions/before").await;
    assert_eq!(status, 404, "{gone}");
}

#[tokio::test]
async fn traffic_counts_each_pools_requests_and_ttft() {
    let (gw, _replicas) = fleet().await;
    for i in 0..4 {
        assert_eq!(chat(&gw, &format!("t-{i}"), "llama").await, 200);
    }
    let what = "/debug/traffic counting 4 answers";
    let pool = poll_until(DEADLINE, what, || async {
        let (_, traffic) = get_json(&gw, "/debug/traffic").await;
        let pool = traffic["pools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "llama")
            .cloned();
        match pool {
            Some(p) if p["window"]["ttftMs"]["count"] == 4.0 => Ok(p),
            _ => Err(traffic.to_string()),
        }
    })
    .await;
    let window = &pool["window"];
    assert_eq!(window["requests"], 4.0, "{pool}");
    assert_eq!(window["ok"], 4.0, "{pool}");
    assert_eq!(window["rateLimited"], 0.0, "{pool}");
    assert_eq!(window["serverErrors"], 0.0, "{pool}");
    let (p50, p95) = (
        window["ttftMs"]["p50"].as_f64().unwrap(),
        window["ttftMs"]["p95"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= p95, "{pool}");
    assert!(
        pool["recent"]["perSecond"].as_f64().unwrap() > 0.0,
        "{pool}"
    );
}

#[tokio::test]
async fn debug_pools_has_what_the_page_shows() {
    let (gw, [_, b]) = fleet().await;
    let pools = until_debug_pools(&gw, DEADLINE, "b's adapter resident", |p| {
        p["pools"][0]["endpoints"][1]["residentAdapters"] == json!(["sql-lora"])
    })
    .await;
    let pool = &pools["pools"][0];
    assert_eq!(
        pool["weights"],
        json!({"queue": 3.0, "kv-cache": 2.0, "inflight": 3.0, "prefix": 9.0, "lora": 2.0, "speed": 2.0, "session": 4.0})
    );
    let endpoint = &pool["endpoints"][1];
    assert_eq!(endpoint["address"], b.addr.to_string());
    assert_eq!(endpoint["ready"], true);
    assert_eq!(endpoint["prefixIndexBlocks"], 0);
    b.kill();
    until_debug_pools(&gw, DEADLINE, "b no longer ready", |p| {
        p["pools"][0]["endpoints"][1]["ready"] == false
    })
    .await;
}
