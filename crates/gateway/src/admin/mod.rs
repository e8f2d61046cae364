//! The admin listener: health, readiness, Prometheus metrics, the state
//! of every pool as the picker sees it, every rewrite's weights, guards
//! and events (`/debug/rewrites`), the fleet page (`ui/`), the load
//! summary global routers read (`/global/summary`, `load_summary.rs`), and
//! replicas drained by hand for maintenance (`/admin/…/drain`, `drain.rs`).

pub mod drain;
pub mod load_summary;
pub mod ui;

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, Method, Response, StatusCode, header};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::generation::pool::Pool;
use crate::inbound::server::Request;
use crate::outbound::response_body::ResponseBody;
use crate::respond::{self, text};
use crate::state::State;
use crate::telemetry::decisions::scorer_name;

/// The OpenMetrics text format; Prometheus reads it natively.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

pub async fn handle(state: Arc<State>, req: Request) -> Response<ResponseBody> {
    if drain::serves(req.path()) {
        return drain::handle(state, req).await;
    }
    match (&req.method, req.path()) {
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok"),
        (&Method::GET, "/readyz") => crate::respond::readyz(state.readiness()),
        (&Method::GET, "/metrics") => {
            let mut r = Response::new(crate::outbound::response_body::full(Bytes::from(
                state.metrics.encode(),
            )));
            r.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(OPENMETRICS));
            r
        }
        (&Method::GET, "/global/summary") => crate::admin::load_summary::get(&state),
        (&Method::GET, "/global/summary/stream") => {
            crate::admin::load_summary::stream(Arc::clone(&state))
        }
        (&Method::GET, "/debug/pools") => debug_pools(&state),
        (&Method::GET, "/debug/config") => debug_config(&state),
        (&Method::GET, "/debug/members") => respond::json(Bytes::from(
            crate::members::debug::page(&state.members).to_string(),
        )),
        (&Method::GET, "/debug/rewrites") => respond::json(Bytes::from(
            state.generation().rewrites.debug_json().to_string(),
        )),
        (&Method::GET, path) if ui::serves(path) => ui::get(&state, &req),
        (
            _,
            path @ ("/healthz"
            | "/readyz"
            | "/metrics"
            | "/debug/pools"
            | "/debug/config"
            | "/debug/members"
            | "/debug/rewrites"
            | "/global/summary"
            | "/global/summary/stream"),
        ) => ApiError::method_not_allowed(&req.method, path).into_response(),
        (_, path) if ui::serves(path) => {
            ApiError::method_not_allowed(&req.method, path).into_response()
        }
        (_, path) => ApiError::not_found(path).into_response(),
    }
}

/// The config in force: which generation, where from, since when, and
/// its spec (a Redis password left out).
fn debug_config(state: &State) -> Response<ResponseBody> {
    let generation = state.generation();
    let applied = &generation.applied;
    let mut spec = applied.spec.clone();
    if let Some(redis) = &mut spec.rate_limits.redis {
        redis.url = crate::rate_limits::redacted(&redis.url);
    }
    let body = json!({
        "generation": applied.number,
        "source": &*state.config_source.lock(),
        "appliedAt": humantime::format_rfc3339_millis(applied.at).to_string(),
        "spec": spec,
    });
    respond::json(Bytes::from(body.to_string()))
}

/// Every pool and replica as the picker sees it right now, with each
/// replica's scores for a typical request.
fn debug_pools(state: &State) -> Response<ResponseBody> {
    let now = Instant::now();
    let pools: Vec<_> = state
        .generation()
        .pools
        .iter()
        .map(|pool| pool_json(pool, now))
        .collect();
    respond::json(Bytes::from(json!({"pools": pools}).to_string()))
}

fn pool_json(pool: &Pool, now: Instant) -> Value {
    let runtime = pool.runtime();
    let cfg = runtime.picker().config();
    let typical = typical_scores(pool, now);
    let prefix_index = runtime.picker().prefix_index();
    let events = runtime.prefix_events();
    let draining = runtime.draining();
    let endpoints: Vec<_> = runtime
        .picker()
        .endpoints()
        .iter()
        .map(|e| {
            let obs = e.observation();
            let s = obs.state.as_deref();
            let health = picker::health(&obs, now, cfg.stale_after);
            let scores = typical.scores.as_ref().map(|scores| {
                scores
                    .iter()
                    .find(|c| Arc::ptr_eq(&c.endpoint, e))
                    .map_or(Value::Null, candidate_json)
            });
            json!({
                "address": &*e.addr,
                // A disaggregated pool's own replicas decode.
                "role": if pool.disaggregation().is_some() { "decode" } else { "both" },
                "reachable": e.is_reachable(),
                "health": health.name(),
                // As /readyz, the metrics and the status count it.
                "ready": picker::is_ready(e, &cfg, now),
                // Drained by hand: no new requests; evacuating: its
                // streams move to other replicas.
                "draining": e.draining(),
                "evacuating": e.evacuating(),
                "drain": draining.iter().find(|d| d.addr == e.addr).map(drain::drain_json),
                "stale": health != picker::Health::Healthy,
                "lastGoodScrapeAgeMs": obs.last_good.map(|t| now.saturating_duration_since(t).as_secs_f64() * 1e3),
                "lastError": obs.last_error,
                "scrapeErrors": pool.metrics().endpoint(e).scrape_errors(),
                "waiting": s.and_then(|s| s.waiting),
                "running": s.and_then(|s| s.running),
                "kvUsage": s.and_then(|s| s.kv_usage),
                "kvCapacityBlocks": s.and_then(|s| s.kv_capacity_blocks),
                "residentAdapters": s.map(|s| s.resident_adapters.clone()).unwrap_or_default(),
                "waitingAdapters": s.map(|s| s.waiting_adapters.clone()).unwrap_or_default(),
                // Prompt and completion tokens the replica takes: its own
                // word, else the pool's maxModelLen; null while unknown.
                "contextLength": e.context_limit().or(cfg.context_length),
                "inflightRequests": e.load.requests(),
                "inflightTokens": e.load.tokens(),
                "inflightUnanswered": e.load.unanswered(),
                "prefixIndexBlocks": prefix_index.blocks_held(e.index),
                "prefixSource": prefix_source(&events, e.index),
                // The replica's learned latency model: its fit, its recent
                // error and whether the predicted policy trusts it.
                "latencyModel": serde_json::to_value(e.latency().summary()).ok(),
                "kvEvents": events
                    .iter()
                    .filter(|p| p.id.replica == e.index as u64)
                    .map(kv_events_json)
                    .collect::<Vec<_>>(),
                // null: not a candidate for the typical request (unhealthy,
                // stale, unreachable or saturated). Absent: the pool's
                // policy does not score.
                "scores": scores,
            })
        })
        .collect();
    let queued: serde_json::Map<String, Value> = config::Priority::ALL
        .iter()
        .map(|band| {
            let (requests, bytes) = runtime.admission().queued(*band);
            (
                band.as_str().to_owned(),
                json!({"requests": requests, "bytes": bytes}),
            )
        })
        .collect();
    json!({
        "name": &**pool.name(),
        "engine": pool.engine().as_str(),
        "policy": cfg.policy.name(),
        "weights": picker::Scorer::ALL
            .iter()
            .map(|s| (scorer_name(*s), json!(s.weight(&cfg.weights))))
            .collect::<serde_json::Map<_, _>>(),
        "ready": runtime.is_ready(now),
        "typicalRequest": {
            "description": "no adapter, no cached prefix, the default output length",
            "estimatedTokens": TYPICAL_TOKENS,
            "outcome": typical.outcome,
        },
        "queued": queued,
        "endpoints": endpoints,
        "disaggregation": pool.disaggregation().map(|d| json!({
            "protocol": d.protocol().as_str(),
            "minUncachedTokens": d.min_uncached_tokens(),
            "prefill": d.replicas().iter().map(|p| json!({
                "address": &*p.addr,
                "role": "prefill",
                "inflightRequests": p.in_flight(),
                "outstandingTokens": p.outstanding_tokens(),
            })).collect::<Vec<_>>(),
        })),
        // Replicas that left the pool (removed, or their pods terminating)
        // and still drain: their requests in flight finish or move.
        "leaving": draining
            .iter()
            .filter(|d| !d.member)
            .map(drain::leaving_json)
            .collect::<Vec<_>>(),
    })
}

/// Which index scores a replica's prefix: `events` while every rank's
/// stream is in step, `unsure` while one is not (the guess answers), and
/// `approximate` for a pool that does not follow events.
fn prefix_source(events: &[kv_events::index::PublisherStatus], replica: usize) -> &'static str {
    let mut ranks = events
        .iter()
        .filter(|p| p.id.replica == replica as u64)
        .peekable();
    if ranks.peek().is_none() {
        return "approximate";
    }
    if ranks.all(|p| p.source == kv_events::index::Source::Events) {
        "events"
    } else {
        "unsure"
    }
}

/// One rank's KV-events stream, as `/debug/pools` shows it.
fn kv_events_json(p: &kv_events::index::PublisherStatus) -> Value {
    json!({
        "rank": p.id.rank,
        "source": match p.source {
            kv_events::index::Source::Events => "events".to_owned(),
            kv_events::index::Source::Unsure(why) => format!("unsure: {why:?}"),
        },
        "connected": p.connected,
        "gpuBlocks": p.gpu_blocks,
        "offloadBlocks": p.offload_blocks,
        "blockSize": p.block_size,
        "lastSequence": p.last_sequence,
        "batches": p.batches,
        "events": p.events,
        "eventsPerSecond": p.events_per_second,
        "unknownEvents": p.unknown_events,
        "gaps": p.gaps,
        "replays": p.replays,
        "replayedBatches": p.replayed_batches,
        "restarts": p.restarts,
        "decodeErrors": p.decode_errors,
    })
}

/// Tokens a typical request is assumed to hold while in flight (what the
/// parse stage estimates for a short prompt with no `max_tokens`).
const TYPICAL_TOKENS: u64 = 256;

struct Typical {
    /// `None` when the pool's policy does not score replicas.
    scores: Option<Vec<picker::CandidateScore>>,
    /// What the picker would do: the chosen replica, or why it refuses.
    outcome: String,
}

/// Score every replica for a typical request without sending one: the
/// pick is explained and nothing is acquired or recorded.
fn typical_scores(pool: &Pool, now: Instant) -> Typical {
    let picker = pool.runtime().picker();
    if !picker.config().policy.uses_signals() {
        return Typical {
            scores: None,
            outcome: "the pool's policy does not score replicas".into(),
        };
    }
    let request = picker::PickRequest {
        adapter: None,
        prefix_hashes: &[],
        estimated_tokens: TYPICAL_TOKENS,
        context_tokens: 0,
        explain: true,
        session: None,
        queue_share: None,
        exact_prefix: None,
        prompt_tokens: TYPICAL_TOKENS,
        expected_output_tokens: 0,
        slo: None,
    };
    match picker.pick(&request, now, &[], &mut rand::thread_rng()) {
        Ok(decision) => Typical {
            outcome: format!(
                "{}{}",
                decision.endpoint.addr,
                if decision.fallback {
                    " (least-request fallback: no replica has fresh metrics)"
                } else {
                    ""
                }
            ),
            scores: Some(decision.scores),
        },
        Err(e) => Typical {
            scores: Some(Vec::new()),
            outcome: format!("refused: {e}"),
        },
    }
}

fn candidate_json(c: &picker::CandidateScore) -> Value {
    let parts: serde_json::Map<String, Value> = picker::Scorer::ALL
        .iter()
        .map(|s| (scorer_name(*s), json!(c.part(*s))))
        .collect();
    json!({"total": c.total, "parts": parts})
}
