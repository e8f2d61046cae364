//! A reload, top to bottom: what every config goes through once it is read
//! and validated — at start, and at each change of the file or the cluster
//! object — and what replicas found by discovery go through between two
//! configs.
//!
//! 1. What the sockets were opened with must be unchanged
//!    ([`FixedAtStart`]): a config that changes it is refused whole.
//! 2. The new generation is built, every pool that stays carrying its
//!    runtime over by name ([`Runtimes::build`]); anything that fails
//!    changes nothing.
//! 3. It replaces the generation in force; running requests keep theirs.
//! 4. The global tier's members are put in force (`members::configure`,
//!    which keeps those that did not change).

use std::sync::Arc;

use parking_lot::Mutex;

use super::wake::Scaler;
use super::{Discovered, Generation, Runtimes};
use crate::members;
use crate::state::State;
use crate::telemetry::Metrics;

/// What a running gateway reloads with: the state its handlers share, the
/// runtimes one generation hands the next, and what is fixed at start.
pub struct Reload {
    state: Arc<State>,
    /// Every pool's runtime, for the next generation; discovery puts its
    /// replicas in here too, under the same lock.
    runtimes: Mutex<Runtimes>,
    /// What the sockets were opened with: a reload must leave it alone.
    fixed: FixedAtStart,
}

impl Reload {
    /// The first generation, `spec`, in force, with `workers` worker
    /// threads for the pools' connections. Needs a Tokio runtime.
    pub fn start(spec: &config::Spec, workers: usize) -> anyhow::Result<Self> {
        let fixed = FixedAtStart::of(spec);
        let metrics = Metrics::new();
        let mut runtimes = Runtimes::new(workers);
        let generation = runtimes.build(spec, &metrics)?;
        log_pools(&generation);
        let state = Arc::new(State::new(generation, metrics, &spec.limits));
        members::configure(&state, spec.global.as_ref(), spec.timeouts.idle());
        Ok(Self {
            state,
            runtimes: Mutex::new(runtimes),
            fixed,
        })
    }

    /// What every handler shares.
    pub fn state(&self) -> &Arc<State> {
        &self.state
    }

    /// Put `spec` in force, or refuse it and change nothing. It must be
    /// validated, with simulated pools started.
    pub fn apply(&self, spec: &config::Spec) -> anyhow::Result<()> {
        let changed = self.fixed.changed_in(spec);
        if !changed.is_empty() {
            anyhow::bail!(
                "{} changed: these are fixed while the gateway runs; \
                 restart it to change them (a rotated certificate file needs no restart)",
                changed.join(", ")
            );
        }
        let generation = self.runtimes.lock().build(spec, &self.state.metrics)?;
        log_pools(&generation);
        self.state.install(generation);
        members::configure(&self.state, spec.global.as_ref(), spec.timeouts.idle());
        tracing::info!(pools = spec.pools.len(), "config applied");
        Ok(())
    }

    /// Scale cold pools' Kubernetes workloads up with `scaler` from now on.
    pub fn set_scaler(&self, scaler: Box<dyn Scaler>) {
        self.runtimes.lock().scaler.store(Some(Arc::new(scaler)));
    }

    /// Where discovery reports the replicas of pools found in Kubernetes.
    pub fn discovery(self: &Arc<Self>) -> Discovery {
        Discovery {
            reload: Arc::clone(self),
        }
    }
}

/// The settings a running gateway cannot change: its listeners (addresses,
/// TLS on or off, which files), the connection limits they were opened
/// with, the drain and the telemetry set up at start. A reload that
/// changes them is refused, naming them, rather than applied in part.
#[derive(Debug)]
struct FixedAtStart {
    listeners: Vec<config::Listener>,
    admin: Option<config::Admin>,
    limits: config::Limits,
    shutdown: config::Shutdown,
    telemetry: config::Telemetry,
}

impl FixedAtStart {
    fn of(spec: &config::Spec) -> Self {
        Self {
            listeners: spec.listeners.clone(),
            admin: spec.admin.clone(),
            limits: spec.limits.clone(),
            shutdown: spec.shutdown.clone(),
            telemetry: spec.telemetry.clone(),
        }
    }

    /// The fields of `spec` that differ from what the gateway started with.
    fn changed_in(&self, spec: &config::Spec) -> Vec<&'static str> {
        let (was, now) = (&self.limits, &spec.limits);
        [
            ("spec.listeners", self.listeners != spec.listeners),
            ("spec.admin", self.admin != spec.admin),
            (
                "spec.limits.maxConnections",
                was.max_connections != now.max_connections,
            ),
            (
                "spec.limits.maxConnectionsPerClient",
                was.max_connections_per_client != now.max_connections_per_client,
            ),
            (
                "spec.limits.maxBufferedBodyBytes",
                was.max_buffered_body_bytes != now.max_buffered_body_bytes,
            ),
            (
                "spec.limits.headerTimeout",
                was.header_timeout != now.header_timeout,
            ),
            ("spec.shutdown", self.shutdown != spec.shutdown),
            ("spec.telemetry", self.telemetry != spec.telemetry),
        ]
        .into_iter()
        .filter_map(|(field, changed)| changed.then_some(field))
        .collect()
    }
}

/// One line per pool, so an operator sees what was loaded.
fn log_pools(generation: &Generation) {
    for pool in &generation.pools {
        let picker = pool.runtime().picker();
        let endpoints: Vec<String> = picker
            .endpoints()
            .iter()
            .map(|e| e.addr.to_string())
            .collect();
        tracing::info!(
            pool = %pool.name(),
            engine = pool.engine().as_str(),
            policy = picker.config().policy.name(),
            endpoints = %endpoints.join(","),
            "pool"
        );
    }
}

/// One replica as discovery found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredReplica {
    /// `host:port`.
    pub addr: String,
    /// Its metrics dialect, when not the pool's `engine`.
    pub dialect: Option<signals::Dialect>,
    /// Set while its pod terminates: when the pod's grace period ends and
    /// it is killed.
    pub terminating: Option<std::time::SystemTime>,
}

/// The gateway's side of replica discovery: where a watcher of the
/// cluster (the `infergate-kube` crate) reports a pool's replicas, and
/// whether it reaches the API server. Replicas change through the same
/// reconcile as a reload (a leaver finishes its requests, a newcomer is
/// picked once scraped), without rebuilding anything else. A handle on a
/// running gateway; cheap to clone.
#[derive(Clone)]
pub struct Discovery {
    reload: Arc<Reload>,
}

impl Discovery {
    /// `pool`'s replicas are now `replicas`. Those terminating are not
    /// members: a member that starts terminating drains, and is evacuated
    /// before its pod is killed.
    pub fn set_replicas(&self, pool: &str, replicas: Vec<DiscoveredReplica>) {
        let mut discovered = Discovered::default();
        for replica in replicas {
            if let Some(kill) = replica.terminating {
                discovered.terminating.insert(replica.addr, kill);
                continue;
            }
            if let Some(dialect) = replica.dialect {
                discovered.engines.insert(replica.addr.clone(), dialect);
            }
            discovered.addrs.push(replica.addr);
        }
        let reload = &self.reload;
        reload
            .runtimes
            .lock()
            .set_discovered(pool, discovered, &reload.state.metrics);
    }

    /// Whether `pool`'s discovery reaches the API server
    /// (`infergate_discovery_up`).
    pub fn set_up(&self, pool: &str, up: bool) {
        self.reload.state.metrics.set_discovery_up(pool, up);
    }

    /// One failed list or watch (`infergate_discovery_errors_total`).
    pub fn count_error(&self, pool: &str) {
        self.reload.state.metrics.count_discovery_error(pool);
    }
}
