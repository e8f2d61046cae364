//! The summary book: the latest summary every caller shares, so that
//! generation numbers mean the same to every stream, and the outcome
//! samples recent rates are measured against.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use config::defaults::SUMMARY_RATE_WINDOW;
use global::{LoadSummary, ModelLoad};
use parking_lot::Mutex;

use crate::generation::Generation;
use crate::generation::pool::Pool;
use crate::telemetry::outcomes::{OutcomeBook, OutcomeCounts, RouteKey};

/// Rate samples are at least this far apart.
const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The latest summary and what its generation number and rates are
/// measured against.
pub struct SummaryBook {
    book: Mutex<Book>,
}

struct Book {
    generation: u64,
    /// What the last summary said, to see whether the next one differs.
    last: Option<BTreeMap<String, ModelLoad>>,
    /// Outcome counts by (pool, model), oldest first, spanning the rate
    /// window.
    samples: VecDeque<(Instant, Counts)>,
}

/// Every route's outcome counts at one time.
type Counts = HashMap<RouteKey, OutcomeCounts>;

impl Default for SummaryBook {
    fn default() -> Self {
        Self {
            book: Mutex::new(Book {
                generation: 1,
                last: None,
                samples: VecDeque::new(),
            }),
        }
    }
}

impl SummaryBook {
    /// The summary now.
    pub fn current(
        &self,
        generation: &Generation,
        outcomes: &OutcomeBook,
        now: Instant,
        wall: SystemTime,
    ) -> LoadSummary {
        let mut book = self.book.lock();
        let counts: Counts = served(generation)
            .map(|(pool, model)| {
                let key = (pool.name().to_string(), model.to_owned());
                let read = outcomes.read(&key.0, &key.1);
                (key, read)
            })
            .collect();
        let base = book.samples.front().map(|(_, c)| c.clone());
        if book
            .samples
            .back()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= SAMPLE_EVERY)
        {
            book.samples.push_back((now, counts.clone()));
        }
        // Keep one sample at least a window old, none older.
        while book.samples.len() > 1
            && book
                .samples
                .get(1)
                .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= SUMMARY_RATE_WINDOW)
        {
            book.samples.pop_front();
        }

        let mut models = BTreeMap::new();
        let pools: HashMap<&str, PoolFigures> = generation
            .pools
            .iter()
            .map(|p| (&**p.name(), PoolFigures::of(p, now)))
            .collect();
        for (pool, model) in served(generation) {
            let Some(figures) = pools.get(&**pool.name()) else {
                continue;
            };
            let key = (pool.name().to_string(), model.to_owned());
            let recent = counts[&key].since(
                base.as_ref()
                    .and_then(|b| b.get(&key).copied())
                    .unwrap_or_default(),
            );
            let rate = |n: u64| {
                if recent.answered == 0 {
                    0.0
                } else {
                    round(n as f64 / recent.answered as f64, 1e3)
                }
            };
            models.insert(
                model.to_owned(),
                ModelLoad {
                    pool: key.0,
                    ready_replicas: figures.ready,
                    replicas: figures.replicas,
                    kv_headroom: figures.kv_headroom,
                    queue_depth: figures.queue_depth,
                    in_flight: figures.in_flight,
                    saturated: figures.saturated,
                    cold: figures.ready == 0,
                    error_rate: rate(recent.errors),
                    throttle_rate: rate(recent.throttled),
                },
            );
        }
        match &book.last {
            Some(last) if *last == models => {}
            Some(_) => {
                book.generation += 1;
                book.last = Some(models.clone());
            }
            None => book.last = Some(models.clone()),
        }
        LoadSummary {
            generation: book.generation,
            at_unix_ms: wall
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            models,
        }
    }
}

/// Every (pool, model or adapter) of the generation.
fn served(generation: &Generation) -> impl Iterator<Item = (&Arc<Pool>, &str)> {
    generation.applied.spec.pools.iter().flat_map(move |spec| {
        let pool = generation.pools.iter().find(|p| **p.name() == *spec.name);
        spec.models
            .iter()
            .chain(&spec.adapters)
            .filter_map(move |model| Some((pool?, model.as_str())))
    })
}

/// `x` rounded to `1 / scale`: the figures that wobble with every scrape
/// change the summary only when they move by something a router would
/// notice.
fn round(x: f64, scale: f64) -> f64 {
    (x * scale).round() / scale
}

/// One pool's load now.
struct PoolFigures {
    ready: u32,
    replicas: u32,
    kv_headroom: Option<f64>,
    queue_depth: u64,
    in_flight: u64,
    saturated: bool,
}

impl PoolFigures {
    fn of(pool: &Pool, now: Instant) -> PoolFigures {
        let runtime = pool.runtime();
        let cfg = runtime.picker().config();
        let endpoints = runtime.picker().endpoints();
        let (mut ready, mut kv_sum, mut kv_known, mut waiting) = (0u32, 0.0, 0u32, 0u64);
        let (mut in_flight, mut saturated) = (0u64, true);
        for e in endpoints.iter() {
            in_flight += e.load.requests();
            let obs = e.observation();
            let state = obs.state.as_deref();
            waiting += state.and_then(|s| s.waiting).unwrap_or(0);
            // As /readyz, /debug/pools and the ready metrics count it.
            if !picker::is_ready(e, &cfg, now) {
                continue;
            }
            ready += 1;
            let kv = state.and_then(|s| s.kv_usage);
            if let Some(kv) = kv {
                kv_sum += (1.0 - kv).clamp(0.0, 1.0);
                kv_known += 1;
            }
            if !cfg
                .saturation
                .is_saturated(state.and_then(|s| s.waiting), kv)
            {
                saturated = false;
            }
        }
        let queued: u64 = config::Priority::ALL
            .iter()
            .map(|band| runtime.admission().queued(*band).0 as u64)
            .sum();
        PoolFigures {
            ready,
            replicas: endpoints.len() as u32,
            kv_headroom: (kv_known > 0).then(|| round(kv_sum / f64::from(kv_known), 100.0)),
            queue_depth: waiting + queued,
            in_flight,
            saturated,
        }
    }
}
