//! What asking infergate for a replica over the endpoint-picker protocol
//! costs, beside the pick itself, at 100 and 1,000 replicas:
//!
//! - `in_process`: one pick by the pool's picker, as the gateway's own
//!   listeners make it (the same picker config, the same replicas);
//! - `grpc_decision`: one request as a data plane sends it over Envoy's
//!   ext_proc (FULL_DUPLEX_STREAMED): a stream opened, the head and body
//!   sent, the decision and the body back, the stream closed — parse,
//!   route, limits, admission and the pick on the way;
//! - `grpc_exchange`: the same, then the answer's head and one body chunk
//!   through the picker, as Envoy sends them for accounting;
//! - `grpc_concurrent`: decisions from 32 streams at once, for the picks
//!   per second one picker serves.
//!
//! The replicas report no metrics (`engine: none`): picks go by in-flight
//! requests over the whole pool. Each replica is a loopback listener that
//! answers the pool's reachability check (once: the check's interval is
//! longer than the bench); no request is ever forwarded to one.
//!
//! `cargo bench -p infergate-gateway --bench endpoint_picker`

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    HttpBody, HttpHeaders, ProcessingRequest, ProtocolConfiguration,
};
use rand::SeedableRng;
use tokio::sync::mpsc;
use tonic::transport::Channel;

const FLEETS: [usize; 2] = [100, 1_000];
const CONCURRENCY: usize = 32;

/// `replicas` loopback listeners answering every request 200, empty.
async fn replicas(replicas: usize) -> Vec<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut addrs = Vec::with_capacity(replicas);
    for _ in 0..replicas {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap().to_string());
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0; 4096];
                    while let Ok(n) = conn.read(&mut buf).await {
                        if n == 0 {
                            return;
                        }
                        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
                        if conn.write_all(ok).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }
    addrs
}

fn config(endpoints: &[String]) -> config::InferenceGatewayConfig {
    let endpoints: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: []\n  endpointPicker: {{address: \"127.0.0.1:0\"}}\n  pools:\n    - {{name: p, engine: none, models: [m], endpoints: [{}], scheduling: {{metrics: {{interval: 1h}}}}}}\n",
        endpoints.join(", ")
    );
    config::from_yaml(&yaml).unwrap()
}

fn body() -> Vec<u8> {
    serde_json::json!({"model": "m", "max_tokens": 64, "messages": [
        {"role": "system", "content": "You are a helpful assistant. ".repeat(20)},
        {"role": "user", "content": "Summarise the billing policy in three sentences."},
    ]})
    .to_string()
    .into_bytes()
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        raw_value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn message(request: Message, first: bool) -> ProcessingRequest {
    let duplex = BodySendMode::FullDuplexStreamed as i32;
    ProcessingRequest {
        request: Some(request),
        protocol_config: first.then_some(ProtocolConfiguration {
            request_body_mode: duplex,
            response_body_mode: duplex,
            send_body_without_waiting_for_header_response: false,
        }),
        ..Default::default()
    }
}

fn request_headers() -> Message {
    Message::RequestHeaders(HttpHeaders {
        headers: Some(HeaderMap {
            headers: vec![
                header(":method", "POST"),
                header(":path", "/v1/chat/completions"),
                header(":authority", "gateway"),
                header("content-type", "application/json"),
            ],
        }),
        ..Default::default()
    })
}

fn body_chunk(body: &[u8], end_of_stream: bool) -> Message {
    Message::RequestBody(HttpBody {
        body: body.to_vec(),
        end_of_stream,
        ..Default::default()
    })
}

/// One request through the picker: the decision, and with `answer` the
/// answer's head and body through it too.
async fn one_request(client: &mut ExternalProcessorClient<Channel>, body: &[u8], answer: bool) {
    let (tx, rx) = mpsc::unbounded_channel();
    let outbound =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|m| (m, rx)) });
    tx.send(message(request_headers(), true)).unwrap();
    tx.send(message(body_chunk(body, true), false)).unwrap();
    let mut inbound = client.process(outbound).await.unwrap().into_inner();
    let decided = inbound.message().await.unwrap().unwrap();
    assert!(
        matches!(decided.response, Some(Answer::RequestHeaders(_))),
        "{decided:?}"
    );
    // The body back, ending the request's stream.
    loop {
        let m = inbound.message().await.unwrap().unwrap();
        if let Some(Answer::RequestBody(b)) = m.response {
            let Some(envoy_types::pb::envoy::service::ext_proc::v3::body_mutation::Mutation::StreamedResponse(part)) =
                b.response.and_then(|r| r.body_mutation).and_then(|m| m.mutation)
            else {
                panic!("a streamed body");
            };
            if part.end_of_stream {
                break;
            }
        }
    }
    if answer {
        tx.send(message(
            Message::ResponseHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![
                        header(":status", "200"),
                        header("content-type", "application/json"),
                    ],
                }),
                ..Default::default()
            }),
            false,
        ))
        .unwrap();
        inbound.message().await.unwrap().unwrap();
        tx.send(message(
            Message::ResponseBody(HttpBody {
                body: br#"{"choices":[{"message":{"content":"ok"}}],"usage":{"prompt_tokens":60,"completion_tokens":2}}"#.to_vec(),
                end_of_stream: true,
                ..Default::default()
            }),
            false,
        ))
        .unwrap();
        inbound.message().await.unwrap().unwrap();
    }
    // Done, as Envoy is: its side closed, then the picker's.
    drop(tx);
    while inbound.message().await.unwrap().is_some() {}
}

fn endpoint_picker(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let body = body();
    let mut group = c.benchmark_group("endpoint_picker");
    group.measurement_time(Duration::from_secs(5));
    for fleet in FLEETS {
        let addrs = runtime.block_on(replicas(fleet));
        let config = config(&addrs);
        // In process: the pool's own picker, as the gateway configures it.
        let endpoints: Vec<Arc<picker::Endpoint>> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| picker::Endpoint::new(i, a.as_str()))
            .collect();
        let picker = picker::Picker::new(gateway::picker_config(&config.spec.pools[0]), endpoints);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        group.bench_function(BenchmarkId::new("in_process", fleet), |b| {
            b.iter(|| {
                let request = picker::PickRequest {
                    estimated_tokens: 100,
                    ..Default::default()
                };
                let decision = picker
                    .pick(&request, Instant::now(), &[], &mut rng)
                    .unwrap();
                // The pick's load, taken and given back as a request does.
                drop(black_box(decision.acquire()));
            });
        });

        let gateway = runtime.block_on(gateway::Gateway::start(&config)).unwrap();
        let addr = gateway.endpoint_picker_addr().unwrap();
        let channel = runtime.block_on(async {
            Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap()
        });
        let client = ExternalProcessorClient::new(channel);
        for (name, answer) in [("grpc_decision", false), ("grpc_exchange", true)] {
            group.bench_function(BenchmarkId::new(name, fleet), |b| {
                b.to_async(&runtime).iter(|| {
                    let mut client = client.clone();
                    let body = body.clone();
                    async move { one_request(&mut client, &body, answer).await }
                });
            });
        }
        group.bench_function(BenchmarkId::new("grpc_concurrent", fleet), |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let client = client.clone();
                let body = body.clone();
                async move {
                    let started = Instant::now();
                    let tasks: Vec<_> = (0..CONCURRENCY as u64)
                        .map(|t| {
                            let mut client = client.clone();
                            let body = body.clone();
                            let n = iters / CONCURRENCY as u64
                                + u64::from(t < iters % CONCURRENCY as u64);
                            tokio::spawn(async move {
                                for _ in 0..n {
                                    one_request(&mut client, &body, false).await;
                                }
                            })
                        })
                        .collect();
                    for t in tasks {
                        t.await.unwrap();
                    }
                    started.elapsed()
                }
            });
        });
        runtime.block_on(gateway.shutdown());
    }
    group.finish();
}

criterion_group!(benches, endpoint_picker);
criterion_main!(benches);
