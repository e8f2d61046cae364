//! Triton Inference Server with the TensorRT-LLM backend.
//!
//! `nv_trt_llm_request_metrics{request_type}`: `waiting` is the executor's
//! queue; `active` is every request the batch manager holds (`scheduled` is
//! the subset that ran in the last iteration, used only if `active` is
//! missing). `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}` gives
//! `max`, `free`, `used`, `tokens_per` and `fraction`. When a model has no
//! TensorRT-LLM request metrics, Triton's generic
//! `nv_inference_pending_request_count` (requests queued for execution) is
//! the queue.

use picker::EngineState;

use super::aggregate::{Largest, Mean, Total};
use super::extractor::Extractor;
use crate::prom::{Metric, Sample, Visitor};

const REQUESTS: &str = "nv_trt_llm_request_metrics";
const KV_BLOCKS: &str = "nv_trt_llm_kv_cache_block_metrics";
const PENDING: &str = "nv_inference_pending_request_count";

#[derive(Default)]
pub(super) struct Triton {
    waiting: Total,
    active: Total,
    scheduled: Total,
    pending: Total,
    max_blocks: Total,
    used_blocks: Total,
    tokens_per_block: Largest,
    fraction: Mean,
}

impl<'a> Visitor<'a> for Triton {
    fn wants(&mut self, metric: &Metric<'a>) -> bool {
        matches!(metric.name, REQUESTS | KV_BLOCKS | PENDING)
    }

    fn sample(&mut self, sample: Sample<'a>) {
        let value = sample.value;
        match sample.name() {
            REQUESTS => match sample.labels.get("request_type").as_deref() {
                Some("waiting") => self.waiting.add(value),
                Some("active") => self.active.add(value),
                Some("scheduled") => self.scheduled.add(value),
                _ => {}
            },
            KV_BLOCKS => match sample.labels.get("kv_cache_block_type").as_deref() {
                Some("max") => self.max_blocks.add(value),
                Some("used") => self.used_blocks.add(value),
                Some("tokens_per") => self.tokens_per_block.add(value),
                Some("fraction") => self.fraction.add(value),
                _ => {}
            },
            PENDING => self.pending.add(value),
            _ => {}
        }
    }
}

impl Extractor<'_> for Triton {
    fn finish(self) -> EngineState {
        let kv_usage = self.fraction.fraction().or_else(|| {
            match (self.used_blocks.get(), self.max_blocks.get()) {
                (Some(used), Some(max)) if max > 0.0 => Some((used / max).clamp(0.0, 1.0)),
                _ => None,
            }
        });
        EngineState {
            waiting: self.waiting.count().or(self.pending.count()),
            running: self.active.count().or(self.scheduled.count()),
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

    #[test]
    fn tensorrt_llm_backend_readme() {
        // The README's fraction (0.4875) was edited in by hand and does not
        // match used/max (1/6239); the reported fraction wins.
        let text = fixture("triton-trtllm-readme.prom");
        let expected = EngineState {
            waiting: Some(1),
            running: Some(0),
            kv_usage: Some(0.4875),
            block_size: Some(64),
            kv_capacity_blocks: Some(6239),
            ..EngineState::default()
        };
        assert_eq!(Dialect::Triton.extract(&text), Ok(expected));
    }

    #[test]
    fn generic_triton_metrics_give_the_queue_only() {
        let text = fixture("triton-nv-inference-readme.prom");
        let expected = EngineState {
            waiting: Some(0),
            ..EngineState::default()
        };
        assert_eq!(Dialect::Triton.extract(&text), Ok(expected));
    }

    #[test]
    fn trt_llm_queue_wins_over_generic_pending_count() {
        let mut text = fixture("triton-trtllm-readme.prom");
        text.push_str("nv_inference_pending_request_count{model=\"ensemble\",version=\"1\"} 7\n");
        assert_eq!(Dialect::Triton.extract(&text).unwrap().waiting, Some(1));
    }

    #[test]
    fn fallbacks_for_older_backends() {
        // Hand-written: no `active` request type and no `fraction` block type.
        let text = "\
nv_trt_llm_request_metrics{model=\"tensorrt_llm\",request_type=\"scheduled\",version=\"1\"} 3
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"used\",model=\"tensorrt_llm\",version=\"1\"} 50
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\",model=\"tensorrt_llm\",version=\"1\"} 200
";
        let state = Dialect::Triton.extract(text).unwrap();
        assert_eq!(state.running, Some(3));
        assert_eq!(state.waiting, None);
        assert_eq!(state.kv_usage, Some(0.25));
        assert_eq!(state.kv_capacity_blocks, Some(200));
    }

    #[test]
    fn block_counts_too_large_to_sum_keep_usage_a_fraction() {
        // Found by fuzzing: these summed to infinity, and inf / inf is NaN.
        let text = "\
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"} 1e308
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"used\"} 1e308
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"} 1e308
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"used\"} 1e308
";
        let state = Dialect::Triton.extract(text).unwrap();
        assert_eq!(state.kv_usage, Some(1.0));
    }
}
