//! A replica as the picker sees it: its address, the load this gateway has
//! put on it, the latest observation of its engine, its latency model, and
//! whether it is draining (taking no new requests) or evacuating (its
//! streams should move elsewhere).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use arc_swap::{ArcSwap, Guard};

use crate::health::{Health, health};
use crate::observation::Observation;
use crate::policy::{Fallback, PickerConfig};
use crate::predict::LatencyModel;
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
    /// Set while a task waits for `requests` to reach 0 (see
    /// [`Endpoint::idle`]): only then does a release look for a waker.
    idle_wanted: AtomicBool,
    /// The task waiting for `requests` to reach 0.
    idle_waker: Mutex<Option<Waker>>,
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

    /// One request released: wake the task waiting for the last one.
    fn release(&self, tokens: u64) {
        self.tokens.fetch_sub(tokens, Ordering::Relaxed);
        self.completed.fetch_add(1, Ordering::Relaxed);
        // Sequentially consistent with the waiter's flag and its own read
        // of `requests`: either the waiter sees this release, or this
        // release sees the waiter (the store-buffer case). On x86 the
        // read-modify-write costs what a relaxed one does, and the load a
        // plain load.
        let before = self.requests.fetch_sub(1, Ordering::SeqCst);
        if before == 1 && self.idle_wanted.load(Ordering::SeqCst) {
            self.idle_wanted.store(false, Ordering::SeqCst);
            let waker = self
                .idle_waker
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    fn poll_idle(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.requests.load(Ordering::SeqCst) == 0 {
            return Poll::Ready(());
        }
        {
            let mut slot = self.idle_waker.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_mut() {
                Some(waker) if waker.will_wake(cx.waker()) => {}
                _ => *slot = Some(cx.waker().clone()),
            }
        }
        // After the waker is in place: a release that sees the flag finds
        // it.
        self.idle_wanted.store(true, Ordering::SeqCst);
        if self.requests.load(Ordering::SeqCst) == 0 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Resolves when the replica has no request of this gateway in flight;
/// see [`Endpoint::idle`].
#[derive(Debug)]
pub struct Idle<'a> {
    load: &'a Load,
}

impl Future for Idle<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.load.poll_idle(cx)
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
        self.endpoint.load.release(self.tokens);
    }
}

/// Whether a replica takes new requests (see [`Endpoint::draining`]).
const SERVING: u8 = 0;
const DRAINING: u8 = 1;
/// Draining, and its streams should move to other replicas.
const EVACUATING: u8 = 2;

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
    /// `SERVING`, `DRAINING` or `EVACUATING`.
    drain: AtomicU8,
    /// What this replica's latency has been learned to be.
    latency: LatencyModel,
}

/// Whether replica `e` can take requests now: reachable, not draining,
/// and with fresh metrics when its pool refuses to pick without them. The
/// one rule behind `/readyz`, `/debug/pools`, the ready-replica metrics
/// and the custom resource's status, so they agree.
pub fn is_ready(e: &Endpoint, config: &PickerConfig, now: std::time::Instant) -> bool {
    let needs_metrics = config.policy.uses_signals() && config.fallback == Fallback::Refuse;
    e.is_reachable()
        && !e.draining()
        && (!needs_metrics || health(&e.observation(), now, config.stale_after) == Health::Healthy)
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
            drain: AtomicU8::new(SERVING),
            latency: LatencyModel::default(),
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

    /// The replica's latency model: what the predicted policy reads, and
    /// what the gateway teaches with each finished request
    /// ([`LatencyModel::observe`] with the features the decision carried).
    pub fn latency(&self) -> &LatencyModel {
        &self.latency
    }

    pub fn is_reachable(&self) -> bool {
        !self.unreachable.load(Ordering::Relaxed)
    }

    pub fn set_reachable(&self, reachable: bool) {
        self.unreachable.store(!reachable, Ordering::Relaxed);
    }

    /// A draining replica is never picked, by any policy or fallback, for
    /// a new request or a waiting one; the requests it has in flight go on.
    pub fn draining(&self) -> bool {
        self.drain.load(Ordering::Relaxed) != SERVING
    }

    /// Start draining (an evacuating replica stays evacuating), or stop:
    /// `false` makes the replica a candidate again and ends an evacuation.
    pub fn set_draining(&self, draining: bool) {
        if draining {
            let _ = self.drain.compare_exchange(
                SERVING,
                DRAINING,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        } else {
            self.drain.store(SERVING, Ordering::Relaxed);
        }
    }

    /// Drain, and ask for the replica's streams to move to other replicas
    /// now: whoever relays a stream from it reads [`Endpoint::evacuating`]
    /// as frames arrive.
    pub fn evacuate(&self) {
        self.drain.store(EVACUATING, Ordering::Relaxed);
    }

    /// Whether the replica's streams should move elsewhere. Implies
    /// [`Endpoint::draining`]. One relaxed load: cheap enough to read on
    /// every frame of a stream.
    pub fn evacuating(&self) -> bool {
        self.drain.load(Ordering::Relaxed) == EVACUATING
    }

    /// Resolves once no request of this gateway is in flight to the
    /// replica (at once when none is). Woken by the release of the last
    /// one, not by polling. One task waits at a time: a second waiter
    /// takes the first one's place.
    pub fn idle(&self) -> Idle<'_> {
        Idle { load: &self.load }
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

    #[test]
    fn evacuating_implies_draining_and_undraining_ends_both() {
        let endpoint = Endpoint::new(0, "10.0.0.1:8000");
        assert!(!endpoint.draining() && !endpoint.evacuating());
        endpoint.set_draining(true);
        assert!(endpoint.draining() && !endpoint.evacuating());
        endpoint.evacuate();
        assert!(endpoint.draining() && endpoint.evacuating());
        endpoint.set_draining(true);
        assert!(endpoint.evacuating(), "draining again keeps the evacuation");
        endpoint.set_draining(false);
        assert!(!endpoint.draining() && !endpoint.evacuating());
        endpoint.evacuate();
        assert!(endpoint.draining(), "evacuating from serving drains too");
    }

    /// A waker that counts its wakes.
    struct Counting(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn idle_resolves_when_the_last_request_is_released() {
        let endpoint = Endpoint::new(0, "10.0.0.1:8000");
        let counting = Arc::new(Counting(Default::default()));
        let waker = Waker::from(Arc::clone(&counting));
        let mut cx = Context::from_waker(&waker);
        let mut idle = std::pin::pin!(endpoint.idle());
        assert!(idle.as_mut().poll(&mut cx).is_ready(), "idle at once");

        let first = endpoint.acquire(1);
        let second = endpoint.acquire(1);
        let mut idle = std::pin::pin!(endpoint.idle());
        assert!(idle.as_mut().poll(&mut cx).is_pending());
        drop(first);
        assert_eq!(counting.0.load(Ordering::SeqCst), 0, "one still runs");
        drop(second);
        assert_eq!(counting.0.load(Ordering::SeqCst), 1, "woken by the last");
        assert!(idle.as_mut().poll(&mut cx).is_ready());

        // Releases with nobody waiting wake nobody.
        drop(endpoint.acquire(1));
        assert_eq!(counting.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn idle_is_woken_across_threads() {
        let endpoint = Endpoint::new(0, "10.0.0.1:8000");
        for _ in 0..200 {
            let guards: Vec<LoadGuard> = (0..4).map(|_| endpoint.acquire(1)).collect();
            let releasing = std::thread::spawn(move || drop(guards));
            // A waiter parks the thread until woken: a missed wake would
            // hang the test.
            block_on(endpoint.idle());
            releasing.join().unwrap();
            assert_eq!(endpoint.load.requests(), 0);
        }
    }

    /// Run a future to completion on this thread, parking between polls.
    fn block_on<F: Future>(future: F) -> F::Output {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
            std::thread::park();
        }
    }
}
