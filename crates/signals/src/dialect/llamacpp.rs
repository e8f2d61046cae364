//! llama.cpp's `llama-server --metrics` (`llamacpp:*`). Recent builds
//! dropped `llamacpp:kv_cache_usage_ratio`; KV usage is then unknown.

use picker::EngineState;

use super::aggregate::{Mean, Total};
use super::extractor::Extractor;
use crate::prom::{Metric, Sample, Visitor};

const WAITING: &str = "llamacpp:requests_deferred";
const RUNNING: &str = "llamacpp:requests_processing";
const KV_USAGE: &str = "llamacpp:kv_cache_usage_ratio";

#[derive(Default)]
pub(super) struct Llamacpp {
    waiting: Total,
    running: Total,
    kv_usage: Mean,
}

impl<'a> Visitor<'a> for Llamacpp {
    fn wants(&mut self, metric: &Metric<'a>) -> bool {
        matches!(metric.name, WAITING | RUNNING | KV_USAGE)
    }

    fn sample(&mut self, sample: Sample<'a>) {
        match sample.name() {
            WAITING => self.waiting.add(sample.value),
            RUNNING => self.running.add(sample.value),
            KV_USAGE => self.kv_usage.add(sample.value),
            _ => {}
        }
    }
}

impl Extractor<'_> for Llamacpp {
    fn finish(self) -> EngineState {
        EngineState {
            waiting: self.waiting.count(),
            running: self.running.count(),
            kv_usage: self.kv_usage.fraction(),
            ..EngineState::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;
    use crate::dialect::test_support::fixture;

    fn idle() -> EngineState {
        EngineState {
            waiting: Some(0),
            running: Some(0),
            ..EngineState::default()
        }
    }

    #[test]
    fn b11434_idle() {
        let text = fixture("llamacpp-b11434-idle.prom");
        assert_eq!(Dialect::Llamacpp.extract(&text), Ok(idle()));
    }

    #[test]
    fn b11434_after_traffic() {
        let text = fixture("llamacpp-b11434-busy.prom");
        assert_eq!(Dialect::Llamacpp.extract(&text), Ok(idle()));
    }

    #[test]
    fn older_builds_report_kv_usage() {
        // Hand-written in the shape older llama.cpp builds used.
        let text = "\
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
";
        let expected = EngineState {
            waiting: Some(1),
            running: Some(2),
            kv_usage: Some(0.125),
            ..EngineState::default()
        };
        assert_eq!(Dialect::Llamacpp.extract(text), Ok(expected));
    }
}
