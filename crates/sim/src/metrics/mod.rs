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
mod scrape;
mod sglang;
mod text;
mod tgi;
mod vllm;

use crate::engine::EngineStats;

pub use histogram::Histogram;
pub use requests::{FinishKind, FinishedTokens, LatencyBuckets, RequestTotals, RequestTracker};
pub use scrape::{ReplicaIdentity, Scrape};
pub use signals::Dialect;

/// The dialects `/metrics` can speak. The gateway reads more (TensorRT-LLM,
/// Triton, none); the simulator renders these.
pub const DIALECTS: [Dialect; 4] = [
    Dialect::Vllm,
    Dialect::Sglang,
    Dialect::Tgi,
    Dialect::Llamacpp,
];

/// Whether the simulator can render `dialect`.
pub fn renders(dialect: Dialect) -> bool {
    DIALECTS.contains(&dialect)
}

/// A dialect the simulator renders, by name in any case.
pub fn parse_dialect(name: &str) -> Result<Dialect, String> {
    DIALECTS
        .into_iter()
        .find(|d| d.as_str().eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            format!("unknown metrics dialect {name:?} (expected vllm, sglang, tgi or llamacpp)")
        })
}

/// Bucket bounds of an engine's latency histograms. Dialects the
/// simulator does not render get vLLM's: nothing renders them.
pub fn latency_buckets(dialect: Dialect) -> LatencyBuckets {
    match dialect {
        Dialect::Vllm | Dialect::Llamacpp => vllm::latency_buckets(),
        Dialect::Sglang => sglang::latency_buckets(),
        Dialect::Tgi => tgi::latency_buckets(),
        Dialect::Trtllm | Dialect::Triton | Dialect::None => vllm::latency_buckets(),
    }
}

/// The `Content-Type` an engine serves `/metrics` with. Dialects the
/// simulator does not render get the plain exposition type.
pub fn content_type(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Vllm | Dialect::Sglang => "text/plain; version=0.0.4; charset=utf-8",
        Dialect::Tgi | Dialect::Llamacpp => "text/plain; version=0.0.4",
        Dialect::Trtllm | Dialect::Triton | Dialect::None => "text/plain; version=0.0.4",
    }
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
    /// # Panics
    ///
    /// When the simulator does not render `dialect` ([`renders`]); a
    /// replica spec with such a dialect is refused before this.
    pub fn new(dialect: Dialect, identity: ReplicaIdentity) -> Self {
        assert!(
            renders(dialect),
            "the simulator does not render the {dialect} metrics dialect"
        );
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
            Dialect::Trtllm | Dialect::Triton | Dialect::None => {
                unreachable!("Exporter::new refuses dialects the simulator does not render")
            }
        }
    }
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
        let mut tracker = RequestTracker::new(latency_buckets(dialect), 8192);
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
        assert_eq!(parse_dialect("SGLang"), Ok(Dialect::Sglang));
        assert!(parse_dialect("triton").is_err());
        for d in DIALECTS {
            assert_eq!(parse_dialect(&d.to_string()), Ok(d));
        }
    }

    #[test]
    fn renders_only_its_own_dialects() {
        assert!(DIALECTS.into_iter().all(renders));
        for d in [Dialect::Trtllm, Dialect::Triton, Dialect::None] {
            assert!(!renders(d), "{d}");
        }
    }

    #[test]
    fn every_dialect_renders_well_formed_text() {
        for dialect in DIALECTS {
            let mut exporter = Exporter::new(dialect, identity());
            let text = exporter.render(&stats(), &requests(dialect), 1_785_967_000.0);
            assert_well_formed(&text);
            assert!(text.ends_with('\n'), "{dialect}");
        }
    }
}
