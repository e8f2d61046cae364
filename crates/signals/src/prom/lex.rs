//! Byte-level tokens of the text format: names, blanks, quoted label
//! values and numbers.

use super::ParseErrorKind;

const METRIC_START: u8 = 1;
const METRIC_CONTINUE: u8 = 2;
const LABEL_START: u8 = 4;
const LABEL_CONTINUE: u8 = 8;

/// Character classes of name bytes; one table lookup per byte.
static CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        let alpha = c.is_ascii_alphabetic() || c == b'_';
        let mut class = 0;
        if alpha {
            class |= METRIC_START | METRIC_CONTINUE | LABEL_START | LABEL_CONTINUE;
        }
        if c.is_ascii_digit() {
            class |= METRIC_CONTINUE | LABEL_CONTINUE;
        }
        if c == b':' {
            class |= METRIC_START | METRIC_CONTINUE;
        }
        table[b] = class;
        b += 1;
    }
    table
};

pub(super) fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

pub(super) fn skip_blanks(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && is_blank(bytes[i]) {
        i += 1;
    }
    i
}

/// End of the token starting at `i`: the next blank or the end of line.
pub(super) fn token_end(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && !is_blank(bytes[i]) {
        i += 1;
    }
    i
}

/// End of the metric name (`[a-zA-Z_:][a-zA-Z0-9_:]*`) starting at `i`.
pub(super) fn metric_name_end(bytes: &[u8], i: usize) -> Result<usize, ParseErrorKind> {
    name_end(bytes, i, METRIC_START, METRIC_CONTINUE).ok_or(ParseErrorKind::InvalidMetricName)
}

/// End of the label name (`[a-zA-Z_][a-zA-Z0-9_]*`) starting at `i`.
pub(super) fn label_name_end(bytes: &[u8], i: usize) -> Result<usize, ParseErrorKind> {
    name_end(bytes, i, LABEL_START, LABEL_CONTINUE).ok_or(ParseErrorKind::InvalidLabelName)
}

fn name_end(bytes: &[u8], mut i: usize, start: u8, rest: u8) -> Option<usize> {
    if CLASS[*bytes.get(i)? as usize] & start == 0 {
        return None;
    }
    i += 1;
    while i < bytes.len() && CLASS[bytes[i] as usize] & rest != 0 {
        i += 1;
    }
    Some(i)
}

/// Whether all of `name` is a valid metric name.
pub(super) fn is_metric_name(name: &str) -> bool {
    metric_name_end(name.as_bytes(), 0) == Ok(name.len())
}

/// `i` is just past the opening quote; returns the index just past the
/// closing one. Only `\\`, `\"` and `\n` are valid escapes.
pub(super) fn quoted_value_end(bytes: &[u8], mut i: usize) -> Result<usize, ParseErrorKind> {
    loop {
        let Some(offset) = memchr::memchr2(b'"', b'\\', &bytes[i..]) else {
            return Err(ParseErrorKind::UnterminatedLabelValue);
        };
        i += offset;
        if bytes[i] == b'"' {
            return Ok(i + 1);
        }
        match bytes.get(i + 1) {
            Some(b'\\' | b'"' | b'n') => i += 2,
            Some(_) => return Err(ParseErrorKind::InvalidEscape),
            None => return Err(ParseErrorKind::UnterminatedLabelValue),
        }
    }
}

/// Whether `token` is a float that [`str::parse::<f64>`] accepts, without
/// converting it: lines the caller skips are checked this cheaper way.
/// The grammar is Rust's: an optional sign, then `inf`, `infinity` or
/// `nan` in any case, or digits with an optional point and exponent.
pub(super) fn is_float(token: &[u8]) -> bool {
    let unsigned = match token.first() {
        Some(b'+' | b'-') => &token[1..],
        _ => token,
    };
    if unsigned.first().is_some_and(u8::is_ascii_alphabetic) {
        return unsigned.eq_ignore_ascii_case(b"inf")
            || unsigned.eq_ignore_ascii_case(b"infinity")
            || unsigned.eq_ignore_ascii_case(b"nan");
    }
    let mut i = 0;
    let mut digits = 0;
    while i < unsigned.len() && unsigned[i].is_ascii_digit() {
        i += 1;
        digits += 1;
    }
    if unsigned.get(i) == Some(&b'.') {
        i += 1;
        while i < unsigned.len() && unsigned[i].is_ascii_digit() {
            i += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return false;
    }
    if matches!(unsigned.get(i), Some(b'e' | b'E')) {
        i += 1;
        if matches!(unsigned.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let exponent_start = i;
        while i < unsigned.len() && unsigned[i].is_ascii_digit() {
            i += 1;
        }
        if i == exponent_start {
            return false;
        }
    }
    i == unsigned.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_float_agrees_with_the_standard_parser() {
        let tokens = [
            "0",
            "0.0",
            "1.7859669528940387e+09",
            "-1",
            "+1",
            "1.",
            ".5",
            "1e3",
            "1E-3",
            "NaN",
            "nan",
            "+Inf",
            "-Inf",
            "Inf",
            "inf",
            "infinity",
            "-Infinity",
            "1e",
            "1e+",
            ".",
            "",
            "+",
            "-",
            "e5",
            "1.2.3",
            "0x10",
            "1_000",
            "Found",
            "Server",
            "12a",
            "--1",
            "1 ",
            "nann",
            "in",
            "+nan",
            "٣",
        ];
        for token in tokens {
            assert_eq!(
                is_float(token.as_bytes()),
                token.parse::<f64>().is_ok(),
                "token {token:?}"
            );
        }
    }

    #[test]
    fn metric_names_allow_colons_but_label_names_do_not() {
        assert_eq!(metric_name_end(b"vllm:x_1 1", 0), Ok(8));
        assert_eq!(metric_name_end(b":a", 0), Ok(2));
        assert_eq!(
            metric_name_end(b"1a", 0),
            Err(ParseErrorKind::InvalidMetricName)
        );
        assert_eq!(label_name_end(b"a:b", 0), Ok(1));
        assert_eq!(
            label_name_end(b":b", 0),
            Err(ParseErrorKind::InvalidLabelName)
        );
    }

    #[test]
    fn quoted_values_end_at_the_first_unescaped_quote() {
        assert_eq!(quoted_value_end(br#"abc" x"#, 0), Ok(4));
        assert_eq!(quoted_value_end(br#"a\"b" x"#, 0), Ok(5));
        assert_eq!(quoted_value_end(br#"a\\" x"#, 0), Ok(4));
        assert_eq!(
            quoted_value_end(br#"a\tb""#, 0),
            Err(ParseErrorKind::InvalidEscape)
        );
        assert_eq!(
            quoted_value_end(br#"abc"#, 0),
            Err(ParseErrorKind::UnterminatedLabelValue)
        );
        assert_eq!(
            quoted_value_end(br#"abc\"#, 0),
            Err(ParseErrorKind::UnterminatedLabelValue)
        );
    }
}
