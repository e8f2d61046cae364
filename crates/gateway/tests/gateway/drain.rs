//! Replicas taken out of service without cutting anyone: drained by hand
//! on the admin listener, or removed by a new config. A draining replica
//! gets no new request while the streams it serves finish there.

use std::time::Duration;

use futures_util::StreamExt;
use gateway::Gateway;
use serde_json::{Value, json};

use crate::support::{
    Behaviour, CHAT, FakeReplica, admin_get, client, config, debug_pools, emit, plain_pool,
    poll_until, sample, within,
};

const ADMIN: &str = "  admin: {address: \"127.0.0.1:0\"}\n";
const WAIT: Duration = Duration::from_secs(10);

fn pool(replicas: &[&FakeReplica]) -> String {
    let addrs: Vec<String> = replicas.iter().map(|r| r.addr.to_string()).collect();
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    plain_pool(&addrs, "")
}

/// A streamed chat request sent in the background; its whole body.
fn stream(gw: &Gateway) -> tokio::task::JoinHandle<String> {
    let url = format!("http://{}{CHAT}", gw.addr());
    tokio::spawn(async move {
        let resp = client()
            .post(url)
            .header("content-type", "application/json")
            .body(r#"{"model": "m", "stream": true, "messages": []}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut body = resp.bytes_stream();
        let mut text = String::new();
        while let Some(chunk) = body.next().await {
            text.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
        text
    })
}

/// Which replica answered a non-streaming request.
async fn answered_by(gw: &Gateway) -> String {
    let resp = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(r#"{"model": "m", "messages": []}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    body["replica"].as_str().unwrap().to_owned()
}

/// An admin request on `path`: its status and JSON body.
async fn admin(
    gw: &Gateway,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let admin = gw.admin_addr().unwrap();
    let mut req = client().request(method, format!("http://{admin}{path}"));
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// The admin listener's `/metrics`.
async fn scrape(gw: &Gateway) -> String {
    admin_get(gw, "/metrics").await
}

fn drain_path(replica: &FakeReplica) -> String {
    format!("/admin/pools/p/replicas/{}/drain", replica.addr)
}

fn endpoint<'a>(pools: &'a Value, replica: &FakeReplica) -> &'a Value {
    pools["pools"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["address"] == replica.addr.to_string())
        .expect("a member")
}

#[tokio::test]
async fn a_drained_replica_gets_no_new_request_while_its_stream_finishes_there() {
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let gw = Gateway::start(&config(ADMIN, &pool(&[&a, &b])))
        .await
        .unwrap();
    // Round-robin's first turn is the first replica.
    let request = stream(&gw);
    let events = a.next_stream().await;
    emit(&events, "data: 1\n\n").await;

    let (status, state) = admin(&gw, reqwest::Method::POST, &drain_path(&a), Some(json!({}))).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["address"], a.addr.to_string());
    assert_eq!(state["pool"], "p");
    assert_eq!(state["member"], true);
    assert_eq!(state["draining"], true);
    assert_eq!(state["evacuating"], false);
    assert_eq!(state["inflightRequests"], 1);
    assert_eq!(state["drain"]["reason"], "by-hand");
    assert!(state["drain"]["evacuateInMs"].as_u64().unwrap() > 0);

    for _ in 0..10 {
        assert_eq!(answered_by(&gw).await, "b");
    }
    assert_eq!(a.count(), 1, "nothing new went to the drained replica");
    let pools = debug_pools(&gw).await;
    let shown = endpoint(&pools, &a);
    assert_eq!(shown["draining"], true, "{shown}");
    assert_eq!(shown["ready"], false, "{shown}");
    assert_eq!(shown["drain"]["reason"], "by-hand", "{shown}");
    assert_eq!(endpoint(&pools, &b)["draining"], false);
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(&metrics, "infergate_pool_draining_endpoints{pool=\"p\"}"),
        Some(1.0)
    );
    assert_eq!(
        sample(&metrics, "infergate_pool_ready_endpoints{pool=\"p\"}"),
        Some(1.0)
    );

    // The stream it serves goes on there, to its end.
    emit(&events, "data: 2\n\n").await;
    emit(&events, "data: [DONE]\n\n").await;
    drop(events);
    assert_eq!(
        within(WAIT, "the stream ends", request).await.unwrap(),
        "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    );

    // Undone: it takes requests again.
    let (status, state) = admin(&gw, reqwest::Method::DELETE, &drain_path(&a), None).await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["draining"], false);
    assert_eq!(state["drain"], Value::Null);
    let second = stream(&gw);
    let third = stream(&gw);
    within(
        WAIT,
        "a request reaches the undrained replica",
        a.wait_for(2),
    )
    .await;
    let events = a.next_stream().await;
    drop(events);
    for request in [second, third] {
        within(WAIT, "both requests end", request).await.unwrap();
    }
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(&metrics, "infergate_pool_draining_endpoints{pool=\"p\"}"),
        Some(0.0)
    );
}

#[tokio::test]
async fn an_evacuated_replica_is_flagged_and_gets_no_new_request() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    // No cold wait: a pool with every replica drained refuses at once.
    let addrs = [a.addr.to_string(), b.addr.to_string()];
    let pool = plain_pool(&[&addrs[0], &addrs[1]], ", coldStart: {timeout: 0s}");
    let gw = Gateway::start(&config(ADMIN, &pool)).await.unwrap();
    // Every pool that has the replica, without naming one.
    let path = format!("/admin/replicas/{}/drain", a.addr);
    let (status, answer) = admin(
        &gw,
        reqwest::Method::POST,
        &path,
        Some(json!({"evacuate": true})),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let state = &answer["replicas"][0];
    assert_eq!(state["draining"], true);
    assert_eq!(state["evacuating"], true);
    assert_eq!(state["drain"]["evacuateInMs"], Value::Null);
    for _ in 0..10 {
        assert_eq!(answered_by(&gw).await, "b");
    }
    assert_eq!(a.count(), 0);
    let pools = debug_pools(&gw).await;
    assert_eq!(endpoint(&pools, &a)["evacuating"], true);
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(&metrics, "infergate_pool_evacuating_endpoints{pool=\"p\"}"),
        Some(1.0)
    );
    // Draining every replica leaves the pool nothing to pick, and not
    // ready.
    let before = b.count();
    let (status, _) = admin(&gw, reqwest::Method::POST, &drain_path(&b), Some(json!({}))).await;
    assert_eq!(status, 200);
    let resp = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(r#"{"model": "m", "messages": []}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert!(gw.readiness().is_err());
    assert_eq!((a.count(), b.count()), (0, before));
}

#[tokio::test]
async fn the_drain_endpoints_refuse_what_they_cannot_do() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&config(ADMIN, &pool(&[&a]))).await.unwrap();
    let admin_addr = gw.admin_addr().unwrap();
    let path = drain_path(&a);
    // No JSON content type: refused, so no page in a browser can ask it.
    let resp = client()
        .post(format!("http://{admin_addr}{path}"))
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let (status, body) = admin(
        &gw,
        reqwest::Method::POST,
        &path,
        Some(json!({"evacuate": "yes"})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = admin(
        &gw,
        reqwest::Method::POST,
        &path,
        Some(json!({"later": true})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/pools/nope/replicas/10.0.0.1:1/drain",
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("pool_not_found"))
    );
    let (status, body) = admin(
        &gw,
        reqwest::Method::POST,
        "/admin/pools/p/replicas/10.0.0.1:1/drain",
        Some(json!({})),
    )
    .await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("replica_not_found"))
    );
    let (status, _) = admin(&gw, reqwest::Method::PUT, &path, None).await;
    assert_eq!(status, 405);
    // Nothing was drained by any of it; GET only looks.
    let (status, state) = admin(&gw, reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 200);
    assert_eq!(state["draining"], false);
    assert_eq!(answered_by(&gw).await, "a");
}

#[tokio::test]
async fn a_replica_removed_by_a_reload_finishes_its_stream_and_gets_nothing_new() {
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let gw = Gateway::start(&config(ADMIN, &pool(&[&a, &b])))
        .await
        .unwrap();
    let request = stream(&gw);
    let events = a.next_stream().await;
    emit(&events, "data: 1\n\n").await;

    gw.apply(&config(ADMIN, &pool(&[&b]))).unwrap();
    let pools = debug_pools(&gw).await;
    let leaving = &pools["pools"][0]["leaving"];
    assert_eq!(leaving.as_array().unwrap().len(), 1, "{pools}");
    assert_eq!(leaving[0]["address"], a.addr.to_string());
    assert_eq!(leaving[0]["inflightRequests"], 1);
    assert_eq!(leaving[0]["drain"]["reason"], "removed");
    let metrics = scrape(&gw).await;
    assert_eq!(
        sample(&metrics, "infergate_pool_draining_endpoints{pool=\"p\"}"),
        Some(1.0)
    );
    for _ in 0..5 {
        assert_eq!(answered_by(&gw).await, "b");
    }
    assert_eq!(a.count(), 1);

    emit(&events, "data: 2\n\n").await;
    emit(&events, "data: [DONE]\n\n").await;
    drop(events);
    assert_eq!(
        within(WAIT, "the stream ends", request).await.unwrap(),
        "data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    );
    // Its last request ended: it is forgotten (by the drain's own task,
    // which the release wakes).
    poll_until(WAIT, "the removed replica forgotten", || async {
        let pools = debug_pools(&gw).await;
        let leaving = &pools["pools"][0]["leaving"];
        if leaving.as_array().unwrap().is_empty() {
            Ok(())
        } else {
            Err(leaving.to_string())
        }
    })
    .await;
}
