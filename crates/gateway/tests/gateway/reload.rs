//! A new config put in force while the gateway runs: routes, pools and
//! replicas change for later requests, requests already running finish
//! under the config they started with.

use bytes::Bytes;
use futures_util::StreamExt;
use gateway::Gateway;
use serde_json::{Value, json};

use crate::support::{Behaviour, CHAT, FakeReplica, client, config};

fn pool(name: &str, model: &str, replicas: &[&FakeReplica]) -> String {
    let endpoints: Vec<String> = replicas.iter().map(|r| format!("\"{}\"", r.addr)).collect();
    format!(
        "    - {{name: {name}, engine: none, models: [{model}], endpoints: [{}], scheduling: {{policy: round-robin}}}}\n",
        endpoints.join(", ")
    )
}

async fn chat(gw: &Gateway, model: &str, stream: bool) -> reqwest::Response {
    client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(
            json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
                .to_string(),
        )
        .send()
        .await
        .unwrap()
}

/// Which replica answered a non-streaming request for `model`.
async fn answered_by(gw: &Gateway, model: &str) -> String {
    let resp = chat(gw, model, false).await;
    assert_eq!(resp.status(), 200, "model {model}");
    let body: Value = resp.json().await.unwrap();
    body["replica"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_stream_runs_to_its_end_across_a_change_that_removes_its_pool() {
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("old", "m", &[&a])))
        .await
        .unwrap();
    let request = tokio::spawn({
        let addr = gw.addr();
        async move {
            client()
                .post(format!("http://{addr}{CHAT}"))
                .header("content-type", "application/json")
                .body(r#"{"model": "m", "stream": true, "messages": []}"#)
                .send()
                .await
                .unwrap()
        }
    });
    let events = a.next_stream().await;
    events
        .send(Bytes::from_static(b"data: 1\n\n"))
        .await
        .unwrap();
    let mut body = request.await.unwrap().bytes_stream();
    assert_eq!(body.next().await.unwrap().unwrap(), "data: 1\n\n");

    // Model `m` moves to another pool; the old pool leaves the config.
    gw.apply(&config("", &pool("new", "m", &[&b]))).unwrap();
    assert_eq!(answered_by(&gw, "m").await, "b");
    assert_eq!(
        gw.pool_endpoints(),
        vec![("new".to_owned(), vec![b.addr.to_string()])]
    );

    // The stream that started before goes on, to its last event.
    events
        .send(Bytes::from_static(b"data: 2\n\n"))
        .await
        .unwrap();
    assert_eq!(body.next().await.unwrap().unwrap(), "data: 2\n\n");
    events
        .send(Bytes::from_static(b"data: [DONE]\n\n"))
        .await
        .unwrap();
    drop(events);
    assert_eq!(body.next().await.unwrap().unwrap(), "data: [DONE]\n\n");
    assert!(body.next().await.is_none());
    assert_eq!(a.count(), 1);
}

#[tokio::test]
async fn replicas_join_and_leave_a_pool_that_stays() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let c = FakeReplica::start("c", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("p", "m", &[&a, &b])))
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(answered_by(&gw, "m").await);
    }
    seen.sort();
    assert_eq!(seen, ["a", "a", "b", "b"]);

    gw.apply(&config("", &pool("p", "m", &[&b, &c]))).unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(answered_by(&gw, "m").await);
    }
    seen.sort();
    assert_eq!(seen, ["b", "b", "c", "c"], "a left the pool, c joined it");
    assert_eq!(a.count(), 2);
}

#[tokio::test]
async fn models_added_and_removed_follow_the_new_config() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("p", "m", &[&a])))
        .await
        .unwrap();
    gw.apply(&config("", &pool("p", "m2", &[&a]))).unwrap();
    assert_eq!(answered_by(&gw, "m2").await, "a");
    let gone = chat(&gw, "m", false).await;
    assert_eq!(gone.status(), 404);
    let body: Value = gone.json().await.unwrap();
    assert_eq!(body["error"]["code"], "model_not_found");
    let models: Value = client()
        .get(format!("http://{}/v1/models", gw.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "m2");
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_config_that_cannot_be_applied_leaves_the_running_one_in_force() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("p", "m", &[&a])))
        .await
        .unwrap();
    // A simulated pool whose replicas were never started.
    let unresolved = config(
        "",
        "    - {name: sim, engine: vllm, models: [s], simulated: {replicas: 1, hardware: [a10g], model: llama-3.1-8b}}\n",
    );
    let err = gw.apply(&unresolved).unwrap_err().to_string();
    assert!(err.contains("simulated"), "{err}");
    assert_eq!(answered_by(&gw, "m").await, "a");
}

#[tokio::test]
async fn a_change_of_listeners_or_connection_limits_asks_for_a_restart() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("p", "m", &[&a])))
        .await
        .unwrap();
    let mut moved = config("", &pool("p", "m", &[&b]));
    moved.spec.listeners[0].address = "127.0.0.1:1".into();
    moved.spec.limits.max_connections = Some(7);
    let err = gw.apply(&moved).unwrap_err().to_string();
    assert!(
        err.contains("spec.listeners, spec.limits.maxConnections changed")
            && err.contains("restart"),
        "{err}"
    );
    // Nothing of it was applied: the old replica still answers.
    assert_eq!(answered_by(&gw, "m").await, "a");
    // The same change without the fixed parts goes through.
    gw.apply(&config("", &pool("p", "m", &[&b]))).unwrap();
    assert_eq!(answered_by(&gw, "m").await, "b");
}
