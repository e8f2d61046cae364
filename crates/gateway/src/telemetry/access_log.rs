//! The access log's own layer: one line per request, written straight into
//! a reused buffer, in the same text and JSON shapes as the process's other
//! logs.
//!
//! tracing-subscriber's formatter spends about 2 µs of the data plane's CPU
//! per request on this line — `fmt::Debug` for every string, a timestamp
//! formatted from scratch, a visitor through `fmt::Write` per field — about
//! a third of the gateway's own work per proxied request. Here strings that
//! need no escaping (nearly all) are copied as they are, and the
//! timestamp's date and time are formatted once per second per thread.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Layer};

use config::LogFormat;

/// Writes each event it sees as one access-log line; filtered to the
/// access log's target where it is installed.
pub struct AccessLogLayer<W> {
    format: LogFormat,
    writer: W,
    ansi: bool,
}

impl<W> AccessLogLayer<W> {
    pub fn new(format: LogFormat, writer: W, ansi: bool) -> Self {
        Self {
            format,
            writer,
            ansi,
        }
    }
}

thread_local! {
    /// The line being written, reused from one line to the next.
    static LINE: RefCell<String> = RefCell::new(String::with_capacity(512));
    /// `2026-01-31T23:59:59` for the second it was made for.
    static DATE_TIME: RefCell<(u64, String)> = const { RefCell::new((u64::MAX, String::new())) };
}

impl<S, W> Layer<S> for AccessLogLayer<W>
where
    S: Subscriber,
    W: for<'w> MakeWriter<'w> + 'static,
{
    fn on_event(&self, event: &Event<'_>, _cx: Context<'_, S>) {
        LINE.with_borrow_mut(|line| {
            line.clear();
            let meta = event.metadata();
            match self.format {
                LogFormat::Text => {
                    let ansi = |line: &mut String, code: &str| {
                        if self.ansi {
                            line.push_str(code);
                        }
                    };
                    ansi(line, DIM);
                    timestamp(line);
                    ansi(line, RESET);
                    line.push(' ');
                    ansi(line, GREEN);
                    let _ = write!(line, "{:>5}", meta.level().as_str());
                    ansi(line, RESET);
                    line.push(' ');
                    paint(line, self.ansi, DIM, meta.target());
                    paint(line, self.ansi, DIM, ":");
                    event.record(&mut TextFields {
                        line,
                        ansi: self.ansi,
                    });
                }
                LogFormat::Json => {
                    line.push_str("{\"timestamp\":\"");
                    timestamp(line);
                    line.push_str("\",\"level\":\"");
                    line.push_str(meta.level().as_str());
                    line.push('"');
                    event.record(&mut JsonFields { line });
                    line.push_str(",\"target\":");
                    json_str(line, meta.target());
                    line.push('}');
                }
            }
            line.push('\n');
            // Nowhere to report a failing log writer.
            let _ = self.writer.make_writer().write_all(line.as_bytes());
        });
    }
}

// tracing-subscriber's colours for a terminal.
const DIM: &str = "\x1b[2m";
const ITALIC: &str = "\x1b[3m";
const GREEN: &str = "\x1b[32m";
const RESET: &str = "\x1b[0m";

fn paint(line: &mut String, ansi: bool, colour: &str, s: &str) {
    if ansi {
        line.push_str(colour);
        line.push_str(s);
        line.push_str(RESET);
    } else {
        line.push_str(s);
    }
}

/// ` name=value` per field, strings quoted and escaped as `fmt::Debug`
/// does, as tracing-subscriber's text format writes them.
struct TextFields<'a> {
    line: &'a mut String,
    ansi: bool,
}

impl TextFields<'_> {
    fn name(&mut self, field: &Field) {
        self.line.push(' ');
        if field.name() == "message" {
            return;
        }
        paint(self.line, self.ansi, ITALIC, field.name());
        paint(self.line, self.ansi, DIM, "=");
    }
}

impl Visit for TextFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.name(field);
        if field.name() == "message" {
            self.line.push_str(value);
        } else if needs_no_escape(value) {
            self.line.push('"');
            self.line.push_str(value);
            self.line.push('"');
        } else {
            let _ = write!(self.line, "{value:?}");
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field);
        let _ = write!(self.line, "{value}");
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.name(field);
        let _ = write!(self.line, "{value}");
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.name(field);
        self.line.push_str(if value { "true" } else { "false" });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.name(field);
        let _ = write!(self.line, "{value:?}");
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.name(field);
        let _ = write!(self.line, "{value:?}");
    }
}

/// `,"name":value` per field, as tracing-subscriber's flattened JSON
/// writes them.
struct JsonFields<'a> {
    line: &'a mut String,
}

impl JsonFields<'_> {
    fn name(&mut self, field: &Field) {
        self.line.push(',');
        json_str(self.line, field.name());
        self.line.push(':');
    }
}

impl Visit for JsonFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.name(field);
        json_str(self.line, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.name(field);
        let _ = write!(self.line, "{value}");
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.name(field);
        let _ = write!(self.line, "{value}");
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.name(field);
        self.line.push_str(if value { "true" } else { "false" });
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.name(field);
        if value.is_finite() {
            // As serde_json writes it: never an exponent, a fraction always.
            let start = self.line.len();
            let _ = write!(self.line, "{value}");
            if !self.line[start..].contains('.') {
                self.line.push_str(".0");
            }
        } else {
            self.line.push_str("null");
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.name(field);
        json_str(self.line, &format!("{value:?}"));
    }
}

/// Printable ASCII but `"` and `\`: written between quotes as it is, in
/// both text (`fmt::Debug`) and JSON.
fn needs_no_escape(s: &str) -> bool {
    s.bytes()
        .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\')
}

fn json_str(line: &mut String, s: &str) {
    if needs_no_escape(s) {
        line.push('"');
        line.push_str(s);
        line.push('"');
    } else {
        // `String`'s serializer writes valid UTF-8 and never fails.
        line.push_str(&serde_json::to_string(s).unwrap_or_default());
    }
}

/// `2026-01-31T23:59:59.123456Z`, the time now in UTC, to the microsecond.
fn timestamp(line: &mut String) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    DATE_TIME.with_borrow_mut(|(at, text)| {
        if *at != secs {
            *at = secs;
            text.clear();
            write_date_time(text, secs);
        }
        line.push_str(text);
    });
    let _ = write!(line, ".{:06}Z", now.subsec_micros());
}

/// `secs` after the Unix epoch as `YYYY-MM-DDTHH:MM:SS` (UTC), by the
/// proleptic Gregorian calendar counted in 400-year eras.
fn write_date_time(out: &mut String, secs: u64) {
    let days = (secs / 86_400) as i64;
    let of_day = secs % 86_400;
    // Days since 0000-03-01, so that a leap day ends each year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        of_day / 3_600,
        of_day / 60 % 60,
        of_day % 60
    );
}

#[cfg(test)]
mod tests;
