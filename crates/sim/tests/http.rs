//! The simulated replica over real HTTP on 127.0.0.1: the OpenAI surface,
//! LoRA endpoints, `/metrics` in every dialect, pacing, aborts and faults.

mod support;

use std::time::Duration;

use http::StatusCode;
use serde_json::{Value, json};
use sim::{Dialect, FleetSpec, ReplicaSpec, start_fleet};
use support::{Exposition, Http, MODEL, chat, eventually, fast_spec, replica};

const ENGINE: (&str, &str) = ("engine", "0");
const MODEL_LABEL: (&str, &str) = ("model_name", MODEL);

fn gauge(metrics: &Exposition, name: &str) -> f64 {
    metrics
        .get(name, &[ENGINE, MODEL_LABEL])
        .unwrap_or_else(|| panic!("no {name} in\n{}", metrics.text))
}

#[tokio::test]
async fn chat_completion_without_streaming() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let reply = http
        .post_json(
            "/v1/chat/completions",
            &chat("Say hello.", json!({"max_tokens": 16})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.headers[http::header::CONTENT_TYPE],
        "application/json"
    );
    let body = reply.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(
        choice["message"]["content"]
            .as_str()
            .unwrap()
            .split(' ')
            .count(),
        16
    );
    let usage = &body["usage"];
    assert_eq!(usage["completion_tokens"], 16);
    let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
    assert!(
        prompt_tokens > 5,
        "chat template and content: {prompt_tokens}"
    );
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt_tokens + 16);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);

    // Without max_tokens the model stops by itself after a drawn length,
    // the same length for the same prompt.
    let unlimited = chat("Tell me a story.", json!({}));
    let first = http
        .post_json("/v1/chat/completions", &unlimited)
        .await
        .json();
    let second = http
        .post_json("/v1/chat/completions", &unlimited)
        .await
        .json();
    assert_eq!(first["choices"][0]["finish_reason"], "stop");
    assert!(first["usage"]["completion_tokens"].as_u64().unwrap() >= 1);
    assert_eq!(
        first["usage"]["completion_tokens"],
        second["usage"]["completion_tokens"]
    );
    assert_eq!(
        first["choices"][0]["message"]["content"],
        second["choices"][0]["message"]["content"]
    );
}

#[tokio::test]
async fn chat_completion_streams_one_chunk_per_token() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let request = chat("Count to ten.", json!({"max_tokens": 12, "stream": true}));
    let events = http
        .stream("/v1/chat/completions", &request)
        .await
        .all()
        .await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    assert!(events.iter().all(|e| e.event.is_none()), "data-only events");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| e.json())
        .collect();

    // The role opens the stream, then one chunk per token.
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    let tokens = &chunks[1..];
    assert_eq!(tokens.len(), 12);
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], MODEL);
        assert_eq!(chunk["id"], chunks[0]["id"]);
        assert!(
            chunk.get("usage").is_none(),
            "no usage without include_usage"
        );
    }
    assert!(tokens.iter().all(|c| {
        !c["choices"][0]["delta"]["content"]
            .as_str()
            .unwrap()
            .is_empty()
    }));
    assert!(
        tokens[..11]
            .iter()
            .all(|c| c["choices"][0]["finish_reason"].is_null())
    );
    assert_eq!(tokens[11]["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn include_usage_adds_a_final_usage_chunk() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let request = chat(
        "Name three colours.",
        json!({"max_tokens": 5, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let events = http
        .stream("/v1/chat/completions", &request)
        .await
        .all()
        .await;
    assert_eq!(events.last().unwrap().data, "[DONE]");
    let usage_chunk = events[events.len() - 2].json();
    assert_eq!(usage_chunk["choices"], json!([]));
    let usage = &usage_chunk["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 5
    );
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
    // Only the usage chunk carries usage.
    let with_usage = events[..events.len() - 1]
        .iter()
        .filter(|e| e.json().get("usage").is_some())
        .count();
    assert_eq!(with_usage, 1);
}

#[tokio::test]
async fn completions_endpoint_streams_text_chunks() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4});
    let reply = http.post_json("/v1/completions", &body).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let whole = reply.json();
    assert_eq!(whole["object"], "text_completion");
    assert_eq!(whole["usage"]["completion_tokens"], 4);

    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let events = http.stream("/v1/completions", &streaming).await.all().await;
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| e.json())
        .collect();
    assert_eq!(chunks.len(), 4);
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let text: String = chunks
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    assert_eq!(
        text,
        whole["choices"][0]["text"].as_str().unwrap(),
        "same prompt, same answer"
    );
}

fn ttft_seconds(metrics: &Exposition) -> (f64, f64) {
    let labels = [ENGINE, MODEL_LABEL];
    (
        metrics
            .get("vllm:time_to_first_token_seconds_sum", &labels)
            .unwrap(),
        metrics
            .get("vllm:time_to_first_token_seconds_count", &labels)
            .unwrap(),
    )
}

fn vector(item: &Value) -> Vec<f64> {
    item["embedding"]
        .as_array()
        .unwrap_or_else(|| panic!("no float embedding in {item}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn norm(vector: &[f64]) -> f64 {
    vector.iter().map(|x| x * x).sum::<f64>().sqrt()
}

/// Standard padded base64, for checking `encoding_format: "base64"`.
fn decode_base64(text: &str) -> Vec<u8> {
    const ALPHABET: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    assert_eq!(text.len() % 4, 0, "padded");
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let pad = chunk.iter().filter(|&&c| c == b'=').count();
        let n = chunk.iter().fold(0u32, |n, &c| {
            let value = ALPHABET.find(c as char).unwrap_or(0) as u32;
            n << 6 | value
        });
        out.extend(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

#[tokio::test]
async fn embeddings_are_deterministic_unit_vectors_with_counted_tokens() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());
    let text = "The gateway routes each request to the fastest replica.";
    let expected_tokens = sim::tokenizer::encode_prompt(text).len() as u64;

    let reply = http
        .post_json("/v1/embeddings", &json!({"model": MODEL, "input": text}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(
        reply.headers[http::header::CONTENT_TYPE],
        "application/json"
    );
    let body = reply.json();
    assert_eq!(body["object"], "list");
    assert_eq!(body["model"], MODEL);
    let data = body["data"].as_array().unwrap();
    assert_eq!(data.len(), 1);
    assert_eq!(data[0]["object"], "embedding");
    assert_eq!(data[0]["index"], 0);
    let first = vector(&data[0]);
    assert_eq!(first.len(), 4096, "Llama-3.1-8B's hidden size");
    assert!((norm(&first) - 1.0).abs() < 1e-4, "unit length");
    assert_eq!(body["usage"]["prompt_tokens"], expected_tokens);
    assert_eq!(body["usage"]["total_tokens"], expected_tokens);

    // The same text gives the same vector, on another replica too.
    let second = support::replica(fast_spec()).await;
    let other = Http::new(second.local_addr());
    let again = other
        .post_json("/v1/embeddings", &json!({"input": text}))
        .await
        .json();
    assert_eq!(vector(&again["data"][0]), first);

    // A list of strings: one vector each, in order, tokens summed.
    let batch = http
        .post_json(
            "/v1/embeddings",
            &json!({"model": MODEL, "input": [text, "Something else entirely."]}),
        )
        .await
        .json();
    let items = batch["data"].as_array().unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[1]["index"], 1);
    assert_eq!(vector(&items[0]), first);
    let cosine: f64 = vector(&items[0])
        .iter()
        .zip(vector(&items[1]))
        .map(|(a, b)| a * b)
        .sum();
    assert!(
        cosine.abs() < 0.1,
        "different texts, unrelated vectors: {cosine}"
    );
    let second_tokens = sim::tokenizer::encode_prompt("Something else entirely.").len() as u64;
    assert_eq!(
        batch["usage"]["prompt_tokens"],
        expected_tokens + second_tokens
    );

    // Token ids, alone or in lists, are counted as sent.
    for (input, tokens) in [(json!([1, 2, 3]), 3), (json!([[1, 2, 3], [4, 5]]), 5)] {
        let reply = http
            .post_json("/v1/embeddings", &json!({"input": input}))
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{input}: {}", reply.text());
        assert_eq!(reply.json()["usage"]["prompt_tokens"], tokens, "{input}");
    }

    // `dimensions`: a shorter unit vector, the start of the full one.
    let short = http
        .post_json("/v1/embeddings", &json!({"input": text, "dimensions": 256}))
        .await
        .json();
    let short = vector(&short["data"][0]);
    assert_eq!(short.len(), 256);
    assert!((norm(&short) - 1.0).abs() < 1e-4);
    let scale = norm(&first[..256]);
    assert!(
        short
            .iter()
            .zip(&first)
            .all(|(s, f)| (s * scale - f).abs() < 1e-4),
        "truncated and renormalized"
    );

    // base64: the little-endian f32 bytes of the same vector.
    let encoded = http
        .post_json(
            "/v1/embeddings",
            &json!({"input": text, "dimensions": 8, "encoding_format": "base64"}),
        )
        .await
        .json();
    let bytes = decode_base64(encoded["data"][0]["embedding"].as_str().unwrap());
    let floats: Vec<f64> = bytes
        .chunks(4)
        .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
        .collect();
    assert_eq!(floats.len(), 8);
    let eight = http
        .post_json("/v1/embeddings", &json!({"input": text, "dimensions": 8}))
        .await
        .json();
    assert_eq!(floats, vector(&eight["data"][0]));
}

#[tokio::test]
async fn embeddings_refuse_what_the_completions_refuse() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let unknown = http
        .post_json("/v1/embeddings", &json!({"model": "gpt-4o", "input": "x"}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(
        unknown.json()["error"]["message"],
        "The model `gpt-4o` does not exist."
    );
    assert_eq!(unknown.json()["error"]["param"], "model");

    for (body, param) in [
        (json!({"input": []}), "input"),
        (json!({"input": [[]]}), "input"),
        (json!({"input": "x", "dimensions": 0}), "dimensions"),
        (json!({"input": "x", "dimensions": 4097}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
    ] {
        let reply = http.post_json("/v1/embeddings", &body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(reply.json()["error"]["param"], param, "{body}");
    }
    let too_long = http
        .post_json("/v1/embeddings", &json!({"input": vec![7; 131_072]}))
        .await;
    assert_eq!(too_long.status, StatusCode::BAD_REQUEST);
    assert!(
        too_long.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 131072")
    );
    let malformed = http.post("/v1/embeddings", "{\"input\": ").await;
    assert_eq!(malformed.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        http.get("/v1/embeddings").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn an_embedding_costs_a_prefill_in_the_engine() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());
    // Two documents of the same length in tokens that share nothing, so
    // neither finds the other in the prefix cache.
    let document = |word: &str| format!(" {word}").repeat(3000);
    let (alpha, bravo) = (document("alpha"), document("bravo"));
    assert_eq!(sim::tokenizer::count(&alpha), sim::tokenizer::count(&bravo));

    let idle = http.metrics().await;
    let reply = http
        .post_json("/v1/embeddings", &json!({"input": alpha}))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let prompt_tokens = reply.json()["usage"]["prompt_tokens"].as_f64().unwrap();
    let embedded = http.metrics().await;
    let (sum0, count0) = ttft_seconds(&idle);
    let (sum1, count1) = ttft_seconds(&embedded);
    assert_eq!(count1 - count0, 1.0, "one engine request per input");
    let embedding_prefill = sum1 - sum0;
    assert_eq!(
        gauge(&embedded, "vllm:prompt_tokens_total") - gauge(&idle, "vllm:prompt_tokens_total"),
        prompt_tokens
    );
    assert_eq!(
        gauge(&embedded, "vllm:generation_tokens_total")
            - gauge(&idle, "vllm:generation_tokens_total"),
        1.0,
        "no decoding beyond the prefill's one token"
    );

    // The prompt half of a completion on the same number of tokens.
    let completion = http
        .post_json(
            "/v1/completions",
            &json!({"prompt": bravo, "max_tokens": 1}),
        )
        .await;
    assert_eq!(completion.status, StatusCode::OK);
    let (sum2, _) = ttft_seconds(&http.metrics().await);
    let completion_prefill = sum2 - sum1;
    assert!(embedding_prefill > 0.0);
    let ratio = embedding_prefill / completion_prefill;
    assert!(
        (0.8..1.25).contains(&ratio),
        "embedding {embedding_prefill}s, completion prefill {completion_prefill}s"
    );
}

#[tokio::test]
async fn responses_answer_like_chat_completions() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let reply = http
        .post_json(
            "/v1/responses",
            &json!({"model": MODEL, "input": "Say hello.", "max_output_tokens": 16}),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["object"], "response");
    assert!(body["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(body["model"], MODEL);
    // Cut by max_output_tokens: incomplete, as OpenAI reports it.
    assert_eq!(body["status"], "incomplete");
    assert_eq!(body["incomplete_details"]["reason"], "max_output_tokens");
    let output = body["output"].as_array().unwrap();
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    let part = &output[0]["content"][0];
    assert_eq!(part["type"], "output_text");
    assert_eq!(part["text"].as_str().unwrap().split(' ').count(), 16);
    let usage = &body["usage"];
    assert_eq!(usage["output_tokens"], 16);

    // The same conversation through chat completions: the same prompt
    // tokens, and without a limit the same answer.
    let chat_reply = http
        .post_json("/v1/chat/completions", &chat("Say hello.", json!({})))
        .await
        .json();
    assert_eq!(usage["input_tokens"], chat_reply["usage"]["prompt_tokens"]);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + 16
    );
    let whole = http
        .post_json(
            "/v1/responses",
            &json!({"model": MODEL, "input": [{"role": "user", "content": "Say hello."}]}),
        )
        .await
        .json();
    assert_eq!(whole["status"], "completed");
    assert_eq!(whole["incomplete_details"], Value::Null);
    assert_eq!(
        whole["output"][0]["content"][0]["text"],
        chat_reply["choices"][0]["message"]["content"]
    );
    assert_eq!(
        whole["usage"]["output_tokens"],
        chat_reply["usage"]["completion_tokens"]
    );
    assert!(
        whole["usage"]["input_tokens_details"]["cached_tokens"]
            .as_u64()
            .is_some()
    );

    // `instructions` are the system message.
    let instructed = http
        .post_json(
            "/v1/responses",
            &json!({"input": "Say hello.", "instructions": "Be brief.", "max_output_tokens": 1}),
        )
        .await
        .json();
    let with_system = http
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello."},
            ], "max_tokens": 1}),
        )
        .await
        .json();
    assert_eq!(
        instructed["usage"]["input_tokens"],
        with_system["usage"]["prompt_tokens"]
    );
    assert_eq!(instructed["instructions"], "Be brief.");

    let unknown = http
        .post_json("/v1/responses", &json!({"model": "gpt-4o", "input": "x"}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["error"]["param"], "model");
    let chained = http
        .post_json(
            "/v1/responses",
            &json!({"input": "x", "previous_response_id": "resp_1"}),
        )
        .await;
    assert_eq!(chained.status, StatusCode::BAD_REQUEST);
    assert_eq!(chained.json()["error"]["param"], "previous_response_id");
    let zero = http
        .post_json(
            "/v1/responses",
            &json!({"input": "x", "max_output_tokens": 0}),
        )
        .await;
    assert_eq!(zero.status, StatusCode::BAD_REQUEST);
    assert_eq!(zero.json()["error"]["param"], "max_output_tokens");
    assert_eq!(
        http.post("/v1/responses", "{}").await.status,
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test]
async fn responses_stream_the_responses_events() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let request =
        json!({"model": MODEL, "input": "Count to five.", "max_output_tokens": 5, "stream": true});
    let events = http.stream("/v1/responses", &request).await.all().await;
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.event.as_deref().expect("named events"))
        .collect();
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(["response.output_text.delta"; 5]);
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]);
    assert_eq!(kinds, expected);
    let data: Vec<Value> = events.iter().map(|e| e.json()).collect();
    for (i, (event, data)) in kinds.iter().zip(&data).enumerate() {
        assert_eq!(data["type"], *event);
        assert_eq!(data["sequence_number"], i);
    }
    let created = &data[0]["response"];
    assert_eq!(created["status"], "in_progress");
    assert_eq!(created["output"], json!([]));
    let deltas: String = data[4..9]
        .iter()
        .map(|d| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(data[9]["text"], deltas.as_str());
    let item_id = &data[2]["item"]["id"];
    assert!(data[4..10].iter().all(|d| d["item_id"] == *item_id));
    let last = &data[12]["response"];
    assert_eq!(last["id"], created["id"]);
    assert_eq!(last["status"], "incomplete");
    assert_eq!(last["output"][0]["content"][0]["text"], deltas.as_str());
    assert_eq!(last["usage"]["output_tokens"], 5);

    // Without a limit the model stops by itself: response.completed, with
    // the answer the non-streaming call gives.
    let request = json!({"input": "Count to five.", "stream": true});
    let events = http.stream("/v1/responses", &request).await.all().await;
    let last = events.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("response.completed"));
    let response = &last.json()["response"];
    assert_eq!(response["status"], "completed");
    let deltas = events
        .iter()
        .filter(|e| e.event.as_deref() == Some("response.output_text.delta"))
        .count();
    assert_eq!(response["usage"]["output_tokens"], deltas);
    let whole = http
        .post_json("/v1/responses", &json!({"input": "Count to five."}))
        .await
        .json();
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        whole["output"][0]["content"][0]["text"]
    );
}

#[tokio::test]
async fn a_repeated_prompt_reports_cached_tokens() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());
    let document =
        "The gateway routes each request to the replica that will answer it fastest. ".repeat(40);

    let request = chat(&document, json!({"max_tokens": 2}));
    let first = http
        .post_json("/v1/chat/completions", &request)
        .await
        .json();
    let second = http
        .post_json("/v1/chat/completions", &request)
        .await
        .json();
    let prompt_tokens = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt_tokens > 300, "{prompt_tokens}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0 && cached <= prompt_tokens,
        "cached {cached} of {prompt_tokens}"
    );
    assert_eq!(cached % 16, 0, "whole KV blocks are cached");

    let metrics = http.metrics().await;
    assert!(gauge(&metrics, "vllm:prefix_cache_hits_total") >= cached as f64);
    assert!(gauge(&metrics, "vllm:prefix_cache_queries_total") >= 2.0 * prompt_tokens as f64 - 2.0);
}

#[tokio::test]
async fn models_lists_the_base_model_and_adapters() {
    let spec = ReplicaSpec {
        adapters: vec!["sql".into()],
        max_loras: Some(2),
        ..fast_spec()
    };
    let replica = replica(spec).await;
    let http = Http::new(replica.local_addr());

    let models = http.get("/v1/models").await.json();
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    assert_eq!(data[0]["id"], MODEL);
    assert_eq!(data[0]["object"], "model");
    assert_eq!(data[0]["parent"], Value::Null);
    assert_eq!(data[0]["max_model_len"], 131_072);
    assert_eq!(data[1]["id"], "sql");
    assert_eq!(data[1]["parent"], MODEL);

    let reply = http
        .post_json(
            "/v1/chat/completions",
            &json!({
                "model": "sql", "messages": [{"role": "user", "content": "SELECT"}], "max_tokens": 3
            }),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["model"], "sql");
}

#[tokio::test]
async fn lora_adapters_load_and_unload_like_vllm() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());
    let ask = |model: &str| chat("hi", json!({"model": model, "max_tokens": 2}));

    assert_eq!(
        http.post_json("/v1/chat/completions", &ask("math"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let load = json!({"lora_name": "math", "lora_path": "/adapters/math"});
    let reply = http.post_json("/v1/load_lora_adapter", &load).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.text(),
        "Success: LoRA adapter 'math' added successfully."
    );

    let again = http.post_json("/v1/load_lora_adapter", &load).await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        again.json()["error"]["message"],
        "The lora adapter 'math' has already been loaded."
    );
    assert_eq!(again.json()["error"]["type"], "InvalidUserInput");
    let incomplete = http
        .post_json("/v1/load_lora_adapter", &json!({"lora_name": "x"}))
        .await;
    assert_eq!(incomplete.status, StatusCode::BAD_REQUEST);

    let ids: Vec<Value> = http.get("/v1/models").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(ids, [json!(MODEL), json!("math")]);
    assert_eq!(
        http.post_json("/v1/chat/completions", &ask("math"))
            .await
            .status,
        StatusCode::OK
    );

    let unload = json!({"lora_name": "math"});
    let reply = http.post_json("/v1/unload_lora_adapter", &unload).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.text(),
        "Success: LoRA adapter 'math' removed successfully."
    );
    let gone = http.post_json("/v1/unload_lora_adapter", &unload).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(
        gone.json()["error"]["message"],
        "The lora adapter 'math' cannot be found."
    );
    assert_eq!(
        http.post_json("/v1/chat/completions", &ask("math"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn unknown_models_are_404_and_malformed_json_is_400() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let reply = http
        .post_json(
            "/v1/chat/completions",
            &chat("hi", json!({"model": "gpt-4o"})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    let error = &reply.json()["error"];
    assert_eq!(error["message"], "The model `gpt-4o` does not exist.");
    assert_eq!(error["type"], "NotFoundError");
    assert_eq!(error["param"], "model");
    assert_eq!(error["code"], 404);

    for (path, body) in [
        ("/v1/chat/completions", "{\"model\": "),
        ("/v1/completions", "not json"),
        ("/v1/chat/completions", "{\"model\": \"x\"}"),
    ] {
        let reply = http.post(path, body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{path} {body}");
        let error = &reply.json()["error"];
        assert_eq!(error["code"], 400);
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("Invalid request body")
        );
    }

    let too_long = chat("hi", json!({"max_tokens": 200_000}));
    let reply = http.post_json("/v1/chat/completions", &too_long).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length is 131072")
    );

    assert_eq!(http.get("/nope").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        http.get("/v1/chat/completions").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
    let health = http.get("/health").await;
    assert_eq!((health.status, health.body.len()), (StatusCode::OK, 0));
}

#[tokio::test]
async fn tokenize_speaks_vllms_shapes_and_errors() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());
    let ids = |reply: &support::Reply| -> Vec<u64> {
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        let body = reply.json();
        assert_eq!(body["count"], body["tokens"].as_array().unwrap().len());
        assert_eq!(body["max_model_len"], 131_072);
        serde_json::from_value(body["tokens"].clone()).unwrap()
    };

    // A chat asks for the reply's header unless told not to.
    let asking = ids(&http
        .post_json("/tokenize", &chat("Hi there", json!({})))
        .await);
    let bare = ids(&http
        .post_json(
            "/tokenize",
            &chat("Hi there", json!({"add_generation_prompt": false})),
        )
        .await);
    assert!(bare.len() < asking.len(), "{bare:?} {asking:?}");
    assert_eq!(asking[..bare.len()], bare[..]);
    // A completion prompt: the begin-of-text id, then the text's; no model
    // named means the base model.
    let prompt = ids(&http
        .post_json("/tokenize", &json!({"prompt": "Hi there"}))
        .await);
    assert_eq!(prompt[0], 128_000);
    assert_eq!(prompt.len(), 3);
    let given = ids(&http
        .post_json("/tokenize", &json!({"model": MODEL, "prompt": [5, 6, 7]}))
        .await);
    assert_eq!(given, [5, 6, 7]);

    let unknown = http
        .post_json("/tokenize", &json!({"model": "gpt-4o", "prompt": "hi"}))
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["error"]["param"], "model");
    assert_eq!(unknown.json()["error"]["code"], 404);
    for body in [
        "not json",
        "{\"model\": \"x\"",
        "{\"model\": \"meta-llama/Llama-3.1-8B-Instruct\"}",
        "{\"prompt\": 7}",
        "{\"messages\": \"hi\"}",
        "{\"prompt\": [\"one\", \"two\"]}",
    ] {
        let reply = http.post("/tokenize", body).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{body}");
        let error = &reply.json()["error"];
        assert_eq!(error["type"], "BadRequestError", "{body}");
        assert_eq!(error["code"], 400, "{body}");
    }
    assert_eq!(
        http.get("/tokenize").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

#[tokio::test]
async fn metrics_follow_the_load() {
    // Two batch slots and a slow clock, so requests pile up in the queue.
    let spec = ReplicaSpec {
        max_num_seqs: Some(2),
        time_scale: 5.0,
        ..fast_spec()
    };
    let replica = replica(spec).await;
    let http = Http::new(replica.local_addr());

    let idle = http.metrics().await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
    ] {
        assert_eq!(idle.types[name], "gauge", "{name}");
    }
    for name in [
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:request_success_total",
    ] {
        assert_eq!(idle.types[name], "counter", "{name}");
    }
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        assert_eq!(idle.types[name], "histogram", "{name}");
    }
    assert_eq!(gauge(&idle, "vllm:num_requests_running"), 0.0);
    assert_eq!(gauge(&idle, "vllm:kv_cache_usage_perc"), 0.0);
    let config = idle
        .matching("vllm:cache_config_info", &[ENGINE])
        .next()
        .unwrap();
    assert_eq!(config.labels["block_size"], "16");
    let blocks: u64 = config.labels["num_gpu_blocks"].parse().unwrap();
    assert!(
        blocks > 10_000,
        "an H100 holds hundreds of thousands of 8B tokens: {blocks}"
    );
    let ttft_buckets: Vec<&str> = idle
        .matching(
            "vllm:time_to_first_token_seconds_bucket",
            &[ENGINE, MODEL_LABEL],
        )
        .map(|s| s.labels["le"].as_str())
        .collect();
    assert_eq!(ttft_buckets.first(), Some(&"0.001"));
    assert_eq!(ttft_buckets.len(), 23);
    assert_eq!(ttft_buckets.last(), Some(&"+Inf"));

    // Five long requests on two slots: two run, three wait.
    let mut streams = Vec::new();
    for i in 0..5 {
        let request = chat(
            &format!("request {i}"),
            json!({"max_tokens": 5000, "stream": true}),
        );
        streams.push(http.stream("/v1/chat/completions", &request).await);
    }
    eventually(
        "2 running and 3 waiting",
        Duration::from_secs(10),
        || async {
            let m = http.metrics().await;
            gauge(&m, "vllm:num_requests_running") == 2.0
                && gauge(&m, "vllm:num_requests_waiting") == 3.0
        },
    )
    .await;
    let busy = http.metrics().await;
    assert!(gauge(&busy, "vllm:kv_cache_usage_perc") > 0.0);
    assert!(gauge(&busy, "vllm:generation_tokens_total") > 0.0);
    assert!(gauge(&busy, "vllm:prompt_tokens_total") > 0.0);
    assert_eq!(
        busy.get(
            "vllm:time_to_first_token_seconds_count",
            &[ENGINE, MODEL_LABEL]
        ),
        Some(2.0)
    );

    // Clients leave: everything is aborted and freed.
    drop(streams);
    eventually("the replica drains", Duration::from_secs(10), || async {
        let m = http.metrics().await;
        gauge(&m, "vllm:num_requests_running") == 0.0
            && gauge(&m, "vllm:num_requests_waiting") == 0.0
    })
    .await;
    let after = http.metrics().await;
    assert_eq!(gauge(&after, "vllm:kv_cache_usage_perc"), 0.0);
    let aborted = after.get(
        "vllm:request_success_total",
        &[ENGINE, ("finished_reason", "abort")],
    );
    assert_eq!(aborted, Some(5.0));
    assert_eq!(
        after.get(
            "vllm:e2e_request_latency_seconds_count",
            &[ENGINE, MODEL_LABEL]
        ),
        Some(5.0)
    );
}

#[tokio::test]
async fn each_dialect_speaks_its_engine_names() {
    let expectations: [(Dialect, &[&str], &str); 4] = [
        (
            Dialect::Vllm,
            &[
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:kv_cache_usage_perc",
            ],
            "vllm:",
        ),
        (
            Dialect::Sglang,
            &[
                "sglang:num_running_reqs",
                "sglang:num_queue_reqs",
                "sglang:token_usage",
                "sglang:page_size",
                "sglang:num_pages",
                "sglang:max_total_num_tokens",
            ],
            "sglang:",
        ),
        (
            Dialect::Tgi,
            &["tgi_queue_size", "tgi_batch_current_size"],
            "tgi_",
        ),
        (
            Dialect::Llamacpp,
            &[
                "llamacpp:requests_processing",
                "llamacpp:requests_deferred",
                "llamacpp:kv_cache_usage_ratio",
            ],
            "llamacpp:",
        ),
    ];
    for (dialect, names, prefix) in expectations {
        let replica = replica(ReplicaSpec {
            dialect,
            ..fast_spec()
        })
        .await;
        let http = Http::new(replica.local_addr());
        let reply = http
            .post_json(
                "/v1/chat/completions",
                &chat("hi", json!({"max_tokens": 3})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK);
        let metrics = http.metrics().await;
        for name in names {
            assert!(
                metrics.has_family(name),
                "{dialect}: no {name} in\n{}",
                metrics.text
            );
            assert!(
                metrics.matching(name, &[]).next().is_some(),
                "{dialect}: no sample of {name}"
            );
        }
        assert!(
            metrics.samples.iter().all(|s| s.name.starts_with(prefix)),
            "{dialect}: foreign names in\n{}",
            metrics.text
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_pace_follows_the_engine_inter_token_latency() {
    let time_scale = 5.0;
    let replica = replica(ReplicaSpec {
        time_scale,
        ..fast_spec()
    })
    .await;
    let http = Http::new(replica.local_addr());

    let request = chat(
        "Write a long answer.",
        json!({"max_tokens": 200, "stream": true}),
    );
    let events = http
        .stream("/v1/chat/completions", &request)
        .await
        .all()
        .await;
    // Events: role, 200 tokens, [DONE]. Time the tokens after the first.
    let tokens = &events[1..201];
    let wall = tokens
        .last()
        .unwrap()
        .at
        .duration_since(tokens[0].at)
        .as_secs_f64();
    let measured_engine_itl = wall * time_scale / 199.0;

    let metrics = http.metrics().await;
    let sum = metrics
        .get(
            "vllm:inter_token_latency_seconds_sum",
            &[ENGINE, MODEL_LABEL],
        )
        .unwrap();
    let count = metrics
        .get(
            "vllm:inter_token_latency_seconds_count",
            &[ENGINE, MODEL_LABEL],
        )
        .unwrap();
    assert_eq!(count, 199.0);
    let engine_itl = sum / count;
    assert!(
        (0.002..0.05).contains(&engine_itl),
        "8B on an H100 decodes in milliseconds: {engine_itl}"
    );
    let ratio = measured_engine_itl / engine_itl;
    assert!(
        (0.5..2.0).contains(&ratio),
        "paced at {measured_engine_itl}s per token, engine says {engine_itl}s"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_mid_stream_aborts_its_request() {
    // At 5× an answer of 20,000 tokens would take minutes: only an abort
    // can empty the batch within the test.
    let replica = replica(ReplicaSpec {
        time_scale: 5.0,
        ..fast_spec()
    })
    .await;
    let http = Http::new(replica.local_addr());

    let request = chat(
        "Go on forever.",
        json!({"max_tokens": 20_000, "stream": true}),
    );
    let mut stream = http.stream("/v1/chat/completions", &request).await;
    for _ in 0..4 {
        stream.next().await.expect("tokens flow");
    }
    assert_eq!(
        gauge(&http.metrics().await, "vllm:num_requests_running"),
        1.0
    );
    drop(stream);

    eventually(
        "the aborted request leaves the batch",
        Duration::from_secs(10),
        || async { gauge(&http.metrics().await, "vllm:num_requests_running") == 0.0 },
    )
    .await;
    let metrics = http.metrics().await;
    assert_eq!(
        metrics.get(
            "vllm:request_success_total",
            &[ENGINE, ("finished_reason", "abort")]
        ),
        Some(1.0)
    );
    assert_eq!(gauge(&metrics, "vllm:kv_cache_usage_perc"), 0.0);
}

#[tokio::test]
async fn a_client_that_gives_up_on_a_non_streaming_request_aborts_it() {
    let replica = replica(ReplicaSpec {
        time_scale: 5.0,
        ..fast_spec()
    })
    .await;
    let http = Http::new(replica.local_addr());

    let request = chat("Go on forever.", json!({"max_tokens": 20_000}));
    let client = http.clone();
    let waiting =
        tokio::spawn(async move { client.post_json("/v1/chat/completions", &request).await });
    eventually("the request runs", Duration::from_secs(10), || async {
        gauge(&http.metrics().await, "vllm:num_requests_running") == 1.0
    })
    .await;
    waiting.abort();
    assert!(waiting.await.unwrap_err().is_cancelled());

    eventually(
        "the abandoned request leaves the batch",
        Duration::from_secs(10),
        || async { gauge(&http.metrics().await, "vllm:num_requests_running") == 0.0 },
    )
    .await;
    let metrics = http.metrics().await;
    assert_eq!(
        metrics.get(
            "vllm:request_success_total",
            &[ENGINE, ("finished_reason", "abort")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn error_rate_fault_answers_500() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    let set = http
        .post_json("/admin/faults", &json!({"error_rate": 1.0}))
        .await;
    assert_eq!(set.status, StatusCode::OK);
    assert_eq!(set.json()["error_rate"], 1.0);
    assert_eq!(http.get("/admin/faults").await.json()["error_rate"], 1.0);
    for _ in 0..5 {
        let reply = http
            .post_json(
                "/v1/chat/completions",
                &chat("hi", json!({"max_tokens": 2})),
            )
            .await;
        assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(reply.json()["error"]["code"], 500);
    }
    let bad = http
        .post_json("/admin/faults", &json!({"error_rate": 2.0}))
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    http.post_json("/admin/faults", &json!({"error_rate": 0.0}))
        .await;
    let reply = http
        .post_json(
            "/v1/chat/completions",
            &chat("hi", json!({"max_tokens": 2})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
}

#[tokio::test]
async fn hang_fault_accepts_and_never_answers() {
    let spec = ReplicaSpec {
        faults: sim::Faults {
            hang: true,
            ..Default::default()
        },
        ..fast_spec()
    };
    let replica = replica(spec).await;
    let http = Http::new(replica.local_addr());

    let body = chat("hi", json!({"max_tokens": 1}));
    let request = http.post_json("/v1/chat/completions", &body);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), request)
            .await
            .is_err(),
        "no answer"
    );
    let metrics = http.metrics().await;
    assert_eq!(
        gauge(&metrics, "vllm:num_requests_running") + gauge(&metrics, "vllm:num_requests_waiting"),
        0.0
    );
}

#[tokio::test]
async fn metrics_faults_dead_hang_frozen_and_garbage() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());

    http.post_json("/admin/faults", &json!({"metrics": "garbage"}))
        .await;
    let garbage = http.get("/metrics").await;
    assert_eq!(garbage.status, StatusCode::OK);
    assert!(garbage.text().starts_with("<html>"), "{}", garbage.text());

    http.post_json("/admin/faults", &json!({"metrics": "dead"}))
        .await;
    assert_eq!(
        http.get("/metrics").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );

    http.post_json("/admin/faults", &json!({"metrics": "hang"}))
        .await;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), http.get("/metrics"))
            .await
            .is_err()
    );

    http.post_json("/admin/faults", &json!({"metrics": "ok"}))
        .await;
    let before = http.get("/metrics").await.text();
    http.post_json("/admin/faults", &json!({"metrics": "frozen"}))
        .await;
    let reply = http
        .post_json(
            "/v1/chat/completions",
            &chat("hi", json!({"max_tokens": 4})),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        http.get("/metrics").await.text(),
        before,
        "frozen: stale values"
    );

    http.post_json("/admin/faults", &json!({"metrics": "ok"}))
        .await;
    let live = http.metrics().await;
    assert_eq!(
        live.get(
            "vllm:request_success_total",
            &[ENGINE, ("finished_reason", "length")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn slowdown_fault_stretches_engine_steps() {
    let replica = replica(fast_spec()).await;
    let http = Http::new(replica.local_addr());
    let itl = |m: &Exposition| {
        let sum = m
            .get(
                "vllm:inter_token_latency_seconds_sum",
                &[ENGINE, MODEL_LABEL],
            )
            .unwrap();
        let count = m
            .get(
                "vllm:inter_token_latency_seconds_count",
                &[ENGINE, MODEL_LABEL],
            )
            .unwrap();
        (sum, count)
    };

    http.post_json(
        "/v1/chat/completions",
        &chat("first", json!({"max_tokens": 50})),
    )
    .await;
    let (sum1, count1) = itl(&http.metrics().await);
    let set = http
        .post_json("/admin/faults", &json!({"slowdown": 3.0}))
        .await;
    assert_eq!(set.json()["slowdown"], 3.0);
    http.post_json(
        "/v1/chat/completions",
        &chat("second", json!({"max_tokens": 50})),
    )
    .await;
    let (sum2, count2) = itl(&http.metrics().await);

    let normal = sum1 / count1;
    let slowed = (sum2 - sum1) / (count2 - count1);
    let ratio = slowed / normal;
    assert!(
        (2.5..3.5).contains(&ratio),
        "slowdown 3 gave ITL ratio {ratio}"
    );
}

#[tokio::test]
async fn crash_closes_the_port() {
    let first = replica(fast_spec()).await;
    let addr = first.local_addr();
    assert_eq!(Http::new(addr).get("/health").await.status, StatusCode::OK);
    first.crash().await;
    assert!(first.is_stopped());
    let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

    // Through the admin API, with a stream open: the stream is cut too.
    let second = replica(ReplicaSpec {
        time_scale: 5.0,
        ..fast_spec()
    })
    .await;
    let addr = second.local_addr();
    let http = Http::new(addr);
    let mut stream = http
        .stream(
            "/v1/chat/completions",
            &chat("long", json!({"max_tokens": 20_000, "stream": true})),
        )
        .await;
    stream.next().await.expect("the stream started");
    let crash = http
        .send(http::Method::POST, "/admin/crash", bytes::Bytes::new())
        .await;
    assert_eq!(crash.status(), StatusCode::OK);
    second.stopped().await;
    let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // The stream is cut, never completed.
    while let Ok(Some(event)) = stream.try_next().await {
        assert_ne!(event.data, "[DONE]", "a crash does not finish streams");
    }
}

#[tokio::test]
async fn a_fleet_cycles_hardware_and_shuts_down() {
    let spec = FleetSpec {
        replicas: 3,
        hardware: vec!["h100".into(), "a10g".into()],
        time_scale: 50.0,
        ..FleetSpec::default()
    };
    let fleet = start_fleet(spec).await.unwrap();
    let addrs = fleet.addrs();
    assert_eq!(addrs.len(), 3);
    let hardware: Vec<&str> = fleet
        .replicas()
        .iter()
        .map(|r| r.info().hardware.as_str())
        .collect();
    assert_eq!(hardware, ["h100", "a10g", "h100"]);
    assert!(fleet.replicas()[1].info().num_gpu_blocks < fleet.replicas()[0].info().num_gpu_blocks);
    for addr in &addrs {
        assert_eq!(Http::new(*addr).get("/health").await.status, StatusCode::OK);
    }
    fleet.shutdown().await;
    for addr in addrs {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "{addr} still open"
        );
    }
}

/// A replica that loads its model refuses connections until its load time
/// (in engine time, divided by the time scale) has passed, then serves.
#[tokio::test]
async fn a_loading_replica_refuses_connections_until_its_load_time() {
    let started = std::time::Instant::now();
    let replica = sim::start_replica(
        "127.0.0.1:0".parse().unwrap(),
        sim::ReplicaSpec {
            time_scale: 20.0,
            load_time: sim::LoadTime::Fixed(std::time::Duration::from_secs(40)),
            ..sim::ReplicaSpec::default()
        },
    )
    .await
    .unwrap();
    let addr = replica.local_addr();
    let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    // Then it listens: 40 s of engine time at 20× is 2 s of wall time.
    let connected = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => break stream,
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused),
        }
        assert!(started.elapsed() < std::time::Duration::from_secs(30));
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    drop(connected);
    assert!(started.elapsed() >= std::time::Duration::from_secs(2));
    assert_eq!(Http::new(addr).get("/health").await.status, StatusCode::OK);
}

/// The calibrated load time: the weights at a network volume's speed
/// (split over tensor-parallel ranks), then the engine's start-up.
#[test]
fn the_calibrated_load_time_grows_with_the_weights_per_gpu() {
    let config = |model: &str, tp| {
        sim::ReplicaSpec {
            model: model.into(),
            tensor_parallel: tp,
            ..sim::ReplicaSpec::default()
        }
        .engine_config()
        .unwrap()
    };
    let small = sim::calibrated_load_time(&config("llama-3.1-8b", Some(1)));
    // 16.06 GB at 0.33 GB/s, plus 40 s.
    assert!(
        (small.as_secs_f64() - (16.06 / 0.33 + 40.0)).abs() < 1.0,
        "{small:?}"
    );
    let big = sim::calibrated_load_time(&config("llama-3.1-70b", Some(4)));
    assert!(big > small, "{big:?} vs {small:?}");
    let big_tp8 = sim::calibrated_load_time(&config("llama-3.1-70b", Some(8)));
    assert!(big_tp8 < big);
    assert_eq!(
        "calibrated".parse::<sim::LoadTime>().unwrap(),
        sim::LoadTime::Calibrated
    );
    assert_eq!(
        "45s".parse::<sim::LoadTime>().unwrap(),
        sim::LoadTime::Fixed(std::time::Duration::from_secs(45))
    );
    assert!("soon".parse::<sim::LoadTime>().is_err());
}

/// A fleet started asleep refuses connections until its wake endpoint is
/// called; then its replicas load and listen.
#[tokio::test]
async fn a_fleet_started_asleep_listens_once_woken() {
    let fleet = sim::start_fleet(sim::FleetSpec {
        replicas: 2,
        time_scale: 20.0,
        start_asleep: true,
        ..sim::FleetSpec::default()
    })
    .await
    .unwrap();
    let wake = fleet
        .wake_url()
        .expect("a fleet started asleep has a wake endpoint");
    for addr in fleet.addrs() {
        let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    }
    let (host, path) = wake
        .strip_prefix("http://")
        .unwrap()
        .split_once('/')
        .unwrap();
    let woke = Http::new(host.parse().unwrap())
        .post_json(&format!("/{path}"), &serde_json::json!({"pool": "p"}))
        .await;
    assert_eq!(woke.status, StatusCode::OK);
    for addr in fleet.addrs() {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "{addr} never listened"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(Http::new(addr).get("/health").await.status, StatusCode::OK);
    }
}
