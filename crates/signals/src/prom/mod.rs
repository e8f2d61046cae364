//! Prometheus text exposition format (version 0.0.4).
//!
//! Written by hand because it is a measured hot path: the gateway scrapes
//! every replica every ~50 ms. The caller passes a [`Visitor`] that says
//! which metrics it wants; every line is still checked (a replica serving
//! an HTML page or JSON must fail, not look idle), but only wanted samples
//! have their value converted and are handed over. Nothing is allocated:
//! samples borrow from the input, and label values are unescaped only when
//! the caller reads them.

mod error;
mod labels;
mod lex;

pub use error::{ParseError, ParseErrorKind};
pub use labels::Labels;

use std::str::FromStr;

/// The type a `# TYPE` line declares for a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    /// Declared `untyped`, or no `# TYPE` line covers the sample.
    #[default]
    Untyped,
}

impl MetricKind {
    /// Whether a sample named `family + suffix` belongs to a family of this
    /// type: `_total`/`_created` for counters, `_bucket`/`_sum`/`_count`/
    /// `_created` for histograms, `_sum`/`_count`/`_created` for summaries.
    fn has_suffix(self, suffix: &str) -> bool {
        match self {
            MetricKind::Counter => matches!(suffix, "_total" | "_created"),
            MetricKind::Histogram => matches!(suffix, "_bucket" | "_sum" | "_count" | "_created"),
            MetricKind::Summary => matches!(suffix, "_sum" | "_count" | "_created"),
            MetricKind::Gauge | MetricKind::Untyped => false,
        }
    }
}

impl FromStr for MetricKind {
    type Err = ParseErrorKind;

    fn from_str(s: &str) -> Result<Self, ParseErrorKind> {
        match s {
            "counter" => Ok(MetricKind::Counter),
            "gauge" => Ok(MetricKind::Gauge),
            "histogram" => Ok(MetricKind::Histogram),
            "summary" => Ok(MetricKind::Summary),
            "untyped" => Ok(MetricKind::Untyped),
            _ => Err(ParseErrorKind::InvalidMetricType),
        }
    }
}

/// The name of a sample and the family it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric<'a> {
    /// The sample's own name, e.g. `vllm:e2e_request_latency_seconds_bucket`.
    pub name: &'a str,
    /// The family declared by the closest preceding `# TYPE` line when the
    /// name matches it (exactly or with a suffix its type allows); otherwise
    /// the sample's own name.
    pub family: &'a str,
    pub kind: MetricKind,
}

impl<'a> Metric<'a> {
    /// What the name adds to the family name, e.g. `_bucket`; empty for a
    /// plain gauge or counter sample.
    pub fn suffix(&self) -> &'a str {
        &self.name[self.family.len()..]
    }
}

/// One sample line, borrowing from the exposition text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub metric: Metric<'a>,
    pub labels: Labels<'a>,
    /// May be NaN or ±infinity.
    pub value: f64,
    /// Milliseconds since the Unix epoch, when the line carries one.
    pub timestamp_ms: Option<i64>,
}

impl<'a> Sample<'a> {
    pub fn name(&self) -> &'a str {
        self.metric.name
    }
}

/// Chooses and receives the samples of a parse.
pub trait Visitor<'a> {
    /// Whether to decode this sample and pass it to [`Visitor::sample`].
    /// Called for every sample line, before its value is converted.
    fn wants(&mut self, metric: &Metric<'a>) -> bool;

    fn sample(&mut self, sample: Sample<'a>);
}

/// Check all of `text` and hand the samples `visitor` wants to it, in text
/// order. Stops at the first line that is not valid exposition.
///
/// Accepted beyond the strict grammar, as Prometheus itself does: CRLF line
/// ends, blanks (spaces, tabs) around tokens, a trailing comma in a label
/// set, comment lines of any content. An empty text is a valid exposition
/// with no samples.
pub fn parse<'a, V: Visitor<'a>>(text: &'a str, visitor: &mut V) -> Result<(), ParseError> {
    let bytes = text.as_bytes();
    let mut declared: Option<TypeDecl<'a>> = None;
    let mut start = 0;
    let mut line_number = 0;
    while start < bytes.len() {
        line_number += 1;
        let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |n| start + n);
        let mut line = &text[start..end];
        start = end + 1;
        if let Some(stripped) = line.strip_suffix('\r') {
            line = stripped;
        }
        let result = match line.trim_start_matches([' ', '\t']) {
            "" => Ok(()),
            comment if comment.starts_with('#') => {
                parse_comment(&comment[1..]).map(|decl| declared = decl.or(declared))
            }
            sample => parse_sample(sample, declared, visitor),
        };
        result.map_err(|kind| ParseError::new(line_number, kind, line))?;
    }
    Ok(())
}

/// Check `body` is UTF-8 text, as the format requires.
pub fn from_utf8(body: &[u8]) -> Result<&str, ParseError> {
    std::str::from_utf8(body).map_err(|err| {
        let valid = &body[..err.valid_up_to()];
        let line = memchr::memchr_iter(b'\n', valid).count() + 1;
        ParseError::new(line, ParseErrorKind::InvalidUtf8, "")
    })
}

/// Every sample of `text`, for tests and tools; the hot path uses [`parse`].
pub fn samples(text: &str) -> Result<Vec<Sample<'_>>, ParseError> {
    struct All<'a>(Vec<Sample<'a>>);
    impl<'a> Visitor<'a> for All<'a> {
        fn wants(&mut self, _: &Metric<'a>) -> bool {
            true
        }
        fn sample(&mut self, sample: Sample<'a>) {
            self.0.push(sample);
        }
    }
    let mut all = All(Vec::new());
    parse(text, &mut all)?;
    Ok(all.0)
}

/// The family and type of the latest `# TYPE` line.
#[derive(Debug, Clone, Copy)]
struct TypeDecl<'a> {
    family: &'a str,
    kind: MetricKind,
}

impl<'a> TypeDecl<'a> {
    fn resolve(declared: Option<Self>, name: &'a str) -> Metric<'a> {
        if let Some(decl) = declared
            && let Some(suffix) = name.strip_prefix(decl.family)
            && (suffix.is_empty() || decl.kind.has_suffix(suffix))
        {
            return Metric {
                name,
                family: decl.family,
                kind: decl.kind,
            };
        }
        Metric {
            name,
            family: name,
            kind: MetricKind::Untyped,
        }
    }
}

/// `body` follows the `#`. Returns the declaration of a `# TYPE` line.
/// `# HELP` lines need a valid metric name; other comments are free text.
fn parse_comment(body: &str) -> Result<Option<TypeDecl<'_>>, ParseErrorKind> {
    let body = body.trim_start_matches([' ', '\t']);
    let bytes = body.as_bytes();
    let keyword_end = lex::token_end(bytes, 0);
    let keyword = &body[..keyword_end];
    if keyword != "HELP" && keyword != "TYPE" {
        return Ok(None);
    }
    let name_start = lex::skip_blanks(bytes, keyword_end);
    let name_end = lex::token_end(bytes, name_start);
    let name = &body[name_start..name_end];
    if !lex::is_metric_name(name) {
        return Err(ParseErrorKind::InvalidMetricName);
    }
    if keyword == "HELP" {
        // The docstring may hold anything, escapes included.
        return Ok(None);
    }
    let kind_start = lex::skip_blanks(bytes, name_end);
    let kind_end = lex::token_end(bytes, kind_start);
    let kind = body[kind_start..kind_end].parse()?;
    if lex::skip_blanks(bytes, kind_end) != bytes.len() {
        return Err(ParseErrorKind::TrailingText);
    }
    Ok(Some(TypeDecl { family: name, kind }))
}

/// `line` starts at the metric name (leading blanks removed).
fn parse_sample<'a, V: Visitor<'a>>(
    line: &'a str,
    declared: Option<TypeDecl<'a>>,
    visitor: &mut V,
) -> Result<(), ParseErrorKind> {
    let bytes = line.as_bytes();
    let name_end = lex::metric_name_end(bytes, 0)?;
    let mut i = lex::skip_blanks(bytes, name_end);
    let labels = if bytes.get(i) == Some(&b'{') {
        let block_end = label_block_end(bytes, i + 1)?;
        let labels = Labels::from_validated(&line[i + 1..block_end - 1]);
        i = lex::skip_blanks(bytes, block_end);
        labels
    } else {
        if i == name_end && i < bytes.len() {
            // A byte that is neither a name byte, a blank nor '{'.
            return Err(ParseErrorKind::InvalidMetricName);
        }
        Labels::default()
    };
    if i == bytes.len() {
        return Err(ParseErrorKind::MissingValue);
    }
    let value_end = lex::token_end(bytes, i);
    let value = &line[i..value_end];
    let timestamp_ms = parse_timestamp(line, value_end)?;

    let metric = TypeDecl::resolve(declared, &line[..name_end]);
    if visitor.wants(&metric) {
        let value = value
            .parse::<f64>()
            .map_err(|_| ParseErrorKind::InvalidValue)?;
        visitor.sample(Sample {
            metric,
            labels,
            value,
            timestamp_ms,
        });
    } else if !lex::is_float(value.as_bytes()) {
        return Err(ParseErrorKind::InvalidValue);
    }
    Ok(())
}

/// What follows the value: nothing, or an integer timestamp.
fn parse_timestamp(line: &str, value_end: usize) -> Result<Option<i64>, ParseErrorKind> {
    let bytes = line.as_bytes();
    let start = lex::skip_blanks(bytes, value_end);
    if start == bytes.len() {
        return Ok(None);
    }
    let end = lex::token_end(bytes, start);
    let timestamp = line[start..end]
        .parse::<i64>()
        .map_err(|_| ParseErrorKind::InvalidTimestamp)?;
    if lex::skip_blanks(bytes, end) != bytes.len() {
        return Err(ParseErrorKind::TrailingText);
    }
    Ok(Some(timestamp))
}

/// `i` is just past `{`; returns the index just past the matching `}`.
fn label_block_end(bytes: &[u8], mut i: usize) -> Result<usize, ParseErrorKind> {
    loop {
        i = lex::skip_blanks(bytes, i);
        match bytes.get(i) {
            None => return Err(ParseErrorKind::UnterminatedLabelSet),
            Some(b'}') => return Ok(i + 1),
            Some(_) => {}
        }
        i = lex::label_name_end(bytes, i)?;
        i = lex::skip_blanks(bytes, i);
        if bytes.get(i) != Some(&b'=') {
            return Err(ParseErrorKind::ExpectedEquals);
        }
        i = lex::skip_blanks(bytes, i + 1);
        if bytes.get(i) != Some(&b'"') {
            return Err(ParseErrorKind::ExpectedQuote);
        }
        i = lex::quoted_value_end(bytes, i + 1)?;
        i = lex::skip_blanks(bytes, i);
        match bytes.get(i) {
            Some(b',') => i += 1,
            Some(b'}') => return Ok(i + 1),
            None => return Err(ParseErrorKind::UnterminatedLabelSet),
            Some(_) => return Err(ParseErrorKind::ExpectedLabelSeparator),
        }
    }
}

#[cfg(test)]
mod tests;
