//! A pool at run time: its replicas, the picker over them, the scrapers
//! that keep their signals fresh, and each worker's connections to them.

use std::sync::Arc;
use std::time::Instant;

use picker::Endpoint;
use tokio::task::JoinHandle;

use crate::admit::Admission;
use crate::server::WorkerId;
use crate::telemetry::{Metrics, PoolMetrics};
use crate::upstream::Connections;
use crate::upstream::connections::Settings;

pub struct PoolRuntime {
    pub name: Arc<str>,
    pub spec: config::Pool,
    pub picker: Arc<picker::Pool>,
    /// Flow control in front of the picker.
    pub admission: Arc<Admission>,
    /// One connection pool per worker thread: a connection is only used by
    /// the thread that drives it.
    connections: Vec<Connections>,
    /// Metric handles resolved for this pool, its models and replicas.
    pub metrics: PoolMetrics,
    /// One per replica; each stops its task when dropped.
    scrapers: Vec<signals::Scraper>,
    dispatcher: Option<JoinHandle<()>>,
}

impl PoolRuntime {
    /// `addrs` are the replicas: the pool's static endpoints, or the
    /// simulated replicas started for it.
    pub fn new(
        spec: &config::Pool,
        addrs: &[String],
        timeouts: &config::Timeouts,
        flow_control: &config::FlowControl,
        metrics: &Metrics,
        workers: usize,
    ) -> Self {
        let endpoints: Vec<Arc<Endpoint>> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| Endpoint::new(i, a.clone()))
            .collect();
        let picker = Arc::new(picker::Pool::new(picker_config(spec), endpoints));
        let admission = Admission::new(
            Arc::clone(&picker),
            flow_control.clone(),
            metrics.pick_duration(&spec.name),
        );
        Self {
            name: Arc::from(spec.name.as_str()),
            metrics: metrics.pool(spec, &picker, &admission),
            admission,
            picker,
            connections: (0..workers.max(1))
                .map(|_| Connections::new(Settings::new(spec.protocol, timeouts.connect())))
                .collect(),
            scrapers: Vec::new(),
            dispatcher: None,
            spec: spec.clone(),
        }
    }

    /// The connections of the worker thread serving a request.
    pub fn connections(&self, worker: WorkerId) -> &Connections {
        &self.connections[worker % self.connections.len()]
    }

    /// Start one scraper (or reachability probe) per replica and the flow
    /// control dispatcher. Needs a Tokio runtime.
    pub fn start(&mut self, connect_timeout: std::time::Duration) {
        self.dispatcher = Some(tokio::spawn(Arc::clone(&self.admission).dispatch_forever()));
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
        // Below the scrape timeout, so a replica that never answers the
        // handshake shows as unreachable rather than slow.
        let client = signals::ScrapeClient::new(cfg.timeout.min(connect_timeout));
        self.scrapers = self
            .picker
            .endpoints()
            .iter()
            .map(|e| {
                // Fresh signals may show room for requests waiting in line.
                let admission = Arc::clone(&self.admission);
                let metrics = self.metrics.endpoint(e);
                signals::spawn_reporting_scraper(
                    Arc::clone(e),
                    cfg,
                    client.clone(),
                    move |_, report| {
                        metrics.observe_scrape(report);
                        admission.wake()
                    },
                )
            })
            .collect();
    }

    /// Ready when at least one replica can be picked: it is reachable and,
    /// if the pool scores on metrics, reports them — or the pool falls back
    /// to least-request when metrics are missing, so a metrics outage does
    /// not take the gateway out of service.
    pub fn is_ready(&self, now: Instant) -> bool {
        let config = self.picker.config();
        let needs_metrics =
            config.policy.uses_signals() && config.fallback == picker::Fallback::Refuse;
        self.picker.endpoints().iter().any(|e| {
            e.is_reachable()
                && (!needs_metrics
                    || picker::health(&e.observation(), now, config.stale_after)
                        == picker::Health::Healthy)
        })
    }
}

impl Drop for PoolRuntime {
    fn drop(&mut self) {
        if let Some(dispatcher) = &self.dispatcher {
            dispatcher.abort();
        }
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
