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
//! | `GET /health` | 200, empty |
//! | `GET /metrics` | Prometheus text in the replica's dialect |
//! | `GET|POST /admin/faults`, `POST /admin/crash` | fault injection |
//!
//! Served with hyper 1.x (HTTP/1.1 and h2c), `TCP_NODELAY` on every accepted
//! socket so small SSE events leave at once instead of waiting on Nagle.

mod admin;
mod body;
mod completions;
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

use body::ResponseBody;
use openai::Endpoint;
pub(crate) use state::{AppState, StopMode, StopSignal};

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
        (&Method::POST, "/v1/responses") => responses::handle(state, body).await,
        (&Method::POST, "/v1/embeddings") => embeddings::handle(state, body).await,
        (&Method::GET, "/v1/models") => models::list(&state),
        (&Method::POST, "/v1/load_lora_adapter") => models::load_adapter(state, body).await,
        (&Method::POST, "/v1/unload_lora_adapter") => models::unload_adapter(state, body).await,
        (&Method::POST, "/tokenize") => tokenize::handle(&state, body).await,
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

const ROUTES: [&str; 12] = [
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
];
