//! W3C Trace Context: the `traceparent` a replica receives.
//!
//! With trace export on, the gateway's request span joins the caller's
//! trace and the replica sees that span as its parent. Without it, the
//! caller's `traceparent` is forwarded as it came, and a request that
//! arrives without one gets a fresh one, so replica logs and traces can
//! still be tied to the gateway's access log by trace id.

use std::fmt;

use http::{HeaderName, HeaderValue};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Version 00 of the header: `00-<trace id>-<parent id>-<flags>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: u128,
    pub parent_id: u64,
    pub flags: u8,
}

impl TraceParent {
    const SAMPLED: u8 = 0x01;

    /// A new trace, sampled: the caller sent none, so nobody upstream has
    /// decided against recording it.
    pub fn generate() -> Self {
        Self {
            trace_id: nonzero(rand::random()),
            parent_id: nonzero(rand::random()),
            flags: Self::SAMPLED,
        }
    }

    /// This trace with its sampled flag set by `ratio` rather than by the
    /// caller: the same decision for the same trace id, as the trace-id
    /// ratio sampler makes it (the id's low 63 bits against the ratio).
    pub fn sampled_by(self, ratio: f64) -> Self {
        let low = (self.trace_id as u64) >> 1;
        let bound = (ratio.clamp(0.0, 1.0) * (1u64 << 63) as f64) as u64;
        let sampled = ratio >= 1.0 || low < bound;
        Self {
            flags: (self.flags & !Self::SAMPLED) | if sampled { Self::SAMPLED } else { 0 },
            ..self
        }
    }

    /// Parse a header value; `None` for anything invalid per the spec
    /// (wrong length or case, all-zero ids, version ff). Versions above 00
    /// are read by their first four fields, as the spec asks.
    pub fn parse(value: &[u8]) -> Option<Self> {
        if value.len() < 55 || (value.len() > 55 && value[55] != b'-') {
            return None;
        }
        if value[2] != b'-' || value[35] != b'-' || value[52] != b'-' {
            return None;
        }
        let version = hex(&value[0..2])? as u8;
        if version == 0xff || (version == 0 && value.len() != 55) {
            return None;
        }
        let trace_id = hex(&value[3..35])?;
        let parent_id = hex(&value[36..52])? as u64;
        let flags = hex(&value[53..55])? as u8;
        (trace_id != 0 && parent_id != 0).then_some(Self {
            trace_id,
            parent_id,
            flags,
        })
    }

    pub fn sampled(&self) -> bool {
        self.flags & Self::SAMPLED != 0
    }

    pub fn to_header(self) -> HeaderValue {
        // `00-` + 32 + `-` + 16 + `-` + 2, written without the formatter.
        let mut out = [b'-'; 55];
        out[..2].copy_from_slice(b"00");
        lower_hex(self.trace_id, &mut out[3..35]);
        lower_hex(u128::from(self.parent_id), &mut out[36..52]);
        lower_hex(u128::from(self.flags), &mut out[53..55]);
        HeaderValue::from_bytes(&out).expect("hex digits and dashes are a valid header")
    }

    fn otel_context(self) -> opentelemetry::Context {
        let span = SpanContext::new(
            TraceId::from_bytes(self.trace_id.to_be_bytes()),
            SpanId::from_bytes(self.parent_id.to_be_bytes()),
            TraceFlags::new(self.flags),
            true,
            TraceState::default(),
        );
        opentelemetry::Context::new().with_remote_span_context(span)
    }
}

impl fmt::Display for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.parent_id, self.flags
        )
    }
}

/// The trace id as the access log writes it.
#[derive(Debug, Clone, Copy)]
pub struct TraceId32(pub u128);

impl fmt::Display for TraceId32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The low `out.len()` hex digits of `v`, lowercase and zero-padded, as
/// `{:0N$x}` writes them.
pub fn lower_hex(mut v: u128, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for d in out.iter_mut().rev() {
        *d = DIGITS[(v & 0xf) as usize];
        v >>= 4;
    }
}

fn nonzero<T: Default + PartialEq + From<u8>>(v: T) -> T {
    if v == T::default() { T::from(1) } else { v }
}

/// Lowercase hex only, as the spec requires.
fn hex(digits: &[u8]) -> Option<u128> {
    digits.iter().try_fold(0u128, |acc, &d| {
        let v = match d {
            b'0'..=b'9' => d - b'0',
            b'a'..=b'f' => d - b'a' + 10,
            _ => return None,
        };
        Some(acc << 4 | u128::from(v))
    })
}

/// The trace context to send upstream for a request whose span is
/// `span` (the request span, before it is first entered).
///
/// With an OpenTelemetry layer installed, the span is parented to the
/// caller's context and the replica gets the span's own id as its parent.
/// Otherwise the caller's header is kept, or a new one generated.
///
/// `sampling` is `None` when the caller may decide whether its trace is
/// recorded; otherwise the caller's trace is joined but its sampled flag
/// replaced by this ratio's decision for the trace id.
pub fn upstream(
    headers: &http::HeaderMap,
    span: &tracing::Span,
    sampling: Option<f64>,
) -> (TraceParent, HeaderValue) {
    let incoming = headers
        .get(TRACEPARENT)
        .and_then(|v| TraceParent::parse(v.as_bytes()).map(|tp| (tp, v.clone())))
        .map(|(tp, v)| match sampling {
            None => (tp, v),
            Some(ratio) => {
                let tp = tp.sampled_by(ratio);
                (tp, tp.to_header())
            }
        });
    if !span.is_disabled() {
        if let Some((tp, _)) = incoming {
            // Fails only when no OpenTelemetry layer is installed.
            let _ = span.set_parent(tp.otel_context());
        }
        let cx = span.context();
        let own = cx.span().span_context().clone();
        if own.is_valid() {
            let tp = TraceParent {
                trace_id: u128::from_be_bytes(own.trace_id().to_bytes()),
                parent_id: u64::from_be_bytes(own.span_id().to_bytes()),
                flags: own.trace_flags().to_u8(),
            };
            return (tp, tp.to_header());
        }
    }
    match incoming {
        // Parsed, so a valid value.
        Some((tp, value)) => (tp, value),
        None => {
            let tp = TraceParent::generate();
            (tp, tp.to_header())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parses_and_prints_the_spec_example() {
        let tp = TraceParent::parse(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(tp.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert_eq!(tp.parent_id, 0x00f067aa0ba902b7);
        assert!(tp.sampled());
        assert_eq!(tp.to_string(), EXAMPLE);
        assert_eq!(
            TraceId32(tp.trace_id).to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }

    #[test]
    fn refuses_invalid_headers() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad.as_bytes()), None, "{bad:?}");
        }
        // A later version may carry more fields.
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-whatever";
        assert!(TraceParent::parse(future.as_bytes()).is_some());
    }

    #[test]
    fn generated_contexts_are_valid_sampled_and_distinct() {
        let a = TraceParent::generate();
        let b = TraceParent::generate();
        assert_ne!(a.trace_id, b.trace_id);
        assert!(a.sampled());
        let header = a.to_header();
        assert_eq!(TraceParent::parse(header.as_bytes()), Some(a));
        assert_eq!(header, a.to_string());
        let small = TraceParent {
            trace_id: 1,
            parent_id: 0xab,
            flags: 0,
        };
        assert_eq!(small.to_header(), small.to_string());
        let mut out = [0; 32];
        lower_hex(u128::MAX - 1, &mut out);
        assert_eq!(out, *format!("{:032x}", u128::MAX - 1).as_bytes());
    }

    #[test]
    fn without_export_the_callers_header_is_kept_or_one_generated() {
        let none = http::HeaderMap::new();
        let (generated, value) = upstream(&none, &tracing::Span::none(), None);
        assert_eq!(TraceParent::parse(value.as_bytes()), Some(generated));

        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(EXAMPLE));
        let (kept, value) = upstream(&headers, &tracing::Span::none(), None);
        assert_eq!(value, EXAMPLE);
        assert_eq!(kept.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
    }

    #[test]
    fn a_caller_not_trusted_to_sample_joins_the_trace_but_the_ratio_decides() {
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, HeaderValue::from_static(EXAMPLE));
        let (never, value) = upstream(&headers, &tracing::Span::none(), Some(0.0));
        assert_eq!(never.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
        assert!(!never.sampled());
        assert!(value.to_str().unwrap().ends_with("-00"), "{value:?}");
        let (always, _) = upstream(&headers, &tracing::Span::none(), Some(1.0));
        assert!(always.sampled());
        // The same trace id gets the same decision from the same ratio.
        let ids = (1..2_000u128).map(|i| i.wrapping_mul(0x9e3779b97f4a7c15_f39cc0605cedc835));
        let sampled = ids
            .map(|trace_id| {
                TraceParent {
                    trace_id,
                    parent_id: 1,
                    flags: 1,
                }
                .sampled_by(0.25)
            })
            .filter(|tp| tp.sampled())
            .count();
        assert!((350..650).contains(&sampled), "{sampled} of 2000 at 0.25");
    }
}
