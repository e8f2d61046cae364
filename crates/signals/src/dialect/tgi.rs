//! Hugging Face Text Generation Inference (`tgi_*`). TGI reports its queue
//! and batch size only; KV cache and adapters stay unknown.

use picker::EngineState;

use super::aggregate::Total;
use super::extractor::Extractor;
use crate::prom::{Metric, Sample, Visitor};

const WAITING: &str = "tgi_queue_size";
const RUNNING: &str = "tgi_batch_current_size";

#[derive(Default)]
pub(super) struct Tgi {
    waiting: Total,
    running: Total,
}

impl<'a> Visitor<'a> for Tgi {
    fn wants(&mut self, metric: &Metric<'a>) -> bool {
        matches!(metric.name, WAITING | RUNNING)
    }

    fn sample(&mut self, sample: Sample<'a>) {
        match sample.name() {
            WAITING => self.waiting.add(sample.value),
            RUNNING => self.running.add(sample.value),
            _ => {}
        }
    }
}

impl Extractor<'_> for Tgi {
    fn finish(self) -> EngineState {
        EngineState {
            waiting: self.waiting.count(),
            running: self.running.count(),
            ..EngineState::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;

    // No real TGI capture with known provenance exists in testdata (see
    // SOURCES.md), so this is hand-written in the shape of TGI's exporter:
    // unlabelled gauges, integer values, histograms alongside.
    const TGI: &str = "\
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 12
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 4096
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le=\"0.5\"} 3
tgi_request_duration_bucket{le=\"+Inf\"} 9
tgi_request_duration_sum 17.25
tgi_request_duration_count 9
";

    #[test]
    fn queue_and_batch() {
        let expected = EngineState {
            waiting: Some(5),
            running: Some(12),
            ..EngineState::default()
        };
        assert_eq!(Dialect::Tgi.extract(TGI), Ok(expected));
    }
}
