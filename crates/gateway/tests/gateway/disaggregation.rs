//! Prefill/decode disaggregation against simulated replicas in both
//! protocols: the decode replica picked first, the decider, each leg's
//! body, the faults of either leg, and a client that goes away.

use std::time::Duration;

use serde_json::{Value, json};

use super::support::logs::Logs;
use super::support::*;
use gateway::Gateway;

/// A simulated replica of `role` serving `m`, `time_scale` times faster
/// than an H100.
async fn replica(role: sim::Role, time_scale: f64, faults: sim::Faults) -> sim::ReplicaHandle {
    sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale,
            faults,
            disaggregation: sim::DisaggregationSpec {
                role,
                ..sim::DisaggregationSpec::default()
            },
            ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
        },
    )
    .await
    .unwrap()
}

/// A gateway whose pool decodes on `decode` and prefills on `prefill`,
/// speaking `protocol`; `extra` goes into `disaggregation`.
async fn gateway(decode: &[String], prefill: &[String], protocol: &str, extra: &str) -> Gateway {
    let list = |addrs: &[String]| {
        addrs
            .iter()
            .map(|a| format!("\"{a}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let pool = format!(
        "    - {{name: p, engine: none, models: [m], endpoints: [{}], scheduling: {{policy: round-robin}}, disaggregation: {{protocol: {protocol}, prefill: {{endpoints: [{}]}}{extra}}}}}\n",
        list(decode),
        list(prefill)
    );
    Gateway::start(&config("  admin: {address: \"127.0.0.1:0\"}\n", &pool))
        .await
        .unwrap()
}

fn addr(replica: &sim::ReplicaHandle) -> String {
    replica.local_addr().to_string()
}

/// About 4,000 tokens: well past the decider's default of 512.
fn long_prompt() -> String {
    "the quarterly report says revenue grew while costs fell ".repeat(400)
}

fn chat_body(prompt: &str, stream: bool) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 8, "stream": stream, "stream_options": {"include_usage": true}})
}

async fn post(gw: &Gateway, body: &Value) -> reqwest::Response {
    client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("x-request-id", "pd-1")
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The content tokens of a streamed chat answer.
fn streamed_tokens(text: &str) -> usize {
    text.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count()
}

/// Prompt tokens the replica's engine has computed or taken (prefills
/// and remote prefills alike count the prompt once it produced a token).
async fn requests_done(replica: &sim::ReplicaHandle) -> f64 {
    sim_metric(replica, "vllm:request_success_total", "").await
}

#[tokio::test]
async fn vllm_a_long_prompt_is_prefilled_on_the_prefill_replica_and_streamed_by_the_decode() {
    let (logs, _guard) = Logs::capture();
    let prefill = replica(sim::Role::Prefill, 50.0, sim::Faults::default()).await;
    let decode = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    let gw = gateway(&[addr(&decode)], &[addr(&prefill)], "vllm", "").await;

    let resp = post(&gw, &chat_body(&long_prompt(), true)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert_eq!(streamed_tokens(&text), 8, "{text}");
    assert!(
        text.contains("\"usage\""),
        "the client's stream options reach the decode"
    );

    let line = logs.wait_for_access(1).await.remove(0);
    assert_eq!(line["disaggregation"], "remote", "{line}");
    assert_eq!(line["prefill"], addr(&prefill));
    assert_eq!(line["endpoint"], addr(&decode));
    assert!(line["prefill_ms"].as_f64().unwrap() > 0.0, "{line}");
    assert!(line["decode_ttft_ms"].as_f64().is_some(), "{line}");
    assert_eq!(requests_done(&prefill).await, 1.0);
    assert_eq!(requests_done(&decode).await, 1.0);

    // The fleet page's data shows each replica's role.
    let pools = debug_pools(&gw).await;
    let pool = &pools["pools"][0];
    assert_eq!(pool["endpoints"][0]["role"], "decode");
    assert_eq!(pool["disaggregation"]["protocol"], "vllm");
    assert_eq!(
        pool["disaggregation"]["prefill"][0]["address"],
        addr(&prefill)
    );
    assert_eq!(pool["disaggregation"]["prefill"][0]["role"], "prefill");
    assert_eq!(pool["disaggregation"]["prefill"][0]["inflightRequests"], 0);

    let metrics = admin_get(&gw, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            r#"infergate_disaggregation_legs_total{pool="p",role="prefill",outcome="sent"}"#
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"infergate_disaggregation_legs_total{pool="p",role="decode",outcome="remote"}"#
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn vllm_the_prefill_leg_is_one_token_whole_with_the_same_request_id() {
    // A prefill replica that records what it got, answering as vLLM does.
    let answer = json!({"id": "x", "object": "chat.completion", "choices": [],
        "kv_transfer_params": {"do_remote_prefill": true, "do_remote_decode": false,
            "remote_engine_id": "e-1", "remote_block_ids": [7, 8], "remote_host": "10.0.0.9",
            "remote_port": 5600, "tp_size": 1}});
    let prefill = FakeReplica::start(
        "prefill",
        Behaviour::Reply(http::StatusCode::OK, answer.to_string()),
    )
    .await;
    let decode = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    let gw = gateway(&[addr(&decode)], &[prefill.addr.to_string()], "vllm", "").await;

    let resp = post(&gw, &chat_body(&long_prompt(), true)).await;
    assert_eq!(resp.status(), 200);
    // The decode replica finds no such KV and recomputes, as vLLM does.
    assert_eq!(streamed_tokens(&resp.text().await.unwrap()), 8);

    let got = prefill.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].headers["x-request-id"], "pd-1");
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["max_tokens"], 1);
    assert_eq!(body["stream"], false);
    assert!(body.get("stream_options").is_none(), "{body}");
    assert_eq!(
        body["kv_transfer_params"],
        json!({"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
            "remote_block_ids": null, "remote_host": null, "remote_port": null})
    );
    assert_eq!(body["messages"][0]["content"], long_prompt());
}

#[tokio::test]
async fn the_decider_leaves_a_short_prompt_to_the_decode_replica() {
    let (logs, _guard) = Logs::capture();
    let prefill = replica(sim::Role::Prefill, 50.0, sim::Faults::default()).await;
    let decode = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    let gw = gateway(&[addr(&decode)], &[addr(&prefill)], "vllm", "").await;

    let resp = post(&gw, &chat_body("Say hello.", false)).await;
    assert_eq!(resp.status(), 200);
    let line = logs.wait_for_access(1).await.remove(0);
    assert_eq!(line["disaggregation"], "skipped", "{line}");
    assert!(line["uncached_tokens"].as_u64().unwrap() < 512, "{line}");
    assert!(line.get("prefill").is_none());
    assert_eq!(requests_done(&prefill).await, 0.0);
    assert_eq!(requests_done(&decode).await, 1.0);
    let metrics = admin_get(&gw, "/metrics").await;
    for (role, outcome) in [("prefill", "skipped"), ("decode", "local")] {
        let series = format!(
            r#"infergate_disaggregation_legs_total{{pool="p",role="{role}",outcome="{outcome}"}}"#
        );
        assert_eq!(sample(&metrics, &series), Some(1.0), "{series}");
    }

    // A threshold of 0 sends every prompt through a prefill replica.
    let gw = gateway(
        &[addr(&decode)],
        &[addr(&prefill)],
        "vllm",
        ", decider: {minUncachedTokens: 0}",
    )
    .await;
    assert_eq!(
        post(&gw, &chat_body("Say hello.", false)).await.status(),
        200
    );
    assert_eq!(requests_done(&prefill).await, 1.0);
}

#[tokio::test]
async fn vllm_a_failing_prefill_replica_is_passed_over_then_the_decode_does_it_all() {
    let (logs, _guard) = Logs::capture();
    let failing = sim::Faults {
        error_rate: 1.0,
        ..sim::Faults::default()
    };
    let broken = replica(sim::Role::Prefill, 50.0, failing.clone()).await;
    let good = replica(sim::Role::Prefill, 50.0, sim::Faults::default()).await;
    let decode = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    // The broken replica is tried first: it is listed first and both are idle.
    let gw = gateway(&[addr(&decode)], &[addr(&broken), addr(&good)], "vllm", "").await;
    let resp = post(&gw, &chat_body(&long_prompt(), true)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(streamed_tokens(&resp.text().await.unwrap()), 8);
    let line = logs.wait_for_access(1).await.remove(0);
    assert_eq!(line["disaggregation"], "remote", "{line}");
    assert_eq!(line["prefill"], addr(&good));
    assert_eq!(requests_done(&good).await, 1.0);

    // Every prefill replica failing (one refused, one dead): the decode
    // replica prefills and answers alone, once.
    let gw = gateway(
        &[addr(&decode)],
        &[addr(&broken), closed_port().await],
        "vllm",
        "",
    )
    .await;
    let resp = post(&gw, &chat_body(&long_prompt(), true)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(streamed_tokens(&resp.text().await.unwrap()), 8);
    let line = logs.wait_for_access(2).await.remove(1);
    assert_eq!(line["disaggregation"], "fallback", "{line}");
    assert_eq!(requests_done(&decode).await, 2.0);
    let metrics = admin_get(&gw, "/metrics").await;
    assert_eq!(
        sample(
            &metrics,
            r#"infergate_disaggregation_legs_total{pool="p",role="prefill",outcome="failed"}"#
        ),
        Some(2.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn vllm_a_prefill_past_its_timeout_gives_way_to_the_decode_replica() {
    let hanging = sim::Faults {
        hang: true,
        ..sim::Faults::default()
    };
    let stuck = replica(sim::Role::Prefill, 50.0, hanging).await;
    let decode = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    let gw = gateway(
        &[addr(&decode)],
        &[addr(&stuck)],
        "vllm",
        ", prefillTimeout: 200ms",
    )
    .await;
    let resp = within(
        Duration::from_secs(10),
        "the answer",
        post(&gw, &chat_body(&long_prompt(), false)),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 8);
}

#[tokio::test]
async fn sglang_both_legs_go_at_once_and_the_decodes_answer_is_returned() {
    let (logs, _guard) = Logs::capture();
    let prefill = replica(sim::Role::Prefill, 50.0, sim::Faults::default()).await;
    let decode = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    let gw = gateway(&[addr(&decode)], &[addr(&prefill)], "sglang", "").await;

    for stream in [true, false] {
        let resp = post(&gw, &chat_body(&long_prompt(), stream)).await;
        assert_eq!(resp.status(), 200);
        let text = resp.text().await.unwrap();
        if stream {
            assert_eq!(streamed_tokens(&text), 8, "{text}");
        } else {
            let answer: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                answer["usage"]["completion_tokens"], 8,
                "the decode's, not the prefill's one token"
            );
        }
    }
    let lines = logs.wait_for_access(2).await;
    for line in &lines {
        assert_eq!(line["disaggregation"], "remote", "{line}");
        assert_eq!(line["prefill"], addr(&prefill));
    }
    assert_eq!(requests_done(&prefill).await, 2.0);
    assert_eq!(requests_done(&decode).await, 2.0);
}

#[tokio::test]
async fn sglang_a_failed_prefill_cancels_the_decode_leg_which_goes_again_alone() {
    let (logs, _guard) = Logs::capture();
    let failing = sim::Faults {
        error_rate: 1.0,
        ..sim::Faults::default()
    };
    let prefill = replica(sim::Role::Prefill, 50.0, failing).await;
    let decode = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    let gw = gateway(&[addr(&decode)], &[addr(&prefill)], "sglang", "").await;
    let resp = within(
        Duration::from_secs(10),
        "the decode alone",
        post(&gw, &chat_body(&long_prompt(), true)),
    )
    .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(streamed_tokens(&resp.text().await.unwrap()), 8);
    let line = logs.wait_for_access(1).await.remove(0);
    assert_eq!(line["disaggregation"], "fallback", "{line}");
    // The decode leg waiting for its room was cancelled before it
    // generated anything: one answer, generated once.
    assert_eq!(requests_done(&decode).await, 1.0);
    assert_eq!(
        sim_metric(&decode, "vllm:request_success_total", "abort").await,
        0.0
    );
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_both_legs() {
    // Real time: the prefill of a long prompt takes a while.
    let prefill = replica(sim::Role::Prefill, 0.2, sim::Faults::default()).await;
    let decode = replica(sim::Role::Decode, 0.2, sim::Faults::default()).await;
    for protocol in ["vllm", "sglang"] {
        let gw = gateway(&[addr(&decode)], &[addr(&prefill)], protocol, "").await;
        let before = sim_metric(&prefill, "vllm:request_success_total", "abort").await;
        let sent = tokio::spawn({
            let url = format!("http://{}{CHAT}", gw.addr());
            let body = chat_body(&long_prompt(), true);
            async move { client().post(url).json(&body).send().await }
        });
        poll_until(Duration::from_secs(10), "the prefill running", || async {
            let running = sim_metric(&prefill, "vllm:num_requests_running", "").await;
            if running > 0.0 {
                Ok(())
            } else {
                Err(format!("{running} running"))
            }
        })
        .await;
        sent.abort();
        poll_until(Duration::from_secs(10), "the prefill aborted", || async {
            let aborted = sim_metric(&prefill, "vllm:request_success_total", "abort").await;
            if aborted > before {
                Ok(())
            } else {
                Err(format!("{aborted} aborted"))
            }
        })
        .await;
        poll_until(Duration::from_secs(10), "nothing left running", || async {
            let running = sim_metric(&prefill, "vllm:num_requests_running", "").await
                + sim_metric(&decode, "vllm:num_requests_running", "").await;
            if running == 0.0 {
                Ok(())
            } else {
                Err(format!("{running} running"))
            }
        })
        .await;
        assert_eq!(
            sim_metric(&decode, "vllm:request_success_total", "length").await,
            0.0,
            "{protocol}: the decode generated nothing"
        );
    }
}

#[tokio::test]
async fn a_decode_that_breaks_mid_stream_is_continued_from_the_clients_request() {
    let (logs, _guard) = Logs::capture();
    let cut = sim::Faults {
        cut_after_tokens: Some(3),
        ..sim::Faults::default()
    };
    let prefill = replica(sim::Role::Prefill, 50.0, sim::Faults::default()).await;
    let breaking = replica(sim::Role::Decode, 50.0, cut).await;
    let steady = replica(sim::Role::Decode, 50.0, sim::Faults::default()).await;
    for protocol in ["vllm", "sglang"] {
        let gw = gateway(
            &[addr(&breaking), addr(&steady)],
            &[addr(&prefill)],
            protocol,
            "",
        )
        .await;
        // Round-robin: one of the two goes to the replica that breaks.
        for _ in 0..2 {
            let resp = within(
                Duration::from_secs(10),
                "a whole answer",
                post(&gw, &chat_body(&long_prompt(), true)),
            )
            .await;
            assert_eq!(resp.status(), 200);
            let text = resp.text().await.unwrap();
            assert_eq!(streamed_tokens(&text), 8, "{protocol}: {text}");
        }
    }
    let lines = logs.wait_for_access(4).await;
    // Every answer the breaking replica started was continued elsewhere.
    for line in &lines {
        match line.get("moved") {
            Some(moved) => assert!(
                moved.as_str().unwrap().starts_with(&addr(&breaking)),
                "{line}"
            ),
            None => assert_eq!(line["endpoint"], addr(&steady), "{line}"),
        }
    }
    assert!(
        lines.iter().filter(|l| l.get("moved").is_some()).count() >= 2,
        "{lines:?}"
    );
}
