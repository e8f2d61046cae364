//! What a gateway's failover meets, over real HTTP: continuations that
//! resume an answer exactly where a dead replica left it, replicas that die
//! (`cut_after_tokens`, `crash_after_tokens`) or freeze
//! (`stall_after_tokens`) mid-answer, and graceful stops.

#[allow(dead_code)] // The helpers are shared with tests/http.rs, which uses the rest.
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use sim::{Dialect, FaultsUpdate, FleetSpec, ReplicaSpec, start_fleet};
use support::{Http, MODEL, Sse, chat, fast_spec, replica};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Fast enough that answers of a few hundred tokens take well under a second.
fn quick(seed: u64) -> ReplicaSpec {
    ReplicaSpec {
        time_scale: 200.0,
        seed,
        ..fast_spec()
    }
}

/// The first `k` words of an answer's text (words are joined by single
/// spaces, the first has none before it).
fn first_words(text: &str, k: usize) -> String {
    text.split(' ').take(k).collect::<Vec<_>>().join(" ")
}

/// A stream's chunks up to `[DONE]` (the bool is true) or the end of the
/// body, a broken body included (false).
async fn collect(mut stream: Sse) -> (Vec<Value>, bool) {
    let mut chunks = Vec::new();
    loop {
        match stream.try_next().await {
            Ok(Some(event)) if event.data == "[DONE]" => {
                assert!(stream.next().await.is_none(), "nothing after [DONE]");
                return (chunks, true);
            }
            Ok(Some(event)) => chunks.push(event.json()),
            Ok(None) | Err(_) => return (chunks, false),
        }
    }
}

/// The text a chat or completion stream's chunks carry.
fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| {
            let choice = c["choices"].get(0)?;
            choice["delta"]["content"]
                .as_str()
                .or(choice["text"].as_str())
        })
        .collect()
}

fn finish_reason(chunks: &[Value]) -> Option<String> {
    chunks.iter().find_map(|c| {
        c["choices"]
            .get(0)?
            .get("finish_reason")?
            .as_str()
            .map(str::to_owned)
    })
}

fn messages_with(answer: &str) -> Value {
    json!([
        {"role": "system", "content": "Be thorough."},
        {"role": "user", "content": "Explain how a paged KV cache works."},
        {"role": "assistant", "content": answer},
    ])
}

/// The conversation [`messages_with`] continues.
fn conversation() -> Value {
    json!(messages_with("").as_array().unwrap()[..2])
}

#[tokio::test]
async fn a_chat_continuation_joins_into_the_single_run() {
    for seed in [0, 7, 1234] {
        let replica = replica(quick(seed)).await;
        let http = Http::new(replica.local_addr());
        let question = json!({"model": MODEL, "messages": conversation()});

        // The single run, without max_tokens: the model stops by itself.
        let single = http
            .post_json("/v1/chat/completions", &question)
            .await
            .json();
        let text = single["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let length = single["usage"]["completion_tokens"].as_u64().unwrap() as usize;
        assert_eq!(single["choices"][0]["finish_reason"], "stop");
        assert!(length >= 2, "seed {seed}: a long enough answer");

        for k in [1, 2, length / 2, length - 1] {
            let partial = first_words(&text, k);
            let body = json!({
                "model": MODEL,
                "messages": messages_with(&partial),
                "continue_final_message": true,
                "add_generation_prompt": false,
            });
            // As the engine counts it: the conversation with the open message.
            let tokenized = http
                .post_json(
                    "/tokenize",
                    &json!({"model": MODEL, "messages": messages_with(&partial),
                            "continue_final_message": true, "add_generation_prompt": false}),
                )
                .await
                .json();

            let rest = http.post_json("/v1/chat/completions", &body).await.json();
            let choice = &rest["choices"][0];
            assert_eq!(
                format!(
                    "{partial}{}",
                    choice["message"]["content"].as_str().unwrap()
                ),
                text,
                "seed {seed}, k {k}"
            );
            assert_eq!(choice["finish_reason"], "stop");
            assert_eq!(rest["usage"]["completion_tokens"], length - k);
            assert_eq!(rest["usage"]["prompt_tokens"], tokenized["count"]);

            let mut streaming = body.clone();
            streaming["stream"] = json!(true);
            streaming["stream_options"] = json!({"include_usage": true});
            let (chunks, done) =
                collect(http.stream("/v1/chat/completions", &streaming).await).await;
            assert!(done);
            assert_eq!(format!("{partial}{}", streamed_text(&chunks)), text);
            assert_eq!(finish_reason(&chunks).as_deref(), Some("stop"));
            let usage = &chunks.last().unwrap()["usage"];
            assert_eq!(usage["completion_tokens"], length - k);
            assert_eq!(usage["prompt_tokens"], tokenized["count"]);
        }

        // With max_tokens M, the continuation asks for M - k and gets them all.
        let mut limited = question.clone();
        limited["max_tokens"] = json!(40);
        let single = http
            .post_json("/v1/chat/completions", &limited)
            .await
            .json();
        let text = single["choices"][0]["message"]["content"].as_str().unwrap();
        let partial = first_words(text, 15);
        let body = json!({
            "model": MODEL,
            "messages": messages_with(&partial),
            "continue_final_message": true,
            "add_generation_prompt": false,
            "max_completion_tokens": 25,
            "stream": true,
        });
        let (chunks, done) = collect(http.stream("/v1/chat/completions", &body).await).await;
        assert!(done);
        assert_eq!(format!("{partial}{}", streamed_text(&chunks)), text);
        assert_eq!(finish_reason(&chunks).as_deref(), Some("length"));
    }
}

#[tokio::test]
async fn a_final_assistant_message_is_continued_by_llamacpp_only() {
    let question = json!({
        "model": MODEL,
        "messages": conversation(),
        "max_tokens": 30,
    });
    let mut texts = Vec::new();
    for dialect in [Dialect::Vllm, Dialect::Llamacpp] {
        let replica = replica(ReplicaSpec {
            dialect,
            ..quick(3)
        })
        .await;
        let http = Http::new(replica.local_addr());
        let single = http
            .post_json("/v1/chat/completions", &question)
            .await
            .json();
        let text = single["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let partial = first_words(&text, 10);
        let body = json!({"model": MODEL, "messages": messages_with(&partial), "max_tokens": 20});
        let rest = http.post_json("/v1/chat/completions", &body).await.json();
        let rest = rest["choices"][0]["message"]["content"].as_str().unwrap();
        texts.push((text.clone(), format!("{partial}{rest}")));
    }
    let (vllm_single, vllm_joined) = &texts[0];
    assert_ne!(vllm_single, vllm_joined, "vLLM answers with a new turn");
    let (llamacpp_single, llamacpp_joined) = &texts[1];
    assert_eq!(llamacpp_single, llamacpp_joined, "llama.cpp continues");
}

#[tokio::test]
async fn a_completion_continuation_joins_as_text_or_token_ids() {
    for seed in [1, 99] {
        let replica = replica(quick(seed)).await;
        let http = Http::new(replica.local_addr());
        for prompt in ["Once upon a time", "Q: what is a KV cache?\nA: "] {
            let single = http
                .post_json(
                    "/v1/completions",
                    &json!({"model": MODEL, "prompt": prompt, "return_token_ids": true}),
                )
                .await
                .json();
            let choice = &single["choices"][0];
            let text = choice["text"].as_str().unwrap().to_owned();
            let ids: Vec<u64> = serde_json::from_value(choice["token_ids"].clone()).unwrap();
            let prompt_ids: Vec<u64> =
                serde_json::from_value(choice["prompt_token_ids"].clone()).unwrap();
            let length = single["usage"]["completion_tokens"].as_u64().unwrap() as usize;
            assert_eq!(ids.len(), length);
            assert_eq!(
                prompt_ids.len() as u64,
                single["usage"]["prompt_tokens"].as_u64().unwrap()
            );
            assert_eq!(choice["finish_reason"], "stop");

            for k in [1, length / 3, length - 1] {
                let k = k.max(1);
                let partial = first_words(&text, k);
                // As text: the prompt and the text so far.
                let body = json!({"model": MODEL, "prompt": format!("{prompt}{partial}"),
                                  "stream": true, "stream_options": {"include_usage": true}});
                let (chunks, done) = collect(http.stream("/v1/completions", &body).await).await;
                assert!(done);
                assert_eq!(
                    format!("{partial}{}", streamed_text(&chunks)),
                    text,
                    "seed {seed}, {prompt:?}, k {k}"
                );
                assert_eq!(finish_reason(&chunks).as_deref(), Some("stop"));
                let usage = &chunks.last().unwrap()["usage"];
                assert_eq!(usage["completion_tokens"], length - k);

                // As ids: the prompt's and the answer's so far.
                let carried: Vec<u64> = prompt_ids.iter().chain(&ids[..k]).copied().collect();
                let body = json!({"model": MODEL, "prompt": carried, "return_token_ids": true});
                let rest = http.post_json("/v1/completions", &body).await.json();
                let choice = &rest["choices"][0];
                assert_eq!(
                    format!("{partial}{}", choice["text"].as_str().unwrap()),
                    text
                );
                assert_eq!(choice["token_ids"], json!(ids[k..]));
                assert_eq!(choice["prompt_token_ids"], json!(carried));
                assert_eq!(rest["usage"]["prompt_tokens"], carried.len());
                assert_eq!(rest["usage"]["completion_tokens"], length - k);
            }
        }
    }
}

#[tokio::test]
async fn token_ids_are_streamed_per_chunk() {
    let replica = replica(quick(0)).await;
    let http = Http::new(replica.local_addr());
    let body = chat(
        "hello",
        json!({"max_tokens": 6, "stream": true, "return_token_ids": true}),
    );
    let (chunks, done) = collect(http.stream("/v1/chat/completions", &body).await).await;
    assert!(done);
    let tokenized = http
        .post_json("/tokenize", &chat("hello", json!({})))
        .await
        .json();
    assert_eq!(chunks[0]["prompt_token_ids"], tokenized["tokens"]);
    assert!(
        chunks[1..]
            .iter()
            .all(|c| c.get("prompt_token_ids").is_none())
    );
    let ids: Vec<Value> = chunks[1..]
        .iter()
        .flat_map(|c| c["choices"][0]["token_ids"].as_array().unwrap().clone())
        .collect();
    assert_eq!(ids.len(), 6);
    let text = streamed_text(&chunks);
    let retokenized = http
        .post_json("/tokenize", &json!({"model": MODEL, "prompt": text}))
        .await
        .json();
    // The answer's ids are its text's, after the prompt's begin-of-text.
    assert_eq!(
        json!(ids),
        json!(retokenized["tokens"].as_array().unwrap()[1..])
    );
}

/// A slow replica with `faults` in force from the start: 20 tokens take a
/// fraction of a second, and an answer of 10,000 never ends within a test.
async fn faulty(faults: FaultsUpdate) -> (sim::ReplicaHandle, Http) {
    let replica = replica(ReplicaSpec {
        time_scale: 20.0,
        ..fast_spec()
    })
    .await;
    replica.set_faults(&faults).unwrap();
    let http = Http::new(replica.local_addr());
    (replica, http)
}

fn long_chat(stream: bool) -> Value {
    chat(
        "Go on for a long time.",
        json!({"max_tokens": 10_000, "stream": stream}),
    )
}

/// Sends `body` to `path` on a fresh connection and reads until the server
/// closes it: the raw bytes, chunked framing included.
async fn raw_post(addr: SocketAddr, path: &str, body: &Value) -> Vec<u8> {
    let body = serde_json::to_vec(body).unwrap();
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&body).await.unwrap();
    let mut received = Vec::new();
    socket.read_to_end(&mut received).await.unwrap();
    received
}

#[tokio::test]
async fn cut_after_tokens_breaks_the_stream_after_exactly_that_many() {
    let (replica, http) = faulty(FaultsUpdate {
        cut_after_tokens: Some(Some(5)),
        ..FaultsUpdate::default()
    })
    .await;
    assert_eq!(
        http.get("/admin/faults").await.json()["cut_after_tokens"],
        5
    );

    let (chunks, done) = collect(http.stream("/v1/chat/completions", &long_chat(true)).await).await;
    assert!(!done, "no [DONE]");
    assert_eq!(chunks.len(), 6, "the role chunk and five tokens");
    assert_eq!(streamed_text(&chunks).split(' ').count(), 5);
    assert_eq!(finish_reason(&chunks), None, "no closing chunk");

    // On the wire: the events, then the connection closes without the
    // chunked body's terminating zero-length chunk.
    let raw = raw_post(
        replica.local_addr(),
        "/v1/completions",
        &json!({
            "model": MODEL, "prompt": "Go on.", "max_tokens": 10_000, "stream": true,
        }),
    )
    .await;
    let raw = String::from_utf8(raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 200 OK"), "{raw}");
    assert!(raw.contains("transfer-encoding: chunked"), "{raw}");
    assert_eq!(raw.matches("data: {").count(), 5, "{raw}");
    assert!(!raw.contains("[DONE]"));
    assert!(!raw.ends_with("0\r\n\r\n"), "{raw}");

    // Without streaming: no response at all.
    let raw = raw_post(
        replica.local_addr(),
        "/v1/chat/completions",
        &long_chat(false),
    )
    .await;
    assert!(raw.is_empty(), "{}", String::from_utf8_lossy(&raw));

    // An answer of at most five tokens is untouched, and the replica lives on.
    let short = chat("hi", json!({"max_tokens": 5, "stream": true}));
    let (chunks, done) = collect(http.stream("/v1/chat/completions", &short).await).await;
    assert!(done);
    assert_eq!(finish_reason(&chunks).as_deref(), Some("length"));
    let reply = http
        .post_json(
            "/v1/chat/completions",
            &chat("hi", json!({"max_tokens": 4})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);

    // Turned off with null.
    let off = http
        .post_json("/admin/faults", &json!({"cut_after_tokens": null}))
        .await;
    assert_eq!(off.json()["cut_after_tokens"], Value::Null);
    let body = chat("hi", json!({"max_tokens": 8, "stream": true}));
    assert!(
        collect(http.stream("/v1/chat/completions", &body).await)
            .await
            .1
    );
}

#[tokio::test]
async fn stall_after_tokens_stops_sending_and_keeps_the_connection() {
    let (_replica, http) = faulty(FaultsUpdate {
        stall_after_tokens: Some(Some(3)),
        ..FaultsUpdate::default()
    })
    .await;
    let mut stream = http.stream("/v1/chat/completions", &long_chat(true)).await;
    for _ in 0..4 {
        stream.next().await.expect("the role and three tokens");
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.try_next())
            .await
            .is_err(),
        "nothing more, and the body is not closed either"
    );
    let body = long_chat(false);
    let waiting = http.post_json("/v1/chat/completions", &body);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), waiting)
            .await
            .is_err(),
        "a non-streaming request is never answered"
    );
}

#[tokio::test]
async fn crash_after_tokens_takes_the_replica_down_mid_stream() {
    let (replica, http) = faulty(FaultsUpdate {
        crash_after_tokens: Some(Some(4)),
        ..FaultsUpdate::default()
    })
    .await;
    let (chunks, done) = collect(http.stream("/v1/chat/completions", &long_chat(true)).await).await;
    assert!(!done);
    assert_eq!(chunks.len(), 5, "the role chunk and four tokens");
    replica.stopped().await;
    let refused = tokio::net::TcpStream::connect(replica.local_addr())
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

    // Without streaming: the replica goes down without answering.
    let (replica, _http) = faulty(FaultsUpdate {
        crash_after_tokens: Some(Some(4)),
        ..FaultsUpdate::default()
    })
    .await;
    let raw = raw_post(
        replica.local_addr(),
        "/v1/chat/completions",
        &long_chat(false),
    )
    .await;
    assert!(raw.is_empty());
    replica.stopped().await;
}

#[tokio::test]
async fn a_graceful_stop_refuses_new_requests_and_finishes_the_open_ones() {
    let replica = replica(ReplicaSpec {
        time_scale: 5.0,
        ..fast_spec()
    })
    .await;
    let http = Http::new(replica.local_addr());
    let body = chat("Count.", json!({"max_tokens": 30, "stream": true}));
    let mut open = http.stream("/v1/chat/completions", &body).await;
    open.next().await.expect("the stream started");

    let stop = http.post("/admin/stop", "").await;
    assert_eq!(stop.status, StatusCode::OK);
    assert_eq!(stop.json(), json!({"stopping": true, "in_flight": 1}));

    // Still listening, but refusing.
    let refused = http
        .post_json(
            "/v1/chat/completions",
            &chat("hi", json!({"max_tokens": 2})),
        )
        .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    let error = &refused.json()["error"];
    assert_eq!(error["code"], 503);
    assert!(
        error["message"].as_str().unwrap().contains("shutting down"),
        "{error}"
    );
    assert_eq!(
        http.get("/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    // The open stream runs to its end, then the replica stops.
    let mut events = Vec::new();
    while let Some(event) = open.next().await {
        events.push(event);
    }
    assert_eq!(events.last().unwrap().data, "[DONE]");
    assert_eq!(events.len(), 31, "30 tokens and [DONE]");
    replica.stopped().await;
    assert!(
        tokio::net::TcpStream::connect(replica.local_addr())
            .await
            .is_err()
    );

    // With nothing in flight, it stops at once (through the handle here).
    let idle = sim::start_replica("127.0.0.1:0".parse().unwrap(), fast_spec())
        .await
        .unwrap();
    idle.drain();
    idle.stopped().await;
}

#[tokio::test]
async fn one_replica_of_a_fleet_can_be_made_to_die_mid_answer() {
    let fleet = start_fleet(FleetSpec {
        replicas: 2,
        time_scale: 200.0,
        seed: 11,
        ..FleetSpec::default()
    })
    .await
    .unwrap();
    let [dying, healthy] = fleet.replicas() else {
        panic!("two replicas")
    };
    dying
        .set_faults(&FaultsUpdate {
            cut_after_tokens: Some(Some(7)),
            ..FaultsUpdate::default()
        })
        .unwrap();
    assert_eq!(dying.faults().cut_after_tokens, Some(7));
    assert_eq!(healthy.faults().cut_after_tokens, None);

    // The answer the healthy replica gives in one run...
    let body = chat(
        "Explain batching.",
        json!({"max_tokens": 50, "stream": true}),
    );
    let (whole, _) = collect(
        Http::new(healthy.local_addr())
            .stream("/v1/chat/completions", &body)
            .await,
    )
    .await;
    let whole = streamed_text(&whole);
    // ... is the dying replica's first seven tokens and the healthy
    // replica's continuation of them.
    let (part, done) = collect(
        Http::new(dying.local_addr())
            .stream("/v1/chat/completions", &body)
            .await,
    )
    .await;
    assert!(!done);
    let part = streamed_text(&part);
    let mut messages = body["messages"].clone();
    messages
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": part}));
    let rest = json!({"model": MODEL, "messages": messages, "max_tokens": 43, "stream": true,
                      "continue_final_message": true, "add_generation_prompt": false});
    let (rest, done) = collect(
        Http::new(healthy.local_addr())
            .stream("/v1/chat/completions", &rest)
            .await,
    )
    .await;
    assert!(done);
    assert_eq!(format!("{part}{}", streamed_text(&rest)), whole);
    fleet.shutdown().await;
}
