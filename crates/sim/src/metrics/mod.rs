//! `/metrics` in the text exposition format, rendered by hand in the exact
//! names, labels, units and number spelling of real engines, so a gateway's
//! scraper meets the simulator as it would meet vLLM, SGLang, TGI or
//! llama.cpp.
//!
//! Written by hand rather than with a metrics library because the point is to
//! reproduce other exporters' quirks (Python float spelling, `_created`
//! series, line order), which a library would normalise away.
//!
//! Latency histograms hold **engine seconds** (see [`RequestTracker`]): with
//! `--time-scale 50` a request that took 20 ms of wall time shows as 1 s, the
//! time the simulated GPU would have taken.

mod format;
mod histogram;
mod llamacpp;
mod requests;
mod sglang;
mod text;
mod tgi;
mod vllm;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::engine::EngineStats;

pub use histogram::Histogram;
pub use requests::{FinishKind, FinishedTokens, LatencyBuckets, RequestTotals, RequestTracker};

/// Which engine's metric names `/metrics` speaks.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// vLLM V1 (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, ...).
    #[default]
    Vllm,
    /// SGLang (`sglang:num_running_reqs`, `sglang:token_usage`, ...).
    Sglang,
    /// Hugging Face TGI (`tgi_queue_size`, `tgi_batch_current_size`, ...).
    Tgi,
    /// llama.cpp server (`llamacpp:requests_processing`, ...).
    Llamacpp,
}

impl Dialect {
    pub const ALL: [Dialect; 4] = [
        Dialect::Vllm,
        Dialect::Sglang,
        Dialect::Tgi,
        Dialect::Llamacpp,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Vllm => "vllm",
            Dialect::Sglang => "sglang",
            Dialect::Tgi => "tgi",
            Dialect::Llamacpp => "llamacpp",
        }
    }

    /// Bucket bounds of this engine's latency histograms.
    pub fn latency_buckets(self) -> LatencyBuckets {
        match self {
            Dialect::Vllm | Dialect::Llamacpp => vllm::latency_buckets(),
            Dialect::Sglang => sglang::latency_buckets(),
            Dialect::Tgi => tgi::latency_buckets(),
        }
    }

    /// The `Content-Type` this engine serves `/metrics` with.
    pub fn content_type(self) -> &'static str {
        match self {
            Dialect::Vllm | Dialect::Sglang => "text/plain; version=0.0.4; charset=utf-8",
            Dialect::Tgi | Dialect::Llamacpp => "text/plain; version=0.0.4",
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Dialect {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Dialect::ALL
            .into_iter()
            .find(|d| d.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown metrics dialect {s:?} (expected vllm, sglang, tgi or llamacpp)")
            })
    }
}

/// What does not change while a replica runs: labels and configuration
/// values that appear in `/metrics`.
#[derive(Debug, Clone)]
pub struct ReplicaIdentity {
    /// The served model name (the `model_name` label).
    pub model_name: String,
    pub max_model_len: u32,
    pub gpu_memory_utilization: f64,
    pub enable_prefix_caching: bool,
    /// Unix time the replica started (the `_created` series).
    pub started_unix: f64,
}

/// One scrape's inputs.
pub struct Scrape<'a> {
    pub identity: &'a ReplicaIdentity,
    pub stats: &'a EngineStats,
    pub requests: &'a RequestTotals,
    /// Wall-clock unix time of the scrape (vLLM's `lora_requests_info` value).
    pub now_unix: f64,
}

/// Renders `/metrics` for one replica. Keeps the little state a real
/// exporter keeps between scrapes (vLLM's old `lora_requests_info` series).
#[derive(Debug)]
pub struct Exporter {
    dialect: Dialect,
    identity: ReplicaIdentity,
    lora_series: vllm::LoraInfoSeries,
}

impl Exporter {
    pub fn new(dialect: Dialect, identity: ReplicaIdentity) -> Self {
        Self {
            dialect,
            identity,
            lora_series: vllm::LoraInfoSeries::default(),
        }
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub fn identity(&self) -> &ReplicaIdentity {
        &self.identity
    }

    pub fn render(
        &mut self,
        stats: &EngineStats,
        requests: &RequestTotals,
        now_unix: f64,
    ) -> String {
        let scrape = Scrape {
            identity: &self.identity,
            stats,
            requests,
            now_unix,
        };
        match self.dialect {
            Dialect::Vllm => vllm::render(&scrape, &mut self.lora_series),
            Dialect::Sglang => sglang::render(&scrape),
            Dialect::Tgi => tgi::render(&scrape),
            Dialect::Llamacpp => llamacpp::render(&scrape),
        }
    }
}

/// Cumulative prefix-cache hit rate in [0, 1] (0 before any query).
fn prefix_hit_rate(stats: &EngineStats) -> f64 {
    if stats.prefix_cache_queries == 0 {
        0.0
    } else {
        stats.prefix_cache_hits as f64 / stats.prefix_cache_queries as f64
    }
}

/// KV-cache capacity in tokens.
fn kv_capacity_tokens(stats: &EngineStats) -> u64 {
    stats.num_gpu_blocks * u64::from(stats.block_size)
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::*;

    pub fn identity() -> ReplicaIdentity {
        ReplicaIdentity {
            model_name: "meta-llama/Llama-3.1-8B-Instruct".into(),
            max_model_len: 8192,
            gpu_memory_utilization: 0.9,
            enable_prefix_caching: true,
            started_unix: 1_785_966_952.5,
        }
    }

    pub fn stats() -> EngineStats {
        EngineStats {
            waiting: 3,
            running: 5,
            kv_usage: 0.25,
            num_gpu_blocks: 1000,
            block_size: 16,
            running_adapters: vec!["sql".into(), "chat".into()],
            waiting_adapters: vec!["math".into()],
            max_loras: 2,
            prefix_cache_queries: 400,
            prefix_cache_hits: 100,
            prompt_tokens_total: 1234,
            generation_tokens_total: 567,
            preemptions_total: 2,
            requests_finished_total: 9,
        }
    }

    pub fn requests(dialect: Dialect) -> RequestTotals {
        let mut tracker = RequestTracker::new(dialect.latency_buckets(), 8192);
        tracker.on_submit(1, 0.0, true);
        tracker.on_first_token(1, 0.05);
        tracker.on_token(1, 0.07);
        let tokens = FinishedTokens {
            prompt: 100,
            completion: 2,
            cached: 48,
        };
        tracker.on_finished(1, 0.07, tokens, false);
        tracker.on_submit(2, 1.0, false);
        tracker.on_finished(2, 1.5, FinishedTokens::default(), true);
        tracker.totals().clone()
    }

    /// Sample lines as (name, sorted-labels text, value text).
    pub fn samples(text: &str) -> Vec<(String, String, String)> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("sample has a value");
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, rest.trim_end_matches('}')),
                    None => (series, ""),
                };
                (name.to_owned(), labels.to_owned(), value.to_owned())
            })
            .collect()
    }

    pub fn value_of(text: &str, name: &str) -> String {
        samples(text)
            .into_iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("{name} missing in:\n{text}"))
            .2
    }

    /// Every sample's family has HELP and TYPE lines before it.
    pub fn assert_well_formed(text: &str) {
        let mut typed = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                typed.insert(rest.split(' ').next().unwrap().to_owned());
            }
        }
        for (name, _, value) in samples(text) {
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| typed.contains(*f)))
                .unwrap_or(&name);
            assert!(typed.contains(family), "{name} has no TYPE line");
            let parsed = match value.as_str() {
                "+Inf" => Some(f64::INFINITY),
                v => v.parse::<f64>().ok(),
            };
            assert!(parsed.is_some(), "{name} has unparsable value {value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn dialect_parses_case_insensitively() {
        assert_eq!("SGLang".parse::<Dialect>(), Ok(Dialect::Sglang));
        assert!("triton".parse::<Dialect>().is_err());
        for d in Dialect::ALL {
            assert_eq!(d.to_string().parse::<Dialect>(), Ok(d));
        }
    }

    #[test]
    fn every_dialect_renders_well_formed_text() {
        for dialect in Dialect::ALL {
            let mut exporter = Exporter::new(dialect, identity());
            let text = exporter.render(&stats(), &requests(dialect), 1_785_967_000.0);
            assert_well_formed(&text);
            assert!(text.ends_with('\n'), "{dialect}");
        }
    }
}
