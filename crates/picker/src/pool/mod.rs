//! A pool of replicas and the pick over its current membership.
//!
//! Inside, dependencies run one way: this module drives the policies
//! (`scored`, which uses `simple`, and in which `predicted` ranks the
//! candidates by predicted latency) and lends them what they read of the
//! pool; a pick's request, result and error live in the leaf `decision`,
//! which this module, `scored` and `predicted` build on.

mod context;
mod decision;
mod predicted;
mod scored;
mod simple;

pub use decision::{Decision, PickError, PickRequest};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rand::Rng;
use serde_json::Value;

use crate::endpoint::Endpoint;
use crate::policy::{PickerConfig, Policy, PrefixConfig};
use crate::prefix::{PrefixIndex, prompt_hashes};
use crate::retry_after::{DrainMeter, assumed_drain, estimate_retry_after};

/// The picker over one pool: its replicas, its picking configuration and
/// its memory of where prompts went. Shared by every request to the pool;
/// every method takes `&self`.
pub struct Picker {
    endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    config: ArcSwap<PickerConfig>,
    prefix: PrefixIndex,
    round_robin: AtomicUsize,
    drain_meter: Mutex<DrainMeter>,
}

impl fmt::Debug for Picker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Picker")
            .field("endpoints", &self.endpoints.load().len())
            .field("config", &**self.config.load())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Picker {
    pub fn new(config: PickerConfig, endpoints: Vec<Arc<Endpoint>>) -> Self {
        for endpoint in &endpoints {
            endpoint.latency().configure(&config.predict);
        }
        Picker {
            prefix: PrefixIndex::new(config.prefix.default_capacity_blocks),
            endpoints: ArcSwap::from_pointee(endpoints),
            config: ArcSwap::from_pointee(config),
            round_robin: AtomicUsize::new(0),
            drain_meter: Mutex::new(DrainMeter::default()),
        }
    }

    /// The configuration in force, borrowed (no reference count written per
    /// request). Hold it briefly.
    pub fn config(&self) -> arc_swap::Guard<Arc<PickerConfig>> {
        self.config.load()
    }

    /// Apply a new configuration to later picks. Load, membership and the
    /// prefix index carry over.
    pub fn set_config(&self, config: PickerConfig) {
        for endpoint in self.endpoints.load().iter() {
            endpoint.latency().configure(&config.predict);
        }
        self.config.store(Arc::new(config));
    }

    /// The current membership snapshot.
    pub fn endpoints(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.endpoints.load_full()
    }

    /// Swap in a new membership. Keep the same `Arc<Endpoint>` for a replica
    /// that stays, so its in-flight load carries over. The prefix index
    /// forgets every endpoint index that is gone or now names another
    /// address. Latency models go with their endpoints: a replica that
    /// joins starts unmeasured, and is explored.
    pub fn replace_endpoints(&self, endpoints: Vec<Arc<Endpoint>>) {
        let predict = self.config.load().predict;
        for endpoint in &endpoints {
            endpoint.latency().configure(&predict);
        }
        let old = self.endpoints.swap(Arc::new(endpoints));
        let new = self.endpoints.load();
        for gone in old.iter() {
            let kept = new
                .iter()
                .any(|ep| ep.index == gone.index && ep.addr == gone.addr);
            if !kept {
                self.prefix.forget(gone.index);
            }
        }
    }

    pub fn prefix_index(&self) -> &PrefixIndex {
        &self.prefix
    }

    /// The prompt's chained block hashes under this pool's prefix config.
    pub fn hash_prompt(&self, model: &str, adapter: Option<&str>, body: &Value) -> Vec<u64> {
        prompt_hashes(model, adapter, body, &self.config.load().prefix)
    }

    /// Choose a replica for `req`.
    ///
    /// `exclude` lists endpoint indexes this request already tried. `now`
    /// is the only clock the picker sees. Candidates are the reachable,
    /// non-draining, non-excluded endpoints that can hold the request's
    /// context (a draining one is never picked, not even as a fallback); see
    /// [`Policy`] for what each policy does with them.
    pub fn pick<R: Rng + ?Sized>(
        &self,
        req: &PickRequest<'_>,
        now: Instant,
        exclude: &[usize],
        rng: &mut R,
    ) -> Result<Decision, PickError> {
        let snapshot = self.endpoints.load();
        let config = self.config.load();
        let too_small = context::exclude_too_small(
            &snapshot,
            exclude,
            req.context_tokens,
            config.context_length,
        );
        let exclude = too_small.as_deref().unwrap_or(exclude);
        // Uncontended in practice; a pick that finds it busy skips the sample.
        if let Some(mut meter) = self.drain_meter.try_lock() {
            meter.observe(now, || snapshot.iter().map(|ep| ep.load.completed()).sum());
        }
        let plain = |endpoint: Option<&Arc<Endpoint>>| {
            endpoint
                .map(|ep| Decision {
                    endpoint: Arc::clone(ep),
                    policy: config.policy,
                    fallback: false,
                    top: None,
                    scores: Vec::new(),
                    estimated_tokens: req.estimated_tokens,
                    prefix_source: crate::PrefixSource::Approximate,
                    latency: None,
                })
                .ok_or(PickError::NoReplicas)
        };
        match config.policy {
            Policy::RoundRobin => plain(simple::round_robin(&snapshot, exclude, &self.round_robin)),
            Policy::LeastRequest => plain(simple::least_request(&snapshot, exclude, rng)),
            Policy::Random => plain(simple::random(&snapshot, exclude, rng)),
            Policy::Scored | Policy::Predicted => scored::ScoredPick {
                snapshot: &snapshot,
                config: &config,
                req,
                now,
                exclude,
                prefix: &self.prefix,
                retry_after: &|waiting, replicas| self.retry_after(waiting, replicas),
            }
            .pick(rng),
        }
    }

    /// Note that the prompt `hashes` went to `endpoint` (an endpoint index),
    /// so later requests sharing the prefix prefer it. Call right after a
    /// scored or predicted pick, before forwarding, so a burst sharing a
    /// prefix sees it. Does nothing unless the policy reads prompt hashes
    /// ([`PickerConfig::uses_prompt_hashes`]: [`Policy::Predicted`], or
    /// [`Policy::Scored`] with a prefix weight above 0).
    pub fn record(&self, endpoint: usize, hashes: &[u64]) {
        let config = self.config.load();
        if !config.uses_prompt_hashes(false) || hashes.is_empty() {
            return;
        }
        let capacity = self
            .endpoint_by_index(endpoint)
            .and_then(|ep| {
                let observation = ep.observation();
                let state = observation.state.as_deref()?;
                Some(
                    config
                        .prefix
                        .capacity_from_kv(state.kv_capacity_blocks?, state.block_size?),
                )
            })
            .unwrap_or(config.prefix.default_capacity_blocks as u64)
            .min(PrefixConfig::POOL_BUDGET_BLOCKS / self.endpoints.load().len().max(1) as u64);
        self.prefix.record(endpoint, hashes, Some(capacity));
    }

    /// The pool's measured completion rate (requests per second), once the
    /// pool has been busy for a couple of seconds.
    pub fn drain_rate(&self) -> Option<f64> {
        self.drain_meter.lock().rate()
    }

    /// `Retry-After` for a pool with `waiting` queued requests across
    /// `replicas` saturated replicas.
    fn retry_after(&self, waiting: u64, replicas: usize) -> Duration {
        let rate = self.drain_rate().unwrap_or_else(|| assumed_drain(replicas));
        estimate_retry_after(waiting, rate)
    }

    fn endpoint_by_index(&self, index: usize) -> Option<Arc<Endpoint>> {
        let snapshot = self.endpoints.load();
        // Positions and indexes usually coincide; fall back to a scan.
        match snapshot.get(index) {
            Some(ep) if ep.index == index => Some(Arc::clone(ep)),
            _ => snapshot.iter().find(|ep| ep.index == index).cloned(),
        }
    }
}

#[cfg(test)]
mod predicted_tests;
#[cfg(test)]
mod tests;
