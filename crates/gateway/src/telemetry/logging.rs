//! The process's `tracing` subscriber: logs on stderr (text or JSON), the
//! access log in its own format, and span export when configured.

use std::io::IsTerminal;

use tracing::Subscriber;
use tracing_subscriber::filter::{EnvFilter, FilterExt, LevelFilter, Targets, filter_fn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, Registry};

pub use config::LogFormat;

use super::access_log::AccessLogLayer;

/// Target of access-log events: one per request, written by the record
/// stage. `INFERGATE_LOG=info,infergate::access=off` silences them.
pub const ACCESS_TARGET: &str = "infergate::access";
/// Environment variable with the log filter (`EnvFilter` syntax).
pub const LOG_FILTER_ENV: &str = "INFERGATE_LOG";
/// The filter without `INFERGATE_LOG`, for a gateway that serves.
pub const DEFAULT_FILTER: &str = "info";
/// The filter without `INFERGATE_LOG` for commands that run gateways
/// inside themselves (`bench`): their access lines would bury the report.
pub const QUIET_ACCESS_FILTER: &str = "info,infergate::access=off";

/// Keeps trace export running; [`TelemetryGuard::shutdown`] flushes the
/// spans still buffered.
#[must_use = "dropping the guard stops trace export"]
pub struct TelemetryGuard {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
    /// Writes out the log lines still buffered when dropped.
    _log_writer: super::log_writer::LogWriterGuard,
}

impl TelemetryGuard {
    /// Send the spans still buffered and stop exporting.
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            // Blocks until the batch thread has exported, and that export
            // runs on this runtime: wait for it from a blocking thread.
            let result = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(e)) = result {
                tracing::warn!(error = %e, "trace export did not shut down cleanly");
            }
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            // Not shut down explicitly: stop without waiting for a flush
            // that may need the runtime this thread is blocking.
            std::thread::spawn(move || provider.shutdown());
        }
    }
}

/// Install the global subscriber: `format` for the process's logs, the
/// access log as `telemetry.accessLog.format` says (else `format`), and
/// OTLP span export when `telemetry.otlp` is set. The filter comes from
/// `INFERGATE_LOG`, else `default_filter` ([`DEFAULT_FILTER`] or
/// [`QUIET_ACCESS_FILTER`]). Call once, inside the Tokio runtime when
/// exporting.
pub fn init(
    format: LogFormat,
    telemetry: &config::Telemetry,
    default_filter: &str,
) -> anyhow::Result<TelemetryGuard> {
    let filter = std::env::var(LOG_FILTER_ENV).unwrap_or_else(|_| default_filter.to_owned());
    // Fail on a bad filter here rather than silently logging nothing.
    EnvFilter::try_new(&filter)
        .map_err(|e| anyhow::anyhow!("{LOG_FILTER_ENV}={filter:?} is not a valid filter: {e}"))?;
    let ansi = std::io::stderr().is_terminal();
    // A line per request must not cost the data plane a write(2) each: a
    // writer thread writes the lines in batches (see `log_writer`).
    let (writer, log_writer) = super::log_writer::batch_writer(std::io::stderr())?;
    let logs = log_layers(format, telemetry.access_log.format, &filter, ansi, writer);
    let (export, provider) = match &telemetry.otlp {
        Some(otlp) => {
            let (tracer, provider) = super::otlp::tracer(otlp)?;
            (Some(span_export_layer(tracer)), Some(provider))
        }
        None => (None, None),
    };
    Registry::default()
        .with(logs)
        .with(export)
        .try_init()
        .map_err(|e| anyhow::anyhow!("a logger is already installed: {e}"))?;
    if let Some(otlp) = &telemetry.otlp {
        tracing::info!(endpoint = %otlp.traces_url(), service = otlp.service_name(),
            sample_ratio = otlp.sample_ratio(), "exporting traces over OTLP/HTTP");
    }
    Ok(TelemetryGuard {
        provider,
        _log_writer: log_writer,
    })
}

/// The log layers alone, writing to `writer`: everything but the access
/// log in `format`, the access log in `access_format` (default `format`).
/// `filter` applies to both; `ansi` colours text (for a terminal). Public
/// so tests can capture exactly what the gateway writes.
pub fn log_layers<S, W>(
    format: LogFormat,
    access_format: Option<LogFormat>,
    filter: &str,
    ansi: bool,
    writer: W,
) -> impl Layer<S> + Send + Sync + 'static
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Clone + Send + Sync + 'static,
{
    // Only static filters (directives and targets): they are decided once
    // per call site, so a disabled span or event costs nothing per request.
    // A dynamic filter would make every span be built just to be dropped.
    let env = |extra: &str| {
        EnvFilter::try_new(format!("{filter}{extra}"))
            .unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER))
    };
    let general =
        fmt_layer(format, writer.clone(), ansi).with_filter(env(&format!(",{ACCESS_TARGET}=off")));
    let access = AccessLogLayer::new(access_format.unwrap_or(format), writer, ansi)
        .with_filter(env("").and(Targets::new().with_target(ACCESS_TARGET, LevelFilter::TRACE)));
    general.and_then(access)
}

/// The process's log lines. A span the filter lets through (the gateway's
/// own, `infergate::trace` at `debug`, when asked for) gets a line when it
/// opens and one when it closes, with its fields and, on closing, its
/// busy and idle time: the formatter otherwise shows spans only as the
/// context of events inside them, and the gateway logs none inside its
/// request spans at `info`, so asking for spans would print nothing.
fn fmt_layer<S, W>(format: LogFormat, writer: W, ansi: bool) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        .with_ansi(ansi)
        .with_span_events(FmtSpan::NEW | FmtSpan::CLOSE);
    match format {
        LogFormat::Text => layer.boxed(),
        LogFormat::Json => layer
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    }
}

/// Export the gateway's own spans (request and stages), nothing else:
/// events stay in the logs, other crates' spans stay out.
pub(super) fn span_export_layer<S>(tracer: opentelemetry_sdk::trace::Tracer) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter_fn(|m| {
            m.is_span() && m.target() == super::spans::SPAN_TARGET
        }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::test_writer::Buffer;

    #[test]
    fn access_log_has_its_own_format() {
        let buffer = Buffer::default();
        let subscriber = Registry::default().with(log_layers(
            LogFormat::Text,
            Some(LogFormat::Json),
            "info",
            false,
            buffer.clone(),
        ));
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: ACCESS_TARGET, request_id = "r1", status = 200u16);
            tracing::info!(answer = 42, "plain line");
            tracing::debug!("filtered out");
        });
        let text = buffer.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let access: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(access["request_id"], "r1");
        assert_eq!(access["status"], 200);
        assert_eq!(access["target"], ACCESS_TARGET);
        assert!(lines[1].contains("plain line") && lines[1].contains("answer=42"));
        assert!(serde_json::from_str::<serde_json::Value>(lines[1]).is_err());
    }

    /// One request span with a stage inside, as the pipeline makes them.
    fn a_request_with_a_stage() {
        let request_id = http::HeaderValue::from_static("r1");
        let request = crate::telemetry::request_span(
            &http::Method::POST,
            "/v1/chat/completions",
            &request_id,
        );
        request.in_scope(|| crate::telemetry::stage_span!("route", pool = "llama").in_scope(|| {}));
        request.record("http.response.status_code", 200u16);
        drop(request);
    }

    fn lines_for(format: LogFormat, filter: &str) -> Vec<String> {
        let buffer = Buffer::default();
        let subscriber =
            Registry::default().with(log_layers(format, None, filter, false, buffer.clone()));
        tracing::subscriber::with_default(subscriber, a_request_with_a_stage);
        buffer.lines()
    }

    #[test]
    fn the_trace_filter_prints_the_gateways_spans() {
        let lines = lines_for(LogFormat::Text, "info,infergate::trace=debug");
        assert_eq!(lines.len(), 4, "{lines:#?}");
        let (request_new, route_new, route_close, request_close) =
            (&lines[0], &lines[1], &lines[2], &lines[3]);
        for line in &lines {
            assert!(line.contains(" DEBUG "), "{line}");
            assert!(line.contains(crate::telemetry::SPAN_TARGET), "{line}");
        }
        assert!(
            request_new.contains(r#"request{otel.kind="server" http.request.method=POST url.path="/v1/chat/completions" request_id="r1"}"#)
                && request_new.ends_with(" new"),
            "{request_new}"
        );
        assert!(
            route_new.contains(r#":route{pool="llama"}"#) && route_new.ends_with(" new"),
            "{route_new}"
        );
        assert!(
            route_close.contains(r#":route{pool="llama"}"#)
                && route_close.contains(" close time.busy="),
            "{route_close}"
        );
        // Fields recorded later are on the closing line.
        assert!(
            request_close.contains("http.response.status_code=200")
                && request_close.contains(" close time.busy=")
                && request_close.contains(" time.idle="),
            "{request_close}"
        );

        // JSON: the same four lines, the span and its fields as objects.
        let json: Vec<serde_json::Value> =
            lines_for(LogFormat::Json, "info,infergate::trace=debug")
                .iter()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
        let messages: Vec<&str> = json
            .iter()
            .map(|v| v["message"].as_str().unwrap())
            .collect();
        assert_eq!(messages, ["new", "new", "close", "close"]);
        assert_eq!(json[1]["span"]["name"], "route");
        assert_eq!(json[1]["span"]["pool"], "llama");
        assert_eq!(json[3]["span"]["request_id"], "r1");
        assert_eq!(json[3]["span"]["http.response.status_code"], 200);
    }

    #[test]
    fn spans_stay_silent_unless_asked_for() {
        assert_eq!(lines_for(LogFormat::Text, "info"), Vec::<String>::new());
        assert_eq!(
            lines_for(LogFormat::Text, "debug,infergate::trace=off"),
            Vec::<String>::new()
        );
    }
}
