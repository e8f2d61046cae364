//! What every request handler shares: the current generation of the
//! config, and what lives as long as the gateway (metrics, the budget for
//! request bodies, whether it is shutting down).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::admin::load_summary::book::SummaryBook;
use crate::generation::Generation;
use crate::inbound::read_body::BodyBudget;
use crate::members::roster::Members;
use crate::telemetry::Metrics;
use crate::telemetry::decisions::DecisionFeed;
use crate::telemetry::traffic::Traffic;

pub struct State {
    generation: ArcSwap<Generation>,
    pub metrics: Metrics,
    /// Request bodies held at once, across connections.
    pub body_budget: BodyBudget,
    /// Recent routing decisions, recorded while the fleet page watches.
    pub decisions: Arc<DecisionFeed>,
    /// Snapshots of the request counters, taken while the page watches.
    pub traffic: Traffic,
    /// What global routers are told of this gateway's load.
    pub summaries: SummaryBook,
    /// The global tier's members, when this gateway routes to any.
    pub members: Members,
    shutting_down: AtomicBool,
    /// Where the config comes from, as `/debug/config` says it.
    pub config_source: parking_lot::Mutex<String>,
}

impl State {
    pub fn new(generation: Generation, metrics: Metrics, limits: &config::Limits) -> Self {
        Self {
            generation: ArcSwap::from_pointee(generation),
            metrics,
            body_budget: BodyBudget::new(
                limits.max_buffered_body_bytes(),
                config::defaults::BODY_BUDGET_WAIT,
            ),
            decisions: Arc::new(DecisionFeed::new()),
            traffic: Traffic::new(tokio::time::Instant::now()),
            summaries: SummaryBook::default(),
            members: Members::default(),
            shutting_down: AtomicBool::new(false),
            config_source: parking_lot::Mutex::new("the embedding program".to_owned()),
        }
    }

    /// The generation in force. A request loads it once and keeps it.
    pub fn generation(&self) -> Arc<Generation> {
        self.generation.load_full()
    }

    /// Later requests see `generation`; those running keep theirs.
    pub fn install(&self, generation: Generation) {
        self.generation.store(Arc::new(generation));
    }

    /// Ready to serve: not shutting down, and the pools `readyWhen` asks
    /// for can pick; a router with global members and no local pool, once
    /// a member is up. `Err` says why not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.is_shutting_down() {
            return Err("shutting down".to_owned());
        }
        let generation = self.generation.load();
        if generation.pools.is_empty() {
            return match self.members.any_up() {
                Some(true) => Ok(()),
                Some(false) => Err("no global member is up yet".to_owned()),
                None => Err("no pool and no global member".to_owned()),
            };
        }
        generation.readiness()
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Relaxed);
    }
}
