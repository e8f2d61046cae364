//! TensorRT-LLM's `trtllm-serve` (`trtllm_*`).
//!
//! The KV families are in every capture we have (v1.3.0rc23). The request
//! gauges `trtllm_num_requests_waiting`/`_running` are listed by
//! TensorRT-LLM's metrics collector in newer releases but absent from those
//! captures, so they are read when present and unknown otherwise.

use picker::EngineState;

use super::aggregate::{Largest, Mean, Total, usage_from_free};
use super::extractor::Extractor;
use crate::prom::{Metric, Sample, Visitor};

const WAITING: &str = "trtllm_num_requests_waiting";
const RUNNING: &str = "trtllm_num_requests_running";
const KV_USAGE: &str = "trtllm_kv_cache_utilization";
const MAX_BLOCKS: &str = "trtllm_kv_cache_max_blocks";
const FREE_BLOCKS: &str = "trtllm_kv_cache_free_blocks";
const TOKENS_PER_BLOCK: &str = "trtllm_kv_cache_tokens_per_block";

#[derive(Default)]
pub(super) struct Trtllm {
    waiting: Total,
    running: Total,
    kv_usage: Mean,
    max_blocks: Total,
    free_blocks: Total,
    tokens_per_block: Largest,
}

impl<'a> Visitor<'a> for Trtllm {
    fn wants(&mut self, metric: &Metric<'a>) -> bool {
        matches!(
            metric.name,
            WAITING | RUNNING | KV_USAGE | MAX_BLOCKS | FREE_BLOCKS | TOKENS_PER_BLOCK
        )
    }

    fn sample(&mut self, sample: Sample<'a>) {
        match sample.name() {
            WAITING => self.waiting.add(sample.value),
            RUNNING => self.running.add(sample.value),
            KV_USAGE => self.kv_usage.add(sample.value),
            MAX_BLOCKS => self.max_blocks.add(sample.value),
            FREE_BLOCKS => self.free_blocks.add(sample.value),
            TOKENS_PER_BLOCK => self.tokens_per_block.add(sample.value),
            _ => {}
        }
    }
}

impl Extractor<'_> for Trtllm {
    fn finish(self) -> EngineState {
        let kv_usage = self
            .kv_usage
            .fraction()
            .or_else(|| usage_from_free(self.free_blocks.get(), self.max_blocks.get()));
        EngineState {
            waiting: self.waiting.count(),
            running: self.running.count(),
            kv_usage,
            block_size: self.tokens_per_block.as_u32(),
            kv_capacity_blocks: self.max_blocks.count(),
            ..EngineState::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;
    use crate::dialect::test_support::fixture;

    fn kv_only(kv_usage: f64, capacity: u64) -> EngineState {
        EngineState {
            kv_usage: Some(kv_usage),
            block_size: Some(32),
            kv_capacity_blocks: Some(capacity),
            ..EngineState::default()
        }
    }

    #[test]
    fn legacy_kv_manager_with_host_cache() {
        let text = fixture("trtllm-legacy.prom");
        assert_eq!(
            Dialect::Trtllm.extract(&text),
            Ok(kv_only(0.055374130342183726, 21129))
        );
    }

    #[test]
    fn legacy_kv_manager_without_host_cache() {
        let text = fixture("trtllm-nohost.prom");
        assert_eq!(Dialect::Trtllm.extract(&text), Ok(kv_only(0.0, 19960)));
    }

    #[test]
    fn v2_kv_manager() {
        let text = fixture("trtllm-v2.prom");
        assert_eq!(Dialect::Trtllm.extract(&text), Ok(kv_only(0.0, 19958)));
    }

    #[test]
    fn usage_from_free_blocks_when_utilization_is_missing() {
        // The legacy capture without its utilization line: 1 - 19959/21129.
        let text: String = fixture("trtllm-legacy.prom")
            .lines()
            .filter(|line| !line.contains("utilization"))
            .map(|line| format!("{line}\n"))
            .collect();
        let usage = Dialect::Trtllm.extract(&text).unwrap().kv_usage.unwrap();
        assert!((usage - 0.055374130342183726).abs() < 1e-12, "{usage}");
    }

    #[test]
    fn request_gauges_when_present() {
        // Hand-written in the collector's naming; not in the captures.
        let text = "trtllm_num_requests_waiting{model_name=\"m\"} 4.0\ntrtllm_num_requests_running{model_name=\"m\"} 9.0\n";
        let state = Dialect::Trtllm.extract(text).unwrap();
        assert_eq!((state.waiting, state.running), (Some(4), Some(9)));
    }
}
