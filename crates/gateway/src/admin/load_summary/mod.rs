//! What this gateway tells global routers about its load: per model,
//! ready replicas, KV headroom, queue depth, requests in flight, whether
//! it is saturated, and its recent error and 429 rates, with a generation
//! number that rises when any of it changes (docs/global.md).
//!
//! Served on the admin listener as one JSON document
//! (`GET /global/summary`) and as a stream of JSON lines
//! (`GET /global/summary/stream`): a line when the summary changes, at
//! most every [`SUMMARY_MIN_INTERVAL`], and at least every
//! [`SUMMARY_HEARTBEAT`] so a router can tell a quiet gateway from a dead
//! one. Paths under `/global/`, not `/debug/`: this is an interface other
//! gateways depend on, not a page for people.
//!
//! Nothing runs while nobody asks: a summary is computed when a request
//! or a stream's tick wants one, and every caller shares one [`book::SummaryBook`]
//! so that generation numbers mean the same to all of them.

pub(crate) mod book;

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::Bytes;
use config::defaults::{SUMMARY_HEARTBEAT, SUMMARY_MIN_INTERVAL};
use http::{HeaderValue, Response, header};

use crate::outbound::response_body::ResponseBody;
use crate::state::State;

const NDJSON: &str = "application/x-ndjson";

/// `GET /global/summary`.
pub fn get(state: &State) -> Response<ResponseBody> {
    let summary = state.summaries.current(
        &state.generation(),
        state.metrics.outcomes(),
        Instant::now(),
        SystemTime::now(),
    );
    crate::respond::json(Bytes::from(summary.to_line()))
}

/// `GET /global/summary/stream`: a line at once, then one whenever the
/// summary changes (at most every [`SUMMARY_MIN_INTERVAL`]) or
/// [`SUMMARY_HEARTBEAT`] passes without one. Ends when the client leaves
/// or the gateway shuts down.
pub fn stream(state: Arc<State>) -> Response<ResponseBody> {
    let (lines, body) = tokio::sync::mpsc::channel::<Bytes>(2);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SUMMARY_MIN_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut sent: Option<(u64, Instant)> = None;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = lines.closed() => return,
            }
            if state.is_shutting_down() {
                return;
            }
            let now = Instant::now();
            let summary = state.summaries.current(
                &state.generation(),
                state.metrics.outcomes(),
                now,
                SystemTime::now(),
            );
            let due = sent.is_none_or(|(generation, at)| {
                generation != summary.generation
                    || now.saturating_duration_since(at) >= SUMMARY_HEARTBEAT
            });
            if !due {
                continue;
            }
            if lines.send(Bytes::from(summary.to_line())).await.is_err() {
                return;
            }
            sent = Some((summary.generation, now));
        }
    });
    let mut response = Response::new(ResponseBody::Lines(body));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(NDJSON));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
