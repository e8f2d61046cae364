//! Errors a pipeline stage answers the client with, in the OpenAI shape
//! `{"error": {"message", "type", "param", "code"}}`. A leaf: what they
//! look like on the wire is rendered in [`crate::respond`].

use std::time::Duration;

use http::StatusCode;
use serde_json::json;

/// An error from a body or a connection, whatever its source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why flow control refused a request; sent as `x-infergate-dropped-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    QueueFull,
    WaitExpired,
    NoReplicas,
    Saturated,
    /// No replica is predicted to meet the request's latency objectives.
    SloUnmet,
    /// The pool stayed cold (no ready replica) for as long as requests
    /// wait for it.
    ColdStartTimeout,
}

impl DropReason {
    pub const ALL: [DropReason; 6] = [
        DropReason::QueueFull,
        DropReason::WaitExpired,
        DropReason::NoReplicas,
        DropReason::Saturated,
        DropReason::SloUnmet,
        DropReason::ColdStartTimeout,
    ];

    /// The reason a `x-infergate-dropped-reason` value names.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == value)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue-full",
            DropReason::WaitExpired => "wait-expired",
            DropReason::NoReplicas => "no-replicas",
            DropReason::Saturated => "saturated",
            DropReason::SloUnmet => "slo-unmet",
            DropReason::ColdStartTimeout => "cold-start-timeout",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    /// Set for refusals a client should retry later (429/503).
    pub retry_after: Option<Duration>,
    /// Why flow control refused the request (`x-infergate-dropped-reason`).
    pub dropped_reason: Option<DropReason>,
    /// Retrying cannot succeed (`x-should-retry: false`, which the OpenAI
    /// SDKs obey even on a 429).
    pub never_retry: bool,
    /// The `WWW-Authenticate` challenge of a 401.
    pub challenge: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
            dropped_reason: None,
            never_retry: false,
            challenge: None,
        }
    }

    pub fn with_dropped_reason(self, reason: DropReason) -> Self {
        Self {
            dropped_reason: Some(reason),
            ..self
        }
    }

    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model"),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist or is not served by this gateway."),
            )
        }
    }

    /// No valid credential (RFC 6750): `code` is `invalid_api_key` or
    /// `invalid_token`, `reason` a stable word the client may act on
    /// (`expired`, `unknown_key`); why exactly is logged, not told. A
    /// request that carried no credential at all gets a challenge without
    /// an error, as RFC 6750 §3.1 asks.
    pub fn unauthorized(code: &'static str, reason: &'static str, missing: bool) -> Self {
        let message = if missing {
            "No API key or token was given: send `Authorization: Bearer <key or token>` (the OpenAI SDKs' `api_key`) or `x-api-key`.".to_owned()
        } else if code == "invalid_api_key" {
            format!("Incorrect API key provided ({reason}).")
        } else {
            format!("The token was refused ({reason}).")
        };
        let challenge = if missing {
            "Bearer realm=\"infergate\"".to_owned()
        } else {
            format!(
                "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\"{reason}\""
            )
        };
        Self {
            code: Some(code),
            challenge: Some(challenge),
            ..Self::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
        }
    }

    /// The credential cannot be checked now (the issuer's keys were never
    /// fetched, or every key check is busy): the caller is not to blame.
    pub fn auth_unavailable(why: &str) -> Self {
        Self {
            code: Some("auth_unavailable"),
            retry_after: Some(Duration::from_secs(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                format!("The credential cannot be checked right now: {why}."),
            )
        }
    }

    /// The caller's tenant (or token) may not use `model`.
    pub fn model_not_allowed(model: &str) -> Self {
        Self {
            param: Some("model"),
            code: Some("model_not_allowed"),
            ..Self::new(
                StatusCode::FORBIDDEN,
                "invalid_request_error",
                format!("You are not allowed to use the model `{model}`."),
            )
        }
    }

    pub fn missing_model(message: impl Into<String>) -> Self {
        Self {
            param: Some("model"),
            ..Self::invalid_request(message)
        }
    }

    pub fn body_too_large(limit: u64) -> Self {
        Self {
            code: Some("body_too_large"),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("The request body is larger than the limit of {limit} bytes."),
            )
        }
    }

    /// The request is not valid HTTP as the gateway accepts it.
    pub fn malformed(what: impl std::fmt::Display) -> Self {
        Self {
            code: Some("malformed_request"),
            ..Self::invalid_request(format!("Malformed HTTP request: {what}."))
        }
    }

    pub fn target_too_long(limit: usize) -> Self {
        Self {
            code: Some("target_too_long"),
            ..Self::new(
                StatusCode::URI_TOO_LONG,
                "invalid_request_error",
                format!("The request target is longer than {limit} bytes."),
            )
        }
    }

    /// A path the gateway will not resolve: dot segments, encoded
    /// characters, backslashes.
    pub fn invalid_path() -> Self {
        Self {
            code: Some("invalid_path"),
            ..Self::invalid_request(
                "The path must be plain: no dot segments, %-encoded characters or backslashes.",
            )
        }
    }

    pub fn request_timeout(limit: Duration) -> Self {
        Self {
            code: Some("request_timeout"),
            ..Self::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "The request did not arrive in full within {} s.",
                    limit.as_secs()
                ),
            )
        }
    }

    /// The gateway holds as many request bodies in memory as it may.
    pub fn body_budget_exhausted(retry_after: Duration) -> Self {
        Self {
            code: Some("overloaded"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "The gateway is holding as many request bodies as it may; retry shortly.",
            )
        }
    }

    /// A bug: a stage panicked. The panic hook has logged it.
    pub fn internal() -> Self {
        Self {
            code: Some("internal_error"),
            ..Self::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "The gateway failed to handle the request.",
            )
        }
    }

    pub fn not_found(path: &str) -> Self {
        Self {
            code: Some("not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("No route for {path}."),
            )
        }
    }

    pub fn method_not_allowed(method: &http::Method, path: &str) -> Self {
        Self {
            code: Some("method_not_allowed"),
            ..Self::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                format!("{method} is not allowed on {path}."),
            )
        }
    }

    pub fn saturated(pool: &str, retry_after: Duration) -> Self {
        Self {
            code: Some("pool_saturated"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "Every replica of pool `{pool}` is saturated; retry after {} ms.",
                    retry_after.as_millis()
                ),
            )
        }
    }

    /// A sheddable request no replica is predicted to serve within its
    /// latency objectives: refused before any work is spent on it.
    pub fn slo_unmet(pool: &str, best: &picker::LatencyPrediction, retry_after: Duration) -> Self {
        Self {
            code: Some("slo_unmet"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "No replica of pool `{pool}` is predicted to meet the request's latency objectives (the best: time to first token {:.0} ms, {:.1} ms per token); retry after {} ms.",
                    best.ttft * 1e3,
                    best.itl * 1e3,
                    retry_after.as_millis()
                ),
            )
        }
    }

    pub fn queue_full(pool: &str, band: &str, retry_after: Duration) -> Self {
        Self {
            code: Some("queue_full"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!("Pool `{pool}` is saturated and its {band} queue is full."),
            )
        }
    }

    pub fn wait_expired(pool: &str, waited: Duration, retry_after: Duration) -> Self {
        Self {
            code: Some("wait_expired"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "Pool `{pool}` stayed saturated for the {} s this request may wait.",
                    waited.as_secs_f64()
                ),
            )
        }
    }

    /// The pool had no ready replica for as long as the request waited.
    pub fn cold_start_timeout(pool: &str, waited: Duration, retry_after: Duration) -> Self {
        Self {
            code: Some("cold_start_timeout"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                format!(
                    "Pool `{pool}` had no ready replica for the {} s this request may wait for one; it may still be starting.",
                    waited.as_secs_f64()
                ),
            )
        }
    }

    pub fn no_replicas(pool: &str, why: &str) -> Self {
        Self {
            code: Some("no_replicas"),
            retry_after: Some(Duration::from_secs(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                format!("Pool `{pool}` cannot serve the request: {why}."),
            )
        }
    }

    /// No global member may take the request (none serves the model in
    /// the residency it is held to, or they are all down): `why` says.
    pub fn no_member(why: &str) -> Self {
        Self {
            code: Some("no_member"),
            retry_after: Some(Duration::from_secs(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                format!("No global member can take the request: {why}."),
            )
        }
    }

    pub fn upstream_timeout(pool: &str) -> Self {
        Self {
            code: Some("upstream_timeout"),
            ..Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_error",
                format!("The replica of pool `{pool}` did not answer in time."),
            )
        }
    }

    pub fn upstream_failed(pool: &str, detail: &str) -> Self {
        Self {
            code: Some("upstream_error"),
            ..Self::new(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                format!("The replica of pool `{pool}` failed: {detail}"),
            )
        }
    }

    /// Over a rate limit: `kind` is `requests` or `tokens`, as OpenAI's
    /// own 429s have it.
    pub fn rate_limited(kind: &'static str, message: String, retry_after: Duration) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, kind, message)
        }
    }

    /// A request larger than a whole limit: it can never pass.
    pub fn too_large_for_limit(kind: &'static str, message: String) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            never_retry: true,
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, kind, message)
        }
    }

    /// `onBackendError: deny` and the limits' backend did not answer.
    pub fn limits_unavailable() -> Self {
        Self {
            code: Some("limits_unavailable"),
            retry_after: Some(Duration::from_secs(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "Rate limits cannot be checked right now.",
            )
        }
    }

    pub fn shutting_down() -> Self {
        Self {
            code: Some("shutting_down"),
            retry_after: Some(Duration::from_secs(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "The gateway is shutting down.",
            )
        }
    }

    pub fn body_json(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}
