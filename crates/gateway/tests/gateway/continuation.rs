//! Nothing lost mid-stream: an answer whose replica breaks or stalls after
//! it started goes on from another replica, and the client's one stream
//! holds exactly what a single uninterrupted run would have produced (the
//! simulator's answers are a deterministic function of its seed and the
//! prompt, and it continues a final assistant message from where it
//! stops).

use serde_json::{Value, json};

use super::support::*;
use gateway::Gateway;

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";

/// A simulated replica serving `m`, with `faults`.
async fn replica(faults: sim::Faults) -> sim::ReplicaHandle {
    replica_at_speed(faults, 50.0).await
}

/// The same, `time_scale` times faster than the GPU it simulates.
async fn replica_at_speed(faults: sim::Faults, time_scale: f64) -> sim::ReplicaHandle {
    sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale,
            faults,
            ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
        },
    )
    .await
    .unwrap()
}

/// A gateway over a round-robin pool of `replicas`, continuation settings
/// `extra` (a YAML flow mapping's fields, after the pool's).
async fn gateway(replicas: &[&sim::ReplicaHandle], extra: &str) -> Gateway {
    let addrs: Vec<String> = replicas
        .iter()
        .map(|r| r.local_addr().to_string())
        .collect();
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        &plain_pool(&addrs, extra),
    );
    Gateway::start(&cfg).await.unwrap()
}

/// The events of a stream, `[DONE]` as `Value::Null`.
fn events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .map(|d| {
            if d == "[DONE]" {
                Value::Null
            } else {
                serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}"))
            }
        })
        .collect()
}

/// What a stream says: its text, its ids, its finish reasons, its usage.
#[derive(Debug, PartialEq)]
struct Said {
    text: String,
    ids: Vec<String>,
    finishes: Vec<String>,
    usage: Vec<Value>,
    errors: Vec<Value>,
    done: usize,
}

fn said(stream: &str) -> Said {
    let mut s = Said {
        text: String::new(),
        ids: Vec::new(),
        finishes: Vec::new(),
        usage: Vec::new(),
        errors: Vec::new(),
        done: 0,
    };
    for event in events(stream) {
        if event.is_null() {
            s.done += 1;
            continue;
        }
        if let Some(error) = event.get("error") {
            s.errors.push(error.clone());
            continue;
        }
        if let Some(id) = event["id"].as_str()
            && !s.ids.iter().any(|i| i == id)
        {
            s.ids.push(id.to_owned());
        }
        for choice in event["choices"].as_array().into_iter().flatten() {
            let text = choice["delta"]["content"]
                .as_str()
                .or(choice["text"].as_str())
                .unwrap_or("");
            s.text.push_str(text);
            if let Some(f) = choice["finish_reason"].as_str() {
                s.finishes.push(f.to_owned());
            }
        }
        if event["usage"].is_object() {
            s.usage.push(event["usage"].clone());
        }
    }
    s
}

async fn post(addr: impl std::fmt::Display, path: &str, body: &Value) -> (u16, String) {
    let resp = client()
        .post(format!("http://{addr}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

fn migrations(metrics: &str, reason: &str, outcome: &str) -> f64 {
    let series = format!(
        "infergate_migrations_total{{pool=\"p\",reason=\"{reason}\",outcome=\"{outcome}\"}}"
    );
    sample(metrics, &series).unwrap_or(0.0)
}

/// A stream cut after a few tokens completes with exactly the text, the
/// finish and the usage of one uninterrupted run, under one id, for chat
/// and completions, with and without `max_tokens`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_midway_continues_on_another_replica_as_if_never_cut() {
    let cut = replica(sim::Faults {
        cut_after_tokens: Some(5),
        ..sim::Faults::default()
    })
    .await;
    let healthy = replica(sim::Faults::default()).await;
    let gw = gateway(&[&cut, &healthy], "").await;
    let usage = json!({"include_usage": true});
    let bodies = [
        (
            CHAT,
            json!({"model": "m", "stream": true, "max_tokens": 24, "stream_options": usage,
            "messages": [{"role": "user", "content": "tell me a story"}]}),
        ),
        (
            CHAT,
            json!({"model": "m", "stream": true, "stream_options": usage,
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why is the sky blue"}]}),
        ),
        (
            COMPLETIONS,
            json!({"model": "m", "stream": true, "max_tokens": 30, "stream_options": usage,
            "prompt": "Once upon a time"}),
        ),
        (
            CHAT,
            json!({"model": "m", "stream": true, "max_tokens": 12,
            "messages": [{"role": "user", "content": "no usage asked"}]}),
        ),
    ];
    for (path, body) in &bodies {
        let (status, single) = post(healthy.local_addr(), path, body).await;
        assert_eq!(status, 200);
        let single = said(&single);
        // Twice: round-robin sends one of the two to the replica that cuts.
        for round in 0..2 {
            let (status, through) = post(gw.addr(), path, body).await;
            assert_eq!(status, 200);
            let through = said(&through);
            assert_eq!(through.ids.len(), 1, "one id, round {round}: {through:?}");
            assert_eq!(through.text, single.text, "round {round}");
            assert_eq!(through.finishes, single.finishes, "round {round}");
            assert_eq!(through.done, 1, "round {round}");
            assert!(through.errors.is_empty(), "round {round}: {through:?}");
            assert_eq!(through.usage.len(), single.usage.len(), "round {round}");
            for (got, want) in through.usage.iter().zip(&single.usage) {
                assert_eq!(
                    got["completion_tokens"], want["completion_tokens"],
                    "round {round}"
                );
                // Derived from the continuation's prompt less the tokens
                // generated: the text so far may re-tokenize into a token
                // more or less than the model generated.
                let (got, want) = (
                    got["prompt_tokens"].as_i64().unwrap(),
                    want["prompt_tokens"].as_i64().unwrap(),
                );
                assert!(
                    (got - want).abs() <= 2,
                    "prompt tokens {got} vs {want}, round {round}"
                );
            }
        }
    }
    let metrics = admin_get(&gw, "/metrics").await;
    // Round-robin moves on with each continuation: at least one request
    // of each body's two met the replica that cuts.
    assert!(migrations(&metrics, "broken", "continued") >= bodies.len() as f64);
}

/// A non-streaming request whose replica dies before answering (it had
/// generated some tokens, none of which the client saw) is sent whole to
/// another replica: the client gets one complete answer, that of a single
/// run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_streaming_answer_whose_replica_dies_is_answered_whole_by_another() {
    let dies = replica(sim::Faults {
        cut_after_tokens: Some(4),
        ..sim::Faults::default()
    })
    .await;
    let healthy = replica(sim::Faults::default()).await;
    let gw = gateway(&[&dies, &healthy], "").await;
    let body = json!({"model": "m", "max_tokens": 20,
        "messages": [{"role": "user", "content": "answer at once"}]});
    let (status, single) = post(healthy.local_addr(), CHAT, &body).await;
    assert_eq!(status, 200);
    let single: Value = serde_json::from_str(&single).unwrap();
    // Twice: round-robin sends one of the two to the replica that dies.
    for round in 0..2 {
        let (status, through) = post(gw.addr(), CHAT, &body).await;
        assert_eq!(status, 200, "round {round}: {through}");
        let through: Value = serde_json::from_str(&through).unwrap();
        assert_eq!(
            through["choices"][0]["message"]["content"], single["choices"][0]["message"]["content"],
            "round {round}"
        );
        assert_eq!(through["usage"], single["usage"], "round {round}");
    }
    let metrics = admin_get(&gw, "/metrics").await;
    assert!(migrations(&metrics, "broken", "resent") >= 1.0, "{metrics}");
}

/// What a continuation would not give faithfully is not continued: the
/// stream ends with an error event in the OpenAI shape that says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_cannot_be_continued_ends_with_an_error_event_saying_why() {
    let cut = replica(sim::Faults {
        cut_after_tokens: Some(3),
        ..sim::Faults::default()
    })
    .await;
    let gw = gateway(&[&cut], "").await;
    let cases = [
        (json!({"n": 2}), "several choices"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
            "structured output",
        ),
        (json!({"logprobs": true}), "logprobs"),
    ];
    for (extra, why) in cases {
        let mut body = json!({"model": "m", "stream": true, "max_tokens": 20,
            "messages": [{"role": "user", "content": "hello"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, stream) = post(gw.addr(), CHAT, &body).await;
        assert_eq!(status, 200);
        let s = said(&stream);
        assert_eq!(s.errors.len(), 1, "{why}: {stream}");
        let message = s.errors[0]["message"].as_str().unwrap();
        assert!(message.contains(why), "{why}: {message}");
        assert_eq!(s.errors[0]["code"], "upstream_failed");
    }
    // With a replica to continue on but the attempts spent, the same.
    let metrics = admin_get(&gw, "/metrics").await;
    assert!(
        migrations(&metrics, "broken", "not_continued") >= 3.0,
        "{metrics}"
    );
}

/// A replica that stops sending mid-answer is abandoned after the pool's
/// idle limit, and the answer goes on from another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_is_abandoned_after_the_idle_limit_and_continued() {
    let stalled = replica(sim::Faults {
        stall_after_tokens: Some(4),
        ..sim::Faults::default()
    })
    .await;
    let healthy = replica(sim::Faults::default()).await;
    let gw = gateway(
        &[&stalled, &healthy],
        ", continuation: {idleTimeout: 300ms}",
    )
    .await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 16,
        "messages": [{"role": "user", "content": "stall here"}]});
    let (_, single) = post(healthy.local_addr(), CHAT, &body).await;
    for _ in 0..2 {
        let (status, through) = post(gw.addr(), CHAT, &body).await;
        assert_eq!(status, 200);
        assert_eq!(said(&through).text, said(&single).text);
        assert_eq!(said(&through).ids.len(), 1);
    }
    let metrics = admin_get(&gw, "/metrics").await;
    assert!(migrations(&metrics, "stalled", "continued") >= 1.0);
}

/// With continuation off, a cut stream ends with an error event, as
/// before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_continuation_off_a_cut_stream_ends_with_an_error_event() {
    let cut = replica(sim::Faults {
        cut_after_tokens: Some(3),
        ..sim::Faults::default()
    })
    .await;
    let healthy = replica(sim::Faults::default()).await;
    let gw = gateway(&[&cut, &healthy], ", continuation: {enabled: false}").await;
    let body = json!({"model": "m", "stream": true, "max_tokens": 20,
        "messages": [{"role": "user", "content": "hello"}]});
    let mut errors = 0;
    for _ in 0..2 {
        let (_, stream) = post(gw.addr(), CHAT, &body).await;
        errors += said(&stream).errors.len();
    }
    assert_eq!(errors, 1);
}

/// Evacuating a replica moves the streams it serves to another at once:
/// the client's stream goes on, whole, with one id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evacuated_replicas_stream_moves_to_another_at_once() {
    use futures_util::StreamExt;
    let a = replica_at_speed(sim::Faults::default(), 1.0).await;
    let b = replica_at_speed(sim::Faults::default(), 1.0).await;
    let addrs = [a.local_addr().to_string(), b.local_addr().to_string()];
    let pool = plain_pool(&[&addrs[0], &addrs[1]], "");
    let cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n  debug: {decisionHeaders: true}\n",
        &pool,
    );
    let gw = Gateway::start(&cfg).await.unwrap();
    let body = json!({"model": "m", "stream": true, "max_tokens": 300,
        "messages": [{"role": "user", "content": "a long answer"}]});
    let (_, single) = post(b.local_addr(), CHAT, &body).await;
    let resp = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let serving = resp.headers()["x-infergate-endpoint"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut stream = resp.bytes_stream();
    let mut text = Vec::new();
    let first = within(
        std::time::Duration::from_secs(10),
        "the first event",
        stream.next(),
    )
    .await
    .unwrap()
    .unwrap();
    text.extend_from_slice(&first);
    let admin = gw.admin_addr().unwrap();
    let drained = client()
        .post(format!("http://{admin}/admin/replicas/{serving}/drain"))
        .header("content-type", "application/json")
        .body(json!({"evacuate": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(drained.status(), 200);
    while let Some(chunk) = stream.next().await {
        text.extend_from_slice(&chunk.unwrap());
    }
    let through = said(std::str::from_utf8(&text).unwrap());
    assert_eq!(through.text, said(&single).text);
    assert_eq!(through.ids.len(), 1);
    assert!(through.errors.is_empty(), "{through:?}");
    let metrics = admin_get(&gw, "/metrics").await;
    assert_eq!(migrations(&metrics, "evacuated", "continued"), 1.0);
}
