//! Prefill and decode replicas speaking vLLM's (NixlConnector) and SGLang's
//! disaggregation protocols over real HTTP: the hand-off, the transfer in
//! place of the decode's prefill, and malformed or misdirected legs.

#[allow(dead_code)] // The helpers are shared with tests/http.rs, which uses the rest.
mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use serde_json::{Value, json};
use sim::{DisaggregationSpec, ReplicaSpec, Role};
use support::{Http, chat, replica};

/// Real time, so a long prompt's prefill (about 0.2 s on an H100) and its
/// transfer (about 20 ms over RDMA) are far apart on the wall clock.
fn spec(role: Role, time_scale: f64) -> ReplicaSpec {
    ReplicaSpec {
        time_scale,
        disaggregation: DisaggregationSpec {
            role,
            ..DisaggregationSpec::default()
        },
        ..ReplicaSpec::new("h100", "llama-3.1-8b")
    }
}

fn long_prompt() -> String {
    "the quarterly report says revenue grew while costs fell ".repeat(600)
}

/// Time to the first content token of a streamed chat.
async fn streamed_ttft(http: &Http, body: &Value) -> (Duration, usize) {
    let sent = Instant::now();
    let events = http.stream("/v1/chat/completions", body).await.all().await;
    let first = events
        .iter()
        .find(|e| {
            e.data != "[DONE]"
                && e.json()["choices"][0]["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
        })
        .expect("a content token");
    let tokens = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter(|e| {
            e.json()["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    (first.at - sent, tokens)
}

#[tokio::test]
async fn vllm_prefill_hands_its_kv_to_the_decode_which_skips_the_prefill() {
    let prefill = replica(spec(Role::Prefill, 1.0)).await;
    let decode = replica(spec(Role::Decode, 1.0)).await;
    let (p, d) = (
        Http::new(prefill.local_addr()),
        Http::new(decode.local_addr()),
    );

    let prefill_leg = chat(
        &long_prompt(),
        json!({"max_tokens": 1, "stream": false, "kv_transfer_params": {
            "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
            "remote_block_ids": null, "remote_host": null, "remote_port": null}}),
    );
    let reply = p.post_json("/v1/chat/completions", &prefill_leg).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let answer = reply.json();
    assert_eq!(answer["usage"]["completion_tokens"], 1);
    let prompt_tokens = answer["usage"]["prompt_tokens"].as_u64().unwrap();
    let params = answer["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["do_remote_decode"], false);
    assert!(
        params["remote_engine_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty())
    );
    assert_eq!(params["remote_host"], "127.0.0.1");
    assert_eq!(params["remote_port"], prefill.local_addr().port());
    assert_eq!(
        params["remote_block_ids"].as_array().unwrap().len() as u64,
        prompt_tokens.div_ceil(16)
    );

    // The prefill replica holds the prompt's KV for the decode.
    let kv_usage = |http: Http| async move {
        let metrics = http.metrics().await;
        metrics
            .matching("vllm:kv_cache_usage_perc", &[])
            .map(|sample| sample.value)
            .sum::<f64>()
    };
    assert!(
        kv_usage(Http::new(prefill.local_addr())).await > 0.0,
        "held for the decode"
    );

    // The decode leg pulls the held KV: its first token comes after the
    // transfer and one step, not after a prefill of the whole prompt.
    let decode_leg = chat(
        &long_prompt(),
        json!({"max_tokens": 8, "stream": true, "kv_transfer_params": params}),
    );
    let (remote_ttft, tokens) = streamed_ttft(&d, &decode_leg).await;
    assert_eq!(tokens, 8);
    assert_eq!(
        kv_usage(Http::new(prefill.local_addr())).await,
        0.0,
        "freed once pulled"
    );
    // The same params again name KV already pulled: vLLM's recompute
    // policy prefills here instead (a fresh replica, so no prefix cache).
    let fresh = replica(spec(Role::Decode, 1.0)).await;
    let (recomputed_ttft, tokens) =
        streamed_ttft(&Http::new(fresh.local_addr()), &decode_leg).await;
    assert_eq!(tokens, 8);
    assert!(
        remote_ttft * 3 < recomputed_ttft,
        "pulled {remote_ttft:?} vs recomputed {recomputed_ttft:?}"
    );
}

#[tokio::test]
async fn vllm_legs_sent_to_the_wrong_role_or_malformed_get_a_400() {
    let prefill = replica(spec(Role::Prefill, 50.0)).await;
    let decode = replica(spec(Role::Decode, 50.0)).await;
    let pull = json!({"max_tokens": 4, "kv_transfer_params": {"do_remote_prefill": true,
        "remote_engine_id": "x", "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 1}});
    let reply = Http::new(prefill.local_addr())
        .post_json("/v1/chat/completions", &chat("hi", pull))
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    let error = &reply.json()["error"];
    assert_eq!(error["type"], "BadRequestError");
    assert_eq!(error["param"], "kv_transfer_params");
    assert!(
        error["message"].as_str().unwrap().contains("prefill role"),
        "{error}"
    );

    let reply = Http::new(decode.local_addr())
        .post_json(
            "/v1/chat/completions",
            &chat(
                "hi",
                json!({"kv_transfer_params": {"do_remote_prefill": true}}),
            ),
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply.text().contains("remote_engine_id"),
        "{}",
        reply.text()
    );
}

fn bootstrap(prefill: std::net::SocketAddr, room: u64) -> Value {
    json!({"bootstrap_host": prefill.ip().to_string(), "bootstrap_port": 8998, "bootstrap_room": room})
}

#[tokio::test]
async fn sglang_prefill_and_decode_pair_by_room() {
    let prefill = replica(spec(Role::Prefill, 1.0)).await;
    let decode = replica(spec(Role::Decode, 1.0)).await;
    let (p, d) = (
        Http::new(prefill.local_addr()),
        Http::new(decode.local_addr()),
    );
    let mut body = chat(&long_prompt(), json!({"max_tokens": 8, "stream": true}));
    body.as_object_mut().unwrap().extend(
        bootstrap(prefill.local_addr(), 0x5eed)
            .as_object()
            .unwrap()
            .clone(),
    );

    let prefill_leg = async {
        let reply = p.post_json("/v1/chat/completions", &body).await;
        (reply, Instant::now())
    };
    let decode_leg = async { d.stream("/v1/chat/completions", &body).await.all().await };
    let ((prefill_reply, prefill_done), events) = tokio::join!(prefill_leg, decode_leg);
    assert_eq!(
        prefill_reply.status,
        StatusCode::OK,
        "{}",
        prefill_reply.text()
    );
    assert_eq!(prefill_reply.json()["usage"]["completion_tokens"], 1);
    let content: Vec<_> = events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter(|e| {
            e.json()["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .collect();
    assert_eq!(content.len(), 8, "the decode's answer is the whole answer");
    // The decode waited for its room's prefill and the transfer after it.
    assert!(
        content[0].at > prefill_done,
        "the decode answered before its prefill"
    );
    // The decode pulled the prefill's KV: the prefill holds none now.
    let usage = p.metrics().await;
    let held: f64 = usage
        .matching("vllm:kv_cache_usage_perc", &[])
        .map(|sample| sample.value)
        .sum();
    assert_eq!(held, 0.0);
}

#[tokio::test]
async fn an_sglang_decode_whose_prefill_never_comes_fails_once_the_bootstrap_times_out() {
    // 300 engine seconds of bootstrap timeout at 2,000× pass in 0.15 s.
    let decode = replica(spec(Role::Decode, 2000.0)).await;
    let prefill = replica(spec(Role::Prefill, 2000.0)).await;
    let mut body = chat("hello", json!({"max_tokens": 4}));
    body.as_object_mut().unwrap().extend(
        bootstrap(prefill.local_addr(), 77)
            .as_object()
            .unwrap()
            .clone(),
    );
    let reply = Http::new(decode.local_addr())
        .post_json("/v1/chat/completions", &body)
        .await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        reply.text().contains("bootstrap room 77"),
        "{}",
        reply.text()
    );

    // A prefill named at the wrong bootstrap port refuses the leg.
    body["bootstrap_port"] = json!(9000);
    let reply = Http::new(prefill.local_addr())
        .post_json("/v1/chat/completions", &body)
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.json()["error"]["param"], "bootstrap_host");
}
