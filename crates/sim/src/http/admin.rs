//! `/metrics`, `/health` and the fault-injection admin API
//! (`GET|POST /admin/faults`, `POST /admin/crash`, `POST /admin/stop`).

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;

use super::body::{ApiError, ResponseBody, boxed, json, read_json, text};
use super::state::{AppState, StopMode};
use crate::faults::{Faults, FaultsUpdate, MetricsFault};

/// What `/metrics` serves under the `garbage` fault: a page a proxy in the
/// way might answer with, 200 and all.
const GARBAGE_METRICS: &str =
    "<html><head><title>Welcome</title></head><body><h1>It works!</h1></body></html>\n";

pub(super) async fn metrics(state: &AppState) -> Response<ResponseBody> {
    let content_type = crate::metrics::content_type(state.exporter.lock().dialect());
    match state.faults.current().metrics {
        MetricsFault::Ok => {}
        MetricsFault::Dead => {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain; charset=utf-8",
                "Service Unavailable",
            );
        }
        MetricsFault::Hang => std::future::pending::<()>().await,
        MetricsFault::Garbage => {
            return text(StatusCode::OK, "text/html; charset=utf-8", GARBAGE_METRICS);
        }
        MetricsFault::Frozen => {
            if let Some(frozen) = state.last_metrics.lock().clone() {
                return text(StatusCode::OK, content_type, frozen);
            }
        }
    }
    match render_metrics(state).await {
        Ok(rendered) => text(StatusCode::OK, content_type, rendered),
        Err(error) => error.into_response(),
    }
}

/// Renders fresh metrics and remembers them (what a frozen `/metrics` serves).
async fn render_metrics(state: &AppState) -> Result<Bytes, ApiError> {
    let snapshot = state.engine.snapshot().await.map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "The engine has stopped.",
        )
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let rendered = Bytes::from(state.exporter.lock().render(
        &snapshot.stats,
        &snapshot.requests,
        now,
    ));
    *state.last_metrics.lock() = Some(rendered.clone());
    Ok(rendered)
}

pub(super) fn get_faults(state: &AppState) -> Response<ResponseBody> {
    json(StatusCode::OK, &state.faults.current())
}

pub(super) async fn set_faults(state: Arc<AppState>, body: Incoming) -> Response<ResponseBody> {
    let update: FaultsUpdate = match read_json(body).await {
        Ok(update) => update,
        Err(error) => return error.into_response(),
    };
    match apply_faults(&state, &update) {
        Ok(faults) => json(StatusCode::OK, &faults),
        Err(error) => error.into_response(),
    }
}

/// Applies a change of faults (the admin API's, or a test's through the
/// replica's handle); the faults now in force.
pub(crate) fn apply_faults(state: &AppState, update: &FaultsUpdate) -> Result<Faults, ApiError> {
    let faults = state.faults.update(update).map_err(ApiError::bad_request)?;
    if let Some(factor) = update.slowdown
        && state.engine.set_slowdown(factor).is_err()
    {
        return Err(ApiError::internal("The engine has stopped."));
    }
    tracing::info!(?faults, "faults changed");
    Ok(faults)
}

/// A graceful stop: new inference requests get a 503 from now on, the ones
/// in flight run to their end, then the replica stops listening. Answers
/// with the number of requests it waits for.
pub(super) fn stop(state: &Arc<AppState>) -> Response<ResponseBody> {
    tracing::warn!("graceful stop requested through the admin API");
    state.begin_drain();
    json(
        StatusCode::OK,
        &serde_json::json!({"stopping": true, "in_flight": state.drain.in_flight()}),
    )
}

/// Answers, then crashes the replica once the answer has been handed to the
/// connection (the body's drop triggers it).
pub(super) fn crash(state: &Arc<AppState>) -> Response<ResponseBody> {
    tracing::warn!("crash requested through the admin API");
    let body = CrashAfter {
        inner: Full::new(Bytes::from_static(b"crashing\n")),
        state: state.clone(),
    };
    let mut response = Response::new(boxed(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

struct CrashAfter {
    inner: Full<Bytes>,
    state: Arc<AppState>,
}

impl Drop for CrashAfter {
    fn drop(&mut self) {
        self.state.stop.request(StopMode::Crash);
    }
}

impl Body for CrashAfter {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
