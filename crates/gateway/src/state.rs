//! What every request handler shares: the pools, the model table and the
//! gateway-wide settings, built once from the config.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::pool::PoolRuntime;
use crate::routes::ModelTable;
use crate::telemetry::Metrics;

pub struct State {
    pub pools: Vec<PoolRuntime>,
    pub routes: ModelTable,
    pub limits: config::Limits,
    pub timeouts: config::Timeouts,
    pub debug: config::Debug,
    pub objectives: std::collections::BTreeMap<String, config::Priority>,
    pub flow_control: config::FlowControl,
    pub metrics: Metrics,
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
            shutting_down: AtomicBool::new(false),
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }
}
