//! A pool of replicas and the pick over its current membership.

mod scored;
mod simple;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use rand::Rng;
use serde_json::Value;

use crate::drain::{DrainMeter, assumed_drain, estimate_retry_after};
use crate::endpoint::{Endpoint, LoadGuard};
use crate::explain::{CandidateScore, ScoresHeader, TopScores};
use crate::policy::{PickerConfig, Policy, PrefixConfig};
use crate::prefix::{PrefixIndex, prompt_hashes};

/// What the picker needs to know about a request.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickRequest<'a> {
    /// LoRA adapter the request asks for, if any.
    pub adapter: Option<&'a str>,
    /// The prompt's chained block hashes ([`Pool::hash_prompt`]).
    pub prefix_hashes: &'a [u64],
    /// Estimated tokens of the request; [`Decision::acquire`] counts them
    /// as in flight on the chosen replica.
    pub estimated_tokens: u64,
    /// Fill [`Decision::scores`] with every candidate's scores.
    pub explain: bool,
}

/// The chosen replica, and why.
#[derive(Debug, Clone)]
pub struct Decision {
    pub endpoint: Arc<Endpoint>,
    /// The policy that chose it.
    pub policy: Policy,
    /// True when no replica had fresh, healthy metrics and the scored
    /// policy fell back to least-request.
    pub fallback: bool,
    /// Winner's and runner-up's totals ([`Policy::Scored`] only).
    pub top: Option<TopScores>,
    /// Every scored candidate, best first; only when
    /// [`PickRequest::explain`] was set.
    pub scores: Vec<CandidateScore>,
    /// From the request, for [`Decision::acquire`].
    pub estimated_tokens: u64,
}

impl Decision {
    /// The chosen replica's endpoint index (for retries' `exclude` and for
    /// [`Pool::record`]).
    pub fn index(&self) -> usize {
        self.endpoint.index
    }

    /// Count this request against the chosen replica until the guard drops.
    pub fn acquire(&self) -> LoadGuard {
        self.endpoint.acquire(self.estimated_tokens)
    }

    /// The `x-infergate-scores` header value, best `limit` candidates.
    pub fn scores_header(&self, limit: usize) -> ScoresHeader<'_> {
        ScoresHeader {
            scores: &self.scores,
            limit,
        }
    }
}

/// Why no replica was picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PickError {
    /// Every replica is unreachable or was already tried (503).
    NoReplicas,
    /// Replicas are reachable but none has fresh, healthy metrics, and the
    /// fallback is [`crate::Fallback::Refuse`] (503).
    NoHealthyReplicas { reachable: usize },
    /// Every healthy replica is saturated (429 with `Retry-After`).
    Saturated {
        retry_after: Duration,
        /// Requests waiting across the saturated replicas.
        waiting: u64,
    },
}

impl fmt::Display for PickError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PickError::NoReplicas => f.write_str("no reachable replica"),
            PickError::NoHealthyReplicas { reachable } => write!(
                f,
                "none of {reachable} reachable replicas has fresh, healthy metrics"
            ),
            PickError::Saturated {
                retry_after,
                waiting,
            } => write!(
                f,
                "every replica is saturated ({waiting} requests waiting); retry after {} s",
                retry_after.as_secs()
            ),
        }
    }
}

impl std::error::Error for PickError {}

/// One pool's replicas, its picking configuration and its memory of where
/// prompts went. Shared by every request to the pool; every method takes
/// `&self`.
pub struct Pool {
    endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    config: ArcSwap<PickerConfig>,
    prefix: PrefixIndex,
    round_robin: AtomicUsize,
    drain: Mutex<DrainMeter>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("endpoints", &self.endpoints.load().len())
            .field("config", &**self.config.load())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Pool {
    pub fn new(config: PickerConfig, endpoints: Vec<Arc<Endpoint>>) -> Self {
        Pool {
            prefix: PrefixIndex::new(config.prefix.default_capacity_blocks),
            endpoints: ArcSwap::from_pointee(endpoints),
            config: ArcSwap::from_pointee(config),
            round_robin: AtomicUsize::new(0),
            drain: Mutex::new(DrainMeter::default()),
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
        self.config.store(Arc::new(config));
    }

    /// The current membership snapshot.
    pub fn endpoints(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.endpoints.load_full()
    }

    /// Swap in a new membership. Keep the same `Arc<Endpoint>` for a replica
    /// that stays, so its in-flight load carries over. The prefix index
    /// forgets every endpoint index that is gone or now names another
    /// address.
    pub fn replace_endpoints(&self, endpoints: Vec<Arc<Endpoint>>) {
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
    /// non-excluded endpoints; see [`Policy`] for what each policy does
    /// with them.
    pub fn pick<R: Rng + ?Sized>(
        &self,
        req: &PickRequest<'_>,
        now: Instant,
        exclude: &[usize],
        rng: &mut R,
    ) -> Result<Decision, PickError> {
        let snapshot = self.endpoints.load();
        let config = self.config.load();
        // Uncontended in practice; a pick that finds it busy skips the sample.
        if let Some(mut meter) = self.drain.try_lock() {
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
                })
                .ok_or(PickError::NoReplicas)
        };
        match config.policy {
            Policy::RoundRobin => plain(simple::round_robin(&snapshot, exclude, &self.round_robin)),
            Policy::LeastRequest => plain(simple::least_request(&snapshot, exclude, rng)),
            Policy::Random => plain(simple::random(&snapshot, exclude, rng)),
            Policy::Scored => scored::pick(self, &snapshot, &config, req, now, exclude, rng),
        }
    }

    /// Note that the prompt `hashes` went to `endpoint` (an endpoint index),
    /// so later requests sharing the prefix prefer it. Call right after a
    /// scored pick, before forwarding, so a burst sharing a prefix sees it.
    /// Does nothing unless the policy is [`Policy::Scored`] with a prefix
    /// weight above 0.
    pub fn record(&self, endpoint: usize, hashes: &[u64]) {
        let config = self.config.load();
        if config.policy != Policy::Scored || config.weights.prefix <= 0.0 || hashes.is_empty() {
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
        self.drain.lock().rate()
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
mod tests;
