//! The admin listener: health, readiness and the state of every pool.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;

use crate::body::{self, ResponseBody};
use crate::error::ApiError;
use crate::state::State;

pub async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<ResponseBody> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/healthz") => plain(StatusCode::OK, "ok".into()),
        (&Method::GET, "/readyz") => {
            let now = Instant::now();
            if !state.is_shutting_down() && state.pools.iter().any(|p| p.is_ready(now)) {
                plain(StatusCode::OK, "ready".into())
            } else {
                plain(StatusCode::SERVICE_UNAVAILABLE, "not ready".into())
            }
        }
        (&Method::GET, "/debug/pools") => debug_pools(&state),
        (_, path @ ("/healthz" | "/readyz" | "/debug/pools")) => {
            ApiError::method_not_allowed(req.method(), path).into_response()
        }
        (_, path) => ApiError::not_found(path).into_response(),
    }
}

/// Every pool and replica as the picker sees it right now.
fn debug_pools(state: &State) -> Response<ResponseBody> {
    let now = Instant::now();
    let pools: Vec<_> = state
        .pools
        .iter()
        .map(|pool| {
            let cfg = pool.picker.config();
            let endpoints: Vec<_> = pool
                .picker
                .endpoints()
                .iter()
                .map(|e| {
                    let obs = e.observation.load();
                    let s = obs.state.as_deref();
                    json!({
                        "address": e.addr,
                        "reachable": e.is_reachable(),
                        "health": format!("{:?}", picker::health(&obs, now, cfg.stale_after)).to_lowercase(),
                        "lastGoodScrapeAgeMs": obs.last_good.map(|t| now.duration_since(t).as_secs_f64() * 1e3),
                        "lastError": obs.last_error,
                        "waiting": s.and_then(|s| s.waiting),
                        "running": s.and_then(|s| s.running),
                        "kvUsage": s.and_then(|s| s.kv_usage),
                        "kvCapacityBlocks": s.and_then(|s| s.kv_capacity_blocks),
                        "residentAdapters": s.map(|s| s.resident_adapters.clone()).unwrap_or_default(),
                        "waitingAdapters": s.map(|s| s.waiting_adapters.clone()).unwrap_or_default(),
                        "inflightRequests": e.load.requests(),
                        "inflightTokens": e.load.tokens(),
                    })
                })
                .collect();
            json!({
                "name": pool.name,
                "engine": pool.spec.engine.as_str(),
                "policy": format!("{:?}", cfg.policy),
                "ready": pool.is_ready(now),
                "endpoints": endpoints,
            })
        })
        .collect();
    let mut r = Response::new(body::full(Bytes::from(json!({"pools": pools}).to_string())));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn plain(status: StatusCode, text: String) -> Response<ResponseBody> {
    let mut r = Response::new(body::full(Bytes::from(text)));
    *r.status_mut() = status;
    r
}
