//! The Prometheus text parser (`signals::prom`) and every engine dialect
//! on the same scraped text, as the scraper sees a replica's `/metrics`.
//!
//! Checked beyond "no panic":
//! - the body is accepted as UTF-8 exactly when the standard library does;
//! - accepting is the visitor's business only in what it is handed: a parse
//!   that wants no sample, one that wants every sample, and each dialect
//!   accept the same texts and fail with the same error (skipped lines are
//!   checked a cheaper way, and must agree with the full conversion);
//! - every sample survives being written back out and parsed again, and
//!   its labels read back consistently;
//! - each dialect's engine state keeps the ranges the picker relies on.

#![no_main]

use libfuzzer_sys::fuzz_target;
use signals::Dialect;
use signals::prom::{self, Metric, Sample, Visitor};

fuzz_target!(|body: &[u8]| {
    let text = match prom::from_utf8(body) {
        Ok(text) => {
            assert!(std::str::from_utf8(body).is_ok());
            text
        }
        Err(_) => {
            assert!(std::str::from_utf8(body).is_err());
            return;
        }
    };

    let all = prom::samples(text);
    let error = all.as_ref().err();
    assert_eq!(
        prom::parse(text, &mut WantNothing).as_ref().err(),
        error,
        "wanting no samples"
    );

    for dialect in Dialect::ALL {
        let state = dialect.extract(text);
        if dialect.has_metrics() {
            assert_eq!(state.as_ref().err(), error, "{dialect}");
        }
        let Ok(state) = state else { continue };
        if let Some(kv) = state.kv_usage {
            assert!((0.0..=1.0).contains(&kv), "{dialect}: kv_usage {kv}");
        }
        for adapter in state
            .resident_adapters
            .iter()
            .chain(&state.waiting_adapters)
        {
            assert!(
                !adapter.is_empty() && adapter.trim() == adapter,
                "{dialect}: adapter {adapter:?}"
            );
        }
    }

    if let Ok(samples) = all {
        for sample in &samples {
            check_labels(sample);
            check_round_trip(sample);
        }
    }
});

/// A visitor that takes nothing: every line is only checked.
struct WantNothing;

impl<'a> Visitor<'a> for WantNothing {
    fn wants(&mut self, _: &Metric<'a>) -> bool {
        false
    }
    fn sample(&mut self, _: Sample<'a>) {
        unreachable!("no sample was wanted");
    }
}

/// Label names are valid, `get` finds the first of a name, and `is_empty`
/// agrees with `iter`.
fn check_labels(sample: &Sample<'_>) {
    let labels = sample.labels;
    let pairs: Vec<_> = labels.iter().collect();
    assert_eq!(labels.is_empty(), pairs.is_empty());
    for (i, (name, value)) in pairs.iter().enumerate() {
        let mut bytes = name.bytes();
        assert!(
            bytes
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "label name {name:?}"
        );
        if pairs[..i].iter().all(|(earlier, _)| earlier != name) {
            assert_eq!(labels.get(name).as_ref(), Some(value));
        }
    }
}

/// The sample written as one line of text parses back to itself.
fn check_round_trip(sample: &Sample<'_>) {
    let mut line = sample.name().to_owned();
    if !sample.labels.as_raw().is_empty() {
        line.push('{');
        line.push_str(sample.labels.as_raw());
        line.push('}');
    }
    // `Display` of an f64 is the shortest text that parses back to it.
    line.push_str(&format!(" {}", sample.value));
    if let Some(ts) = sample.timestamp_ms {
        line.push_str(&format!(" {ts}"));
    }
    let again = prom::samples(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
    let [again] = again.as_slice() else {
        panic!("{line:?} gave {} samples", again.len());
    };
    assert_eq!(again.name(), sample.name(), "{line:?}");
    assert_eq!(
        again.labels.iter().collect::<Vec<_>>(),
        sample.labels.iter().collect::<Vec<_>>(),
        "{line:?}"
    );
    // NaN is written without its sign, and any NaN is as good as another.
    if sample.value.is_nan() {
        assert!(again.value.is_nan(), "{line:?}");
    } else {
        assert_eq!(again.value.to_bits(), sample.value.to_bits(), "{line:?}");
    }
    assert_eq!(again.timestamp_ms, sample.timestamp_ms, "{line:?}");
}
