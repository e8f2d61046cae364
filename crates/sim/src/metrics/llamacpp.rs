//! llama.cpp server's `/metrics` (`--metrics`): names and HELP texts from a
//! real b11434 scrape (`llamacpp-b11434-*.prom`): no labels, numbers written by
//! a C++ `ostream` (`%g`), one HELP/TYPE pair per metric.
//!
//! The b11434 build no longer exports KV-cache usage; older builds exported
//! `llamacpp:kv_cache_usage_ratio` and `llamacpp:kv_cache_tokens`, and the
//! simulator keeps them so gateways written for those builds have a KV
//! signal. Throughput gauges are cumulative averages here (llama.cpp averages
//! over the interval since the previous scrape).

use super::format::ostream_double;
use super::scrape::{Scrape, kv_capacity_tokens};
use super::text::TextWriter;

pub(super) fn render(scrape: &Scrape<'_>) -> String {
    let stats = scrape.stats;
    let r = scrape.requests;
    let uncached_prompt = r.prompt_tokens.saturating_sub(r.cached_prompt_tokens);
    let per_second = |tokens: u64, seconds: f64| {
        if seconds > 0.0 {
            tokens as f64 / seconds
        } else {
            0.0
        }
    };
    let busy_per_decode = if r.decode_steps > 0 {
        r.step_tokens as f64 / r.decode_steps as f64
    } else {
        0.0
    };
    let kv_tokens = (stats.kv_usage * kv_capacity_tokens(stats) as f64).round();

    let metrics: [(&str, &str, &str, f64); 17] = [
        (
            "prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed, excluding cached tokens",
            uncached_prompt as f64,
        ),
        (
            "prompt_tokens_cached_total",
            "counter",
            "Number of prompt tokens reused from the cache",
            r.cached_prompt_tokens as f64,
        ),
        (
            "prompt_seconds_total",
            "counter",
            "Total time spent processing prompts",
            r.prefill_seconds,
        ),
        (
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed",
            r.generation_tokens as f64,
        ),
        (
            "tokens_predicted_seconds_total",
            "counter",
            "Total time spent generating tokens",
            r.decode_seconds,
        ),
        (
            "n_decode_total",
            "counter",
            "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
            r.decode_steps as f64,
        ),
        (
            "n_tokens_max",
            "counter",
            "Largest observed sequence length (prompt + generation)",
            r.max_sequence_len as f64,
        ),
        (
            "spec_decode_num_draft_tokens_total",
            "counter",
            "Speculative: Total draft tokens generated",
            0.0,
        ),
        (
            "spec_decode_num_accepted_tokens_total",
            "counter",
            "Speculative: Total draft tokens accepted by the target model",
            0.0,
        ),
        (
            "spec_decode_num_drafts_total",
            "counter",
            "Speculative: Total speculative decoding verification steps",
            0.0,
        ),
        (
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s",
            per_second(uncached_prompt, r.prefill_seconds),
        ),
        (
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s",
            per_second(r.generation_tokens, r.decode_seconds),
        ),
        (
            "kv_cache_usage_ratio",
            "gauge",
            "KV-cache usage. 1 means 100 percent usage.",
            stats.kv_usage,
        ),
        ("kv_cache_tokens", "gauge", "KV-cache tokens.", kv_tokens),
        (
            "requests_processing",
            "gauge",
            "Number of requests processing",
            stats.running as f64,
        ),
        (
            "requests_deferred",
            "gauge",
            "Number of requests deferred",
            stats.waiting as f64,
        ),
        (
            "n_busy_slots_per_decode",
            "gauge",
            "Average number of busy slots per llama_decode() call",
            busy_per_decode,
        ),
    ];

    let mut w = TextWriter::new(ostream_double);
    for (name, kind, help, value) in metrics {
        let name = format!("llamacpp:{name}");
        w.header(&name, help, kind);
        w.sample(&name, &[], value);
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{Dialect, Exporter};

    #[test]
    fn processing_and_deferred_map_running_and_waiting() {
        let mut exporter = Exporter::new(Dialect::Llamacpp, identity());
        let text = exporter.render(&stats(), &requests(Dialect::Llamacpp), 0.0);
        assert!(text.contains(
            "# HELP llamacpp:requests_processing Number of requests processing\n\
             # TYPE llamacpp:requests_processing gauge\n\
             llamacpp:requests_processing 5\n"
        ));
        assert!(text.contains("\nllamacpp:requests_deferred 3\n"));
        assert!(text.contains("\nllamacpp:kv_cache_usage_ratio 0.25\n"));
        assert!(text.contains("\nllamacpp:prompt_tokens_total 52\n"));
        assert!(text.contains("\nllamacpp:prompt_tokens_cached_total 48\n"));
        assert!(!text.contains('{'));
    }
}
