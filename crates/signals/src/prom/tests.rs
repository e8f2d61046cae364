use super::*;

fn only<'a>(text: &'a str, wanted: &'a [&'a str]) -> Result<Vec<Sample<'a>>, ParseError> {
    struct Filter<'a> {
        wanted: &'a [&'a str],
        seen: Vec<Sample<'a>>,
    }
    impl<'a> Visitor<'a> for Filter<'a> {
        fn wants(&mut self, metric: &Metric<'a>) -> bool {
            self.wanted.contains(&metric.name)
        }
        fn sample(&mut self, sample: Sample<'a>) {
            self.seen.push(sample);
        }
    }
    let mut filter = Filter {
        wanted,
        seen: Vec::new(),
    };
    parse(text, &mut filter)?;
    Ok(filter.seen)
}

fn error_of(text: &str) -> (usize, ParseErrorKind) {
    let err = samples(text).expect_err("text must be rejected");
    (err.line, err.kind)
}

#[test]
fn names_with_colons_and_plain_values() {
    let all = samples("vllm:num_requests_waiting{engine=\"0\"} 3.0\n:odd_name 1\n").unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].name(), "vllm:num_requests_waiting");
    assert_eq!(all[0].value, 3.0);
    assert_eq!(all[0].labels.get("engine").as_deref(), Some("0"));
    assert_eq!(all[1].name(), ":odd_name");
    assert!(all[1].labels.is_empty());
}

#[test]
fn label_escapes_any_order_blanks_and_trailing_comma() {
    let text = concat!(
        r#"m{ z = "a\\b" , a="say \"hi\"",n="x\ny" , } 1"#,
        "\n",
        r#"m{a="}",z="{"} 2"#,
        "\n",
    );
    let all = samples(text).unwrap();
    assert_eq!(all[0].labels.get("z").as_deref(), Some("a\\b"));
    assert_eq!(all[0].labels.get("a").as_deref(), Some("say \"hi\""));
    assert_eq!(all[0].labels.get("n").as_deref(), Some("x\ny"));
    assert_eq!(all[1].labels.get("a").as_deref(), Some("}"));
    assert_eq!(all[1].labels.get("z").as_deref(), Some("{"));
    assert_eq!(all[1].value, 2.0);
}

#[test]
fn special_values_and_timestamps() {
    let text = "a NaN\nb +Inf\nc -Inf 1700000000000\nd 1.5e-3 -5\ne{le=\"+Inf\"} 7\n";
    let all = samples(text).unwrap();
    assert!(all[0].value.is_nan());
    assert_eq!(all[1].value, f64::INFINITY);
    assert_eq!(all[2].value, f64::NEG_INFINITY);
    assert_eq!(all[2].timestamp_ms, Some(1_700_000_000_000));
    assert_eq!(all[3].value, 0.0015);
    assert_eq!(all[3].timestamp_ms, Some(-5));
    assert_eq!(all[0].timestamp_ms, None);
    assert_eq!(all[4].labels.get("le").as_deref(), Some("+Inf"));
}

#[test]
fn blank_lines_crlf_and_missing_final_newline() {
    let text = "\r\n# TYPE g gauge\r\n\r\n   \t\ng{a=\"1\"} 4\r\n\ng 5";
    let all = samples(text).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].value, 4.0);
    assert_eq!(all[1].value, 5.0);
    assert_eq!(all[0].metric.kind, MetricKind::Gauge);
}

#[test]
fn help_and_type_without_samples_and_free_comments() {
    let text = concat!(
        "# HELP vllm:kv_offload_load_size Histogram of \\n sizes \\\\ \"quoted\".\n",
        "# TYPE vllm:kv_offload_load_size histogram\n",
        "# HELP lonely_help only help, no type and no sample\n",
        "# just a comment: <html> { not parsed }\n",
        "#\n",
        "# EOF\n",
    );
    assert_eq!(samples(text).unwrap(), []);
}

#[test]
fn empty_text_is_a_valid_exposition() {
    assert_eq!(samples("").unwrap(), []);
    assert_eq!(samples("\n\n").unwrap(), []);
}

#[test]
fn families_follow_type_lines_and_suffix_conventions() {
    let text = concat!(
        "# TYPE req counter\n",
        "req_total 5\n",
        "req_created 1.7e9\n",
        "# TYPE lat histogram\n",
        "lat_bucket{le=\"0.1\"} 1\n",
        "lat_bucket{le=\"+Inf\"} 2\n",
        "lat_sum 0.3\n",
        "lat_count 2\n",
        "lat_total 9\n",
        "# TYPE q summary\n",
        "q{quantile=\"0.5\"} 1\n",
        "q_sum 1\n",
        "q_bucket 1\n",
        "# TYPE vllm:x_created gauge\n",
        "vllm:x_created 1.7e9\n",
        "# TYPE g gauge\n",
        "g_total 1\n",
        "unknown_family 3\n",
    );
    let all = samples(text).unwrap();
    let by_name = |name: &str| all.iter().find(|s| s.name() == name).unwrap().metric;
    let req = by_name("req_total");
    assert_eq!(
        (req.family, req.kind, req.suffix()),
        ("req", MetricKind::Counter, "_total")
    );
    assert_eq!(by_name("req_created").family, "req");
    let bucket = by_name("lat_bucket");
    assert_eq!(
        (bucket.family, bucket.kind, bucket.suffix()),
        ("lat", MetricKind::Histogram, "_bucket")
    );
    assert_eq!(by_name("lat_sum").family, "lat");
    assert_eq!(by_name("lat_count").family, "lat");
    // `_total` is not a histogram suffix: its own untyped family.
    let stray = by_name("lat_total");
    assert_eq!(
        (stray.family, stray.kind),
        ("lat_total", MetricKind::Untyped)
    );
    assert_eq!(by_name("q").kind, MetricKind::Summary);
    assert_eq!(by_name("q_sum").family, "q");
    assert_eq!(by_name("q_bucket").kind, MetricKind::Untyped);
    // prometheus_client exports `_created` as its own gauge family.
    let created = by_name("vllm:x_created");
    assert_eq!(
        (created.family, created.kind),
        ("vllm:x_created", MetricKind::Gauge)
    );
    assert_eq!(by_name("g_total").kind, MetricKind::Untyped);
    assert_eq!(by_name("unknown_family").kind, MetricKind::Untyped);
}

#[test]
fn visitor_gets_only_wanted_samples() {
    let text = "a 1\nb{x=\"y\"} 2\nc 3\nb 4\n";
    let seen = only(text, &["b"]).unwrap();
    let values: Vec<f64> = seen.iter().map(|s| s.value).collect();
    assert_eq!(values, [2.0, 4.0]);
}

#[test]
fn skipped_lines_are_still_checked() {
    let err = only("a 1\nb not-a-number\n", &["a"]).unwrap_err();
    assert_eq!((err.line, err.kind), (2, ParseErrorKind::InvalidValue));
    let err = only("a 1\nb{x=\"1} 2\n", &["a"]).unwrap_err();
    assert_eq!(
        (err.line, err.kind),
        (2, ParseErrorKind::UnterminatedLabelValue)
    );
}

#[test]
fn garbage_is_rejected() {
    let html = "<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n";
    assert_eq!(error_of(html), (1, ParseErrorKind::InvalidMetricName));
    let json = "{\"object\":\"error\",\"message\":\"not found\"}";
    assert_eq!(error_of(json), (1, ParseErrorKind::InvalidMetricName));
    assert_eq!(error_of("[1, 2]"), (1, ParseErrorKind::InvalidMetricName));
    assert_eq!(
        error_of("404 page not found\n"),
        (1, ParseErrorKind::InvalidMetricName)
    );
    assert_eq!(error_of("Not Found\n"), (1, ParseErrorKind::InvalidValue));
    assert_eq!(error_of("OK"), (1, ParseErrorKind::MissingValue));
    assert_eq!(
        error_of("a 1\n\u{1}\u{7f}\u{3}junk"),
        (2, ParseErrorKind::InvalidMetricName)
    );
}

#[test]
fn invalid_utf8_is_rejected_with_its_line() {
    let err = from_utf8(b"a 1\nb 2\n\xff\xfe\x00").unwrap_err();
    assert_eq!((err.line, err.kind), (3, ParseErrorKind::InvalidUtf8));
    assert_eq!(from_utf8(b"a 1\n"), Ok("a 1\n"));
}

#[test]
fn malformed_lines_name_their_error() {
    let cases: &[(&str, ParseErrorKind)] = &[
        ("foo-bar 1", ParseErrorKind::InvalidMetricName),
        ("foo{1a=\"x\"} 1", ParseErrorKind::InvalidLabelName),
        ("foo{a:b=\"x\"} 1", ParseErrorKind::ExpectedEquals),
        ("foo{a \"x\"} 1", ParseErrorKind::ExpectedEquals),
        ("foo{a=x} 1", ParseErrorKind::ExpectedQuote),
        ("foo{a=\"x} 1", ParseErrorKind::UnterminatedLabelValue),
        ("foo{a=\"\\x\"} 1", ParseErrorKind::InvalidEscape),
        (
            "foo{a=\"x\" b=\"y\"} 1",
            ParseErrorKind::ExpectedLabelSeparator,
        ),
        ("foo{a=\"x\"", ParseErrorKind::UnterminatedLabelSet),
        ("foo{", ParseErrorKind::UnterminatedLabelSet),
        ("foo{,} 1", ParseErrorKind::InvalidLabelName),
        ("foo", ParseErrorKind::MissingValue),
        ("foo{a=\"x\"}", ParseErrorKind::MissingValue),
        ("foo 1,5", ParseErrorKind::InvalidValue),
        ("foo 1 12.5", ParseErrorKind::InvalidTimestamp),
        ("foo 1 12 extra", ParseErrorKind::TrailingText),
        ("# TYPE foo gaugee", ParseErrorKind::InvalidMetricType),
        ("# TYPE foo", ParseErrorKind::InvalidMetricType),
        ("# TYPE foo gauge extra", ParseErrorKind::TrailingText),
        ("# TYPE 1foo gauge", ParseErrorKind::InvalidMetricName),
        ("# HELP", ParseErrorKind::InvalidMetricName),
        ("# HELP foo-bar text", ParseErrorKind::InvalidMetricName),
    ];
    for (line, kind) in cases {
        let text = format!("ok 1\n{line}\nok 2\n");
        let err = samples(&text).expect_err(line);
        assert_eq!((err.line, err.kind), (2, *kind), "line {line:?}");
    }
}

#[test]
fn every_fixture_parses() {
    use std::path::Path;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/metrics");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|ext| ext == "prom") {
            let text = std::fs::read_to_string(&path).unwrap();
            let all = samples(&text).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            let sample_lines = text
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .count();
            assert_eq!(all.len(), sample_lines, "{}", path.display());
            checked += 1;
        }
    }
    assert_eq!(checked, 13);
}
