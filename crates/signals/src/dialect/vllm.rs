//! vLLM (`vllm:*`).
//!
//! Counts are summed over series: a data-parallel replica reports one
//! series per engine (`engine="0"`, `engine="1"`, ...) and may serve
//! several `model_name`s. `vllm:lora_requests_info` is different: vLLM
//! keeps one series per adapter configuration it has seen, valued with the
//! wall-clock time it was last set, so the series with the greatest value
//! is the current one.

use picker::EngineState;

use super::aggregate::{Largest, Mean, Total, parse_label_number, split_list};
use super::extractor::Extractor;
use crate::prom::{Labels, Metric, Sample, Visitor};

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// The V0 engine's name for [`KV_USAGE`], still a 0..1 fraction.
const KV_USAGE_V0: &str = "vllm:gpu_cache_usage_perc";
const CACHE_CONFIG: &str = "vllm:cache_config_info";
const LORA: &str = "vllm:lora_requests_info";

#[derive(Default)]
pub(super) struct Vllm<'a> {
    waiting: Total,
    running: Total,
    kv_usage: Mean,
    kv_usage_v0: Mean,
    block_size: Largest,
    gpu_blocks: Total,
    /// The lora series with the greatest timestamp so far.
    lora: Option<(f64, Labels<'a>)>,
}

impl<'a> Visitor<'a> for Vllm<'a> {
    fn wants(&mut self, metric: &Metric<'a>) -> bool {
        matches!(
            metric.name,
            WAITING | RUNNING | KV_USAGE | KV_USAGE_V0 | CACHE_CONFIG | LORA
        )
    }

    fn sample(&mut self, sample: Sample<'a>) {
        match sample.name() {
            WAITING => self.waiting.add(sample.value),
            RUNNING => self.running.add(sample.value),
            KV_USAGE => self.kv_usage.add(sample.value),
            KV_USAGE_V0 => self.kv_usage_v0.add(sample.value),
            CACHE_CONFIG => {
                let labels = sample.labels;
                self.block_size
                    .add_label(labels.get("block_size").as_deref());
                self.gpu_blocks
                    .add_label(labels.get("num_gpu_blocks").as_deref());
            }
            LORA => {
                let newer = match self.lora {
                    Some((latest, _)) => sample.value > latest,
                    None => !sample.value.is_nan(),
                };
                if newer {
                    self.lora = Some((sample.value, sample.labels));
                }
            }
            _ => {}
        }
    }
}

impl<'a> Extractor<'a> for Vllm<'a> {
    fn finish(self) -> EngineState {
        let mut state = EngineState {
            waiting: self.waiting.count(),
            running: self.running.count(),
            kv_usage: self.kv_usage.fraction().or(self.kv_usage_v0.fraction()),
            block_size: self.block_size.as_u32(),
            kv_capacity_blocks: self.gpu_blocks.count(),
            ..EngineState::default()
        };
        if let Some((_, labels)) = self.lora {
            let list = |name| labels.get(name).map(|v| split_list(&v)).unwrap_or_default();
            state.resident_adapters = list("running_lora_adapters");
            state.waiting_adapters = list("waiting_lora_adapters");
            state.max_adapters = labels
                .get("max_lora")
                .as_deref()
                .and_then(parse_label_number)
                .filter(|n| *n >= 0.0 && *n <= f64::from(u32::MAX))
                .map(|n| n as u32);
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::Dialect;
    use crate::dialect::test_support::fixture;

    /// All three v0.26.0 captures of llm-d-router: idle, no running gauge,
    /// no LoRA, `block_size="16"`, `num_gpu_blocks="74272"`.
    fn idle_v1() -> EngineState {
        EngineState {
            waiting: Some(0),
            running: None,
            kv_usage: Some(0.0),
            block_size: Some(16),
            kv_capacity_blocks: Some(74272),
            ..EngineState::default()
        }
    }

    #[test]
    fn v1_no_offload() {
        let text = fixture("vllm-v1-llmd-none.prom");
        assert_eq!(Dialect::Vllm.extract(&text), Ok(idle_v1()));
    }

    #[test]
    fn v1_offload_flag() {
        let text = fixture("vllm-v1-llmd-flag.prom");
        assert_eq!(Dialect::Vllm.extract(&text), Ok(idle_v1()));
    }

    #[test]
    fn v1_offload_connector() {
        let text = fixture("vllm-v1-llmd-conn.prom");
        assert_eq!(Dialect::Vllm.extract(&text), Ok(idle_v1()));
    }

    // The real captures are idle and have no running gauge or LoRA series,
    // so the following use hand-written text in vLLM's shapes. The LoRA
    // label shapes are the ones quoted in testdata/metrics/SOURCES.md.

    #[test]
    fn counts_sum_over_engines_and_usage_averages() {
        let text = r#"
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 4.0
vllm:num_requests_running{engine="0",model_name="m"} 10.0
vllm:num_requests_running{engine="1",model_name="m"} 6.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:cache_config_info{block_size="32",engine="0",num_gpu_blocks="1000"} 1.0
vllm:cache_config_info{block_size="32",engine="1",num_gpu_blocks="1000"} 1.0
"#;
        let state = Dialect::Vllm.extract(text).unwrap();
        assert_eq!(state.waiting, Some(7));
        assert_eq!(state.running, Some(16));
        assert_eq!(state.kv_usage, Some(0.375));
        assert_eq!(state.block_size, Some(32));
        assert_eq!(state.kv_capacity_blocks, Some(2000));
    }

    #[test]
    fn v0_cache_usage_is_the_fallback_only() {
        let v0 = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.8\n";
        assert_eq!(Dialect::Vllm.extract(v0).unwrap().kv_usage, Some(0.8));
        let both = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.8\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.1\n";
        assert_eq!(Dialect::Vllm.extract(both).unwrap().kv_usage, Some(0.1));
    }

    #[test]
    fn latest_lora_series_wins() {
        let text = r#"
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7886264446318772e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="adapter_ko,sql-lora",waiting_lora_adapters="adapter_fr"} 1.7886264546318772e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="adapter_ko",waiting_lora_adapters="adapter_ko"} 1.7886264500000000e+09
"#;
        let state = Dialect::Vllm.extract(text).unwrap();
        assert_eq!(state.resident_adapters, ["adapter_ko", "sql-lora"]);
        assert_eq!(state.waiting_adapters, ["adapter_fr"]);
        assert_eq!(state.max_adapters, Some(2));
    }

    #[test]
    fn lora_enabled_with_nothing_loaded() {
        let text = "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.0\n";
        let state = Dialect::Vllm.extract(text).unwrap();
        assert!(state.resident_adapters.is_empty());
        assert!(state.waiting_adapters.is_empty());
        assert_eq!(state.max_adapters, Some(0));
    }

    #[test]
    fn unknown_block_counts_stay_unknown() {
        let text = "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1.0\n";
        let state = Dialect::Vllm.extract(text).unwrap();
        assert_eq!(state.block_size, Some(16));
        assert_eq!(state.kv_capacity_blocks, None);
    }
}
