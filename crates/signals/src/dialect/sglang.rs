//! SGLang (`sglang:*`).
//!
//! Counts are summed over series: by default only the first tensor-parallel
//! rank of each data-parallel group reports, so each series is a distinct
//! scheduler queue. The KV geometry comes from the separate
//! `sglang:page_size`/`sglang:num_pages` gauges (v0.5.16), from the labels
//! of `sglang:cache_config_info` (v0.5.9), or, failing both, from
//! `sglang:max_total_num_tokens` divided by the page size.

use picker::EngineState;

use super::aggregate::{Largest, Mean, Total};
use super::extractor::Extractor;
use crate::prom::{Metric, Sample, Visitor};

const WAITING: &str = "sglang:num_queue_reqs";
const RUNNING: &str = "sglang:num_running_reqs";
const KV_USAGE: &str = "sglang:token_usage";
const PAGE_SIZE: &str = "sglang:page_size";
const NUM_PAGES: &str = "sglang:num_pages";
const MAX_TOKENS: &str = "sglang:max_total_num_tokens";
const CACHE_CONFIG: &str = "sglang:cache_config_info";

#[derive(Default)]
pub(super) struct Sglang {
    waiting: Total,
    running: Total,
    kv_usage: Mean,
    page_size: Largest,
    num_pages: Total,
    config_page_size: Largest,
    config_num_pages: Total,
    max_tokens: Total,
}

impl<'a> Visitor<'a> for Sglang {
    fn wants(&mut self, metric: &Metric<'a>) -> bool {
        matches!(
            metric.name,
            WAITING | RUNNING | KV_USAGE | PAGE_SIZE | NUM_PAGES | MAX_TOKENS | CACHE_CONFIG
        )
    }

    fn sample(&mut self, sample: Sample<'a>) {
        match sample.name() {
            WAITING => self.waiting.add(sample.value),
            RUNNING => self.running.add(sample.value),
            KV_USAGE => self.kv_usage.add(sample.value),
            PAGE_SIZE => self.page_size.add(sample.value),
            NUM_PAGES => self.num_pages.add(sample.value),
            MAX_TOKENS => self.max_tokens.add(sample.value),
            CACHE_CONFIG => {
                let labels = sample.labels;
                self.config_page_size
                    .add_label(labels.get("page_size").as_deref());
                self.config_num_pages
                    .add_label(labels.get("num_pages").as_deref());
            }
            _ => {}
        }
    }
}

impl Extractor<'_> for Sglang {
    fn finish(self) -> EngineState {
        // The v0.5.16 gauge, else the v0.5.9 label.
        let page_size = if self.page_size.get().is_some() {
            self.page_size
        } else {
            self.config_page_size
        };
        let pages_from_tokens = match (self.max_tokens.get(), page_size.get()) {
            (Some(tokens), Some(page)) if page >= 1.0 => Some((tokens / page).floor() as u64),
            _ => None,
        };
        EngineState {
            waiting: self.waiting.count(),
            running: self.running.count(),
            kv_usage: self.kv_usage.fraction(),
            block_size: page_size.as_u32(),
            kv_capacity_blocks: self
                .num_pages
                .count()
                .or(self.config_num_pages.count())
                .or(pages_from_tokens),
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
    fn v0_5_16_page_gauges() {
        let text = fixture("sglang-new.prom");
        let expected = EngineState {
            waiting: Some(0),
            running: None,
            kv_usage: Some(0.0),
            block_size: Some(1),
            kv_capacity_blocks: Some(200_000),
            ..EngineState::default()
        };
        assert_eq!(Dialect::Sglang.extract(&text), Ok(expected));
    }

    #[test]
    fn v0_5_9_cache_config_labels() {
        let text = fixture("sglang-old.prom");
        let expected = EngineState {
            waiting: Some(0),
            running: None,
            kv_usage: Some(0.0),
            block_size: Some(1),
            kv_capacity_blocks: Some(200_000),
            ..EngineState::default()
        };
        assert_eq!(Dialect::Sglang.extract(&text), Ok(expected));
    }

    #[test]
    fn documentation_example_under_load() {
        let text = fixture("sglang-docs-legacy.prom");
        let expected = EngineState {
            waiting: Some(2826),
            running: Some(162),
            kv_usage: Some(0.28),
            ..EngineState::default()
        };
        assert_eq!(Dialect::Sglang.extract(&text), Ok(expected));
    }

    #[test]
    fn capacity_from_max_tokens_when_pages_are_not_reported() {
        // Hand-written: a page size without a page count.
        let text = "sglang:page_size 16.0\nsglang:max_total_num_tokens 100000.0\n";
        let state = Dialect::Sglang.extract(text).unwrap();
        assert_eq!(state.block_size, Some(16));
        assert_eq!(state.kv_capacity_blocks, Some(6250));
    }

    #[test]
    fn capacity_needs_a_page_size() {
        let text = "sglang:max_total_num_tokens 100000.0\n";
        let state = Dialect::Sglang.extract(text).unwrap();
        assert_eq!(state.block_size, None);
        assert_eq!(state.kv_capacity_blocks, None);
    }
}
