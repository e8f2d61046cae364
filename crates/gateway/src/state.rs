//! What every request handler shares: the pools, the model table and the
//! gateway-wide settings, built once from the config.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::edge::ForwardedPaths;
use crate::pool::PoolRuntime;
use crate::request_body::BodyBudget;
use crate::routes::ModelTable;
use crate::telemetry::Metrics;
use crate::upstream::TrustedProxies;

pub struct State {
    pub pools: Vec<PoolRuntime>,
    pub routes: ModelTable,
    pub limits: config::Limits,
    pub timeouts: config::Timeouts,
    pub debug: config::Debug,
    pub objectives: std::collections::BTreeMap<String, config::Priority>,
    pub flow_control: config::FlowControl,
    pub metrics: Metrics,
    /// The paths forwarded to replicas.
    pub forwarded_paths: ForwardedPaths,
    pub trusted_proxies: TrustedProxies,
    pub client_sampling: config::ClientSampling,
    /// The trace sample ratio when traces are exported, else every trace.
    pub sample_ratio: f64,
    /// Request bodies held at once, across connections.
    pub body_budget: BodyBudget,
    shutting_down: AtomicBool,
}

impl State {
    pub fn new(config: &config::Spec, pools: Vec<PoolRuntime>, metrics: Metrics) -> Self {
        Self {
            routes: ModelTable::new(&config.pools),
            pools,
            limits: config.limits.clone(),
            timeouts: config.timeouts.clone(),
            debug: config.debug.clone(),
            objectives: config.objectives.clone(),
            flow_control: config.flow_control.clone(),
            metrics,
            forwarded_paths: ForwardedPaths::new(&config.forwarding.extra_paths),
            trusted_proxies: TrustedProxies::new(config.forwarding.trusted_proxies()),
            client_sampling: config.forwarding.client_sampling,
            sample_ratio: config
                .telemetry
                .otlp
                .as_ref()
                .map_or(1.0, |o| o.sample_ratio()),
            body_budget: BodyBudget::new(
                config.limits.max_buffered_body_bytes(),
                config::defaults::BODY_BUDGET_WAIT,
            ),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// How the trace of a request from `peer` is sampled: `None` lets the
    /// caller's `traceparent` decide, else this ratio does.
    pub fn trace_sampling(&self, peer: std::net::IpAddr) -> Option<f64> {
        let caller_decides = match self.client_sampling {
            config::ClientSampling::Always => true,
            config::ClientSampling::TrustedProxies => self.trusted_proxies.trusts(peer),
            config::ClientSampling::Never => false,
        };
        (!caller_decides).then_some(self.sample_ratio)
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }
}
