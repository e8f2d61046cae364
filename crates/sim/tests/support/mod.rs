//! Helpers for the HTTP tests: a small client, an SSE reader, a Prometheus
//! text checker and a bounded condition poll.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use sim::{ReplicaHandle, ReplicaSpec, start_replica};

pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A replica of `spec` on 127.0.0.1 with an OS-assigned port.
pub async fn replica(spec: ReplicaSpec) -> ReplicaHandle {
    start_replica("127.0.0.1:0".parse().unwrap(), spec)
        .await
        .expect("replica starts")
}

/// An 8B model on an H100, 50× faster than real time.
pub fn fast_spec() -> ReplicaSpec {
    ReplicaSpec {
        time_scale: 50.0,
        ..ReplicaSpec::new("h100", "llama-3.1-8b")
    }
}

pub fn chat(content: &str, extra: Value) -> Value {
    let mut body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
    });
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    body
}

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.to_vec()).expect("UTF-8 body")
    }
}

#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    base: String,
}

impl Http {
    pub fn new(addr: SocketAddr) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Self {
            client,
            base: format!("http://{addr}"),
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        let response = self.send(Method::GET, path, Bytes::new()).await;
        read(response).await
    }

    pub async fn post(&self, path: &str, body: impl Into<Bytes>) -> Reply {
        let response = self.send(Method::POST, path, body.into()).await;
        read(response).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Reply {
        self.post(path, serde_json::to_vec(body).unwrap()).await
    }

    /// Sends a streaming request and returns once the response head arrived.
    pub async fn stream(&self, path: &str, body: &Value) -> Sse {
        let response = self
            .send(Method::POST, path, serde_json::to_vec(body).unwrap().into())
            .await;
        assert_eq!(
            response.status(),
            StatusCode::OK,
            "streaming request refused"
        );
        let content_type = response.headers()[http::header::CONTENT_TYPE]
            .to_str()
            .unwrap();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Sse {
            body: response.into_body(),
            buffer: Vec::new(),
        }
    }

    pub async fn metrics(&self) -> Exposition {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
        Exposition::parse(&reply.text())
    }

    pub async fn send(&self, method: Method, path: &str, body: Bytes) -> http::Response<Incoming> {
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .unwrap();
        self.client
            .request(request)
            .await
            .expect("request reaches the replica")
    }
}

async fn read(response: http::Response<Incoming>) -> Reply {
    let status = response.status();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// Server-sent events as they arrive.
pub struct Sse {
    body: Incoming,
    buffer: Vec<u8>,
}

/// One event and when it arrived: its `data:`, and its `event:` type when
/// it has one (the Responses API names its events, chat streams do not).
pub struct Event {
    pub at: Instant,
    pub event: Option<String>,
    pub data: String,
}

impl Event {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("bad event {:?}: {e}", self.data))
    }
}

impl Sse {
    /// The next event, or `None` at the end of the stream.
    pub async fn next(&mut self) -> Option<Event> {
        self.try_next().await.expect("the stream is not cut")
    }

    /// Like [`next`](Self::next), but a stream cut by the server is an `Err`.
    pub async fn try_next(&mut self) -> Result<Option<Event>, hyper::Error> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8(raw).expect("UTF-8 event");
                let (mut event, mut data) = (None, None);
                for line in text.trim_end().lines() {
                    if let Some(name) = line.strip_prefix("event: ") {
                        assert!(event.replace(name.to_owned()).is_none(), "{text:?}");
                    } else if let Some(value) = line.strip_prefix("data: ") {
                        assert!(data.replace(value.to_owned()).is_none(), "{text:?}");
                    } else {
                        panic!("unexpected line {line:?} in {text:?}");
                    }
                }
                return Ok(Some(Event {
                    at: Instant::now(),
                    event,
                    data: data.unwrap_or_else(|| panic!("not a data event: {text:?}")),
                }));
            }
            let Some(frame) = self.body.frame().await else {
                return Ok(None);
            };
            if let Ok(data) = frame?.into_data() {
                self.buffer.extend_from_slice(&data);
            }
        }
    }

    /// Every remaining event.
    pub async fn all(mut self) -> Vec<Event> {
        let mut events = Vec::new();
        while let Some(event) = self.next().await {
            events.push(event);
        }
        events
    }
}

/// A parsed text exposition. Parsing checks the format: every sample line
/// is `name{labels} value` with a parsable value, and every sample belongs
/// to a family announced by a `# TYPE` line.
#[derive(Debug)]
pub struct Exposition {
    pub text: String,
    pub types: HashMap<String, String>,
    pub samples: Vec<Sample>,
}

#[derive(Debug, Clone)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Exposition {
    pub fn parse(text: &str) -> Self {
        let mut types = HashMap::new();
        let mut samples = Vec::new();
        for line in text.lines() {
            if line.is_empty() {
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE line has a kind");
                assert!(
                    ["gauge", "counter", "histogram", "summary", "untyped"].contains(&kind),
                    "bad TYPE line {line}"
                );
                types.insert(name.to_owned(), kind.to_owned());
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            assert!(!line.starts_with('#'), "unexpected comment {line}");
            samples.push(parse_sample(line));
        }
        for sample in &samples {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    sample
                        .name
                        .strip_suffix(suffix)
                        .filter(|f| types.get(*f).is_some_and(|t| t == "histogram"))
                })
                .unwrap_or(&sample.name);
            assert!(
                types.contains_key(family),
                "{} has no TYPE line",
                sample.name
            );
        }
        Self {
            text: text.to_owned(),
            types,
            samples,
        }
    }

    /// The value of the one sample named `name` whose labels include `labels`.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut matching = self.matching(name, labels);
        let first = matching.next()?;
        assert!(
            matching.next().is_none(),
            "several {name} samples match {labels:?}"
        );
        Some(first.value)
    }

    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    pub fn has_family(&self, name: &str) -> bool {
        self.types.contains_key(name)
    }
}

fn parse_sample(line: &str) -> Sample {
    let (series, value) = line
        .rsplit_once(' ')
        .unwrap_or_else(|| panic!("no value: {line}"));
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
    };
    let (name, labels) = match series.split_once('{') {
        None => (series, BTreeMap::new()),
        Some((name, rest)) => {
            let body = rest
                .strip_suffix('}')
                .unwrap_or_else(|| panic!("unclosed labels: {line}"));
            (name, parse_labels(body, line))
        }
    };
    assert!(
        !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
        "bad metric name in {line}"
    );
    Sample {
        name: name.to_owned(),
        labels,
        value,
    }
}

fn parse_labels(mut body: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    while !body.is_empty() {
        let (key, rest) = body
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label in {line}"));
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => panic!("dangling escape in {line}"),
                },
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {line}"),
            }
        };
        labels.insert(key.to_owned(), value);
        body = rest[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&rest[end + 1..]);
    }
    labels
}

/// Polls `condition` every 20 ms until it holds; fails the test after
/// `limit`. For server-side state the test can only observe by asking.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if condition().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
