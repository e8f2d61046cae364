//! The HTTP front of a simulated replica: an OpenAI-compatible server in
//! vLLM's image, plus `/metrics` and a fault-injection admin API.
//!
//! | route | what |
//! |---|---|
//! | `POST /v1/chat/completions`, `POST /v1/completions` | generation, streaming (SSE) or not |
//! | `POST /v1/responses` | OpenAI's Responses API on the same generation, streaming or not |
//! | `POST /v1/embeddings` | deterministic vectors, each input timed as a prefill in the engine |
//! | `GET /v1/models` | the base model and loaded LoRA adapters |
//! | `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter` | runtime LoRA, as vLLM |
//! | `POST /tokenize` | a prompt's token ids as the engine gets them, as vLLM |
//! | `GET /health` | 200, empty (503 once a graceful stop began) |
//! | `GET /metrics` | Prometheus text in the replica's dialect |
//! | `GET|POST /admin/faults`, `POST /admin/crash`, `POST /admin/stop` | fault injection, crash, graceful stop |
//!
//! Served with hyper 1.x (HTTP/1.1 and h2c), `TCP_NODELAY` on every accepted
//! socket so small SSE events leave at once instead of waiting on Nagle.

mod admin;
mod body;
mod completions;
mod connection;
mod disaggregated;
mod embeddings;
mod generate;
mod models;
mod openai;
mod output;
mod responses;
mod state;
mod tokenize;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub(crate) use admin::apply_faults;
use body::ResponseBody;
use connection::{Kill, Watched};
pub(crate) use disaggregated::Disaggregated;
use openai::Endpoint;
pub(crate) use state::{AppState, Drain, StopMode, StopSignal};

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
                    let kill = Kill::new(state.stop.clone());
                    let io = TokioIo::new(Watched::new(stream, kill.clone()));
                    let request_kill = kill.clone();
                    let service = service_fn(move |mut request: Request<Incoming>| {
                        let state = state.clone();
                        request.extensions_mut().insert(request_kill.clone());
                        async move { Ok::<_, Infallible>(route(state, request).await) }
                    });
                    let connection = builder.serve_connection(io, service).into_owned();
                    let mut closing = close_idle_rx.clone();
                    connections.spawn(async move {
                        let mut connection = std::pin::pin!(connection);
                        // A killed connection is dropped mid-answer, as a
                        // dead process drops it.
                        tokio::select! {
                            _ = connection.as_mut() => return,
                            () = kill.closed() => return,
                            _ = closing.wait_for(|closing| *closing) => {}
                        }
                        connection.as_mut().graceful_shutdown();
                        tokio::select! {
                            _ = connection => {}
                            () = kill.closed() => {}
                        }
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
    if parts.method == Method::POST && INFERENCE_ROUTES.contains(&parts.uri.path()) {
        let kill = parts
            .extensions
            .get::<Arc<Kill>>()
            .cloned()
            .expect("every connection has a kill switch");
        return inference(state, parts.uri.path(), body, kill).await;
    }
    match (&parts.method, parts.uri.path()) {
        (&Method::GET, "/v1/models") => models::list(&state),
        (&Method::POST, "/v1/load_lora_adapter") => models::load_adapter(state, body).await,
        (&Method::POST, "/v1/unload_lora_adapter") => models::unload_adapter(state, body).await,
        (&Method::POST, "/tokenize") => tokenize::handle(&state, body).await,
        (&Method::GET, "/health") if state.drain.is_draining() => {
            body::empty(StatusCode::SERVICE_UNAVAILABLE)
        }
        (&Method::GET, "/health") => body::empty(StatusCode::OK),
        (&Method::GET, "/metrics") => admin::metrics(&state).await,
        (&Method::GET, "/admin/faults") => admin::get_faults(&state),
        (&Method::POST, "/admin/faults") => admin::set_faults(state, body).await,
        (&Method::POST, "/admin/crash") => admin::crash(&state),
        (&Method::POST, "/admin/stop") => admin::stop(&state),
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

/// The routes that run the engine: counted in flight, refused while a
/// graceful stop drains them.
const INFERENCE_ROUTES: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
];

/// An inference request, counted in flight until its response (a stream
/// included) is done with.
async fn inference(
    state: Arc<AppState>,
    path: &str,
    body: Incoming,
    kill: Arc<Kill>,
) -> Response<ResponseBody> {
    let Some(in_flight) = state.drain.enter() else {
        return body::ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailableError",
            "The server is shutting down and takes no new requests.",
        )
        .into_response();
    };
    let response = match path {
        "/v1/chat/completions" => completions::handle(state, body, Endpoint::Chat, kill).await,
        "/v1/completions" => completions::handle(state, body, Endpoint::Completions, kill).await,
        "/v1/responses" => responses::handle(state, body, kill).await,
        _ => embeddings::handle(state, body).await,
    };
    response.map(|inner| body::boxed(body::Holding::new(inner, in_flight)))
}

const ROUTES: [&str; 13] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/models",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/tokenize",
    "/health",
    "/metrics",
    "/admin/faults",
    "/admin/crash",
    "/admin/stop",
];
