//! Fake replicas on 127.0.0.1 whose behaviour each test controls, and a
//! gateway started in front of them.

#![allow(dead_code)]

pub mod descriptors;
pub mod exposition;
pub mod logs;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};

pub type FakeBody = BoxBody<Bytes, Infallible>;

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
        Self::serve(listener, name, behaviour)
    }

    /// Start on a given address (e.g. to bring a replica back).
    pub async fn start_at(addr: SocketAddr, name: &str, behaviour: Behaviour) -> Self {
        let listener = TcpListener::bind(addr).await.unwrap();
        Self::serve(listener, name, behaviour)
    }

    fn serve(listener: TcpListener, name: &str, behaviour: Behaviour) -> Self {
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
                connections.spawn(async move {
                    let service = service_fn(move |req| {
                        let ctx = Arc::clone(&ctx);
                        async move { Ok::<_, Infallible>(ctx.answer(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
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

    /// Stop listening and drop every connection.
    pub fn kill(&self) {
        self.task.abort();
    }
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
            let fault = *self.fault.lock();
            match fault {
                MetricsFault::None => return full(StatusCode::OK, self.metrics.lock().clone()),
                MetricsFault::OnceThenHang => {
                    *self.fault.lock() = MetricsFault::Hang;
                    return full(StatusCode::OK, self.metrics.lock().clone());
                }
                MetricsFault::Unavailable => {
                    return full(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "metrics unavailable".into(),
                    );
                }
                MetricsFault::Hang => changed.await,
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
