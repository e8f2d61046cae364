//! The load summary global routers read from the admin listener: its
//! figures from replicas' metrics and the gateway's own counts, and the
//! stream's lines when the load changes.

use std::time::Duration;

use serde_json::Value;

use crate::support::{
    Behaviour, CHAT, FakeReplica, client, config, poll_until, vllm_metrics, within,
};

async fn summary(admin: std::net::SocketAddr) -> Value {
    client()
        .get(format!("http://{admin}/global/summary"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Reads a JSON-lines body line by line.
struct Lines {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Lines {
    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=end).collect();
                return serde_json::from_slice(&line).unwrap();
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("a line within 10 s")
                .unwrap()
                .expect("the stream goes on");
            self.buffer.extend_from_slice(&chunk);
        }
    }
}

#[tokio::test]
async fn the_summary_gives_each_models_load_and_its_recent_errors() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    a.set_metrics(&vllm_metrics(2, 3, 0.25, &[]));
    b.set_metrics(&vllm_metrics(1, 3, 0.75, &[]));
    let flaky = FakeReplica::start(
        "flaky",
        Behaviour::Reply(
            http::StatusCode::SERVICE_UNAVAILABLE,
            r#"{"error":{"message":"down"}}"#.into(),
        ),
    )
    .await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: llama, engine: vllm, models: [m], adapters: [sql], endpoints: [\"{}\", \"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n\
             \x20   - {{name: shaky, engine: none, models: [f], endpoints: [\"{}\"], scheduling: {{policy: round-robin}}}}\n",
            a.addr, b.addr, flaky.addr
        ),
    );
    let gw = gateway::Gateway::start(&cfg).await.unwrap();
    let admin = gw.admin_addr().unwrap();
    let public = gw.addr();
    for _ in 0..3 {
        let resp = client()
            .post(format!("http://{public}{CHAT}"))
            .json(&serde_json::json!({"model": "f", "messages": []}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503);
    }

    let got = poll_until(Duration::from_secs(10), "both replicas ready", || async {
        let s = summary(admin).await;
        if s["models"]["m"]["readyReplicas"] == 2 && s["models"]["f"]["errorRate"] == 1.0 {
            Ok(s)
        } else {
            Err(s.to_string())
        }
    })
    .await;
    let m = &got["models"]["m"];
    assert_eq!(m["pool"], "llama");
    assert_eq!(m["replicas"], 2);
    // Mean free KV share of the two: (0.75 + 0.25) / 2.
    assert_eq!(m["kvHeadroom"], 0.5);
    assert_eq!(m["queueDepth"], 3);
    assert_eq!(m["inFlight"], 0);
    assert_eq!(m["saturated"], false);
    assert_eq!(m["errorRate"], 0.0);
    // An adapter is listed under its own name, with its pool's load.
    assert_eq!(got["models"]["sql"]["queueDepth"], 3);
    let f = &got["models"]["f"];
    assert_eq!(f["pool"], "shaky");
    assert_eq!(f["throttleRate"], 0.0);
    // A pool without engine metrics says nothing of its KV cache.
    assert!(f.get("kvHeadroom").is_none(), "{f}");
    assert!(got["generation"].as_u64().unwrap() >= 1);
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let at = got["atUnixMs"].as_u64().unwrap();
    assert!(at <= now_ms && now_ms - at < 60_000, "{at} vs {now_ms}");
    gw.shutdown().await;
}

#[tokio::test]
async fn the_stream_says_at_once_when_the_load_changes_and_beats_while_it_does_not() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    a.set_metrics(&vllm_metrics(0, 1, 0.5, &[]));
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: llama, engine: vllm, models: [m], endpoints: [\"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n",
            a.addr
        ),
    );
    let gw = gateway::Gateway::start(&cfg).await.unwrap();
    let admin = gw.admin_addr().unwrap();
    let response = client()
        .get(format!("http://{admin}/global/summary/stream"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/x-ndjson");
    let mut lines = Lines {
        response,
        buffer: Vec::new(),
    };
    // Until the replica's first scrape is in (it is ready once reachable,
    // before its metrics are read: the pool picks without them).
    let mut line = lines.next().await;
    while line["models"]["m"]["readyReplicas"] != 1 || line["models"]["m"]["kvHeadroom"] != 0.5 {
        line = lines.next().await;
    }
    let before = line["generation"].as_u64().unwrap();

    // Nothing changes: heartbeats, with the same generation.
    let beat = lines.next().await;
    assert_eq!(beat["generation"].as_u64().unwrap(), before);
    assert!(beat["atUnixMs"].as_u64() > line["atUnixMs"].as_u64());

    // Its queue fills to the saturation threshold (5 waiting): the next
    // lines tell so, under a new generation.
    a.set_metrics(&vllm_metrics(5, 8, 1.0, &[]));
    let mut line = lines.next().await;
    while line["models"]["m"]["queueDepth"] != 5 {
        line = lines.next().await;
    }
    assert!(line["generation"].as_u64().unwrap() > before);
    assert_eq!(line["models"]["m"]["saturated"], true);
    assert_eq!(line["models"]["m"]["kvHeadroom"], 0.0);

    // An open stream does not hold the gateway's shutdown up: it ends.
    within(
        Duration::from_secs(5),
        "shutdown with a summary stream open",
        gw.shutdown(),
    )
    .await;
    let rest = within(Duration::from_secs(5), "the stream's end", async {
        while let Ok(Some(_)) = lines.response.chunk().await {}
    });
    rest.await;
}

#[tokio::test]
async fn the_summary_paths_answer_get_only() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &format!(
            "    - {{name: p, engine: none, models: [m], endpoints: [\"{}\"]}}\n",
            a.addr
        ),
    );
    let gw = gateway::Gateway::start(&cfg).await.unwrap();
    let admin = gw.admin_addr().unwrap();
    for path in ["/global/summary", "/global/summary/stream"] {
        let resp = client()
            .post(format!("http://{admin}{path}"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{path}");
    }
    gw.shutdown().await;
}
