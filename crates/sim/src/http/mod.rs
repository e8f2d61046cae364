//! The HTTP front of a simulated replica: an OpenAI-compatible server in
//! vLLM's image, plus `/metrics` and a fault-injection admin API.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/chat/completions`, `POST /v1/completions` | generation, streaming (SSE) or not |
//! | `GET /v1/models` | the base model and loaded LoRA adapters |
//! | `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter` | runtime LoRA, as vLLM |
//! | `GET /health` | 200, empty |
//! | `GET /metrics` | Prometheus text in the replica's dialect |
//! | `GET|POST /admin/faults`, `POST /admin/crash` | fault injection |
//!
//! Served with hyper 1.x (HTTP/1.1 and h2c), `TCP_NODELAY` on every accepted
//! socket so small SSE events leave at once instead of waiting on Nagle.

mod admin;
mod body;
mod completions;
mod models;
mod openai;
mod output;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::faults::FaultState;
use crate::metrics::Exporter;
use crate::replica::EngineClient;
use body::{ApiError, ResponseBody};
use openai::Endpoint;

/// Largest request body accepted (a long prompt is a few MB of JSON).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// How a replica is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StopMode {
    Running,
    /// Stop accepting, let in-flight requests finish (bounded), then close.
    Graceful,
    /// Stop listening and drop every connection at once.
    Crash,
}

/// Shared by the replica's handle, its admin API and its server loop.
#[derive(Debug)]
pub(crate) struct StopSignal(watch::Sender<StopMode>);

impl StopSignal {
    pub(crate) fn new() -> Self {
        Self(watch::Sender::new(StopMode::Running))
    }

    /// Escalates only: a crash overrides a graceful stop, never the reverse.
    pub(crate) fn request(&self, mode: StopMode) {
        self.0.send_if_modified(|current| {
            let escalate = mode > *current;
            if escalate {
                *current = mode;
            }
            escalate
        });
    }

    fn subscribe(&self) -> watch::Receiver<StopMode> {
        self.0.subscribe()
    }
}

/// A LoRA adapter the server lists and accepts as `model`.
#[derive(Debug, Clone)]
pub(crate) struct LoadedAdapter {
    pub name: String,
    pub path: String,
}

/// Everything the handlers of one replica share.
pub(crate) struct AppState {
    /// The name clients use for the base model.
    pub served_model: String,
    /// `root` of the base model card (the model path, i.e. the HF id).
    pub model_root: String,
    pub max_model_len: u32,
    /// Whether adapters can be loaded (`max_loras > 0`).
    pub lora_enabled: bool,
    /// Seeds answer lengths and words.
    pub seed: u64,
    pub engine: EngineClient,
    pub adapters: Mutex<Vec<LoadedAdapter>>,
    pub faults: FaultState,
    pub exporter: Mutex<Exporter>,
    /// The last `/metrics` text served, for the `frozen` fault.
    pub last_metrics: Mutex<Option<Bytes>>,
    pub stop: Arc<StopSignal>,
}

impl AppState {
    /// Maps a request's `model` to the name to answer with and the adapter
    /// to run (vLLM: base model if absent, 404 if unknown).
    pub(crate) fn resolve_model(
        &self,
        requested: Option<&str>,
    ) -> Result<(String, Option<String>), ApiError> {
        match requested {
            None => Ok((self.served_model.clone(), None)),
            Some(name) if name == self.served_model => Ok((self.served_model.clone(), None)),
            Some(name) if self.adapters.lock().iter().any(|a| a.name == name) => {
                Ok((name.to_owned(), Some(name.to_owned())))
            }
            Some(name) => Err(
                ApiError::not_found(format!("The model `{name}` does not exist."))
                    .with_param("model"),
            ),
        }
    }
}

/// Accepts connections on `listener` until the stop signal fires. A graceful
/// stop lets open requests run for up to `drain`; a crash drops everything.
pub(crate) async fn serve(listener: TcpListener, state: Arc<AppState>, drain: Duration) {
    let mut stop = state.stop.subscribe();
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut connections = JoinSet::new();
    let (close_idle, close_idle_rx) = watch::channel(false);

    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _peer)) => {
                    if let Err(error) = stream.set_nodelay(true) {
                        tracing::debug!(%error, "could not set TCP_NODELAY");
                    }
                    let state = state.clone();
                    let service = service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(route(state, request).await) }
                    });
                    let connection = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                    let mut closing = close_idle_rx.clone();
                    connections.spawn(async move {
                        let mut connection = std::pin::pin!(connection);
                        tokio::select! {
                            _ = connection.as_mut() => return,
                            _ = closing.wait_for(|closing| *closing) => {}
                        }
                        connection.as_mut().graceful_shutdown();
                        let _ = connection.await;
                    });
                }
                Err(error) => {
                    // Typically out of file descriptors: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            () = stop_requested(&mut stop, StopMode::Graceful) => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    // Closing the listener makes new connections fail at once.
    drop(listener);

    if *stop.borrow() == StopMode::Graceful {
        let _ = close_idle.send(true);
        let drained = async { while connections.join_next().await.is_some() {} };
        tokio::select! {
            () = drained => {}
            () = tokio::time::sleep(drain) => {}
            () = stop_requested(&mut stop, StopMode::Crash) => {}
        }
    }
    // Aborting the tasks drops their sockets (and request handles, which
    // abort the requests in the engine).
    connections.shutdown().await;
}

/// Resolves once a stop of at least `mode` is requested (or the signal is gone).
async fn stop_requested(stop: &mut watch::Receiver<StopMode>, mode: StopMode) {
    let _ = stop.wait_for(|current| *current >= mode).await;
}

async fn route(state: Arc<AppState>, request: Request<Incoming>) -> Response<ResponseBody> {
    let (parts, body) = request.into_parts();
    match (&parts.method, parts.uri.path()) {
        (&Method::POST, "/v1/chat/completions") => {
            completions::handle(state, body, Endpoint::Chat).await
        }
        (&Method::POST, "/v1/completions") => {
            completions::handle(state, body, Endpoint::Completions).await
        }
        (&Method::GET, "/v1/models") => models::list(&state),
        (&Method::POST, "/v1/load_lora_adapter") => models::load_adapter(state, body).await,
        (&Method::POST, "/v1/unload_lora_adapter") => models::unload_adapter(state, body).await,
        (&Method::GET, "/health") => body::empty(StatusCode::OK),
        (&Method::GET, "/metrics") => admin::metrics(&state).await,
        (&Method::GET, "/admin/faults") => admin::get_faults(&state),
        (&Method::POST, "/admin/faults") => admin::set_faults(state, body).await,
        (&Method::POST, "/admin/crash") => admin::crash(&state),
        (_, path) if ROUTES.contains(&path) => body::json(
            StatusCode::METHOD_NOT_ALLOWED,
            &serde_json::json!({"detail": "Method Not Allowed"}),
        ),
        _ => body::json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"detail": "Not Found"}),
        ),
    }
}

const ROUTES: [&str; 9] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/health",
    "/metrics",
    "/admin/faults",
    "/admin/crash",
];

/// Reads a request body, refusing bodies over [`MAX_BODY_BYTES`].
async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BadRequestError",
            format!("The request body exceeds {MAX_BODY_BYTES} bytes."),
        )),
        Err(error) => Err(ApiError::bad_request(format!(
            "Could not read the request body: {error}"
        ))),
    }
}

/// Reads and parses a JSON body; malformed JSON is a 400.
async fn read_json<T: DeserializeOwned>(body: Incoming) -> Result<T, ApiError> {
    let bytes = read_body(body).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}
