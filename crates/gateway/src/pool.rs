//! A pool at run time: its replicas, the picker over them, the scrapers
//! that keep their signals fresh, and the client that reaches them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use picker::Endpoint;
use tokio::task::JoinHandle;

use crate::upstream::{self, UpstreamClient};

pub struct PoolRuntime {
    pub name: String,
    pub spec: config::Pool,
    pub picker: picker::Pool,
    pub client: UpstreamClient,
    drain: Mutex<DrainMeter>,
    watchers: Vec<JoinHandle<()>>,
}

impl PoolRuntime {
    /// `addrs` are the replicas: the pool's static endpoints, or the
    /// simulated replicas started for it.
    pub fn new(spec: &config::Pool, addrs: &[String], timeouts: &config::Timeouts) -> Self {
        let endpoints: Vec<Arc<Endpoint>> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Endpoint::new(i, a.clone()))
            .collect();
        Self {
            name: spec.name.clone(),
            picker: picker::Pool::new(endpoints, picker_config(spec)),
            client: upstream::client(spec.protocol, timeouts.connect()),
            drain: Mutex::new(DrainMeter::default()),
            watchers: Vec::new(),
            spec: spec.clone(),
        }
    }

    /// Start one scraper (or reachability probe) per replica. Needs a
    /// Tokio runtime.
    pub fn start_watching(&mut self) {
        let metrics = &self.spec.scheduling.metrics;
        let cfg = signals::ScrapeConfig {
            dialect: self
                .spec
                .engine
                .as_str()
                .parse()
                .expect("config engines and signal dialects have the same names"),
            interval: metrics.interval(),
            timeout: metrics.timeout(),
        };
        let client = signals::ScrapeClient::new();
        self.watchers = self
            .picker
            .endpoints()
            .iter()
            .map(|e| signals::spawn_scraper(Arc::clone(e), cfg.clone(), client.clone(), |_| {}))
            .collect();
    }

    /// Ready when at least one replica can take a request now.
    pub fn is_ready(&self, now: Instant) -> bool {
        self.picker.has_usable(now)
    }

    /// How long a refused client should wait: the pool's queued work over
    /// the rate at which this gateway has seen requests complete.
    pub fn retry_after(&self, now: Instant) -> Duration {
        let endpoints = self.picker.endpoints();
        let completed: u64 = endpoints.iter().map(|e| e.load.completed()).sum();
        let waiting: u64 = endpoints
            .iter()
            .map(|e| {
                e.observation
                    .load()
                    .state
                    .as_ref()
                    .and_then(|s| s.waiting)
                    .unwrap_or(0)
                    + e.load.requests()
            })
            .sum();
        let rate = self.drain.lock().observe(now, completed);
        picker::estimate_retry_after(waiting, rate)
    }
}

impl Drop for PoolRuntime {
    fn drop(&mut self) {
        for w in &self.watchers {
            w.abort();
        }
    }
}

/// Completions per second, smoothed; sampled only when a refusal needs it.
#[derive(Debug, Default)]
struct DrainMeter {
    last: Option<(Instant, u64)>,
    rate: f64,
}

impl DrainMeter {
    const MIN_SAMPLE: Duration = Duration::from_millis(100);

    fn observe(&mut self, now: Instant, completed: u64) -> f64 {
        match self.last {
            None => self.last = Some((now, completed)),
            Some((at, before)) => {
                let dt = now.duration_since(at);
                if dt >= Self::MIN_SAMPLE {
                    let sample = (completed - before) as f64 / dt.as_secs_f64();
                    // Weigh the newest sample more the longer it covers.
                    let w = (dt.as_secs_f64() / 5.0).min(1.0).max(0.2);
                    self.rate = self.rate * (1.0 - w) + sample * w;
                    self.last = Some((now, completed));
                }
            }
        }
        self.rate
    }
}

/// The picker's view of a pool's `scheduling` section; defaults come from
/// the picker crate.
pub fn picker_config(spec: &config::Pool) -> picker::PickerConfig {
    let s = &spec.scheduling;
    let defaults = picker::PickerConfig::default();
    let mut weights = s
        .preset
        .as_deref()
        .and_then(picker::Weights::preset)
        .unwrap_or(defaults.weights);
    if let Some(w) = &s.weights {
        weights.queue = w.queue.unwrap_or(weights.queue);
        weights.kv_cache = w.kv_cache.unwrap_or(weights.kv_cache);
        weights.inflight = w.inflight.unwrap_or(weights.inflight);
        weights.prefix = w.prefix.unwrap_or(weights.prefix);
        weights.lora = w.lora.unwrap_or(weights.lora);
    }
    let mut saturation = defaults.saturation;
    if let Some(sat) = &s.saturation {
        saturation.queue_depth = sat.queue_depth.unwrap_or(saturation.queue_depth);
        saturation.kv_cache = sat.kv_cache.unwrap_or(saturation.kv_cache);
    }
    picker::PickerConfig {
        policy: match spec.policy() {
            config::Policy::Scored => picker::Policy::Scored,
            config::Policy::RoundRobin => picker::Policy::RoundRobin,
            config::Policy::LeastRequest => picker::Policy::LeastRequest,
            config::Policy::Random => picker::Policy::Random,
        },
        weights,
        saturation,
        stale_after: s.metrics.stale_after.unwrap_or(defaults.stale_after),
        fallback: match s.fallback {
            config::Fallback::LeastRequest => picker::Fallback::LeastRequest,
            config::Fallback::Refuse => picker::Fallback::Refuse,
        },
        ..defaults
    }
}
