//! The JSON the fleet page polls besides `/debug/pools`: each pool's
//! recent traffic, and the feed of recent routing decisions. Documented in
//! docs/observability.md for anyone who wants to build on it.

use bytes::Bytes;
use http::{Response, StatusCode};
use serde_json::json;
use tokio::time::Instant;

use crate::outbound::response_body::ResponseBody;
use crate::respond;
use crate::state::State;
use crate::telemetry::decisions::{self, Entry};

const TRAFFIC: &str = "/debug/traffic";
const DECISIONS: &str = "/debug/decisions";
/// Decisions one answer lists when the caller does not say.
const DEFAULT_LIMIT: usize = 100;

pub(super) fn serves(path: &str) -> bool {
    path == TRAFFIC || path == DECISIONS || one_decision(path).is_some()
}

/// The request id in `/debug/decisions/{id}`.
fn one_decision(path: &str) -> Option<&str> {
    path.strip_prefix(DECISIONS)?
        .strip_prefix('/')
        .filter(|id| !id.is_empty())
}

pub(super) fn get(state: &State, path: &str, query: &str) -> Response<ResponseBody> {
    let now = Instant::now();
    if path == TRAFFIC {
        let report = state.traffic.report(&state.metrics, now);
        return respond::json(Bytes::from(report.to_string()));
    }
    if let Some(id) = one_decision(path) {
        let id = percent_encoding::percent_decode_str(id).decode_utf8_lossy();
        return match state.decisions.find(&id) {
            Some(entry) => respond::json(Bytes::from(entry.full_json().to_string())),
            None => not_kept(&id),
        };
    }
    // Asking for the feed is what keeps it recording.
    state.decisions.watch(now);
    let after = param(query, "after")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let limit = param(query, "limit")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_LIMIT)
        .min(decisions::CAPACITY);
    let pool = param(query, "pool").filter(|p| !p.is_empty());
    let model = param(query, "model").filter(|m| !m.is_empty());
    let keep = |e: &Entry| {
        pool.as_deref().is_none_or(|p| e.pool.as_deref() == Some(p))
            && model
                .as_deref()
                .is_none_or(|m| e.model.as_deref() == Some(m))
    };
    let (entries, next) = state.decisions.after(after, keep, limit);
    let listed: Vec<_> = entries.iter().map(|e| e.summary_json()).collect();
    let body = json!({
        "sampling": {
            "watchSeconds": decisions::WATCH_FOR.as_secs(),
            "perSecond": decisions::PER_SECOND,
            "capacity": decisions::CAPACITY,
        },
        "next": next,
        "decisions": listed,
    });
    respond::json(Bytes::from(body.to_string()))
}

fn not_kept(id: &str) -> Response<ResponseBody> {
    let body = json!({"error": {
        "message": format!("No decision is kept for request id {id:?}: it was not sampled, or newer ones have replaced it."),
        "type": "invalid_request_error",
        "code": "not_found",
    }});
    let mut r = respond::json(Bytes::from(body.to_string()));
    *r.status_mut() = StatusCode::NOT_FOUND;
    r
}

/// The first value of `name` in a query string, percent-decoded (`+` is a
/// space, as forms write it).
fn param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| {
            let value = value.replace('+', " ");
            percent_encoding::percent_decode_str(&value)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded() {
        let q = "after=12&model=meta-llama%2FLlama-3.1-8B&pool=a+b&empty=&flag";
        assert_eq!(param(q, "after").as_deref(), Some("12"));
        assert_eq!(
            param(q, "model").as_deref(),
            Some("meta-llama/Llama-3.1-8B")
        );
        assert_eq!(param(q, "pool").as_deref(), Some("a b"));
        assert_eq!(param(q, "empty").as_deref(), Some(""));
        assert_eq!(param(q, "flag").as_deref(), Some(""));
        assert_eq!(param(q, "limit"), None);
        assert_eq!(param("", "after"), None);
    }

    #[test]
    fn paths() {
        assert!(serves("/debug/traffic"));
        assert!(serves("/debug/decisions"));
        assert_eq!(one_decision("/debug/decisions/abc"), Some("abc"));
        assert_eq!(one_decision("/debug/decisions/"), None);
        assert_eq!(one_decision("/debug/decisionsx"), None);
        assert!(!serves("/debug/decisions/"));
        assert!(!serves("/debug/other"));
    }
}
