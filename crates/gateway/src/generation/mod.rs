//! One generation of the configuration, as the request path sees it:
//! routes, pools, limits and objectives, built whole and swapped whole.
//! A request loads the current generation once and keeps it until its
//! response ends, so it never sees half of one config and half of the
//! next. A pool's runtime (its replicas' load, connections, prefix index,
//! scrapers) is not part of a generation: it carries over by the pool's
//! name, and every source of change — the file at start, a reload, later
//! discovery — goes through the same [`Runtimes::build`]. Authentication
//! is the same: keys files and JWKS carry over by path or URL
//! ([`crate::auth::Sources`]), the rest is rebuilt.
//!
//! [`reload`] is the whole of a reload, in order, from the check of what
//! is fixed at start to the swap and the global tier's members.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::auth::{Authenticator, Sources};
use crate::flow::ColdStart;
use crate::generation::pool::{Pool, Runtime};
use crate::generation::wake::ScalerSlot;
use crate::inbound::edge::ForwardedPaths;
use crate::outbound::TrustedProxies;
use crate::outbound::mirror::{MirrorRoom, Mirrors};
use crate::rate_limits::{Limiter, Store};
use crate::route::rewrite::{Rewrites, Rollouts};
use crate::route::session_key::SessionKeys;
use crate::route::table::ModelTable;
use crate::telemetry::Metrics;
use crate::tls::{self, client::PoolTls};

pub struct Generation {
    /// Which config this is, for `/debug/config`.
    pub applied: Applied,
    /// Who callers are and which models their tenants may use.
    pub auth: Authenticator,
    pub routes: ModelTable,
    /// Model rewrites (canaries), applied at the route stage.
    pub rewrites: Rewrites,
    /// Where requests' session keys come from.
    pub sessions: SessionKeys,
    /// Shadow traffic.
    pub mirrors: Mirrors,
    /// In config order.
    pub pools: Vec<Arc<Pool>>,
    pub limits: config::Limits,
    pub timeouts: config::Timeouts,
    pub debug: config::Debug,
    pub objectives: BTreeMap<String, config::Priority>,
    pub flow_control: config::FlowControl,
    /// The paths forwarded to replicas.
    pub forwarded_paths: ForwardedPaths,
    pub trusted_proxies: TrustedProxies,
    pub limiter: Limiter,
    client_sampling: config::ClientSampling,
    ready_when: config::ReadyWhen,
    /// The trace sample ratio when traces are exported, else every trace.
    sample_ratio: f64,
}

/// Which config a generation is: the count of configs put in force since
/// start (1 for the first), when, and the spec itself.
pub struct Applied {
    pub number: u64,
    pub at: std::time::SystemTime,
    pub spec: config::Spec,
}

impl Generation {
    /// The configured tenant named `name`, if any.
    pub fn tenant(&self, name: &str) -> Option<&config::Tenant> {
        self.applied.spec.tenants.iter().find(|t| *t.name == *name)
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

    /// `Ok` when the pools `readyWhen` asks for have a replica that can be
    /// picked now; else why not, naming the pools that have none.
    pub fn readiness(&self) -> Result<(), String> {
        let now = std::time::Instant::now();
        let unready: Vec<&str> = self
            .pools
            .iter()
            .filter(|p| !p.runtime().is_ready(now))
            .map(|p| &**p.name())
            .collect();
        let ready = match self.ready_when {
            config::ReadyWhen::AnyPool => unready.len() < self.pools.len(),
            config::ReadyWhen::AllPools => unready.is_empty(),
        };
        if ready {
            Ok(())
        } else {
            Err(format!(
                "no usable replica in pool {} (readyWhen: {})",
                unready.join(", "),
                match self.ready_when {
                    config::ReadyWhen::AnyPool => "anyPool",
                    config::ReadyWhen::AllPools => "allPools",
                }
            ))
        }
    }

    pub fn pool(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| &**p.name() == name)
    }
}

/// Every pool's runtime by name: what one generation hands the next.
pub struct Runtimes {
    by_name: HashMap<String, Arc<Runtime>>,
    /// Keys files, JWKS and argon2id results.
    auth: Sources,
    /// Worker threads, each with its own connections per pool.
    workers: usize,
    /// Rate-limit counts (or the Redis connection), kept while the
    /// backend settings stay the same.
    limit_store: Option<Store>,
    /// Rewrites' weights, guard windows and sessions, by rewrite name.
    /// Boxed, as the next one: the gateway that holds these is moved by
    /// value, so what it seldom touches is kept out of line.
    rollouts: Box<Rollouts>,
    /// Mirrors' room for copies in flight, by mirror.
    mirror_room: Box<MirrorRoom>,
    /// Generations built so far.
    built: u64,
    /// The replicas last found in Kubernetes, by pool: what a pool with
    /// `endpointSelector` or `inferencePool` is built with, so a new
    /// generation keeps them.
    discovered: HashMap<String, Discovered>,
    /// The pools of the generation in force that are discovered.
    discovering: HashSet<String>,
    /// What wakes cold pools whose workload is on Kubernetes; shared by
    /// every pool, set once a Kubernetes client exists.
    pub scaler: ScalerSlot,
}

/// One pool's replicas as discovery last reported them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovered {
    pub addrs: Vec<String>,
    /// Replicas whose metrics dialect is not the pool's `engine`.
    pub engines: HashMap<String, signals::Dialect>,
    /// Replicas whose pods are terminating, with the time they are killed:
    /// not members, draining until then at the latest.
    pub terminating: pool::Terminating,
}

impl Runtimes {
    pub fn new(workers: usize) -> Self {
        Self {
            by_name: HashMap::new(),
            auth: Sources::default(),
            workers,
            limit_store: None,
            rollouts: Box::default(),
            mirror_room: Box::default(),
            built: 0,
            discovered: HashMap::new(),
            discovering: HashSet::new(),
            scaler: ScalerSlot::default(),
        }
    }

    /// Put the replicas discovery found for `pool` in force at once, in the
    /// generation running now and every later one. Ignored for a pool that
    /// is not discovered in the generation in force (a watch of an older
    /// config still winding down).
    pub fn set_discovered(&mut self, pool: &str, discovered: Discovered, metrics: &Metrics) {
        if !self.discovering.contains(pool) {
            return;
        }
        if let Some(disaggregated) = config::prefill_group_of(pool) {
            if let Some(runtime) = self.by_name.get(disaggregated) {
                runtime.set_prefill_addresses(&discovered.addrs);
            }
        } else if let Some(runtime) = self.by_name.get(pool) {
            runtime.set_replicas(
                &discovered.addrs,
                &discovered.terminating,
                discovered.engines.clone(),
                metrics,
            );
        }
        self.discovered.insert(pool.to_owned(), discovered);
    }

    /// Build the generation `spec` describes, reusing the runtime of every
    /// pool that stays and reconciling its replicas; runtimes of pools that
    /// left are released once the requests of older generations end. The
    /// config must be validated, with simulated pools started (their
    /// replicas in `endpoints`). Needs a Tokio runtime.
    pub fn build(&mut self, spec: &config::Spec, metrics: &Metrics) -> anyhow::Result<Generation> {
        for p in &spec.pools {
            if p.simulated.is_some() && p.endpoints.is_empty() {
                anyhow::bail!(
                    "pool {:?} is simulated: start its replicas and list them in `endpoints` first \
                     (`infergate serve` does)",
                    p.name
                );
            }
        }
        // First: a keys file or JWKS file that cannot be read refuses the
        // config before any pool is touched.
        let auth = self.auth.build(spec)?;
        let limit_store = Store::for_config(&spec.rate_limits, self.limit_store.as_ref())?;
        // Everything that can fail is done before any pool changes: a
        // generation that cannot be built leaves the one in force alone.
        let mut tls = Vec::with_capacity(spec.pools.len());
        for p in &spec.pools {
            tls.push(PoolTls::for_pool(p).map_err(|problems| {
                anyhow::anyhow!(
                    "pool {:?}: TLS: {}",
                    p.name,
                    tls::FileProblem::joined(&problems)
                )
            })?);
        }
        let connect_timeout = spec.timeouts.connect();
        let mut by_name = HashMap::with_capacity(spec.pools.len());
        let mut pools = Vec::with_capacity(spec.pools.len());
        for (p, tls) in spec.pools.iter().zip(tls) {
            let runtime = match self.by_name.remove(&p.name) {
                Some(r) if r.fits(p) => r,
                _ => Runtime::new(p, connect_timeout, metrics, self.workers),
            };
            let found = match p.discovery() {
                Some(_) => self.discovered.get(&p.name).cloned().unwrap_or_default(),
                None => Discovered {
                    addrs: p.endpoints.clone(),
                    ..Discovered::default()
                },
            };
            if let Some(d) = &p.disaggregation {
                let prefills = match d.prefill_discovery() {
                    Some(_) => self
                        .discovered
                        .get(&config::prefill_group_name(&p.name))
                        .map(|found| found.addrs.clone())
                        .unwrap_or_default(),
                    None => d.prefill.endpoints.clone(),
                };
                runtime.set_prefill_addresses(&prefills);
            }
            runtime.set_engines(found.engines);
            runtime.configure(
                p,
                &found.addrs,
                &found.terminating,
                metrics,
                connect_timeout,
                tls,
            );
            runtime
                .admission()
                .set_cold_start(ColdStart::new(&p.cold_start, &self.scaler));
            let pool_metrics = metrics.pool(
                p,
                runtime.picker(),
                Arc::clone(runtime.admission()) as _,
                Arc::clone(runtime.prefix_index()),
                Arc::clone(runtime.drains()) as _,
            );
            by_name.insert(p.name.clone(), Arc::clone(&runtime));
            pools.push(Arc::new(Pool::new(runtime, pool_metrics, p)));
        }
        metrics.retain_pools(|name| by_name.contains_key(name));
        self.by_name = by_name;
        // Pools found in Kubernetes, and prefill groups found there.
        self.discovering = spec
            .pools
            .iter()
            .filter(|p| p.discovery().is_some())
            .map(|p| p.name.clone())
            .chain(spec.pools.iter().filter_map(|p| {
                let d = p.disaggregation.as_ref()?;
                d.prefill_discovery()?;
                Some(config::prefill_group_name(&p.name))
            }))
            .collect();
        let discovering = &self.discovering;
        self.discovered.retain(|pool, _| discovering.contains(pool));
        self.limit_store = Some(limit_store.clone());
        self.built += 1;
        let routes = ModelTable::new(&spec.pools, &pools);
        let rewrites = self.rollouts.build(spec, metrics);
        let mirrors = self.mirror_room.build(spec, &routes, &pools, metrics);
        Ok(Generation {
            applied: Applied {
                number: self.built,
                at: std::time::SystemTime::now(),
                spec: spec.clone(),
            },
            auth,
            routes,
            rewrites,
            sessions: SessionKeys::new(spec.sessions.as_ref()),
            mirrors,
            pools,
            limits: spec.limits.clone(),
            timeouts: spec.timeouts.clone(),
            debug: spec.debug.clone(),
            objectives: spec.objectives.clone(),
            flow_control: spec.flow_control.clone(),
            forwarded_paths: ForwardedPaths::new(&spec.forwarding.extra_paths),
            trusted_proxies: TrustedProxies::new(spec.forwarding.trusted_proxies()),
            client_sampling: spec.forwarding.client_sampling,
            ready_when: spec.ready_when,
            limiter: Limiter::new(spec, limit_store, metrics.limit_backend_errors()),
            sample_ratio: spec
                .telemetry
                .otlp
                .as_ref()
                .map_or(1.0, |o| o.sample_ratio()),
        })
    }
}

pub mod drain;
pub mod pool;
pub mod prefills;
mod prefix_events;
pub mod reload;
pub mod wake;

#[cfg(test)]
mod tests;
