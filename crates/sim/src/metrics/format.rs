//! Number and label formatting of the Prometheus text exposition, as each real
//! engine's exporter writes it.
//!
//! Gateways parse these texts, and their parsers meet whatever the real
//! servers emit, so the simulator reproduces the exact spelling of numbers:
//! Python's `prometheus_client` (vLLM, SGLang) writes `1.0`, `1e+06` and
//! `1.7859669528940387e+09`; llama.cpp streams doubles through a C++
//! `ostream` (`%g`, six significant digits); TGI's Rust exporter writes `0`.

use std::fmt::Write;

/// Python's `repr(float)`: the shortest string that round-trips, in fixed
/// notation for decimal exponents in `[-4, 16)` (always with a fractional
/// part, `1.0`) and scientific notation otherwise (`1e-05`, `1.5e+16`).
pub fn python_repr(value: f64) -> String {
    if value.is_nan() {
        return "nan".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.into();
    }
    if value == 0.0 {
        return if value.is_sign_negative() {
            "-0.0"
        } else {
            "0.0"
        }
        .into();
    }
    // Rust's `{:e}` gives the shortest round-trip digits: "-1.2345e-7".
    let sci = format!("{value:e}");
    let (mantissa, exponent) = sci
        .split_once('e')
        .expect("LowerExp always has an exponent");
    let exponent: i32 = exponent.parse().expect("LowerExp exponent is an integer");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();

    let mut out = String::from(sign);
    if (-4..16).contains(&exponent) {
        if exponent < 0 {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
            out.push_str(&digits);
        } else {
            let int_len = exponent as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(
            out,
            "e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
    }
    out
}

/// `prometheus_client`'s `floatToGoString`: Python's repr, but large positive
/// numbers switch to an exponent sooner, as Go does (`1e+06`,
/// `8.128902e+06`). Used for sample values and `le` labels of vLLM and SGLang.
pub fn prometheus_client(value: f64) -> String {
    if value == f64::INFINITY {
        return "+Inf".into();
    }
    if value == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    if value.is_nan() {
        return "NaN".into();
    }
    let repr = python_repr(value);
    match repr.find('.') {
        Some(dot) if value > 0.0 && dot > 6 => {
            let mut mantissa = String::with_capacity(repr.len());
            mantissa.push_str(&repr[..1]);
            mantissa.push('.');
            mantissa.push_str(&repr[1..dot]);
            mantissa.push_str(&repr[dot + 1..]);
            // The upstream code strips trailing '0' and '.' characters, and
            // always writes the exponent as "e+0" followed by the digit count.
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => repr,
    }
}

/// C++ `ostream << double` with the default precision: `printf("%g")` with
/// six significant digits (`26.4564`, `3143`, `1.23457e+06`). llama.cpp.
pub fn ostream_double(value: f64) -> String {
    if value.is_nan() {
        return "nan".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.into();
    }
    if value == 0.0 {
        return "0".into();
    }
    const PRECISION: i32 = 6;
    let sci = format!("{value:.*e}", (PRECISION - 1) as usize);
    let (mantissa, exponent) = sci
        .split_once('e')
        .expect("LowerExp always has an exponent");
    let exponent: i32 = exponent.parse().expect("LowerExp exponent is an integer");
    if !(-4..PRECISION).contains(&exponent) {
        let mantissa = trim_fraction(mantissa);
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        let decimals = (PRECISION - 1 - exponent) as usize;
        trim_fraction(&format!("{value:.decimals$}")).to_owned()
    }
}

/// TGI's exporter (Rust `metrics-exporter-prometheus`) writes values with
/// Rust's `Display`: `0`, `3`, `0.25`.
pub fn rust_display(value: f64) -> String {
    if value.is_infinite() {
        return if value > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    format!("{value}")
}

fn trim_fraction(number: &str) -> &str {
    if number.contains('.') {
        number.trim_end_matches('0').trim_end_matches('.')
    } else {
        number
    }
}

/// Escapes a label value: backslash, double quote and newline.
pub fn escape_label_value(value: &str, out: &mut String) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Writes `{k1="v1",k2="v2"}` (nothing for an empty label set).
pub fn write_labels(out: &mut String, labels: &[(&str, &str)]) {
    if labels.is_empty() {
        return;
    }
    out.push('{');
    for (i, (key, value)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(key);
        out.push_str("=\"");
        escape_label_value(value, out);
        out.push('"');
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_repr_matches_cpython() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.001, "0.001"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.28, "0.28"),
            (0.007507552643049313, "0.007507552643049313"),
            (2560.0, "2560.0"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (123456.789, "123456.789"),
            (1785966952.8940387, "1785966952.8940387"),
        ];
        for (value, want) in cases {
            assert_eq!(python_repr(*value), *want, "repr({value})");
        }
    }

    #[test]
    fn prometheus_client_spells_numbers_like_the_captures() {
        // Every expected string here appears in a real capture or in vLLM's
        // bucket lists (crates/signals/testdata/metrics).
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (1.0, "1.0"),
            (0.001, "0.001"),
            (2560.0, "2560.0"),
            (1e6, "1e+06"),
            (1.5e8, "1.5e+08"),
            (200000.0, "200000.0"),
            (400001.0, "400001.0"),
            (8128902.0, "8.128902e+06"),
            (2351897.9474117756, "2.3518979474117756e+06"),
            (1785966952.8940387, "1.7859669528940387e+09"),
            (f64::INFINITY, "+Inf"),
            (f64::NAN, "NaN"),
        ];
        for (value, want) in cases {
            assert_eq!(prometheus_client(*value), *want, "floatToGoString({value})");
        }
    }

    #[test]
    fn ostream_double_matches_printf_g() {
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (3143.0, "3143"),
            (26.4564, "26.4564"),
            (118.95412, "118.954"),
            (1.744347, "1.74435"),
            (1234567.0, "1.23457e+06"),
            (0.00001234, "1.234e-05"),
            (0.5, "0.5"),
        ];
        for (value, want) in cases {
            assert_eq!(ostream_double(*value), *want, "%g of {value}");
        }
    }

    #[test]
    fn labels_are_escaped() {
        let mut out = String::new();
        write_labels(&mut out, &[("a", "x\"y"), ("b", "c\\d\ne")]);
        assert_eq!(out, r#"{a="x\"y",b="c\\d\ne"}"#);
        let mut empty = String::new();
        write_labels(&mut empty, &[]);
        assert!(empty.is_empty());
    }
}
