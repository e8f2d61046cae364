//! The one place where the gateway's own answers are rendered: errors in
//! the OpenAI shape, and plain text and JSON bodies.

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};

use crate::error::ApiError;
use crate::outbound::response_body::{ResponseBody, full};
use crate::record::{Record, Refusal};

/// A stage answers the request itself: the refusal is recorded, rendered
/// in the OpenAI shape, and carries the rate-limit headers.
pub fn refuse(mut record: Record, refusal: impl Into<Refusal>) -> Response<ResponseBody> {
    let Refusal { error, headers } = refusal.into();
    record.refused(&error);
    let mut response = error.into_response();
    record.rate_headers(response.headers_mut());
    if let Some(headers) = headers {
        headers.apply(response.headers_mut());
    }
    response
}

impl ApiError {
    pub fn into_response(self) -> Response<ResponseBody> {
        let mut response = Response::new(full(Bytes::from(self.body_json().to_string())));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(reason) = self.dropped_reason {
            headers.insert(
                "x-infergate-dropped-reason",
                HeaderValue::from_static(reason.as_str()),
            );
        }
        if self.never_retry {
            headers.insert("x-should-retry", HeaderValue::from_static("false"));
        }
        if let Some(challenge) = self
            .challenge
            .as_deref()
            .and_then(|c| HeaderValue::from_str(c).ok())
        {
            headers.insert(header::WWW_AUTHENTICATE, challenge);
        }
        if let Some(after) = self.retry_after {
            // Retry-After has whole seconds; round up so a client never
            // comes back too early. retry-after-ms carries the precise value.
            let secs = after.as_millis().div_ceil(1000).max(1);
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs as u64));
            headers.insert(
                "retry-after-ms",
                HeaderValue::from(after.as_millis().max(1) as u64),
            );
        }
        response
    }
}

pub fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ResponseBody> {
    let mut r = Response::new(full(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

pub fn json(bytes: Bytes) -> Response<ResponseBody> {
    let mut r = Response::new(full(bytes));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `/readyz`: 200 `ready`, or 503 with the reason.
pub fn readyz(readiness: Result<(), String>) -> Response<ResponseBody> {
    match readiness {
        Ok(()) => text(StatusCode::OK, "ready"),
        Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}")),
    }
}
