//! The gateway's spans: one per request, one per pipeline stage.

/// Target of the gateway's spans (the request and its stages). They are
/// `debug` level, so they cost nothing unless exported or asked for with
/// `INFERGATE_LOG=infergate::trace=debug`.
pub const SPAN_TARGET: &str = "infergate::trace";

/// A span for one pipeline stage (a child of the current span), e.g.
/// `stage_span!("route", pool = %name)`.
macro_rules! stage_span {
    ($name:literal $(, $($field:tt)*)?) => {
        ::tracing::debug_span!(target: $crate::telemetry::SPAN_TARGET, $name $(, $($field)*)?)
    };
}
pub(crate) use stage_span;

/// The span of one inference request, from arrival to the end of its
/// response body (the record holds it). Fields left empty here are filled
/// in by the record stage.
pub fn request_span(
    method: &http::Method,
    path: &str,
    request_id: &http::HeaderValue,
) -> tracing::Span {
    tracing::debug_span!(
        target: SPAN_TARGET,
        "request",
        otel.kind = "server",
        http.request.method = %method,
        url.path = path,
        request_id = request_id.to_str().unwrap_or("-"),
        gen_ai.request.model = tracing::field::Empty,
        infergate.tenant = tracing::field::Empty,
        infergate.pool = tracing::field::Empty,
        infergate.endpoint = tracing::field::Empty,
        infergate.retries = tracing::field::Empty,
        infergate.disaggregation = tracing::field::Empty,
        infergate.prefill_endpoint = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        error.message = tracing::field::Empty,
    )
}
