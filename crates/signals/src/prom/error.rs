//! Why a text is not a valid exposition, and where.

use std::fmt;

/// A text that is not a Prometheus exposition, with the first line that
/// proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    pub kind: ParseErrorKind,
    /// The start of the offending line, so an operator can see what the
    /// replica served (an HTML error page, JSON, ...).
    pub excerpt: String,
}

/// What is wrong with the offending line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    #[error("text is not valid UTF-8")]
    InvalidUtf8,
    #[error("invalid metric name")]
    InvalidMetricName,
    #[error("invalid label name")]
    InvalidLabelName,
    #[error("expected '=' after label name")]
    ExpectedEquals,
    #[error("expected '\"' to open label value")]
    ExpectedQuote,
    #[error("unterminated label value")]
    UnterminatedLabelValue,
    #[error("invalid escape sequence in label value")]
    InvalidEscape,
    #[error("expected ',' or '}}' after label value")]
    ExpectedLabelSeparator,
    #[error("unterminated label set")]
    UnterminatedLabelSet,
    #[error("missing sample value")]
    MissingValue,
    #[error("invalid sample value")]
    InvalidValue,
    #[error("invalid timestamp")]
    InvalidTimestamp,
    #[error("unexpected text after sample")]
    TrailingText,
    #[error("unknown metric type")]
    InvalidMetricType,
}

/// Longest excerpt kept in an error, in bytes.
const EXCERPT_LIMIT: usize = 60;

impl ParseError {
    pub(crate) fn new(line: usize, kind: ParseErrorKind, text: &str) -> Self {
        let text = text.trim();
        let mut cut = text.len().min(EXCERPT_LIMIT);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut excerpt = text[..cut].to_owned();
        if cut < text.len() {
            excerpt.push('…');
        }
        Self {
            line,
            kind,
            excerpt,
        }
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.kind)?;
        if !self.excerpt.is_empty() {
            write!(f, " in `{}`", self.excerpt.escape_debug())?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_line_kind_and_excerpt() {
        let err = ParseError::new(3, ParseErrorKind::InvalidMetricName, "  <html>\r");
        assert_eq!(err.to_string(), "line 3: invalid metric name in `<html>`");
    }

    #[test]
    fn excerpt_is_truncated_on_a_char_boundary() {
        let text = "é".repeat(EXCERPT_LIMIT);
        let err = ParseError::new(1, ParseErrorKind::InvalidValue, &text);
        assert!(err.excerpt.ends_with('…'));
        assert!(err.excerpt.len() <= EXCERPT_LIMIT + '…'.len_utf8());
    }
}
