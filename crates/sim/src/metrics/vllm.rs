//! vLLM V1's `/metrics`: names, HELP texts and bucket bounds from
//! `vllm/v1/metrics/loggers.py`, layout from real v0.26 scrapes
//! (`crates/signals/testdata/metrics/vllm-v1-*.prom`): labels sorted by key,
//! `engine` and `model_name` on every engine series, counters written as a
//! `_total` family followed by a `_created` gauge family, numbers spelled by
//! Python's `prometheus_client`.

use super::format::{prometheus_client, python_repr};
use super::histogram::Histogram;
use super::requests::{FinishKind, LatencyBuckets};
use super::scrape::{Scrape, kv_capacity_tokens};
use super::text::{HistogramOrder, TextWriter};

const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const INTER_TOKEN_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const REQUEST_LATENCY_BUCKETS: [f64; 21] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

pub(super) fn latency_buckets() -> LatencyBuckets {
    LatencyBuckets {
        time_to_first_token: TTFT_BUCKETS.to_vec(),
        inter_token: INTER_TOKEN_BUCKETS.to_vec(),
        end_to_end: REQUEST_LATENCY_BUCKETS.to_vec(),
    }
}

/// At most this many old `lora_requests_info` series are kept (see below).
const MAX_LORA_SERIES: usize = 64;

/// vLLM sets `vllm:lora_requests_info{max_lora,running_lora_adapters,
/// waiting_lora_adapters}` to the current time with the *current* adapter
/// lists as labels, and `prometheus_client` never forgets a label set: every
/// combination seen keeps its last timestamp, and a scraper must take the
/// series with the largest value. The simulator reproduces that (bounded to
/// the most recent [`MAX_LORA_SERIES`] combinations).
#[derive(Debug, Default)]
pub(super) struct LoraInfoSeries {
    /// (max_lora, running, waiting) → last time it was current.
    series: Vec<([String; 3], f64)>,
}

impl LoraInfoSeries {
    fn touch(&mut self, labels: [String; 3], now: f64) {
        match self.series.iter_mut().find(|(l, _)| *l == labels) {
            Some((_, at)) => *at = now,
            None => {
                if self.series.len() == MAX_LORA_SERIES {
                    let oldest = (0..self.series.len())
                        .min_by(|&a, &b| self.series[a].1.total_cmp(&self.series[b].1))
                        .expect("series is full, so not empty");
                    self.series.remove(oldest);
                }
                self.series.push((labels, now));
            }
        }
    }
}

pub(super) fn render(scrape: &Scrape<'_>, lora_series: &mut LoraInfoSeries) -> String {
    let stats = scrape.stats;
    let requests = scrape.requests;
    let model = scrape.identity.model_name.as_str();
    let labels = [("engine", "0"), ("model_name", model)];
    let mut w = Vllm {
        w: TextWriter::new(prometheus_client),
        created: scrape.identity.started_unix,
    };

    w.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &labels,
        stats.running as f64,
    );
    w.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &labels,
        stats.waiting as f64,
    );
    w.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &labels,
        stats.kv_usage,
    );
    w.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &labels,
        stats.prefix_cache_queries as f64,
    );
    w.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &labels,
        stats.prefix_cache_hits as f64,
    );
    w.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &labels,
        stats.preemptions_total as f64,
    );
    w.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &labels,
        stats.prompt_tokens_total as f64,
    );
    w.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &labels,
        stats.generation_tokens_total as f64,
    );

    let help = "Count of successfully processed requests.";
    w.w.header("vllm:request_success_total", help, "counter");
    for kind in FinishKind::ALL {
        let labels = [
            ("engine", "0"),
            ("finished_reason", kind.as_str()),
            ("model_name", model),
        ];
        w.w.sample(
            "vllm:request_success_total",
            &labels,
            requests.finished(kind) as f64,
        );
    }
    w.w.header("vllm:request_success_created", help, "gauge");
    for kind in FinishKind::ALL {
        let labels = [
            ("engine", "0"),
            ("finished_reason", kind.as_str()),
            ("model_name", model),
        ];
        w.w.sample("vllm:request_success_created", &labels, w.created);
    }

    w.histogram(
        "vllm:request_prompt_tokens",
        "Number of prefill tokens processed.",
        &labels,
        &requests.request_prompt_tokens,
    );
    w.histogram(
        "vllm:request_generation_tokens",
        "Number of generation tokens processed.",
        &labels,
        &requests.request_generation_tokens,
    );
    w.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &labels,
        &requests.time_to_first_token,
    );
    w.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &labels,
        &requests.inter_token_latency,
    );
    // The deprecated name still ships (same observations). The missing space
    // in the HELP text is vLLM's.
    w.histogram(
        "vllm:time_per_output_token_seconds",
        "Histogram of time per output token in seconds.\
         DEPRECATED: Use vllm:inter_token_latency_seconds instead.",
        &labels,
        &requests.inter_token_latency,
    );
    w.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &labels,
        &requests.end_to_end_latency,
    );

    lora_series.touch(
        [
            stats.max_loras.to_string(),
            stats.running_adapters.join(","),
            stats.waiting_adapters.join(","),
        ],
        scrape.now_unix,
    );
    w.w.header(
        "vllm:lora_requests_info",
        "Running stats on lora requests.",
        "gauge",
    );
    for ([max_lora, running, waiting], at) in &lora_series.series {
        let labels = [
            ("max_lora", max_lora.as_str()),
            ("running_lora_adapters", running.as_str()),
            ("waiting_lora_adapters", waiting.as_str()),
        ];
        w.w.sample("vllm:lora_requests_info", &labels, *at);
    }

    let identity = scrape.identity;
    let capacity = kv_capacity_tokens(stats);
    let block_size = stats.block_size.to_string();
    let num_gpu_blocks = stats.num_gpu_blocks.to_string();
    let kv_cache_size_tokens = capacity.to_string();
    let max_concurrency = python_repr(capacity as f64 / f64::from(identity.max_model_len.max(1)));
    let gpu_memory_utilization = python_repr(identity.gpu_memory_utilization);
    let prefix_caching = if identity.enable_prefix_caching {
        "True"
    } else {
        "False"
    };
    // vLLM's CacheConfig.metrics_info(): every field as a label, sorted.
    let cache_labels = [
        ("_block_size_resolved", "True"),
        ("block_size", block_size.as_str()),
        ("cache_dtype", "auto"),
        ("calculate_kv_scales", "False"),
        ("enable_prefix_caching", prefix_caching),
        ("engine", "0"),
        ("gpu_memory_utilization", gpu_memory_utilization.as_str()),
        ("is_attention_free", "False"),
        ("kv_cache_dtype_skip_layers", "[]"),
        ("kv_cache_max_concurrency", max_concurrency.as_str()),
        ("kv_cache_memory_bytes", "None"),
        ("kv_cache_size_tokens", kv_cache_size_tokens.as_str()),
        ("kv_offloading_backend", "native"),
        ("kv_offloading_size", "None"),
        ("kv_sharing_fast_prefill", "False"),
        ("mamba_block_size", "None"),
        ("mamba_cache_dtype", "auto"),
        ("mamba_cache_mode", "none"),
        ("mamba_page_size_padded", "None"),
        ("mamba_ssm_cache_dtype", "auto"),
        ("num_cpu_blocks", "None"),
        ("num_gpu_blocks", num_gpu_blocks.as_str()),
        ("num_gpu_blocks_override", "None"),
        ("prefix_caching_hash_algo", "sha256"),
        ("prefix_match_unit", "None"),
        ("skip_page_size_padded", "None"),
        ("sliding_window", "None"),
        ("user_specified_block_size", "False"),
        ("user_specified_mamba_block_size", "False"),
    ];
    w.gauge(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &cache_labels,
        1.0,
    );
    w.w.finish()
}

/// The writer plus vLLM's conventions for counters and histograms.
struct Vllm {
    w: TextWriter,
    /// Value of every `_created` series: when the replica started.
    created: f64,
}

impl Vllm {
    fn gauge(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.w.header(name, help, "gauge");
        self.w.sample(name, labels, value);
    }

    /// `name_total` as a counter family, then `name_created` as a gauge family.
    fn counter(&mut self, name: &str, help: &str, labels: &[(&str, &str)], value: f64) {
        self.gauge_like(&format!("{name}_total"), help, "counter", labels, value);
        let created = self.created;
        self.gauge_like(&format!("{name}_created"), help, "gauge", labels, created);
    }

    fn histogram(&mut self, name: &str, help: &str, labels: &[(&str, &str)], h: &Histogram) {
        self.w.header(name, help, "histogram");
        self.w.histogram(
            name,
            labels,
            h,
            HistogramOrder::BucketsCountSum,
            prometheus_client,
        );
        let created = self.created;
        self.gauge_like(&format!("{name}_created"), help, "gauge", labels, created);
    }

    fn gauge_like(&mut self, name: &str, help: &str, kind: &str, labels: &[(&str, &str)], v: f64) {
        self.w.header(name, help, kind);
        self.w.sample(name, labels, v);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{Dialect, Exporter};
    use super::*;

    fn render_once() -> String {
        let mut exporter = Exporter::new(Dialect::Vllm, identity());
        exporter.render(&stats(), &requests(Dialect::Vllm), 1_785_967_000.25)
    }

    #[test]
    fn gauges_and_counters_carry_engine_and_model_labels() {
        let text = render_once();
        let m = r#"engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct""#;
        for line in [
            format!("vllm:num_requests_running{{{m}}} 5.0"),
            format!("vllm:num_requests_waiting{{{m}}} 3.0"),
            format!("vllm:kv_cache_usage_perc{{{m}}} 0.25"),
            format!("vllm:prefix_cache_queries_total{{{m}}} 400.0"),
            format!("vllm:prefix_cache_hits_total{{{m}}} 100.0"),
            format!("vllm:num_preemptions_total{{{m}}} 2.0"),
            format!("vllm:prompt_tokens_total{{{m}}} 1234.0"),
            format!("vllm:generation_tokens_total{{{m}}} 567.0"),
            format!("vllm:prompt_tokens_created{{{m}}} 1.7859669525e+09"),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.contains("# TYPE vllm:prefix_cache_hits_total counter\n"));
        assert!(text.contains("# TYPE vllm:prefix_cache_hits_created gauge\n"));
    }

    #[test]
    fn request_success_is_split_by_finished_reason() {
        let text = render_once();
        let line = |reason: &str, v: &str| {
            format!(
                r#"vllm:request_success_total{{engine="0",finished_reason="{reason}",model_name="meta-llama/Llama-3.1-8B-Instruct"}} {v}"#
            )
        };
        for want in [
            line("stop", "0.0"),
            line("length", "1.0"),
            line("abort", "1.0"),
        ] {
            assert!(text.contains(&want), "missing {want}");
        }
    }

    #[test]
    fn histograms_use_vllm_buckets() {
        let text = render_once();
        let ttft: Vec<_> = samples(&text)
            .into_iter()
            .filter(|(n, _, _)| n == "vllm:time_to_first_token_seconds_bucket")
            .collect();
        assert_eq!(ttft.len(), TTFT_BUCKETS.len() + 1);
        assert!(ttft[0].1.contains(r#"le="0.001""#));
        assert!(ttft[11].1.contains(r#"le="1.0""#));
        assert!(ttft.last().unwrap().1.contains(r#"le="+Inf""#));
        // One TTFT of 0.05 s: in the 0.06 bucket, not in 0.04.
        assert_eq!(ttft[4].2, "0.0");
        assert_eq!(ttft[5].2, "1.0");
        assert_eq!(
            value_of(&text, "vllm:time_to_first_token_seconds_count"),
            "1.0"
        );
        assert_eq!(
            value_of(&text, "vllm:inter_token_latency_seconds_count"),
            "1.0"
        );
        assert_eq!(
            value_of(&text, "vllm:time_per_output_token_seconds_count"),
            "1.0"
        );
        assert_eq!(
            value_of(&text, "vllm:e2e_request_latency_seconds_count"),
            "2.0"
        );
        assert!(text.contains(r#"vllm:request_prompt_tokens_bucket{engine="0",le="5000.0","#));
    }

    #[test]
    fn cache_config_info_reports_blocks() {
        let text = render_once();
        let line = text
            .lines()
            .find(|l| l.starts_with("vllm:cache_config_info{"))
            .unwrap();
        assert!(line.contains(r#"block_size="16""#));
        assert!(line.contains(r#"num_gpu_blocks="1000""#));
        assert!(line.contains(r#"kv_cache_size_tokens="16000""#));
        assert!(line.contains(r#"gpu_memory_utilization="0.9""#));
        assert!(line.contains(r#"kv_cache_max_concurrency="1.953125""#));
        assert!(line.contains(r#"engine="0""#));
        assert!(line.ends_with("} 1.0"));
    }

    #[test]
    fn lora_info_keeps_old_combinations_with_their_last_timestamp() {
        let mut exporter = Exporter::new(Dialect::Vllm, identity());
        let mut s = stats();
        exporter.render(&s, &requests(Dialect::Vllm), 1000.0);
        s.running_adapters = vec!["sql".into()];
        s.waiting_adapters.clear();
        let text = exporter.render(&s, &requests(Dialect::Vllm), 2000.0);
        let lora: Vec<_> = text
            .lines()
            .filter(|l| l.starts_with("vllm:lora_requests_info{"))
            .collect();
        assert_eq!(
            lora,
            [
                r#"vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql,chat",waiting_lora_adapters="math"} 1000.0"#,
                r#"vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql",waiting_lora_adapters=""} 2000.0"#,
            ]
        );
    }

    #[test]
    fn lora_series_are_bounded() {
        let mut series = LoraInfoSeries::default();
        for i in 0..(MAX_LORA_SERIES + 10) {
            series.touch([i.to_string(), String::new(), String::new()], i as f64);
        }
        assert_eq!(series.series.len(), MAX_LORA_SERIES);
        assert!(series.series.iter().all(|(_, at)| *at >= 10.0));
    }
}
