//! The layer writes what tracing-subscriber's formatter writes for the same
//! events, timestamps aside.

use tracing_subscriber::layer::SubscriberExt;

use super::*;
use crate::telemetry::test_writer::Buffer;

/// Events with every kind of value the access log carries, and strings
/// that need escaping.
fn emit() {
    let trace = super::super::trace_context::TraceId32(0xabc);
    for (id, model) in [
        ("r1", Some("meta-llama/Llama-3.1-8B-Instruct")),
        ("quote\"back\\slash", None),
        ("tab\tnewline\ncontrol\u{1}", Some("café 😀")),
        ("", Some("del\u{7f}")),
    ] {
        tracing::info!(
            target: "infergate::access",
            request_id = id,
            model,
            status = 200u16,
            stream = true,
            ttft_ms = Some(12.345),
            duration_ms = 0.0,
            queue_wait_ms = Option::<f64>::None,
            tiny_ms = 0.000_01,
            whole_ms = 1_234_567.0,
            signed = -3i64,
            retries = 0u32,
            trace_id = tracing::field::display(trace),
            decision = tracing::field::debug("a \"b\""),
            error = "The model `x` does not exist.",
        );
    }
}

/// Both layers' lines for the events of [`emit`], each without its
/// timestamp.
fn ours_and_theirs(format: LogFormat) -> (Vec<String>, Vec<String>) {
    let ours = Buffer::default();
    let theirs = Buffer::default();
    let reference = tracing_subscriber::fmt::layer()
        .with_writer(theirs.clone())
        .with_ansi(false);
    let reference = match format {
        LogFormat::Text => reference.boxed(),
        LogFormat::Json => reference.json().flatten_event(true).boxed(),
    };
    let subscriber = tracing_subscriber::registry()
        .with(AccessLogLayer::new(format, ours.clone(), false))
        .with(reference);
    tracing::subscriber::with_default(subscriber, emit);
    let untimed = |lines: Vec<String>| -> Vec<String> {
        lines
            .iter()
            .map(|l| {
                let at = l.find("Z").expect("a timestamp");
                l[at + 1..].to_owned()
            })
            .collect()
    };
    (untimed(ours.lines()), untimed(theirs.lines()))
}

#[test]
fn text_lines_match_tracing_subscribers() {
    let (ours, theirs) = ours_and_theirs(LogFormat::Text);
    assert_eq!(ours.len(), 4);
    assert_eq!(ours, theirs);
}

#[test]
fn json_lines_match_tracing_subscribers() {
    let (ours, theirs) = ours_and_theirs(LogFormat::Json);
    assert_eq!(ours.len(), 4);
    for (ours, theirs) in ours.iter().zip(&theirs) {
        let parse = |l: &str| -> serde_json::Value {
            serde_json::from_str(&format!("{{\"timestamp\":\"{l}")).unwrap()
        };
        assert_eq!(parse(ours), parse(theirs), "{ours}\n{theirs}");
        // Keys in the same order, too.
        assert_eq!(ours, theirs);
    }
}

#[test]
fn timestamps_are_utc_to_the_microsecond() {
    let line = {
        let mut line = String::new();
        timestamp(&mut line);
        line
    };
    // 2026-11-30T02:07:23.217251Z
    assert_eq!(line.len(), 27, "{line}");
    assert_eq!(&line[10..11], "T");
    assert!(line.ends_with('Z'));
    let date = |secs: u64| {
        let mut out = String::new();
        write_date_time(&mut out, secs);
        out
    };
    assert_eq!(date(0), "1970-01-01T00:00:00");
    assert_eq!(date(951_782_400), "2000-02-29T00:00:00");
    assert_eq!(date(1_735_689_599), "2024-12-31T23:59:59");
    assert_eq!(date(4_107_542_400), "2100-03-01T00:00:00");
    // Every day for 200 years agrees with HTTP's date format.
    for day in 0..(200 * 366) {
        let secs = day * 86_400 + 45_296;
        let http = httpdate::fmt_http_date(UNIX_EPOCH + std::time::Duration::from_secs(secs));
        // "Sun, 06 Nov 1994 12:34:56 GMT"
        let ours = date(secs);
        let month = [
            "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
        ]
        .iter()
        .position(|m| *m == &http[8..11])
        .unwrap()
            + 1;
        let expected = format!(
            "{}-{month:02}-{}T{}",
            &http[12..16],
            &http[5..7],
            &http[17..25]
        );
        assert_eq!(ours, expected, "{http}");
    }
}
