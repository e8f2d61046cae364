//! infergate as another proxy's endpoint picker: an Envoy stand-in drives
//! `ExternalProcessor/Process` streams exactly as Envoy's ext_proc filter
//! does (request headers, body chunks with end_of_stream, response
//! headers with the served endpoint, body, trailers; FULL_DUPLEX_STREAMED
//! and BUFFERED), forwards to the endpoint the picker chose as a data
//! plane would, and checks every answer field by field against the
//! protocol (the Gateway API Inference Extension's proposal 004). The
//! conformance scenarios follow: the data plane follows the picker, the
//! subset hint, the served endpoint, two weighted pools, an unavailable
//! picker, and the 429 / 503 shapes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{
    HeaderMap, HeaderValue, Metadata, header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_client::ExternalProcessorClient;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request as Message;
use envoy_types::pb::envoy::service::ext_proc::v3::processing_response::Response as Answer;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyResponse, CommonResponse, HeadersResponse, HttpBody, HttpHeaders, HttpTrailers,
    ImmediateResponse, ProcessingRequest, ProcessingResponse, ProtocolConfiguration,
    body_mutation::Mutation,
};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use gateway::Gateway;
use serde_json::{Value as Json, json};
use tokio::sync::mpsc;
use tonic::Streaming;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::support::{
    Behaviour, CHAT, FakeReplica, client, closed_port, config, debug_pools, poll_until, sim_metric,
    within,
};

const DEADLINE: Duration = Duration::from_secs(20);
const DESTINATION: &str = "x-gateway-destination-endpoint";
const SERVED: &str = "x-gateway-destination-endpoint-served";
const SUBSET: &str = "x-gateway-destination-endpoint-subset";

/// How the stand-in's ext_proc filter is configured.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    FullDuplex,
    Buffered,
}

impl Mode {
    fn body_send_mode(self) -> i32 {
        match self {
            Mode::FullDuplex => BodySendMode::FullDuplexStreamed as i32,
            Mode::Buffered => BodySendMode::Buffered as i32,
        }
    }
}

/// A gateway whose endpoint picker serves `pools` (YAML list items).
async fn picker(extra: &str, pools: &str) -> Gateway {
    Gateway::start(&picker_config("{address: \"127.0.0.1:0\"}", extra, pools))
        .await
        .unwrap()
}

/// The config of [`picker`], its `endpointPicker` as given.
fn picker_config(
    endpoint_picker: &str,
    extra: &str,
    pools: &str,
) -> config::InferenceGatewayConfig {
    config(
        &format!(
            "  admin: {{address: \"127.0.0.1:0\"}}\n  endpointPicker: {endpoint_picker}\n  shutdown: {{drainTimeout: 5s}}\n{extra}"
        ),
        pools,
    )
}

/// One pool `name` serving `model` from `replicas`, round-robin.
fn pool(name: &str, model: &str, replicas: &[&FakeReplica]) -> String {
    let endpoints: Vec<String> = replicas.iter().map(|r| format!("\"{}\"", r.addr)).collect();
    format!(
        "    - {{name: {name}, engine: none, models: [{model}], endpoints: [{}], scheduling: {{policy: round-robin}}}}\n",
        endpoints.join(", ")
    )
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The Envoy stand-in: one ext_proc stream per request, as Envoy opens.
struct StandIn {
    client: ExternalProcessorClient<Channel>,
    mode: Mode,
}

/// One request's stream.
struct Stream {
    tx: mpsc::UnboundedSender<ProcessingRequest>,
    rx: Streaming<ProcessingResponse>,
    /// The first message carries the protocol configuration.
    first: bool,
    mode: Mode,
}

impl StandIn {
    async fn connect(gw: &Gateway, mode: Mode) -> Self {
        let addr = gw
            .endpoint_picker_addr()
            .expect("endpoint picker listening");
        Self {
            client: ExternalProcessorClient::new(channel(addr).await),
            mode,
        }
    }

    async fn open(&mut self) -> Stream {
        let (tx, rx) = mpsc::unbounded_channel();
        let outbound =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        let rx = self.client.process(outbound).await.unwrap().into_inner();
        Stream {
            tx,
            rx,
            first: true,
            mode: self.mode,
        }
    }
}

fn header(key: &str, value: &str) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        raw_value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// Filter metadata `namespace` → `key` = `value`.
fn metadata(namespace: &str, key: &str, value: Value) -> Metadata {
    Metadata {
        filter_metadata: HashMap::from([(
            namespace.to_owned(),
            Struct {
                fields: HashMap::from([(key.to_owned(), value)]),
            },
        )]),
        ..Default::default()
    }
}

/// The subset hint as the data plane sets it: a list of `ip:port`.
fn subset(endpoints: &[&str]) -> Metadata {
    let list = ListValue {
        values: endpoints.iter().map(|e| string(e)).collect(),
    };
    metadata(
        "envoy.lb.subset_hint",
        SUBSET,
        Value {
            kind: Some(Kind::ListValue(list)),
        },
    )
}

fn chat_body(model: &str) -> Vec<u8> {
    json!({"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4})
        .to_string()
        .into_bytes()
}

impl Stream {
    fn send(&mut self, request: Message, metadata: Option<Metadata>) {
        let protocol_config = self.first.then(|| ProtocolConfiguration {
            request_body_mode: self.mode.body_send_mode(),
            response_body_mode: self.mode.body_send_mode(),
            send_body_without_waiting_for_header_response: false,
        });
        self.first = false;
        self.tx
            .send(ProcessingRequest {
                request: Some(request),
                metadata_context: metadata,
                protocol_config,
                ..Default::default()
            })
            .expect("stream open");
    }

    /// The client's request head, as Envoy passes it (pseudo-headers
    /// first).
    fn request_headers(
        &mut self,
        extra: &[(&str, &str)],
        end_of_stream: bool,
        hint: Option<Metadata>,
    ) {
        self.request_head("POST", CHAT, extra, end_of_stream, hint);
    }

    fn request_head(
        &mut self,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        end_of_stream: bool,
        hint: Option<Metadata>,
    ) {
        let mut headers = vec![
            header(":method", method),
            header(":path", path),
            header(":authority", "gateway.example"),
            header(":scheme", "http"),
            header("content-type", "application/json"),
            header("x-request-id", "req-1"),
        ];
        headers.extend(extra.iter().map(|(k, v)| header(k, v)));
        self.send(
            Message::RequestHeaders(HttpHeaders {
                headers: Some(HeaderMap { headers }),
                end_of_stream,
                ..Default::default()
            }),
            hint,
        );
    }

    fn request_body(&mut self, chunk: &[u8], end_of_stream: bool) {
        self.send(
            Message::RequestBody(HttpBody {
                body: chunk.to_vec(),
                end_of_stream,
                ..Default::default()
            }),
            None,
        );
    }

    /// The answer's head, with the endpoint that served it.
    fn response_headers(&mut self, status: u16, content_type: &str, served: Option<&str>) {
        self.send(
            Message::ResponseHeaders(HttpHeaders {
                headers: Some(HeaderMap {
                    headers: vec![
                        header(":status", &status.to_string()),
                        header("content-type", content_type),
                    ],
                }),
                end_of_stream: false,
                ..Default::default()
            }),
            served.map(|s| metadata("envoy.lb", SERVED, string(s))),
        );
    }

    fn response_body(&mut self, chunk: &[u8], end_of_stream: bool) {
        self.send(
            Message::ResponseBody(HttpBody {
                body: chunk.to_vec(),
                end_of_stream,
                ..Default::default()
            }),
            None,
        );
    }

    fn response_trailers(&mut self) {
        self.send(Message::ResponseTrailers(HttpTrailers::default()), None);
    }

    async fn next(&mut self) -> Answer {
        within(DEADLINE, "the picker's next answer", self.rx.message())
            .await
            .unwrap()
            .expect("an answer")
            .response
            .expect("a response")
    }

    async fn next_whole(&mut self) -> ProcessingResponse {
        within(DEADLINE, "the picker's next answer", self.rx.message())
            .await
            .unwrap()
            .expect("an answer")
    }

    /// The whole request sent as this mode sends it: the head, then the
    /// body in two chunks (duplex) or whole after the head's answer
    /// (buffered).
    async fn send_request(&mut self, body: &[u8], extra: &[(&str, &str)], hint: Option<Metadata>) {
        self.request_headers(extra, false, hint);
        match self.mode {
            Mode::FullDuplex => {
                let (a, b) = body.split_at(body.len() / 2);
                self.request_body(a, false);
                self.request_body(b, true);
            }
            Mode::Buffered => {
                match self.next().await {
                    Answer::RequestHeaders(HeadersResponse { response }) => {
                        // Nothing decided on the head alone.
                        assert_eq!(response.unwrap_or_default(), CommonResponse::default());
                    }
                    other => panic!("expected the headers' answer, got {other:?}"),
                }
                self.request_body(body, true);
            }
        }
    }

    /// The picker's decision, checked as the protocol defines it: the
    /// destination header (set, replacing), the same list in `envoy.lb`
    /// metadata, the route recomputed; and the body the data plane sends
    /// on.
    async fn decision(&mut self) -> Decision {
        let whole = self.next_whole().await;
        let (common, body) = match (self.mode, whole.response.clone().expect("a response")) {
            (Mode::FullDuplex, Answer::RequestHeaders(HeadersResponse { response })) => {
                let common = response.expect("a common response");
                assert!(common.body_mutation.is_none());
                // Then the body, back as streamed mutations ending the stream.
                let mut body = Vec::new();
                loop {
                    match self.next().await {
                        Answer::RequestBody(BodyResponse { response }) => {
                            let mutation = response.unwrap().body_mutation.unwrap().mutation;
                            let Some(Mutation::StreamedResponse(part)) = mutation else {
                                panic!("a streamed mutation, got {mutation:?}");
                            };
                            body.extend_from_slice(&part.body);
                            if part.end_of_stream {
                                break;
                            }
                        }
                        other => panic!("expected the body back, got {other:?}"),
                    }
                }
                (common, Some(body))
            }
            (Mode::Buffered, Answer::RequestBody(BodyResponse { response })) => {
                let common = response.expect("a common response");
                let body = match common
                    .body_mutation
                    .as_ref()
                    .and_then(|m| m.mutation.clone())
                {
                    None => None,
                    Some(Mutation::Body(b)) => Some(b),
                    other => panic!("a whole body in buffered mode, got {other:?}"),
                };
                (common, body)
            }
            (_, other) => panic!("expected the decision, got {other:?}"),
        };
        assert!(common.clear_route_cache, "the route follows the new header");
        let headers: HashMap<String, String> = common
            .header_mutation
            .expect("headers set")
            .set_headers
            .into_iter()
            .map(|h| {
                assert_eq!(
                    h.append_action,
                    HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                    "a client's own header is replaced"
                );
                let h = h.header.unwrap();
                (h.key, String::from_utf8(h.raw_value).unwrap())
            })
            .collect();
        let endpoints = headers[DESTINATION].clone();
        let lb = &whole.dynamic_metadata.expect("dynamic metadata").fields["envoy.lb"];
        let Some(Kind::StructValue(lb)) = &lb.kind else {
            panic!("envoy.lb is a struct: {lb:?}");
        };
        assert_eq!(
            lb.fields[DESTINATION].kind,
            Some(Kind::StringValue(endpoints.clone())),
            "header and metadata agree"
        );
        Decision {
            endpoints: endpoints.split(',').map(str::to_owned).collect(),
            headers,
            body,
        }
    }

    async fn immediate(&mut self) -> ImmediateResponse {
        match self.next().await {
            Answer::ImmediateResponse(r) => r,
            other => panic!("expected an immediate response, got {other:?}"),
        }
    }

    /// The answer's way back: head (with the served endpoint), body in
    /// chunks, each answered as the mode asks.
    async fn relay_answer(
        &mut self,
        served: &str,
        status: u16,
        content_type: &str,
        chunks: &[&[u8]],
    ) {
        self.response_headers(status, content_type, Some(served));
        match self.next().await {
            Answer::ResponseHeaders(HeadersResponse { response }) => {
                assert_eq!(response.unwrap_or_default(), CommonResponse::default());
            }
            other => panic!("expected the response headers' answer, got {other:?}"),
        }
        for (i, chunk) in chunks.iter().enumerate() {
            let end = i + 1 == chunks.len();
            self.response_body(chunk, end);
            match (self.mode, self.next().await) {
                (Mode::FullDuplex, Answer::ResponseBody(BodyResponse { response })) => {
                    let mutation = response.unwrap().body_mutation.unwrap().mutation;
                    let Some(Mutation::StreamedResponse(part)) = mutation else {
                        panic!("the chunk back as a streamed mutation, got {mutation:?}");
                    };
                    assert_eq!(part.body, *chunk, "the answer passes unchanged");
                    assert_eq!(part.end_of_stream, end);
                }
                (Mode::Buffered, Answer::ResponseBody(BodyResponse { response })) => {
                    assert_eq!(response.unwrap_or_default(), CommonResponse::default());
                }
                (_, other) => panic!("expected the response body's answer, got {other:?}"),
            }
        }
    }

    /// Envoy closes its side when the request is done; the picker then
    /// ends the stream, with nothing more to say.
    async fn close(mut self) {
        drop(self.tx);
        let end = within(DEADLINE, "the picker ending the stream", self.rx.message()).await;
        assert!(matches!(end, Ok(None)), "{end:?}");
    }
}

struct Decision {
    endpoints: Vec<String>,
    headers: HashMap<String, String>,
    /// The body the data plane sends on (duplex: always; buffered: only
    /// when the picker changed it).
    body: Option<Vec<u8>>,
}

/// What the data plane does with a decision: send the request to the
/// first endpoint (the fallbacks are for its retries).
async fn forward(decision: &Decision, body: &[u8]) -> Json {
    let endpoint = &decision.endpoints[0];
    let body = decision.body.clone().unwrap_or_else(|| body.to_vec());
    client()
        .post(format!("http://{endpoint}{CHAT}"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `/debug/pools`' in-flight requests of each replica of the first pool,
/// by address.
async fn in_flight(gw: &Gateway) -> HashMap<String, u64> {
    debug_pools(gw).await["pools"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["address"].as_str().unwrap_or_default().to_owned(),
                e["inflightRequests"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn in_flight_becomes(gw: &Gateway, want: HashMap<String, u64>) {
    let what = format!("in-flight requests {want:?}");
    poll_until(DEADLINE, &what, || {
        let want = want.clone();
        async move {
            let seen = in_flight(gw).await;
            if seen == want {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        }
    })
    .await;
}

fn error_body(immediate: &ImmediateResponse) -> Json {
    serde_json::from_slice(&immediate.body).unwrap()
}

fn immediate_header(immediate: &ImmediateResponse, name: &str) -> Option<String> {
    immediate
        .headers
        .as_ref()?
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == name)
        .map(|h| String::from_utf8(h.raw_value.clone()).unwrap())
}

/// GatewayFollowingEPPRouting, both body modes: the picker's choice is
/// where the request goes, and the whole exchange is answered field by
/// field.
#[tokio::test]
async fn the_data_plane_follows_the_pickers_choice_in_both_body_modes() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let gw = picker("", &pool("p", "m", &[&a, &b])).await;
    for mode in [Mode::FullDuplex, Mode::Buffered] {
        let mut envoy = StandIn::connect(&gw, mode).await;
        let mut seen = Vec::new();
        for _ in 0..2 {
            let body = chat_body("m");
            let mut stream = envoy.open().await;
            stream.send_request(&body, &[], None).await;
            let decision = stream.decision().await;
            // The chosen one, then the other as its fallback.
            assert_eq!(decision.endpoints.len(), 2, "{:?}", decision.endpoints);
            let all = [a.addr.to_string(), b.addr.to_string()];
            for e in &decision.endpoints {
                assert!(all.contains(e), "{e} is a replica of the pool");
            }
            assert_ne!(decision.endpoints[0], decision.endpoints[1]);
            match mode {
                Mode::FullDuplex => {
                    assert_eq!(
                        decision.body.as_deref(),
                        Some(&body[..]),
                        "the body goes on whole"
                    );
                    assert_eq!(decision.headers["content-length"], body.len().to_string());
                }
                Mode::Buffered => {
                    assert_eq!(decision.body, None, "an unchanged body is not replaced")
                }
            }
            let answer = forward(&decision, &body).await;
            let chosen = &decision.endpoints[0];
            let name = if *chosen == a.addr.to_string() {
                "a"
            } else {
                "b"
            };
            assert_eq!(answer["replica"], name, "{answer}");
            let answer = serde_json::to_vec(&answer).unwrap();
            let (first, rest) = answer.split_at(answer.len() / 2);
            stream
                .relay_answer(chosen, 200, "application/json", &[first, rest])
                .await;
            stream.close().await;
            seen.push(chosen.clone());
        }
        // Round-robin: the two requests went to both replicas.
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 2, "{mode:?}: {seen:?}");
    }
    // Every request ended, its load released and its record written.
    in_flight_becomes(
        &gw,
        HashMap::from([(a.addr.to_string(), 0), (b.addr.to_string(), 0)]),
    )
    .await;
    let metrics = crate::support::admin_get(&gw, "/metrics").await;
    let ok: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("infergate_requests_total{") && l.contains("code=\"200\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(ok, 4.0, "{metrics}");
}

/// The subset hint restricts the candidates; an empty subset, or one
/// with no replica of the pool, is a 503 immediate response.
#[tokio::test]
async fn the_subset_hint_is_honoured() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let c = FakeReplica::start("c", Behaviour::Echo).await;
    let gw = picker("", &pool("p", "m", &[&a, &b, &c])).await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    let (b_addr, c_addr) = (b.addr.to_string(), c.addr.to_string());
    for _ in 0..4 {
        let mut stream = envoy.open().await;
        let hint = subset(&[&b_addr, &c_addr]);
        stream.send_request(&chat_body("m"), &[], Some(hint)).await;
        let decision = stream.decision().await;
        let mut listed = decision.endpoints.clone();
        listed.sort();
        let mut allowed = [b_addr.clone(), c_addr.clone()];
        allowed.sort();
        assert_eq!(listed, allowed, "only the subset, all of it");
        stream.close().await;
    }
    let nowhere = closed_port().await;
    for endpoints in [vec![], vec![nowhere.as_str()]] {
        let mut stream = envoy.open().await;
        stream
            .send_request(&chat_body("m"), &[], Some(subset(&endpoints)))
            .await;
        let refused = stream.immediate().await;
        assert_eq!(refused.status.unwrap().code, 503, "{endpoints:?}");
        let body = error_body(&refused);
        assert_eq!(body["error"]["code"], "no_replicas", "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("subset"),
            "{body}"
        );
        assert_eq!(
            immediate_header(&refused, "content-type").as_deref(),
            Some("application/json")
        );
    }
}

/// GatewayDestinationEndpointServed: the data plane reports the endpoint
/// that served; the request's load is accounted to it until the answer
/// ends, then released once.
#[tokio::test]
async fn the_served_endpoint_is_accounted() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let gw = picker("", &pool("p", "m", &[&a, &b])).await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    let mut stream = envoy.open().await;
    stream.send_request(&chat_body("m"), &[], None).await;
    let decision = stream.decision().await;
    let (chosen, other) = (decision.endpoints[0].clone(), decision.endpoints[1].clone());
    in_flight_becomes(
        &gw,
        HashMap::from([(chosen.clone(), 1), (other.clone(), 0)]),
    )
    .await;
    // The data plane fell back to the other replica.
    stream.response_headers(200, "text/event-stream", Some(&other));
    assert!(matches!(stream.next().await, Answer::ResponseHeaders(_)));
    in_flight_becomes(
        &gw,
        HashMap::from([(chosen.clone(), 0), (other.clone(), 1)]),
    )
    .await;
    let events: [&[u8]; 3] = [
        b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
        b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
        b"data: [DONE]\n\n",
    ];
    for (i, event) in events.iter().enumerate() {
        stream.response_body(event, false);
        match stream.next().await {
            Answer::ResponseBody(BodyResponse { response }) => {
                let mutation = response.unwrap().body_mutation.unwrap().mutation;
                let Some(Mutation::StreamedResponse(part)) = mutation else {
                    panic!("{i}: {mutation:?}")
                };
                assert_eq!(part.body, *event);
            }
            other => panic!("{i}: {other:?}"),
        }
    }
    // Trailers end this answer.
    stream.response_trailers();
    assert!(matches!(stream.next().await, Answer::ResponseTrailers(_)));
    stream.close().await;
    in_flight_becomes(&gw, HashMap::from([(chosen, 0), (other.clone(), 0)])).await;
    // The answer was measured as the gateway's own listeners measure
    // theirs: first token, the gap to the next, the usage it reported.
    let metrics = crate::support::admin_get(&gw, "/metrics").await;
    for (series, want) in [
        ("infergate_ttft_seconds_count{pool=\"p\",model=\"m\"}", 1.0),
        (
            "infergate_inter_token_seconds_count{pool=\"p\",model=\"m\"}",
            1.0,
        ),
        (
            "infergate_prompt_tokens_total{pool=\"p\",model=\"m\",tenant=\"anonymous\"}",
            5.0,
        ),
        (
            "infergate_completion_tokens_total{pool=\"p\",model=\"m\",tenant=\"anonymous\"}",
            2.0,
        ),
        (
            "infergate_requests_total{pool=\"p\",model=\"m\",tenant=\"anonymous\",code=\"200\"}",
            1.0,
        ),
    ] {
        assert_eq!(
            crate::support::sample(&metrics, series),
            Some(want),
            "{series}"
        );
    }
}

/// Envoy ending the stream mid-answer (the client left: its side closed,
/// or the stream reset) ends the request: its load is released once, and
/// it is recorded once.
#[tokio::test]
async fn a_stream_ended_mid_answer_releases_its_load() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = picker("", &pool("p", "m", &[&a])).await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    for reset in [false, true] {
        let mut stream = envoy.open().await;
        stream.send_request(&chat_body("m"), &[], None).await;
        let decision = stream.decision().await;
        assert_eq!(decision.endpoints, [a.addr.to_string()]);
        stream.response_headers(200, "text/event-stream", Some(&decision.endpoints[0]));
        assert!(matches!(stream.next().await, Answer::ResponseHeaders(_)));
        stream.response_body(b"data: {\"choices\":[]}\n\n", false);
        assert!(matches!(stream.next().await, Answer::ResponseBody(_)));
        in_flight_becomes(&gw, HashMap::from([(a.addr.to_string(), 1)])).await;
        if reset {
            drop(stream);
        } else {
            stream.close().await;
        }
        in_flight_becomes(&gw, HashMap::from([(a.addr.to_string(), 0)])).await;
    }
    let series =
        "infergate_requests_total{pool=\"p\",model=\"m\",tenant=\"anonymous\",code=\"200\"}";
    let metrics = crate::support::admin_get(&gw, "/metrics").await;
    assert_eq!(
        crate::support::sample(&metrics, series),
        Some(2.0),
        "one record each"
    );
}

/// GatewayWeightedTwoPools: an HTTPRoute weighting two InferencePools,
/// each with its own picker; each request goes where its pool's picker
/// sends it, in the route's proportions.
#[tokio::test]
async fn two_pools_weighted_by_a_route_each_follow_their_picker() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let primary = picker("", &pool("primary", "m", &[&a])).await;
    let secondary = picker("", &pool("secondary", "m", &[&b])).await;
    let mut pickers = [
        StandIn::connect(&primary, Mode::FullDuplex).await,
        StandIn::connect(&secondary, Mode::FullDuplex).await,
    ];
    // Weights 3:1, as the route's backendRefs say; the data plane's split
    // made deterministic.
    let mut served = HashMap::new();
    for i in 0..8 {
        let which = usize::from(i % 4 == 3);
        let body = chat_body("m");
        let mut stream = pickers[which].open().await;
        stream.send_request(&body, &[], None).await;
        let decision = stream.decision().await;
        let answer = forward(&decision, &body).await;
        let replica = answer["replica"].as_str().unwrap().to_owned();
        assert_eq!(replica, ["a", "b"][which], "the pool's own picker chose");
        stream
            .relay_answer(
                &decision.endpoints[0],
                200,
                "application/json",
                &[&serde_json::to_vec(&answer).unwrap()],
            )
            .await;
        stream.close().await;
        *served.entry(replica).or_insert(0) += 1;
    }
    assert_eq!(
        served,
        HashMap::from([("a".to_owned(), 6), ("b".to_owned(), 2)])
    );
}

/// EppUnAvailable: what the data plane's failure mode sees. Readiness
/// and the service turn NOT_SERVING when the picker shuts down, then its
/// port refuses connections (FailClose answers the client 503; FailOpen
/// lets the data plane pick by itself).
#[tokio::test]
async fn an_unavailable_picker_says_so_then_refuses_connections() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = picker("", &pool("p", "m", &[&a])).await;
    let addr = gw.endpoint_picker_addr().unwrap();
    let mut health = HealthClient::new(channel(addr).await);
    let check = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    for service in ["liveness", "envoy.service.ext_proc.v3.ExternalProcessor"] {
        let status = health
            .check(check(service))
            .await
            .unwrap()
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service}");
    }
    let mut readiness = health.watch(check("readiness")).await.unwrap().into_inner();
    let mut service = health
        .watch(check("envoy.service.ext_proc.v3.ExternalProcessor"))
        .await
        .unwrap()
        .into_inner();
    // Ready once the pool can pick.
    loop {
        let update = within(DEADLINE, "readiness", readiness.message())
            .await
            .unwrap()
            .unwrap();
        if update.status == ServingStatus::Serving as i32 {
            break;
        }
    }
    let shutdown = tokio::spawn(gw.shutdown());
    for (name, watch) in [("readiness", &mut readiness), ("service", &mut service)] {
        loop {
            let update = within(DEADLINE, name, watch.message())
                .await
                .unwrap()
                .unwrap();
            if update.status == ServingStatus::NotServing as i32 {
                break;
            }
        }
    }
    drop((readiness, service, health));
    assert!(
        within(DEADLINE, "shutdown", shutdown).await.unwrap(),
        "drained"
    );
    let refused = tokio::net::TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// 429 when over a limit (with Retry-After and the OpenAI error body);
/// 400 for a body that is not a request; 404 for an unknown model — each
/// an immediate response, the client's whole answer. (503: the subset
/// test.)
#[tokio::test]
async fn refusals_are_immediate_responses_in_the_openai_shape() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = picker(
        "  rateLimits: {global: {requestsPerMinute: 1}}\n",
        &pool("p", "m", &[&a]),
    )
    .await;
    for mode in [Mode::FullDuplex, Mode::Buffered] {
        let mut envoy = StandIn::connect(&gw, mode).await;
        let mut stream = envoy.open().await;
        stream.send_request(b"{not json", &[], None).await;
        let refused = stream.immediate().await;
        assert_eq!(refused.status.unwrap().code, 400, "{mode:?}");
        assert_eq!(
            error_body(&refused)["error"]["type"],
            "invalid_request_error"
        );

        let mut stream = envoy.open().await;
        stream
            .send_request(&chat_body("nobody-serves-this"), &[], None)
            .await;
        let refused = stream.immediate().await;
        assert_eq!(refused.status.unwrap().code, 404, "{mode:?}");
        assert_eq!(error_body(&refused)["error"]["code"], "model_not_found");
    }
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    let mut stream = envoy.open().await;
    stream.send_request(&chat_body("m"), &[], None).await;
    let decision = stream.decision().await;
    assert_eq!(decision.endpoints, [a.addr.to_string()]);
    // Answered, so charged: the next request is over the limit. (One
    // whose stream closed before an answer never ran, and is not.)
    stream
        .relay_answer(&decision.endpoints[0], 200, "application/json", &[b"{}"])
        .await;
    stream.close().await;
    let mut stream = envoy.open().await;
    stream.send_request(&chat_body("m"), &[], None).await;
    let refused = stream.immediate().await;
    assert_eq!(refused.status.unwrap().code, 429);
    let retry_after: u64 = immediate_header(&refused, "retry-after")
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry_after >= 1);
    assert_eq!(error_body(&refused)["error"]["type"], "requests");
}

/// A request with no body has no model: 400, answered on its head. The
/// model list, which clients ask the same route for, the picker answers
/// itself.
#[tokio::test]
async fn a_request_without_a_body_is_answered_on_its_head() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = picker("", &pool("p", "m", &[&a])).await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    let mut stream = envoy.open().await;
    stream.request_headers(&[], true, None);
    let refused = stream.immediate().await;
    assert_eq!(refused.status.unwrap().code, 400);
    assert_eq!(
        error_body(&refused)["error"]["type"],
        "invalid_request_error"
    );

    let mut stream = envoy.open().await;
    stream.request_head("GET", "/v1/models", &[], true, None);
    let models = stream.immediate().await;
    assert_eq!(models.status.unwrap().code, 200);
    let list = error_body(&models);
    assert_eq!(list["object"], "list", "{list}");
    assert_eq!(list["data"][0]["id"], "m", "{list}");

    // An engine's admin endpoint is not an inference path: not picked for.
    let mut stream = envoy.open().await;
    stream.request_head("POST", "/v1/load_lora_adapter", &[], false, None);
    let refused = stream.immediate().await;
    assert_eq!(refused.status.unwrap().code, 404);
    assert_eq!(error_body(&refused)["error"]["code"], "not_found");
}

/// A stream charged against a token limit: the picker asks the replica
/// for its usage in the client's place (the body the data plane sends
/// says so), settles the limit on it, and takes the usage event out of
/// the answer on its way back, so the client gets the stream it asked for.
#[tokio::test]
async fn a_stream_charged_in_tokens_is_settled_on_its_usage_unseen_by_the_client() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = picker(
        "  rateLimits: {global: {tokensPerMinute: 100000}}\n",
        &pool("p", "m", &[&a]),
    )
    .await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    let mut stream = envoy.open().await;
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
            .to_string()
            .into_bytes();
    stream.send_request(&body, &[], None).await;
    let decision = stream.decision().await;
    let sent: Json = serde_json::from_slice(decision.body.as_ref().unwrap()).unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true, "{sent}");
    assert_eq!(
        decision.headers["content-length"],
        decision.body.unwrap().len().to_string()
    );

    stream.response_headers(200, "text/event-stream", Some(&decision.endpoints[0]));
    assert!(matches!(stream.next().await, Answer::ResponseHeaders(_)));
    let token = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    let usage = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}\n\n";
    let done = b"data: [DONE]\n\n";
    let mut client_got = Vec::new();
    stream.response_body(token, false);
    stream.response_body(usage, false);
    stream.response_body(done, true);
    loop {
        match stream.next().await {
            Answer::ResponseBody(BodyResponse { response }) => {
                let mutation = response.unwrap().body_mutation.unwrap().mutation;
                let Some(Mutation::StreamedResponse(part)) = mutation else {
                    panic!("{mutation:?}")
                };
                client_got.extend_from_slice(&part.body);
                if part.end_of_stream {
                    break;
                }
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        String::from_utf8(client_got).unwrap(),
        format!(
            "{}{}",
            String::from_utf8_lossy(token),
            String::from_utf8_lossy(done)
        )
    );
    stream.close().await;
    let what = "the usage counted";
    poll_until(DEADLINE, what, || async {
        let metrics = crate::support::admin_get(&gw, "/metrics").await;
        let series = "infergate_prompt_tokens_total{pool=\"p\",model=\"m\",tenant=\"anonymous\"}";
        match crate::support::sample(&metrics, series) {
            Some(7.0) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
}

/// The Gateway's objective header chooses the request's band, as
/// `x-infergate-priority` does (and infergate's own header wins).
#[tokio::test]
async fn the_objective_header_chooses_the_band() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = picker(
        "  flowControl: {headerMayRaise: true}\n",
        &pool("p", "m", &[&a]),
    )
    .await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    let asked: [&[(&str, &str)]; 4] = [
        &[("x-gateway-inference-objective", "critical")],
        &[("x-gateway-inference-objective", "sheddable")],
        &[
            ("x-gateway-inference-objective", "sheddable"),
            ("x-infergate-priority", "critical"),
        ],
        &[("x-gateway-inference-fairness-id", "team-a")],
    ];
    for headers in asked {
        let mut stream = envoy.open().await;
        stream.send_request(&chat_body("m"), headers, None).await;
        stream.decision().await;
        stream.close().await;
    }
    let metrics = crate::support::admin_get(&gw, "/metrics").await;
    let admitted = |band: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| {
                l.starts_with("infergate_queue_wait_seconds_count{")
                    && l.contains(&format!("priority=\"{band}\""))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(
        [
            admitted("critical"),
            admitted("standard"),
            admitted("sheddable")
        ],
        [2.0, 1.0, 1.0],
        "{metrics}"
    );
}

/// The simulator's generated tokens on `replica`.
async fn generated(replica: &sim::ReplicaHandle) -> f64 {
    sim_metric(replica, "vllm:generation_tokens_total", "").await
}

/// Against simulated vLLM replicas scored on their metrics, in both body
/// modes: the stand-in forwards to the endpoint the picker chose, the
/// simulator's streamed answer comes back through the picker chunk by
/// chunk unchanged, and the tokens were generated where the picker said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_plane_gets_the_simulators_answer_from_the_chosen_replica() {
    let mut sims = Vec::new();
    for _ in 0..2 {
        let spec = sim::ReplicaSpec {
            served_model_name: Some("m".into()),
            time_scale: 1000.0,
            ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
        };
        sims.push(
            sim::start_replica("127.0.0.1:0".parse().unwrap(), spec)
                .await
                .unwrap(),
        );
    }
    let pools = format!(
        "    - {{name: p, engine: vllm, models: [m], endpoints: [\"{}\", \"{}\"]}}\n",
        sims[0].local_addr(),
        sims[1].local_addr()
    );
    let gw = picker("", &pools).await;
    poll_until(DEADLINE, "both replicas ready", || async {
        match gw.ready_endpoints().as_slice() {
            [(_, 2)] => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
    for mode in [Mode::FullDuplex, Mode::Buffered] {
        let mut envoy = StandIn::connect(&gw, mode).await;
        let body = json!({"model": "m", "stream": true, "max_tokens": 8,
            "messages": [{"role": "user", "content": "tell me a story"}]})
        .to_string()
        .into_bytes();
        let mut stream = envoy.open().await;
        stream.send_request(&body, &[], None).await;
        let decision = stream.decision().await;
        let chosen = decision.endpoints[0].clone();
        let index = sims
            .iter()
            .position(|s| s.local_addr().to_string() == chosen)
            .expect("a simulated replica");
        let before = [generated(&sims[0]).await, generated(&sims[1]).await];

        let sent = decision.body.clone().unwrap_or_else(|| body.clone());
        let mut answer = client()
            .post(format!("http://{chosen}{CHAT}"))
            .header("content-type", "application/json")
            .body(sent)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        stream.response_headers(200, "text/event-stream", Some(&chosen));
        assert!(matches!(stream.next().await, Answer::ResponseHeaders(_)));
        let mut client_got = Vec::new();
        while let Some(chunk) = answer.chunk().await.unwrap() {
            stream.response_body(&chunk, false);
            match (mode, stream.next().await) {
                (Mode::FullDuplex, Answer::ResponseBody(BodyResponse { response })) => {
                    let mutation = response.unwrap().body_mutation.unwrap().mutation;
                    let Some(Mutation::StreamedResponse(part)) = mutation else {
                        panic!("{mutation:?}")
                    };
                    assert_eq!(part.body, chunk.to_vec(), "passed on unchanged");
                    client_got.extend_from_slice(&part.body);
                }
                (Mode::Buffered, Answer::ResponseBody(_)) => client_got.extend_from_slice(&chunk),
                (_, other) => panic!("{other:?}"),
            }
        }
        stream.response_body(b"", true);
        assert!(matches!(stream.next().await, Answer::ResponseBody(_)));
        stream.close().await;
        let text = String::from_utf8(client_got).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        let after = [generated(&sims[0]).await, generated(&sims[1]).await];
        assert_eq!(
            after[index] - before[index],
            8.0,
            "{mode:?}: generated where chosen"
        );
        assert_eq!(
            after[1 - index],
            before[1 - index],
            "{mode:?}: nothing elsewhere"
        );
    }
    let metrics = crate::support::admin_get(&gw, "/metrics").await;
    let series = "infergate_ttft_seconds_count{pool=\"p\",model=\"m\"}";
    assert_eq!(
        crate::support::sample(&metrics, series),
        Some(2.0),
        "{metrics}"
    );
}

/// How many endpoints the picker lists for one request.
async fn endpoints_listed(envoy: &mut StandIn) -> usize {
    let mut stream = envoy.open().await;
    stream.send_request(&chat_body("m"), &[], None).await;
    let decision = stream.decision().await;
    stream.close().await;
    decision.endpoints.len()
}

/// A reload may change how many fallbacks the picker lists, not where it
/// listens: that asks for a restart, and nothing of it is applied.
#[tokio::test]
async fn a_reload_changes_the_fallbacks_and_not_the_address() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let b = FakeReplica::start("b", Behaviour::Echo).await;
    let c = FakeReplica::start("c", Behaviour::Echo).await;
    let pools = pool("p", "m", &[&a, &b, &c]);
    let gw = picker("", &pools).await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    assert_eq!(
        endpoints_listed(&mut envoy).await,
        3,
        "the chosen one and two fallbacks"
    );

    let moved = picker_config("{address: \"127.0.0.1:1\", fallbacks: 0}", "", &pools);
    let err = gw.apply(&moved).unwrap_err().to_string();
    assert!(
        err.contains("spec.endpointPicker.address") && err.contains("restart"),
        "{err}"
    );
    assert_eq!(
        endpoints_listed(&mut envoy).await,
        3,
        "nothing of it applied"
    );

    gw.apply(&picker_config(
        "{address: \"127.0.0.1:0\", fallbacks: 0}",
        "",
        &pools,
    ))
    .unwrap();
    assert_eq!(
        endpoints_listed(&mut envoy).await,
        1,
        "the chosen one alone"
    );
}

/// The gateway's gauge of request-body bytes held.
async fn buffered_bytes(gw: &Gateway) -> Option<f64> {
    let metrics = crate::support::admin_get(gw, "/metrics").await;
    crate::support::sample(&metrics, "infergate_buffered_body_bytes")
}

/// Envoy resetting the stream (the client left) while the body arrives:
/// the bytes held for it are given back. After the decision, before any
/// answer: the request is recorded once, as the client's leaving, and its
/// replica's load released.
#[tokio::test]
async fn a_stream_reset_before_the_answer_leaves_nothing_behind() {
    let a = FakeReplica::start("a", Behaviour::Echo).await;
    let gw = picker("", &pool("p", "m", &[&a])).await;
    let mut envoy = StandIn::connect(&gw, Mode::FullDuplex).await;
    let mut stream = envoy.open().await;
    let body = chat_body("m");
    stream.request_headers(&[], false, None);
    stream.request_body(&body[..10], false);
    poll_until(DEADLINE, "10 body bytes held", || async {
        match buffered_bytes(&gw).await {
            Some(10.0) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
    drop(stream);
    poll_until(DEADLINE, "the body's bytes given back", || async {
        match buffered_bytes(&gw).await {
            Some(0.0) => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;

    let mut stream = envoy.open().await;
    stream.send_request(&body, &[], None).await;
    stream.decision().await;
    in_flight_becomes(&gw, HashMap::from([(a.addr.to_string(), 1)])).await;
    drop(stream);
    in_flight_becomes(&gw, HashMap::from([(a.addr.to_string(), 0)])).await;
    let metrics = crate::support::admin_get(&gw, "/metrics").await;
    let series =
        "infergate_requests_total{pool=\"p\",model=\"m\",tenant=\"anonymous\",code=\"499\"}";
    assert_eq!(
        crate::support::sample(&metrics, series),
        Some(1.0),
        "{metrics}"
    );
}
