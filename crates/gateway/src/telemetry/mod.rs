//! What the gateway tells operators: Prometheus metrics, the access log,
//! trace spans with OTLP export, and W3C trace context for replicas.
//!
//! - [`metrics`]: the registry and handles resolved per pool, model and
//!   replica; [`gauges`] adds gauges read from live state at scrape time.
//! - [`response`]: TTFT, inter-token times and `usage` from a response
//!   body as it streams through.
//! - [`trace_context`]: the `traceparent` sent upstream.
//! - [`panics`]: the panic hook, which logs without flooding.
//! - [`decisions`] and [`traffic`]: recent routing decisions and each
//!   pool's recent traffic, for the fleet page; kept only while watched.
//! - [`logging`]: the subscriber (logs, access log, span export), set up
//!   once by the binary; [`log_writer`] writes the lines out in batches,
//!   [`otlp`] is the span exporter.
//!
//! - [`outcomes`]: plain counters of how each model's requests ended,
//!   for the load summary's error and 429 rates.
//!
//! The record stage (`record/`) is where a request's numbers are counted.

mod access_log;
pub mod decisions;
mod gauges;
mod labels;
mod log_writer;
pub mod logging;
pub mod metrics;
mod otlp;
pub mod outcomes;
pub mod panics;
pub mod response;
pub mod rollout;
mod spans;
#[cfg(test)]
mod test_writer;
pub mod trace_context;
pub mod traffic;

pub use gauges::{ColdStats, DrainGauges, FlowGauges};
pub use labels::TenantLabel;
pub use logging::{
    ACCESS_TARGET, DEFAULT_FILTER, LogFormat, QUIET_ACCESS_FILTER, TelemetryGuard, init, log_layers,
};
pub use metrics::{
    EndpointMetrics, EndpointSeries, ListenerTlsMetrics, Metrics, PoolMetrics, RouteMetrics,
    refusal_reason,
};
pub(crate) use spans::stage_span;
pub use spans::{SPAN_TARGET, request_span};
