//! The response phase: the data plane reports the endpoint that served
//! (accounted to it, wherever the picker had sent the request), then the
//! answer's head, body and end, as the gateway's own listeners record
//! them — first token, time between tokens, usage for the rate limits.
//! The request's load and record go exactly once, when the [`Answer`] is
//! dropped: at the answer's end, or when the data plane closes the stream
//! or fails.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::service::ext_proc::v3::HttpHeaders;
use http::StatusCode;
use tokio::time::Instant;

use super::protocol;
use super::request::Picked;
use crate::flow::{Admitted, host_port};
use crate::generation::Generation;
use crate::generation::pool::Pool;
use crate::outbound::stream_usage::UsageStripper;
use crate::record::Record;

/// A request the picker decided, as its answer comes back.
pub struct Answer {
    pool: Arc<Pool>,
    // Dropped with the answer, in this order: the record (settled), then
    // the load on its replica — once the load is gone, the request is in
    // the metrics.
    record: Box<Record>,
    admitted: Admitted,
    /// The replica the load is on: the chosen one, or the one the data
    /// plane reports it went to.
    replica: Arc<picker::Endpoint>,
    /// When the decision went to the data plane, which sent the request on.
    sent_at: Instant,
    /// Set when the picker asked the stream for its usage: the usage
    /// event is the picker's, not the client's.
    strip_usage: bool,
    stripper: Option<UsageStripper>,
    /// The generation of the config the request was decided under.
    _generation: Arc<Generation>,
}

impl Answer {
    pub fn new(picked: Picked, generation: Arc<Generation>) -> Self {
        let replica = Arc::clone(&picked.admitted.decision.endpoint);
        Self {
            pool: picked.pool,
            admitted: picked.admitted,
            record: picked.record,
            replica,
            sent_at: Instant::now(),
            strip_usage: picked.strip_usage,
            stripper: None,
            _generation: generation,
        }
    }

    /// The answer's head arrived, with the endpoint that served it.
    pub fn on_headers(&mut self, headers: &HttpHeaders, metadata: Option<&Metadata>) {
        if let Some(served) = protocol::served(metadata) {
            self.account_to(&served);
        }
        let (status, head) = response_head(headers);
        self.record.reached_replica(true);
        self.record.on_response(status, &head);
        if self.strip_usage && crate::headers::is_event_stream(&head) {
            self.stripper = Some(UsageStripper::default());
        }
        if status.is_success() {
            self.record
                .answering(Arc::clone(&self.replica), self.sent_at);
        }
        if headers.end_of_stream {
            self.record.on_end();
        }
    }

    /// A chunk of the answer's body (the first: its first token): what
    /// of it the client gets, `None` when all of it.
    pub fn on_body(&mut self, chunk: &[u8], end_of_stream: bool) -> Option<Vec<u8>> {
        if !chunk.is_empty() {
            self.admitted.lease.answered();
            self.record.on_data(chunk);
        }
        if end_of_stream {
            self.record.on_end();
        }
        let stripper = self.stripper.as_mut()?;
        let mut kept = stripper.filter(chunk).to_vec();
        if end_of_stream && let Some(rest) = stripper.finish() {
            kept.extend_from_slice(&rest);
        }
        Some(kept)
    }

    /// The answer's trailers: its end.
    pub fn on_trailers(&mut self) {
        self.record.on_end();
    }

    /// The data plane sent the request to `served`: the load moves there
    /// when it is another replica of the pool than the one chosen.
    fn account_to(&mut self, served: &str) {
        if host_port(&self.replica.addr) == served {
            return;
        }
        let endpoints = self.pool.runtime().picker().endpoints();
        let Some(replica) = endpoints.iter().find(|e| host_port(&e.addr) == served) else {
            tracing::warn!(pool = %self.pool.name(), served,
                "the data plane reports an endpoint the pool does not have");
            return;
        };
        let tokens = self.admitted.decision.estimated_tokens;
        self.admitted.lease.move_to(replica, tokens);
        self.record.served_by(replica);
        self.replica = Arc::clone(replica);
    }
}

/// The answer's status and regular headers.
fn response_head(headers: &HttpHeaders) -> (StatusCode, http::HeaderMap) {
    let mut status = StatusCode::OK;
    let mut head = http::HeaderMap::new();
    for h in headers.headers.iter().flat_map(|m| m.headers.iter()) {
        let value = if h.raw_value.is_empty() {
            h.value.as_bytes()
        } else {
            &h.raw_value
        };
        if h.key == ":status" {
            if let Some(s) = std::str::from_utf8(value)
                .ok()
                .and_then(|s| s.parse::<u16>().ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
            {
                status = s;
            }
        } else if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(h.key.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            head.append(name, value);
        }
    }
    (status, head)
}
