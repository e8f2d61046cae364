//! SGLang's `/metrics`: names, HELP texts and buckets from
//! `python/sglang/srt/metrics/collector.py`, layout from real v0.5.16 scrapes
//! (`sglang-new.prom`): scheduler gauges carry `engine_type`, `model_name`,
//! `moe_ep_rank`, `pp_rank`, `tp_rank` (sorted); tokenizer-side counters and
//! histograms carry `model_name` only; histograms are written `_sum`,
//! buckets, `_count` (prometheus_client multiprocess mode, no `_created`).
//!
//! SGLang counts the KV pool in tokens with a page size; the simulator's
//! pages are its KV blocks, so `page_size` is the block size.

use super::format::prometheus_client;
use super::requests::{FinishKind, LatencyBuckets};
use super::scrape::{Scrape, kv_capacity_tokens, prefix_hit_rate};
use super::text::{HistogramOrder, TextWriter};

pub(super) fn latency_buckets() -> LatencyBuckets {
    LatencyBuckets {
        time_to_first_token: vec![
            0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
            200.0, 400.0,
        ],
        inter_token: vec![
            0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
            0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
        ],
        end_to_end: vec![
            0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0,
            200.0, 400.0, 600.0, 1200.0, 1800.0, 2400.0,
        ],
    }
}

pub(super) fn render(scrape: &Scrape<'_>) -> String {
    let stats = scrape.stats;
    let requests = scrape.requests;
    let model = scrape.identity.model_name.as_str();
    let scheduler = [
        ("engine_type", "unified"),
        ("model_name", model),
        ("moe_ep_rank", "0"),
        ("pp_rank", "0"),
        ("tp_rank", "0"),
    ];
    let tokenizer = [("model_name", model)];
    let capacity = kv_capacity_tokens(stats);
    let mut w = TextWriter::new(prometheus_client);
    let gauge = |w: &mut TextWriter, name: &str, help: &str, value: f64| {
        w.header(name, help, "gauge");
        w.sample(name, &scheduler, value);
    };

    gauge(
        &mut w,
        "sglang:num_running_reqs",
        "The number of running requests.",
        stats.running as f64,
    );
    gauge(
        &mut w,
        "sglang:num_used_tokens",
        "The number of used tokens.",
        (stats.kv_usage * capacity as f64).round(),
    );
    gauge(
        &mut w,
        "sglang:token_usage",
        "The token usage.",
        stats.kv_usage,
    );
    gauge(
        &mut w,
        "sglang:num_queue_reqs",
        "The number of requests in the waiting queue.",
        stats.waiting as f64,
    );
    gauge(
        &mut w,
        "sglang:cache_hit_rate",
        "The prefix cache hit rate.",
        prefix_hit_rate(stats),
    );
    gauge(
        &mut w,
        "sglang:max_total_num_tokens",
        "Maximum total number of tokens in the KV cache pool.",
        capacity as f64,
    );
    gauge(
        &mut w,
        "sglang:page_size",
        "KV cache page size in tokens.",
        f64::from(stats.block_size),
    );
    gauge(
        &mut w,
        "sglang:num_pages",
        "Number of KV cache pages.",
        stats.num_gpu_blocks as f64,
    );

    let counter = |w: &mut TextWriter, name: &str, help: &str, value: f64| {
        w.header(name, help, "counter");
        w.sample(name, &tokenizer, value);
    };
    counter(
        &mut w,
        "sglang:prompt_tokens_total",
        "Number of prefill tokens processed.",
        stats.prompt_tokens_total as f64,
    );
    counter(
        &mut w,
        "sglang:generation_tokens_total",
        "Number of generation tokens processed.",
        stats.generation_tokens_total as f64,
    );
    counter(
        &mut w,
        "sglang:cached_tokens_total",
        "Number of cached prompt tokens.",
        requests.cached_prompt_tokens as f64,
    );
    counter(
        &mut w,
        "sglang:num_requests_total",
        "Number of requests processed.",
        (requests.succeeded() + requests.finished(FinishKind::Abort)) as f64,
    );
    counter(
        &mut w,
        "sglang:num_aborted_requests_total",
        "Number of requests aborted.",
        requests.finished(FinishKind::Abort) as f64,
    );

    for (name, help, histogram) in [
        (
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &requests.time_to_first_token,
        ),
        (
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &requests.inter_token_latency,
        ),
        (
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            &requests.end_to_end_latency,
        ),
    ] {
        w.header(name, help, "histogram");
        w.histogram(
            name,
            &tokenizer,
            histogram,
            HistogramOrder::SumBucketsCount,
            prometheus_client,
        );
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{Dialect, Exporter};

    #[test]
    fn scheduler_gauges_carry_rank_labels() {
        let mut exporter = Exporter::new(Dialect::Sglang, identity());
        let text = exporter.render(&stats(), &requests(Dialect::Sglang), 0.0);
        let labels = r#"{engine_type="unified",model_name="meta-llama/Llama-3.1-8B-Instruct",moe_ep_rank="0",pp_rank="0",tp_rank="0"}"#;
        for (name, value) in [
            ("sglang:num_running_reqs", "5.0"),
            ("sglang:num_queue_reqs", "3.0"),
            ("sglang:token_usage", "0.25"),
            ("sglang:num_used_tokens", "4000.0"),
            ("sglang:max_total_num_tokens", "16000.0"),
            ("sglang:page_size", "16.0"),
            ("sglang:num_pages", "1000.0"),
            ("sglang:cache_hit_rate", "0.25"),
        ] {
            let line = format!("{name}{labels} {value}");
            assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
        }
        assert!(!text.contains("vllm:"));
    }

    #[test]
    fn histograms_start_with_sum_and_use_sglang_buckets() {
        let mut exporter = Exporter::new(Dialect::Sglang, identity());
        let text = exporter.render(&stats(), &requests(Dialect::Sglang), 0.0);
        let ttft: Vec<_> = text
            .lines()
            .filter(|l| l.starts_with("sglang:time_to_first_token_seconds"))
            .collect();
        assert!(ttft[0].starts_with("sglang:time_to_first_token_seconds_sum{"));
        assert_eq!(
            ttft[1],
            r#"sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0"#
        );
        assert!(
            ttft.last()
                .unwrap()
                .starts_with("sglang:time_to_first_token_seconds_count{")
        );
        assert_eq!(value_of(&text, "sglang:num_aborted_requests_total"), "1.0");
        assert_eq!(value_of(&text, "sglang:cached_tokens_total"), "48.0");
    }
}
