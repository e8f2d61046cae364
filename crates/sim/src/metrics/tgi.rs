//! Hugging Face TGI's `/metrics`: names and HELP texts from the router's
//! `metrics::describe_*` calls (`router/src/server.rs`), written the way Rust's
//! `metrics-exporter-prometheus` writes them: no labels, integer counters,
//! Rust-formatted floats, histogram lines `_bucket`…, `_sum`, `_count`, and a
//! blank line after each family. Duration buckets are TGI's geometric series
//! (0.0001 × 1.5ⁿ, 35 buckets); the token-count histograms use 1-2-5 buckets
//! here (TGI derives its bounds from its token limits).
//!
//! TGI exposes no KV-cache gauge: a gateway sees only queue and batch sizes.

use super::format::rust_display;
use super::requests::LatencyBuckets;
use super::scrape::Scrape;
use super::text::{HistogramOrder, TextWriter};

fn duration_buckets() -> Vec<f64> {
    let mut value = 0.0001;
    (0..35)
        .map(|_| {
            value *= 1.5;
            value
        })
        .collect()
}

pub(super) fn latency_buckets() -> LatencyBuckets {
    LatencyBuckets {
        time_to_first_token: duration_buckets(),
        inter_token: duration_buckets(),
        end_to_end: duration_buckets(),
    }
}

pub(super) fn render(scrape: &Scrape<'_>) -> String {
    let stats = scrape.stats;
    let requests = scrape.requests;
    let mut w = TextWriter::new(rust_display);

    for (name, help, value) in [
        ("tgi_queue_size", "Current queue size", stats.waiting),
        (
            "tgi_batch_current_size",
            "Current batch size",
            stats.running,
        ),
    ] {
        w.header(name, help, "gauge");
        w.sample(name, &[], value as f64);
        w.blank_line();
    }
    for (name, help, value) in [
        (
            "tgi_request_count",
            "Total number of requests",
            requests.requests_received,
        ),
        (
            "tgi_request_success",
            "Number of successful requests",
            requests.succeeded(),
        ),
    ] {
        w.header(name, help, "counter");
        w.raw_sample(name, &[], &value.to_string());
        w.blank_line();
    }
    for (name, help, histogram) in [
        (
            "tgi_request_duration",
            "Total time spent processing the request",
            &requests.end_to_end_latency,
        ),
        (
            "tgi_request_input_length",
            "Input token length per request",
            &requests.request_prompt_tokens,
        ),
        (
            "tgi_request_generated_tokens",
            "Generated tokens per request",
            &requests.request_generation_tokens,
        ),
    ] {
        w.header(name, help, "histogram");
        w.histogram(
            name,
            &[],
            histogram,
            HistogramOrder::BucketsSumCount,
            rust_display,
        );
        w.blank_line();
    }
    w.finish()
}

#[cfg(test)]
mod tests {
    use super::super::test_support::*;
    use super::super::{Dialect, Exporter};
    use super::*;

    #[test]
    fn queue_and_batch_sizes_are_plain_unlabelled_gauges() {
        let mut exporter = Exporter::new(Dialect::Tgi, identity());
        let text = exporter.render(&stats(), &requests(Dialect::Tgi), 0.0);
        assert!(text.starts_with(
            "# HELP tgi_queue_size Current queue size\n# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n\n"
        ));
        assert!(text.contains("\ntgi_batch_current_size 5\n"));
        assert!(text.contains("\ntgi_request_count 2\n"));
        assert!(text.contains("\ntgi_request_success 1\n"));
        assert!(text.contains("\ntgi_request_duration_count 2\n"));
        assert!(!text.contains("model_name"));
    }

    #[test]
    fn duration_buckets_are_geometric() {
        let b = duration_buckets();
        assert_eq!(b.len(), 35);
        assert!((b[0] - 0.00015).abs() < 1e-12);
        assert!(b.windows(2).all(|w| (w[1] / w[0] - 1.5).abs() < 1e-9));
    }
}
