//! What the tests share: fake replicas on 127.0.0.1 whose behaviour each
//! test controls, the configs and clients of a gateway started in front of
//! them, and bounded waits for what can only be polled.

#![allow(dead_code)]

pub mod delay;
pub mod exposition;
pub mod logs;
pub mod redis;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use gateway::Gateway;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};

pub type FakeBody = BoxBody<Bytes, Infallible>;

/// The path of chat completions, the request most tests send.
pub const CHAT: &str = "/v1/chat/completions";

/// What a fake replica received.
#[derive(Debug, Clone)]
pub struct Received {
    pub version: http::Version,
    pub method: http::Method,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// How a fake replica answers `/v1/*`.
#[derive(Clone)]
pub enum Behaviour {
    /// 200 with a JSON body naming the replica.
    Echo,
    /// Answer only when the test releases the request (one permit each).
    Held(Arc<tokio::sync::Semaphore>),
    /// An SSE stream whose events the test sends through the channel handed
    /// out by [`FakeReplica::next_stream`].
    Stream,
    /// This status and this JSON body, every time.
    Reply(StatusCode, String),
}

/// How a fake replica's `/metrics` misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricsFault {
    /// Answer 200 with the text set by [`FakeReplica::set_metrics`].
    #[default]
    None,
    /// Accept the scrape and answer nothing until the fault is changed.
    Hang,
    /// Answer 503.
    Unavailable,
    /// Answer the next scrape as [`MetricsFault::None`] would, then hang
    /// as [`MetricsFault::Hang`]: the gateway keeps that one observation.
    OnceThenHang,
}

pub struct FakeReplica {
    pub addr: SocketAddr,
    pub name: String,
    received: Arc<Mutex<Vec<Received>>>,
    arrived: Arc<Notify>,
    streams: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>>>,
    metrics: Arc<Mutex<String>>,
    fault: Arc<Mutex<MetricsFault>>,
    fault_changed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeReplica {
    pub async fn start(name: &str, behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, name, behaviour, None)
    }

    /// Start on a given address (e.g. to bring a replica back).
    pub async fn start_at(addr: SocketAddr, name: &str, behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        Self::serve(listener, name, behaviour, None)
    }

    /// Start behind TLS with `tls` (see [`tls::replica_config`]): HTTP/1.1
    /// or HTTP/2, as the client chooses by ALPN.
    pub async fn start_tls(
        name: &str,
        behaviour: Behaviour,
        tls: Arc<rustls::ServerConfig>,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(
            listener,
            name,
            behaviour,
            Some(tokio_rustls::TlsAcceptor::from(tls)),
        )
    }

    /// The replica's endpoint as a pool lists it: `https://` when behind TLS.
    pub fn https(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn serve(
        listener: TcpListener,
        name: &str,
        behaviour: Behaviour,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Self {
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let arrived = Arc::new(Notify::new());
        let (stream_tx, stream_rx) = mpsc::unbounded_channel();
        let metrics = Arc::new(Mutex::new(idle_vllm_metrics()));
        let fault = Arc::new(Mutex::new(MetricsFault::None));
        let fault_changed = Arc::new(Notify::new());
        let ctx = Arc::new(Ctx {
            name: name.to_owned(),
            behaviour,
            received: Arc::clone(&received),
            arrived: Arc::clone(&arrived),
            streams: stream_tx,
            metrics: Arc::clone(&metrics),
            fault: Arc::clone(&fault),
            fault_changed: Arc::clone(&fault_changed),
        });
        let task = tokio::spawn(async move {
            // Connections live in the accept task's set, so aborting the
            // task (kill, drop) closes them too.
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    break;
                };
                let _ = stream.set_nodelay(true);
                while connections.try_join_next().is_some() {}
                let ctx = Arc::clone(&ctx);
                let tls = tls.clone();
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let ctx = Arc::clone(&ctx);
                        async move { Ok::<_, Infallible>(ctx.answer(req).await) }
                    });
                    let builder =
                        hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                    let _ = match tls {
                        None => {
                            builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await
                        }
                        Some(tls) => match tls.accept(stream).await {
                            Ok(stream) => {
                                builder
                                    .serve_connection(TokioIo::new(stream), service)
                                    .await
                            }
                            Err(_) => return,
                        },
                    };
                });
            }
        });
        Self {
            addr,
            name: name.to_owned(),
            received,
            arrived,
            streams: Arc::new(tokio::sync::Mutex::new(stream_rx)),
            metrics,
            fault,
            fault_changed,
            task,
        }
    }

    pub fn received(&self) -> Vec<Received> {
        self.received.lock().clone()
    }

    /// Inference requests received (scrapes not counted).
    pub fn count(&self) -> usize {
        self.received.lock().len()
    }

    /// Wait until at least `n` inference requests have arrived.
    pub async fn wait_for(&self, n: usize) {
        loop {
            let notified = self.arrived.notified();
            if self.count() >= n {
                return;
            }
            notified.await;
        }
    }

    /// The sender for the next streamed response, once its request arrived.
    pub async fn next_stream(&self) -> mpsc::Sender<Bytes> {
        self.streams
            .lock()
            .await
            .recv()
            .await
            .expect("replica stopped")
    }

    pub fn set_metrics(&self, text: &str) {
        *self.metrics.lock() = text.to_owned();
    }

    /// Make `/metrics` misbehave, or behave again with
    /// [`MetricsFault::None`]. Scrapes hanging on [`MetricsFault::Hang`]
    /// are answered by the new behaviour.
    pub fn set_metrics_fault(&self, fault: MetricsFault) {
        *self.fault.lock() = fault;
        self.fault_changed.notify_waiters();
    }

    /// Answer exactly one scrape with `text`, then hang as
    /// [`MetricsFault::OnceThenHang`] does. Text and fault change together:
    /// setting them one after the other lets a scrape in between answer
    /// `text` too, a second observation the test did not mean.
    pub fn set_metrics_once(&self, text: &str) {
        {
            let mut fault = self.fault.lock();
            *self.metrics.lock() = text.to_owned();
            *fault = MetricsFault::OnceThenHang;
        }
        self.fault_changed.notify_waiters();
    }

    /// Stop listening and drop every connection.
    pub fn kill(&self) {
        self.task.abort();
    }
}

/// Send one event of a streamed answer through the sender of
/// [`FakeReplica::next_stream`].
pub async fn emit(events: &mpsc::Sender<Bytes>, event: &'static str) {
    events
        .send(Bytes::from_static(event.as_bytes()))
        .await
        .expect("the replica's stream is open");
}

impl Drop for FakeReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Ctx {
    name: String,
    behaviour: Behaviour,
    received: Arc<Mutex<Vec<Received>>>,
    arrived: Arc<Notify>,
    streams: mpsc::UnboundedSender<mpsc::Sender<Bytes>>,
    metrics: Arc<Mutex<String>>,
    fault: Arc<Mutex<MetricsFault>>,
    fault_changed: Arc<Notify>,
}

impl Ctx {
    async fn answer(&self, req: Request<Incoming>) -> Response<FakeBody> {
        if req.uri().path() == "/metrics" {
            return self.metrics().await;
        }
        // The gateway reads a vLLM replica's model list for its context
        // length; like `/metrics`, that is not traffic a test sent.
        if req.method() == http::Method::GET && req.uri().path() == "/v1/models" {
            let mut r = full(
                StatusCode::OK,
                r#"{"object": "list", "data": [{"id": "m", "object": "model"}]}"#.to_owned(),
            );
            r.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            return r;
        }
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        self.received.lock().push(Received {
            version: parts.version,
            method: parts.method,
            path: parts.uri.path().to_owned(),
            headers: parts.headers,
            body,
        });
        self.arrived.notify_waiters();
        match &self.behaviour {
            Behaviour::Echo => self.echo(),
            Behaviour::Held(gate) => {
                gate.acquire().await.unwrap().forget();
                self.echo()
            }
            Behaviour::Reply(status, body) => {
                let mut r = full(*status, body.clone());
                r.headers_mut()
                    .insert("content-type", "application/json".parse().unwrap());
                r
            }
            Behaviour::Stream => {
                let (tx, rx) = mpsc::channel::<Bytes>(16);
                self.streams.send(tx).unwrap();
                let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                    rx.recv()
                        .await
                        .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
                });
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(BodyExt::boxed(StreamBody::new(stream)))
                    .unwrap()
            }
        }
    }

    async fn metrics(&self) -> Response<FakeBody> {
        loop {
            let changed = self.fault_changed.notified();
            // The text is read under the fault's lock, so a scrape sees a
            // fault and a text that were set together.
            let answer = {
                let mut fault = self.fault.lock();
                match *fault {
                    MetricsFault::None => Some(full(StatusCode::OK, self.metrics.lock().clone())),
                    MetricsFault::OnceThenHang => {
                        *fault = MetricsFault::Hang;
                        Some(full(StatusCode::OK, self.metrics.lock().clone()))
                    }
                    MetricsFault::Unavailable => Some(full(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "metrics unavailable".into(),
                    )),
                    MetricsFault::Hang => None,
                }
            };
            match answer {
                Some(answer) => return answer,
                None => changed.await,
            }
        }
    }

    fn echo(&self) -> Response<FakeBody> {
        let mut r = full(
            StatusCode::OK,
            format!(
                r#"{{"object":"chat.completion","replica":"{}"}}"#,
                self.name
            ),
        );
        r.headers_mut()
            .insert("content-type", "application/json".parse().unwrap());
        r
    }
}

fn full(status: StatusCode, body: String) -> Response<FakeBody> {
    let mut r = Response::new(BodyExt::boxed(Full::new(Bytes::from(body))));
    *r.status_mut() = status;
    r
}

/// A vLLM exposition for an idle replica.
pub fn idle_vllm_metrics() -> String {
    vllm_metrics(0, 0, 0.0, &[])
}

pub fn vllm_metrics(waiting: u64, running: u64, kv: f64, resident: &[&str]) -> String {
    format!(
        "# HELP vllm:num_requests_waiting Number of requests waiting.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",model_name=\"m\"}} {waiting}\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",model_name=\"m\"}} {running}\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",model_name=\"m\"}} {kv}\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{{max_lora=\"2\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"\"}} 1.7e9\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"10000\"}} 1.0\n",
        resident.join(",")
    )
}

/// A gateway config with one listener on a free port and the given pools
/// (YAML list items, indented by four spaces).
pub fn config(extra_spec: &str, pools: &str) -> config::InferenceGatewayConfig {
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners:\n    - {{name: public, address: \"127.0.0.1:0\"}}\n{extra_spec}  pools:\n{pools}"
    );
    config::from_yaml(&yaml).unwrap_or_else(|e| panic!("test config refused: {e}\n{yaml}"))
}

/// One pool `p` serving model `m` from `endpoints`, round-robin, with no
/// engine metrics (a YAML list item for [`config`]). `extra` goes on at the
/// end of the pool's fields, e.g. `, retry: {maxRetries: 0}`.
pub fn plain_pool(endpoints: &[&str], extra: &str) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        "    - {{name: p, engine: none, models: [m], endpoints: [{}], scheduling: {{policy: round-robin}}{extra}}}\n",
        endpoints.join(", ")
    )
}

/// The body of a `GET` of `path` on the gateway's admin listener.
pub async fn admin_get(gw: &Gateway, path: &str) -> String {
    let admin = gw.admin_addr().expect("admin listener configured");
    client()
        .get(format!("http://{admin}{path}"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of a simulated replica's `metric` samples whose labels contain
/// `label` (an empty `label`: every sample of the metric).
pub async fn sim_metric(replica: &sim::ReplicaHandle, metric: &str, label: &str) -> f64 {
    let text = client()
        .get(format!("http://{}/metrics", replica.local_addr()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
                && l.contains(label)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The value of the sample `name{labels}` (labels as written, in order).
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// A raw `/healthz` request, for tests that hold the connection themselves.
pub const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n";

/// Read one answer to [`HEALTHZ`] off `conn`: its head, then `ok`. Fails
/// if the connection closes first, or after 10 s without it.
pub async fn healthz_answered(conn: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    while !got.ends_with(b"\r\n\r\nok") {
        let mut buf = [0; 1024];
        let n = tokio::time::timeout(std::time::Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("answered within 10 s")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
}

/// A replica written by hand: a listener on 127.0.0.1 that hands each
/// connection to `serve`, for answers the fake replicas cannot give. Its
/// address, `host:port`.
pub async fn raw_replica<F, Fut>(serve: F) -> String
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream));
        }
    });
    addr
}

/// An address nothing listens on.
pub async fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap().to_string()
}

/// `fut`, failing the test naming `what` if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {limit:?}: {what}"))
}

/// Look every 5 ms until `look` finds what it looks for (`Ok`), for at
/// most `limit`, and return it. What the gateway shows changes with its own
/// timers and scrapes, with no event to wait on from outside; a failure
/// names `what` and what the last look saw instead (its `Err`).
pub async fn poll_until<T, F>(limit: Duration, what: &str, mut look: impl FnMut() -> F) -> T
where
    F: Future<Output = Result<T, String>>,
{
    let mut last = String::from("nothing");
    let found = tokio::time::timeout(limit, async {
        loop {
            match look().await {
                Ok(found) => return found,
                Err(seen) => last = seen,
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("never {what} within {limit:?}; last seen: {last}"))
}

/// The admin listener's `/debug/pools`, whole.
pub async fn debug_pools(gw: &Gateway) -> Value {
    let admin = gw.admin_addr().expect("admin listener configured");
    client()
        .get(format!("http://{admin}/debug/pools"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Poll `/debug/pools` until `ready` holds of it, and return it.
pub async fn until_debug_pools(
    gw: &Gateway,
    limit: Duration,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let ready = &ready;
    poll_until(limit, what, move || async move {
        let pools = debug_pools(gw).await;
        if ready(&pools) {
            Ok(pools)
        } else {
            Err(pools.to_string())
        }
    })
    .await
}
