//! A replica as the picker sees it: its address, the load this gateway has
//! put on it, and the latest observation of its engine.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::{ArcSwap, Guard};

use crate::observation::Observation;
use crate::summary::{ObservationSummary, SummaryCell};

/// Weight of the newest answer in [`Endpoint::token_time`].
const TOKEN_TIME_WEIGHT: f64 = 0.2;

/// Requests and estimated tokens this gateway has in flight to a replica.
/// Only [`LoadGuard`] changes it, so every path (success, error, client
/// gone, retry) releases exactly what it took.
#[derive(Debug, Default)]
pub struct Load {
    requests: AtomicU64,
    tokens: AtomicU64,
    /// Of `requests`, those the replica has not answered yet (no response
    /// byte): waiting in its queue or being prefilled.
    unanswered: AtomicU64,
    completed: AtomicU64,
}

impl Load {
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }
    pub fn tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }
    /// Requests in flight that have not had a response byte yet. Unlike the
    /// engine's scraped queue this is current at every pick: it is the
    /// replica's queue and prefill work as far as this gateway caused it.
    pub fn unanswered(&self) -> u64 {
        self.unanswered.load(Ordering::Relaxed)
    }
    /// Requests released since start; the gateway derives drain rates from it.
    pub fn completed(&self) -> u64 {
        self.completed.load(Ordering::Relaxed)
    }
}

/// Holds one request's share of a replica's [`Load`] until dropped.
#[derive(Debug)]
pub struct LoadGuard {
    endpoint: Arc<Endpoint>,
    tokens: u64,
    answered: bool,
}

impl LoadGuard {
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The replica sent the response's first byte (for a stream, its first
    /// token). Only the first call counts.
    pub fn answered(&mut self) {
        if !self.answered {
            self.answered = true;
            self.endpoint
                .load
                .unanswered
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for LoadGuard {
    fn drop(&mut self) {
        self.answered();
        let load = &self.endpoint.load;
        load.requests.fetch_sub(1, Ordering::Relaxed);
        load.tokens.fetch_sub(self.tokens, Ordering::Relaxed);
        load.completed.fetch_add(1, Ordering::Relaxed);
    }
}

/// One replica of a pool.
#[derive(Debug)]
pub struct Endpoint {
    /// `host:port`.
    pub addr: Arc<str>,
    /// Position in the pool's endpoint list; stable for the pool's lifetime.
    pub index: usize,
    pub load: Load,
    /// Written by the scraper, read by the picker; never blocks either.
    observation: ArcSwap<Observation>,
    /// The figures of `observation` every scored pick reads, in plain
    /// atomics (see [`crate::summary`]).
    summary: SummaryCell,
    /// Serialises [`Endpoint::observe`] calls (one scraper per endpoint, so
    /// never contended).
    observing: Mutex<()>,
    /// Set when a connection attempt failed; cleared when the replica
    /// answers again (a scrape or a probe succeeds).
    unreachable: AtomicBool,
    /// The observation generation the picker last saw and this gateway's
    /// in-flight requests at that moment; see
    /// [`Endpoint::inflight_since_observation`].
    seen_generation: AtomicU64,
    inflight_at_seen: AtomicU64,
    /// The longest context (prompt and completion, in tokens) the replica
    /// takes; 0 while unknown.
    context_limit: AtomicU64,
    /// Seconds per generated token as this gateway measures it, a moving
    /// average (`f64` bits; 0 while nothing was measured).
    token_time: AtomicU64,
}

impl Endpoint {
    pub fn new(index: usize, addr: impl Into<Arc<str>>) -> Arc<Self> {
        Arc::new(Self {
            addr: addr.into(),
            index,
            load: Load::default(),
            observation: ArcSwap::from_pointee(Observation::default()),
            summary: SummaryCell::default(),
            observing: Mutex::new(()),
            unreachable: AtomicBool::new(false),
            seen_generation: AtomicU64::new(0),
            inflight_at_seen: AtomicU64::new(0),
            context_limit: AtomicU64::new(0),
            token_time: AtomicU64::new(0),
        })
    }

    /// The latest observation of the replica's engine.
    pub fn observation(&self) -> Guard<Arc<Observation>> {
        self.observation.load()
    }

    /// Replace the observation (after a scrape).
    pub fn observe(&self, observation: Observation) {
        let _one_writer = self.observing.lock().unwrap_or_else(|e| e.into_inner());
        self.summary.write(&observation);
        self.observation.store(Arc::new(observation));
    }

    /// What a scored pick needs of the latest observation, without loading
    /// it.
    // Inlined into the per-replica loop of a pick, wherever codegen
    // units fall.
    #[inline]
    pub fn summary(&self) -> ObservationSummary {
        self.summary
            .read()
            .unwrap_or_else(|| ObservationSummary::of(&self.observation()))
    }

    /// Requests this gateway has added to the replica since the observation
    /// of `generation` was first seen: work the replica's own figures cannot
    /// show yet. Counted from the first pick that sees a new scrape, so a
    /// burst between two scrapes is visible to the saturation check.
    pub fn inflight_since_observation(&self, generation: u64) -> u64 {
        let now = self.load.requests();
        // Read before writing: most picks see a scrape already seen, and a
        // store on every pick would bounce the cache line between cores.
        if self.seen_generation.load(Ordering::Relaxed) != generation
            && self.seen_generation.swap(generation, Ordering::Relaxed) != generation
        {
            self.inflight_at_seen.store(now, Ordering::Relaxed);
            return 0;
        }
        now.saturating_sub(self.inflight_at_seen.load(Ordering::Relaxed))
    }

    /// Take one request's share of this replica's load.
    pub fn acquire(self: &Arc<Self>, tokens: u64) -> LoadGuard {
        self.load.requests.fetch_add(1, Ordering::Relaxed);
        self.load.tokens.fetch_add(tokens, Ordering::Relaxed);
        self.load.unanswered.fetch_add(1, Ordering::Relaxed);
        LoadGuard {
            endpoint: Arc::clone(self),
            tokens,
            answered: false,
        }
    }

    /// The longest context the replica takes, in tokens, once known: from
    /// its model list, the pool's config, or a request it refused as too
    /// long.
    pub fn context_limit(&self) -> Option<u64> {
        Some(self.context_limit.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    pub fn set_context_limit(&self, tokens: u64) {
        self.context_limit.store(tokens, Ordering::Relaxed);
    }

    /// Seconds per generated token, as measured on this replica's recent
    /// answers; `None` before the first.
    pub fn token_time(&self) -> Option<f64> {
        Some(f64::from_bits(self.token_time.load(Ordering::Relaxed))).filter(|t| *t > 0.0)
    }

    /// One answer of `tokens` generated tokens that took `seconds` from
    /// sending the request to its end (queue and prefill included: what a
    /// client waits), folded into the moving average of seconds per token.
    /// Each answer weighs a fifth, so a replica's speed follows its load
    /// within a few answers; answers of a few tokens say more about time
    /// to first token than speed and are left out. Concurrent calls may
    /// lose one sample.
    pub fn observe_answer(&self, seconds: f64, tokens: u64) {
        const FEWEST_TOKENS: u64 = 4;
        let seconds = seconds / tokens as f64;
        if tokens < FEWEST_TOKENS || !(seconds.is_finite() && seconds > 0.0) {
            return;
        }
        let next = match self.token_time() {
            Some(average) => average + TOKEN_TIME_WEIGHT * (seconds - average),
            None => seconds,
        };
        self.token_time.store(next.to_bits(), Ordering::Relaxed);
    }

    pub fn is_reachable(&self) -> bool {
        !self.unreachable.load(Ordering::Relaxed)
    }

    pub fn set_reachable(&self, reachable: bool) {
        self.unreachable.store(!reachable, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_unanswered_until_answered_or_released() {
        let endpoint = Endpoint::new(0, "10.0.0.1:8000");
        let load = &endpoint.load;
        let mut first = endpoint.acquire(100);
        let second = endpoint.acquire(50);
        assert_eq!(
            (load.requests(), load.unanswered(), load.tokens()),
            (2, 2, 150)
        );

        first.answered();
        first.answered();
        assert_eq!((load.requests(), load.unanswered()), (2, 1), "counted once");
        drop(first);
        assert_eq!((load.requests(), load.unanswered()), (1, 1));
        // Released without an answer (an error, or the client left).
        drop(second);
        assert_eq!(
            (load.requests(), load.unanswered(), load.tokens()),
            (0, 0, 0)
        );
        assert_eq!(load.completed(), 2);
    }
}
