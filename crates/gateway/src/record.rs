//! The record stage: what happened to one request, written once as an
//! access-log line when the request is over.
//!
//! A [`Record`] travels with the request. When the answer is a gateway error
//! it is dropped at the end of the pipeline; when the answer is streamed
//! from a replica it moves into the response body and is dropped when the
//! stream ends, so TTFT and duration cover what the client actually saw.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub struct Record {
    pub request_id: String,
    pub model: Option<String>,
    pub pool: Option<String>,
    pub endpoint: Option<String>,
    pub status: u16,
    pub stream: bool,
    pub retries: u32,
    /// Winner's and runner-up's scores, when the pool scores replicas.
    pub decision: Option<String>,
    start: Instant,
    first_byte: Option<Instant>,
    error: Option<String>,
}

impl Record {
    pub fn new(request_id: String, start: Instant) -> Self {
        Self {
            request_id,
            model: None,
            pool: None,
            endpoint: None,
            status: 0,
            stream: false,
            retries: 0,
            decision: None,
            start,
            first_byte: None,
            error: None,
        }
    }

    pub fn on_data(&mut self, _data: &[u8]) {
        if self.first_byte.is_none() {
            self.first_byte = Some(Instant::now());
        }
    }

    pub fn on_error(&mut self, error: &str) {
        self.error.get_or_insert_with(|| error.to_owned());
    }

    pub fn on_end(&mut self) {}

    pub fn ttft(&self) -> Option<Duration> {
        self.first_byte.map(|t| t - self.start)
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let duration = self.start.elapsed();
        tracing::info!(
            target: "infergate::access",
            request_id = %self.request_id,
            model = self.model.as_deref().unwrap_or("-"),
            pool = self.pool.as_deref().unwrap_or("-"),
            endpoint = self.endpoint.as_deref().unwrap_or("-"),
            status = self.status,
            stream = self.stream,
            ttft_ms = self.ttft().map(|d| d.as_secs_f64() * 1e3),
            duration_ms = duration.as_secs_f64() * 1e3,
            retries = self.retries,
            decision = self.decision.as_deref(),
            error = self.error.as_deref(),
        );
    }
}
