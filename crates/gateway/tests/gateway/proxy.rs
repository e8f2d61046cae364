//! The gateway as a proxy: routing by model and adapter, streaming,
//! errors in the OpenAI shape, what happens to upstream connections when a
//! replica or a client misbehaves, both protocols on both sides, and the
//! connection limit.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{Behaviour, CHAT, FakeReplica, client, config, emit, plain_pool, raw_replica};
use bytes::Bytes;
use futures_util::StreamExt;
use gateway::Gateway;
use serde_json::{Value, json};

fn pool(
    name: &str,
    models: &str,
    adapters: &str,
    replicas: &[&FakeReplica],
    policy: &str,
) -> String {
    let endpoints: Vec<String> = replicas.iter().map(|r| format!("\"{}\"", r.addr)).collect();
    format!(
        "    - {{name: {name}, engine: none, models: [{models}], adapters: [{adapters}], endpoints: [{}], scheduling: {{policy: {policy}}}}}\n",
        endpoints.join(", ")
    )
}

async fn post(gw: &Gateway, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
    client()
        .post(format!("http://{}{path}", gw.addr()))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn chat(gw: &Gateway, model: &str) -> reqwest::Response {
    post(
        gw,
        CHAT,
        json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    )
    .await
}

/// A streamed chat request sent in the background: its response, once its
/// head has arrived.
fn streamed(gw: &Gateway, body: &'static str) -> tokio::task::JoinHandle<reqwest::Response> {
    let request = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .body(body);
    tokio::spawn(async move { request.send().await.unwrap() })
}

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    let body: Value = resp.json().await.unwrap();
    for field in ["message", "type", "param", "code"] {
        assert!(
            body["error"].get(field).is_some(),
            "no error.{field} in {body}"
        );
    }
    (status, body)
}

#[tokio::test]
async fn routes_by_model_and_adapter_across_pools() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let cfg = config(
        "",
        &(pool("llama", "llama-8b", "sql-lora", &[&a], "round-robin")
            + &pool("qwen", "qwen-32b", "", &[&b], "round-robin")),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    for (model, replica) in [("llama-8b", "a"), ("qwen-32b", "b"), ("sql-lora", "a")] {
        let resp = chat(&gw, model).await;
        assert_eq!(resp.status(), 200);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["replica"], replica, "model {model}");
    }
    assert_eq!(a.count(), 2);
    assert_eq!(b.count(), 1);
    // The adapter request reaches the replica with its body unchanged.
    let last: Value = serde_json::from_slice(&a.received()[1].body).unwrap();
    assert_eq!(last["model"], "sql-lora");
}

#[tokio::test]
async fn lists_models_and_adapters() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config(
        "",
        &pool(
            "llama",
            "llama-8b, llama-8b-instruct",
            "sql-lora, chat-lora",
            &[&a],
            "random",
        ),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let body: Value = client()
        .get(format!("http://{}/v1/models", gw.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        ["llama-8b", "llama-8b-instruct", "sql-lora", "chat-lora"]
    );
    assert!(data[0]["parent"].is_null());
    assert_eq!(data[2]["parent"], "llama-8b");
    assert_eq!(data[3]["object"], "model");
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config(
        "  limits: {maxBodyBytes: 1000}\n",
        &pool("p", "m", "", &[&a], "round-robin"),
    );
    let gw = Gateway::start(&cfg).await.unwrap();

    let (status, body) = error_of(chat(&gw, "no-such-model").await).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["code"], "model_not_found");
    assert_eq!(body["error"]["param"], "model");

    for (payload, what) in [
        (r#"{"messages": []}"#, "missing model"),
        (r#"{"model": 7}"#, "non-string model"),
        (r#"{"model": "m", "#, "malformed JSON"),
        ("[]", "not an object"),
    ] {
        let (status, body) = error_of(post(&gw, CHAT, payload).await).await;
        assert_eq!(status, 400, "{what}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{what}");
    }

    let big = json!({"model": "m", "prompt": "x".repeat(2000)}).to_string();
    let (status, _) = error_of(post(&gw, "/v1/completions", big.clone()).await).await;
    assert_eq!(status, 413);
    // Without a Content-Length the limit still holds, counted while reading.
    let chunks = futures_util::stream::iter(
        big.into_bytes()
            .chunks(100)
            .map(|c| Ok::<_, std::io::Error>(Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>(),
    );
    let (status, _) =
        error_of(post(&gw, "/v1/completions", reqwest::Body::wrap_stream(chunks)).await).await;
    assert_eq!(status, 413);

    let resp = client()
        .get(format!("http://{}{CHAT}", gw.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["allow"], "POST");
    assert_eq!(error_of(resp).await.0, 405);
    let resp = client()
        .delete(format!("http://{}/v1/models", gw.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await.0, 405);
    let resp = client()
        .get(format!("http://{}/nothing/here", gw.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await.0, 404);

    assert_eq!(a.count(), 0, "no bad request may reach a replica");
}

#[tokio::test]
async fn forwards_body_byte_for_byte_with_request_id() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("p", "m", "", &[&a], "round-robin")))
        .await
        .unwrap();
    // Odd spacing, key order, unicode escapes and extra fields must survive.
    let body = "{ \"z\":1,\"model\" :\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"caf\\u00e9 \u{1F600}\"}],\"extra\":{\"a\":[1,2.50]}}  \n";
    let resp = client()
        .post(format!("http://{}/v1/completions?x=1", gw.addr()))
        .header("x-request-id", "req-123")
        .header("authorization", "Bearer secret")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "req-123");
    let got = &a.received()[0];
    assert_eq!(got.body, body.as_bytes());
    assert_eq!(got.path, "/v1/completions");
    assert_eq!(got.headers["x-request-id"], "req-123");
    assert_eq!(got.headers["authorization"], "Bearer secret");

    // Without a client id, one is generated and sent upstream too.
    let resp = chat(&gw, "m").await;
    let id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(id.len(), 32);
    assert_eq!(a.received()[1].headers["x-request-id"], id.as_str());
}

#[tokio::test]
async fn decision_headers_name_pool_and_endpoint() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config(
        "  debug: {decisionHeaders: true}\n",
        &pool("p", "m", "", &[&a], "round-robin"),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let resp = chat(&gw, "m").await;
    assert_eq!(resp.headers()["x-infergate-pool"], "p");
    assert_eq!(
        resp.headers()["x-infergate-endpoint"],
        a.addr.to_string().as_str()
    );
    // A replica had room: the request did not wait in the gateway.
    assert_eq!(resp.headers()["x-infergate-queue-wait-ms"], "0");
}

#[tokio::test]
async fn streams_events_as_they_come() {
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let gw = Gateway::start(&config("", &pool("p", "m", "", &[&a], "round-robin")))
        .await
        .unwrap();
    let request = streamed(&gw, r#"{"model":"m","stream":true,"messages":[]}"#);
    let events = a.next_stream().await;
    emit(&events, "data: {\"n\":1}\n\n").await;
    let resp = request.await.unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.bytes_stream();
    // The first event arrives while the replica is still generating.
    let first = body.next().await.unwrap().unwrap();
    assert_eq!(first, "data: {\"n\":1}\n\n");
    emit(&events, "data: {\"n\":2}\n\n").await;
    assert_eq!(body.next().await.unwrap().unwrap(), "data: {\"n\":2}\n\n");
    emit(&events, "data: [DONE]\n\n").await;
    drop(events);
    assert_eq!(body.next().await.unwrap().unwrap(), "data: [DONE]\n\n");
    assert!(body.next().await.is_none());
}

#[tokio::test]
async fn client_disconnect_aborts_the_upstream_stream() {
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let gw = Gateway::start(&config("", &pool("p", "m", "", &[&a], "least-request")))
        .await
        .unwrap();
    let request = streamed(&gw, r#"{"model":"m","stream":true}"#);
    let events = a.next_stream().await;
    emit(&events, "data: 1\n\n").await;
    let mut body = request.await.unwrap().bytes_stream();
    body.next().await.unwrap().unwrap();
    // The client goes away after the first event.
    drop(body);
    // The replica sees its response body dropped: the gateway closed the
    // upstream connection. Keep sending so the gateway notices the client.
    let aborted = async {
        loop {
            if events
                .send(Bytes::from_static(b"data: more\n\n"))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), aborted)
        .await
        .expect("the upstream stream was not aborted");
}

#[tokio::test]
async fn dead_replica_costs_no_failed_requests() {
    let alive = FakeReplica::start("alive", Behaviour::Echo).await;
    let dead = FakeReplica::start("dead", Behaviour::Echo).await;
    dead.kill();
    let gw = Gateway::start(&config(
        "",
        &pool("p", "m", "", &[&dead, &alive], "round-robin"),
    ))
    .await
    .unwrap();
    for _ in 0..20 {
        let resp = chat(&gw, "m").await;
        assert_eq!(resp.status(), 200);
    }
    assert_eq!(alive.count(), 20);
}

#[tokio::test]
async fn no_reachable_replica_is_503() {
    let dead = FakeReplica::start("dead", Behaviour::Echo).await;
    dead.kill();
    // Without a cold wait: whether the first scrape has failed or not, the
    // answer is at once.
    let pool = pool("p", "m", "", &[&dead], "round-robin")
        .replace("}}\n", "}, coldStart: {timeout: 0s}}\n");
    let gw = Gateway::start(&config("", &pool)).await.unwrap();
    let (status, body) = error_of(chat(&gw, "m").await).await;
    assert_eq!(status, 503);
    assert!(body["error"]["message"].as_str().unwrap().contains("`p`"));
}

#[tokio::test]
async fn round_robin_spreads_evenly() {
    let replicas = [
        FakeReplica::start("a", Behaviour::Echo).await,
        FakeReplica::start("b", Behaviour::Echo).await,
        FakeReplica::start("c", Behaviour::Echo).await,
    ];
    let refs: Vec<&FakeReplica> = replicas.iter().collect();
    let gw = Gateway::start(&config("", &pool("p", "m", "", &refs, "round-robin")))
        .await
        .unwrap();
    for _ in 0..30 {
        assert_eq!(chat(&gw, "m").await.status(), 200);
    }
    for r in &replicas {
        assert_eq!(r.count(), 10, "replica {}", r.name);
    }
}

#[tokio::test]
async fn least_request_avoids_busy_replicas() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let busy = FakeReplica::start("busy", Behaviour::Held(Arc::clone(&gate))).await;
    let free = FakeReplica::start("free", Behaviour::Echo).await;
    let gw = Arc::new(
        Gateway::start(&config(
            "",
            &pool("p", "m", "", &[&busy, &free], "least-request"),
        ))
        .await
        .unwrap(),
    );
    // With equal load the first request may go to either replica; send
    // until one is held by the busy replica.
    let held = loop {
        let gw = Arc::clone(&gw);
        let mut request = tokio::spawn(async move { chat(&gw, "m").await.status() });
        let arrived_at_busy = tokio::select! {
            _ = busy.wait_for(1) => true,
            status = &mut request => {
                assert_eq!(status.unwrap(), 200);
                false
            }
        };
        if arrived_at_busy {
            break request;
        }
    };
    let before = free.count();
    // With one request in flight on `busy`, every new one goes to `free`.
    for _ in 0..10 {
        assert_eq!(chat(&gw, "m").await.status(), 200);
    }
    assert_eq!(free.count() - before, 10);
    gate.add_permits(1);
    assert_eq!(held.await.unwrap(), 200);
}

#[tokio::test]
async fn graceful_shutdown_lets_a_stream_finish() {
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let gw = Gateway::start(&config("", &pool("p", "m", "", &[&a], "round-robin")))
        .await
        .unwrap();
    let addr = gw.addr();
    let url = format!("http://{addr}{CHAT}");
    let request = tokio::spawn(async move {
        let resp = client()
            .post(url)
            .body(r#"{"model":"m","stream":true}"#)
            .send()
            .await
            .unwrap();
        resp.bytes().await.unwrap()
    });
    let events = a.next_stream().await;
    emit(&events, "data: 1\n\n").await;
    let shutdown = tokio::spawn(gw.shutdown());
    // New connections are refused once the listener is closed.
    let refused = async {
        loop {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), refused)
        .await
        .unwrap();
    emit(&events, "data: 2\n\n").await;
    drop(events);
    assert_eq!(request.await.unwrap(), "data: 1\n\ndata: 2\n\n");
    assert!(shutdown.await.unwrap(), "drain did not complete");
}

#[tokio::test]
async fn health_and_readiness() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("p", "m", "", &[&a], "round-robin")))
        .await
        .unwrap();
    let c = client();
    let healthz = c
        .get(format!("http://{}/healthz", gw.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(healthz.status(), 200);
    // The model servers' path, for tools written for them.
    let health = c
        .get(format!("http://{}/health", gw.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok");
    let readyz = c
        .get(format!("http://{}/readyz", gw.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(readyz.status(), 200);
}

/// `readyWhen: anyPool` stays ready while one pool has no usable replica;
/// `allPools` is not ready, and says which pool it waits for.
#[tokio::test]
async fn readiness_follows_ready_when() {
    let up = FakeReplica::start("a", Behaviour::Echo).await;
    // A port nothing listens on: the pool's scrapes fail, so it has no
    // usable replica.
    let down = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let pools = format!(
        "{}    - {{name: dead, engine: vllm, models: [d], endpoints: [\"{down}\"]}}\n",
        plain_pool(&[&up.addr.to_string()], "")
    );
    let readyz = |gw: &Gateway| {
        let url = format!("http://{}/readyz", gw.addr());
        async move {
            let r = client().get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let all = Gateway::start(&config("  readyWhen: allPools\n", &pools))
        .await
        .unwrap();
    let (status, body) = crate::support::poll_until(
        Duration::from_secs(10),
        "allPools to be not ready",
        || async {
            let (status, body) = readyz(&all).await;
            if status == 503 {
                Ok((status, body))
            } else {
                Err(format!("{status} {body}"))
            }
        },
    )
    .await;
    assert_eq!(status, 503);
    assert!(body.contains("dead") && body.contains("allPools"), "{body}");
    assert!(!body.contains(" p,") && !body.ends_with(" p"), "{body}");

    let any = Gateway::start(&config("  admin: {address: \"127.0.0.1:0\"}\n", &pools))
        .await
        .unwrap();
    // Once `dead` is known to be down (the same scrape failure as above),
    // the default still answers ready.
    crate::support::poll_until(
        Duration::from_secs(10),
        "dead to be marked down",
        || async {
            let pools: Value = client()
                .get(format!("http://{}/debug/pools", any.admin_addr().unwrap()))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let dead = pools["pools"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "dead")
                .cloned();
            match dead {
                Some(d) if d["ready"] == false => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(readyz(&any).await, (200, "ready".to_owned()));
}

#[tokio::test]
async fn h2c_pools_are_reached_over_http2() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let pools = format!(
        "    - {{name: p, engine: none, protocol: h2c, models: [m], endpoints: [\"{}\"]}}\n",
        a.addr
    );
    let gw = Gateway::start(&config("", &pools)).await.unwrap();
    for _ in 0..3 {
        assert_eq!(chat(&gw, "m").await.status(), 200);
    }
    assert!(
        a.received()
            .iter()
            .all(|r| r.version == http::Version::HTTP_2)
    );
}

#[tokio::test]
async fn clients_may_speak_http2_with_prior_knowledge() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = Gateway::start(&config("", &pool("p", "m", "", &[&a], "round-robin")))
        .await
        .unwrap();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let body = r#"{"model":"m","messages":[]}"#;
    for _ in 0..3 {
        let resp = h2
            .post(format!("http://{}{CHAT}", gw.addr()))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().contains_key("x-request-id"));
    }
    let resp = h2
        .post(format!("http://{}{CHAT}", gw.addr()))
        .body(r#"{"model":"nope"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(error_of(resp).await.0, 404);
    assert!(a.received().iter().all(|r| r.body == body.as_bytes()));
}

#[tokio::test]
async fn a_stream_to_an_http_1_0_client_ends_with_the_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let gw = Gateway::start(&config("", &pool("p", "m", "", &[&a], "round-robin")))
        .await
        .unwrap();
    let mut conn = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    let body = r#"{"model":"m","stream":true}"#;
    let req = format!(
        "POST {CHAT} HTTP/1.0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    let events = a.next_stream().await;
    for event in ["data: 1\n\n", "data: [DONE]\n\n"] {
        emit(&events, event).await;
    }
    drop(events);
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_string(&mut answer))
        .await
        .expect("the gateway closes the connection at the stream's end")
        .unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200 "), "{head}");
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert_eq!(body, "data: 1\n\ndata: [DONE]\n\n");
}

#[tokio::test]
async fn a_replica_slow_to_answer_is_a_504_and_is_not_retried() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let slow = FakeReplica::start("slow", Behaviour::Held(Arc::clone(&gate))).await;
    let other = FakeReplica::start("other", Behaviour::Echo).await;
    let cfg = config(
        "  timeouts: {firstByte: 200ms}\n",
        &pool("p", "m", "", &[&slow, &other], "round-robin"),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let (status, body) = error_of(chat(&gw, "m").await).await;
    assert_eq!(status, 504);
    assert_eq!(body["error"]["code"], "upstream_timeout");
    // The slow replica may still be generating: the work is not sent twice.
    assert_eq!(other.count(), 0);
    gate.add_permits(1);
}

#[tokio::test]
async fn a_stream_that_goes_quiet_is_cut_after_the_idle_timeout() {
    let a = FakeReplica::start("a", Behaviour::Stream).await;
    let cfg = config(
        "  timeouts: {idle: 300ms}\n",
        &pool("p", "m", "", &[&a], "round-robin"),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let request = streamed(&gw, r#"{"model":"m","stream":true}"#);
    let events = a.next_stream().await;
    emit(&events, "data: 1\n\n").await;
    let mut body = request.await.unwrap().bytes_stream();
    assert_eq!(body.next().await.unwrap().unwrap(), "data: 1\n\n");
    // The replica keeps the stream open but sends nothing more: the client
    // sees the stream end with an error event instead of hanging forever.
    let end = tokio::time::timeout(Duration::from_secs(10), body.next())
        .await
        .expect("the quiet stream was not cut")
        .unwrap()
        .unwrap();
    let event = std::str::from_utf8(&end).unwrap().trim();
    let error: serde_json::Value =
        serde_json::from_str(event.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(error["error"]["code"], "upstream_failed");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("sent nothing for 300ms"), "{message}");
    assert!(
        body.next().await.is_none(),
        "the stream ends after the error event"
    );
    drop(events);
}

/// A replica that answers every request with a small JSON body, counts the
/// connections that carried inference requests (reachability probes do
/// not count) and, if `close_idle`, closes each connection as soon as it
/// has answered (as an aggressive keep-alive timeout would), without saying
/// so in the response.
async fn counting_replica(close_idle: bool) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    let addr = raw_replica(move |mut stream| {
        let counter = Arc::clone(&counter);
        async move {
            let mut counted = false;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                // One request: its head, then content-length bytes.
                let (head_end, length) = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..i]).to_ascii_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        break (i + 4, length);
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                while buf.len() < head_end + length {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                if !counted && buf.starts_with(b"POST /v1/") {
                    counted = true;
                    counter.fetch_add(1, Ordering::SeqCst);
                }
                buf.drain(..head_end + length);
                let body = r#"{"object":"chat.completion"}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                if stream.write_all(answer.as_bytes()).await.is_err() || close_idle {
                    return;
                }
            }
        }
    })
    .await;
    (addr, accepted)
}

#[tokio::test]
async fn upstream_connections_are_kept_alive_and_reused() {
    let (addr, accepted) = counting_replica(false).await;
    let gw = Gateway::start(&config("", &plain_pool(&[&addr], "")))
        .await
        .unwrap();
    // One client connection, so one worker serves every request.
    let c = client();
    for _ in 0..20 {
        let resp = c
            .post(format!("http://{}{CHAT}", gw.addr()))
            .body(r#"{"model":"m"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    // That worker reuses its connection to the replica.
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_replica_closing_idle_connections_costs_no_failed_requests() {
    let (addr, accepted) = counting_replica(true).await;
    // No retries on other replicas: a stale connection would be a 502.
    // Here the worker mostly notices the close before the next request;
    // the close crossing a request on the wire is a unit test of the pool.
    let pools = plain_pool(&[&addr], ", retry: {maxRetries: 0}");
    let gw = Gateway::start(&config("", &pools)).await.unwrap();
    for _ in 0..20 {
        let resp = chat(&gw, "m").await;
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 20);
}

/// A replica that reads a request and answers with something that is not
/// HTTP, then closes.
async fn garbage_replica() -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw_replica(|mut stream| async move {
        let mut buf = [0u8; 4096];
        if stream.read(&mut buf).await.is_ok_and(|n| n > 0) {
            let _ = stream.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\n").await;
        }
    })
    .await
}

/// A replica answering garbage had the request and will not answer it:
/// the client's 502, unless another replica can answer it whole. Sending
/// it elsewhere is continuation's resend (on by default); with
/// continuation off the replica may be acting on it, and it is not sent
/// again.
#[tokio::test]
async fn a_replica_answering_garbage_is_a_502_unless_another_replica_answers_it() {
    let garbage = garbage_replica().await;
    let good = FakeReplica::start("good", Behaviour::Echo).await;
    let only_garbage = format!(
        "    - {{name: bad, engine: none, models: [bad], endpoints: [\"{garbage}\"], scheduling: {{policy: round-robin}}}}\n"
    );
    let mixed = |name: &str, model: &str, extra: &str| {
        format!(
            "    - {{name: {name}, engine: none, models: [{model}], endpoints: [\"{garbage}\", \"{}\"], scheduling: {{policy: round-robin}}{extra}}}\n",
            good.addr
        )
    };
    let pools = [
        only_garbage,
        mixed("mixed", "m", ""),
        mixed("kept", "k", ", continuation: {enabled: false}"),
    ]
    .concat();
    let gw = Gateway::start(&config("", &pools)).await.unwrap();
    let (status, body) = error_of(chat(&gw, "bad").await).await;
    assert_eq!(status, 502);
    assert_eq!(body["error"]["code"], "upstream_error");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("failed before answering"), "{message}");
    // Every request is answered, those meeting the garbage by the good
    // replica.
    for _ in 0..4 {
        assert_eq!(chat(&gw, "m").await.status().as_u16(), 200);
    }
    assert_eq!(good.count(), 4);
    // With continuation off, a request that met the garbage is not sent
    // to another replica too.
    let mut ok = 0;
    for _ in 0..4 {
        match chat(&gw, "k").await.status().as_u16() {
            200 => ok += 1,
            status => assert_eq!(status, 502),
        }
    }
    assert_eq!(ok, 2, "round-robin: every other request meets the garbage");
    assert_eq!(good.count(), 4 + ok);
}

#[tokio::test]
async fn a_client_leaving_before_the_answer_closes_the_upstream_connection() {
    use tokio::io::AsyncReadExt;
    // A replica that takes the request, never answers, and reports when
    // the gateway closes the connection (what stops a real one generating).
    let (got_request, request_arrived) = tokio::sync::oneshot::channel();
    let (closed_tx, closed) = tokio::sync::oneshot::channel();
    let signals = Arc::new(parking_lot::Mutex::new(Some((got_request, closed_tx))));
    // Other connections (the gateway probing the replica) come and go.
    let addr = raw_replica(move |mut stream| {
        let signals = Arc::clone(&signals);
        async move {
            let mut buf = [0u8; 4096];
            if !stream.read(&mut buf).await.is_ok_and(|n| n > 0) {
                return;
            }
            let Some((got_request, closed_tx)) = signals.lock().take() else {
                return;
            };
            got_request.send(()).unwrap();
            while stream.read(&mut buf).await.is_ok_and(|n| n > 0) {}
            let _ = closed_tx.send(());
        }
    })
    .await;
    let gw = Gateway::start(&config("", &plain_pool(&[&addr], "")))
        .await
        .unwrap();
    let url = format!("http://{}{CHAT}", gw.addr());
    let client_request = tokio::spawn(async move {
        let _ = client().post(url).body(r#"{"model":"m"}"#).send().await;
    });
    tokio::time::timeout(Duration::from_secs(10), request_arrived)
        .await
        .expect("the request never reached the replica")
        .unwrap();
    // The client goes away while the replica is still working.
    client_request.abort();
    tokio::time::timeout(Duration::from_secs(10), closed)
        .await
        .expect("the gateway kept the upstream connection open")
        .unwrap();
}

/// A replica that answers every request with end-to-end headers, some
/// twice, hop-by-hop ones, its own request id and a date.
async fn replica_with_headers() -> String {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\n\
        Content-Type: application/json\r\n\
        X-Replica: one\r\n\
        x-replica: two\r\n\
        Connection: keep-alive, X-Hop\r\n\
        X-Hop: secret\r\n\
        Keep-Alive: timeout=5\r\n\
        X-Request-Id: theirs\r\n\
        Date: Tue, 01 Jan 2030 00:00:00 GMT\r\n\
        Content-Length: 2\r\n\r\n{}";
    raw_replica(|stream| async move {
        let mut stream = BufReader::new(stream);
        loop {
            let mut length = 0;
            loop {
                let mut line = String::new();
                if stream.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            stream.read_exact(&mut body).await.unwrap();
            stream.get_mut().write_all(ANSWER).await.unwrap();
        }
    })
    .await
}

#[tokio::test]
async fn a_replicas_end_to_end_headers_reach_the_client_over_either_protocol() {
    let replica = replica_with_headers().await;
    let cfg = config("", &plain_pool(&[&replica], ""));
    let gw = Gateway::start(&cfg).await.unwrap();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    for (client, version) in [
        (client(), http::Version::HTTP_11),
        (h2, http::Version::HTTP_2),
    ] {
        let resp = client
            .post(format!("http://{}{CHAT}", gw.addr()))
            .header("x-request-id", "mine")
            .body(r#"{"model":"m"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.version(), version);
        assert_eq!(resp.status(), 200);
        let headers = resp.headers();
        let all = |name: &str| -> Vec<&str> {
            headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(all("x-replica"), ["one", "two"], "{version:?}");
        assert_eq!(all("content-type"), ["application/json"]);
        assert_eq!(all("date"), ["Tue, 01 Jan 2030 00:00:00 GMT"]);
        // The gateway's id replaces the replica's.
        assert_eq!(all("x-request-id"), ["mine"]);
        for hop in ["x-hop", "keep-alive"] {
            assert!(
                headers.get(hop).is_none(),
                "{hop} forwarded over {version:?}"
            );
        }
        assert!(
            all("connection").iter().all(|v| !v.contains("X-Hop")),
            "{version:?}"
        );
        assert_eq!(resp.bytes().await.unwrap(), "{}");
    }
}

#[tokio::test]
async fn at_the_connection_limit_new_connections_wait_for_a_free_slot() {
    use crate::support::{HEALTHZ, healthz_answered, logs::Logs};
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let (logs, _guard) = Logs::capture();
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config(
        "  limits: {maxConnections: 1}\n",
        &pool("p", "m", "", &[&a], "round-robin"),
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let mut first = TcpStream::connect(gw.addr()).await.unwrap();
    first.write_all(HEALTHZ).await.unwrap();
    healthz_answered(&mut first).await;
    // The kernel completes the second connection, but the gateway does
    // not take it while the first is open...
    let mut second = TcpStream::connect(gw.addr()).await.unwrap();
    second.write_all(HEALTHZ).await.unwrap();
    // ...though it goes on serving the first, asked after the second was.
    first.write_all(HEALTHZ).await.unwrap();
    healthz_answered(&mut first).await;
    let mut nothing = [0; 16];
    assert_eq!(
        second.try_read(&mut nothing).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock)
    );
    // A slot frees: the second is served.
    drop(first);
    healthz_answered(&mut second).await;
    // Said once, when the limit was reached, not per connection after.
    let warnings = logs.text().matches("connection limit reached").count();
    assert_eq!(warnings, 1, "{}", logs.text());
}

#[tokio::test]
async fn a_replica_error_in_another_shape_reaches_the_client_in_the_openai_shape() {
    let detail = FakeReplica::start(
        "a",
        Behaviour::Reply(
            http::StatusCode::NOT_FOUND,
            r#"{"detail":"Not Found"}"#.into(),
        ),
    )
    .await;
    let shaped = FakeReplica::start(
        "b",
        Behaviour::Reply(
            http::StatusCode::BAD_REQUEST,
            r#"{"error":{"message":"max_tokens is too large","type":"invalid_request_error","param":"max_tokens","code":null}}"#.into(),
        ),
    )
    .await;
    let gw = Gateway::start(&config(
        "",
        &(pool("a", "m-a", "", &[&detail], "round-robin")
            + &pool("b", "m-b", "", &[&shaped], "round-robin")),
    ))
    .await
    .unwrap();
    // Wrapped: the replica's status and message, in the shape SDKs read.
    let (status, body) = error_of(chat(&gw, "m-a").await).await;
    assert_eq!(status, 404);
    assert_eq!(body["error"]["message"], "Not Found");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    // Already OpenAI-shaped: passed on byte for byte.
    let resp = chat(&gw, "m-b").await;
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["param"], "max_tokens");
    assert_eq!(body["error"]["message"], "max_tokens is too large");
}
