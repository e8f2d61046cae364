//! Replicas on their way out of a pool, and replicas drained by hand.
//!
//! A draining replica ([`Endpoint::draining`]) is never picked; its
//! requests in flight go on where they are. One task per draining replica
//! waits for the first of two events: its last request's release
//! ([`Endpoint::idle`], woken by the release itself, no polling), or the
//! pool's `drain.deadline`, at which the replica is evacuated
//! ([`Endpoint::evacuate`]: whoever relays one of its streams moves the
//! stream to another replica) and the task waits for the last release.
//! A replica that left the pool is then forgotten (its metric series
//! too); one drained by hand stays drained, and a member, until undone.
//!
//! Why a replica drains:
//!
//! - it left the pool: a config reload or discovery no longer lists it
//!   ([`Why::Removed`]), or its pod is terminating ([`Why::Terminating`]:
//!   the deadline is then also before the kubelet kills it);
//! - an operator drained it ([`Why::ByHand`]), through the admin listener.
//!
//! A replica that comes back while it still drains is the same endpoint
//! again (its id, its in-flight load), no longer draining, its task
//! cancelled; one drained by hand stays drained, whatever discovery does
//! meanwhile, until the drain is undone by hand.
//!
//! Every change is made under the runtime's membership lock (see
//! `pool.rs`), so a drain by hand never races a reconcile. The tracker is
//! bounded: past [`MAX_DRAINING`] replicas draining at once in a pool, a
//! replica that leaves with requests in flight is evacuated at once and
//! not followed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use picker::Endpoint;

use crate::telemetry::{DrainGauges, EndpointSeries};

/// Replicas followed while they drain, per pool. A fleet that replaces
/// all its pods at once stays far below it; a churn of addresses beyond
/// it must not grow tasks without bound.
pub const MAX_DRAINING: usize = 4096;

/// Addresses drained by hand remembered per pool while they are away.
const MAX_BY_HAND: usize = 4096;

/// Why a replica drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A config or discovery no longer lists it.
    Removed,
    /// Its pod is terminating.
    Terminating,
    /// An operator drained it; it is still a member of the pool.
    ByHand,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Removed => "removed",
            Why::Terminating => "terminating",
            Why::ByHand => "by-hand",
        }
    }
}

/// A draining replica as the admin listener shows it.
#[derive(Debug, Clone)]
pub struct DrainState {
    pub addr: Arc<str>,
    pub why: Why,
    /// Still a member of the pool (drained by hand); else it left and is
    /// forgotten once idle.
    pub member: bool,
    /// Drained by hand (also when it has left the pool since).
    pub by_hand: bool,
    pub evacuating: bool,
    /// This gateway's requests still running on it.
    pub inflight: u64,
    pub draining_for: Duration,
    /// Until it is evacuated; `None` once it is.
    pub evacuate_in: Option<Duration>,
}

/// The draining replicas of one pool.
pub struct Drains {
    pool: Arc<str>,
    series: EndpointSeries,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    /// By address.
    entries: HashMap<Arc<str>, Entry>,
    /// Addresses drained by hand, until undone: still drained if they
    /// leave and come back.
    by_hand: HashSet<Arc<str>>,
    next_id: u64,
}

struct Entry {
    endpoint: Arc<Endpoint>,
    why: Why,
    since: Instant,
    deadline: Instant,
    /// Tells a finishing task from the one that replaced it.
    id: u64,
    /// Waits for the last release (and the deadline); `None` once done.
    task: Option<Task>,
}

impl Entry {
    fn member(&self) -> bool {
        self.why == Why::ByHand
    }
}

/// A drain task, cancelled when dropped (unless let go).
struct Task(Option<tokio::task::JoinHandle<()>>);

impl Task {
    /// Let the task run to its end without this handle.
    fn let_go(mut self) {
        self.0.take();
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        if let Some(handle) = &self.0 {
            handle.abort();
        }
    }
}

impl Drains {
    pub fn new(pool: Arc<str>, series: EndpointSeries) -> Self {
        Self {
            pool,
            series,
            state: Arc::default(),
        }
    }

    /// `endpoint` left the pool: it drains until its last request ends,
    /// evacuated at `now + deadline` or at `kill` (a terminating pod's
    /// end, less a margin), whichever comes first, then is forgotten. An
    /// idle one is forgotten at once. Needs a Tokio runtime.
    pub fn leave(
        &self,
        endpoint: &Arc<Endpoint>,
        why: Why,
        deadline: Duration,
        kill: Option<Instant>,
    ) {
        let now = Instant::now();
        let mut deadline = now + deadline;
        if let Some(kill) = kill {
            deadline = deadline.min(kill);
        }
        let mut state = self.state.lock();
        endpoint.set_draining(true);
        if let Some(entry) = state.entries.get_mut(&endpoint.addr) {
            // Drained by hand before, or leaving already (now terminating):
            // the earlier deadline holds.
            if why != Why::Removed || entry.why == Why::ByHand {
                entry.why = why;
            }
            if deadline < entry.deadline && entry.task.is_some() {
                entry.deadline = deadline;
                self.restart(&mut state, &endpoint.addr);
            } else if entry.task.is_none() {
                // Drained by hand and idle: nothing runs there.
                state.entries.remove(&endpoint.addr);
                self.forget_series(&endpoint.addr);
            }
            return;
        }
        if endpoint.load.requests() == 0 {
            tracing::info!(pool = %self.pool, replica = %endpoint.addr, why = why.as_str(), "replica left the pool with nothing in flight");
            self.forget_series(&endpoint.addr);
            return;
        }
        if state.entries.len() >= MAX_DRAINING {
            tracing::warn!(pool = %self.pool, replica = %endpoint.addr, limit = MAX_DRAINING, "too many replicas draining: this one is evacuated at once");
            endpoint.evacuate();
            return;
        }
        tracing::info!(
            pool = %self.pool,
            replica = %endpoint.addr,
            why = why.as_str(),
            inflight = endpoint.load.requests(),
            evacuate_in = ?deadline.saturating_duration_since(now),
            "replica draining: no new requests, those in flight finish"
        );
        self.insert(&mut state, endpoint, why, now, deadline);
    }

    /// A replica coming back to the pool: the endpoint it drains under,
    /// if it still does, so its id and in-flight load carry over. It stops
    /// draining unless it was drained by hand.
    pub fn rejoin(&self, addr: &str) -> Option<Arc<Endpoint>> {
        let mut state = self.state.lock();
        let by_hand = state.by_hand.contains(addr);
        let entry = state.entries.get_mut(addr)?;
        if entry.member() {
            // Still a member: not leaving, nothing to rejoin.
            return None;
        }
        let endpoint = Arc::clone(&entry.endpoint);
        if by_hand {
            entry.why = Why::ByHand;
        } else {
            state.entries.remove(addr);
            endpoint.set_draining(false);
            tracing::info!(pool = %self.pool, replica = %addr, "replica back in the pool: draining stopped");
        }
        Some(endpoint)
    }

    /// A newcomer to the pool: drained at once if its address was drained
    /// by hand and not undone.
    pub fn admit(&self, endpoint: &Arc<Endpoint>) {
        let mut state = self.state.lock();
        if state.by_hand.contains(&endpoint.addr) && !state.entries.contains_key(&endpoint.addr) {
            endpoint.set_draining(true);
            let now = Instant::now();
            self.insert(&mut state, endpoint, Why::ByHand, now, now);
        }
    }

    /// Drain `endpoint` by hand, a member of the pool or a replica still
    /// leaving it, evacuated now with `evacuate`, else at `now +
    /// deadline`. Needs a Tokio runtime.
    pub fn drain_by_hand(
        &self,
        endpoint: &Arc<Endpoint>,
        member: bool,
        evacuate: bool,
        deadline: Duration,
    ) -> DrainState {
        let mut state = self.state.lock();
        if state.by_hand.len() < MAX_BY_HAND || state.by_hand.contains(&endpoint.addr) {
            state.by_hand.insert(Arc::clone(&endpoint.addr));
        }
        endpoint.set_draining(true);
        if evacuate {
            endpoint.evacuate();
        }
        let now = Instant::now();
        match state.entries.get_mut(&endpoint.addr) {
            Some(entry) => {
                if evacuate && entry.task.is_some() {
                    entry.deadline = now;
                    self.restart(&mut state, &endpoint.addr);
                }
            }
            None => {
                tracing::info!(pool = %self.pool, replica = %endpoint.addr, evacuate, inflight = endpoint.load.requests(), "replica drained by hand");
                let why = if member { Why::ByHand } else { Why::Removed };
                let deadline = if evacuate { now } else { now + deadline };
                self.insert(&mut state, endpoint, why, now, deadline);
            }
        }
        self.describe(&state, &endpoint.addr, now)
            .expect("the entry was just made")
    }

    /// Undo a drain by hand: a member takes requests again (its task is
    /// cancelled); a replica that has left the pool goes on leaving.
    pub fn undrain_by_hand(&self, endpoint: &Arc<Endpoint>) -> Option<DrainState> {
        let mut state = self.state.lock();
        state.by_hand.remove(&endpoint.addr);
        let now = Instant::now();
        match state.entries.get(&endpoint.addr) {
            Some(entry) if !entry.member() => self.describe(&state, &endpoint.addr, now),
            _ => {
                state.entries.remove(&endpoint.addr);
                endpoint.set_draining(false);
                tracing::info!(pool = %self.pool, replica = %endpoint.addr, "replica undrained by hand");
                None
            }
        }
    }

    /// A leaving replica by address.
    pub fn leaving(&self, addr: &str) -> Option<Arc<Endpoint>> {
        let state = self.state.lock();
        state
            .entries
            .get(addr)
            .filter(|e| !e.member())
            .map(|e| Arc::clone(&e.endpoint))
    }

    /// The draining state of `addr`, if it drains.
    pub fn state_of(&self, addr: &str) -> Option<DrainState> {
        self.describe(&self.state.lock(), addr, Instant::now())
    }

    /// Every draining replica, members and leavers, by address.
    pub fn states(&self) -> Vec<DrainState> {
        let state = self.state.lock();
        let now = Instant::now();
        let mut out: Vec<DrainState> = state
            .entries
            .keys()
            .filter_map(|addr| self.describe(&state, addr, now))
            .collect();
        out.sort_by(|a, b| a.addr.cmp(&b.addr));
        out
    }

    /// Replicas that left the pool and still drain, and of those the
    /// evacuating ones.
    pub fn leaving_counts(&self) -> (usize, usize) {
        let state = self.state.lock();
        let leaving = state.entries.values().filter(|e| !e.member());
        let evacuating = leaving.clone().filter(|e| e.endpoint.evacuating()).count();
        (leaving.count(), evacuating)
    }

    fn describe(&self, state: &State, addr: &str, now: Instant) -> Option<DrainState> {
        let entry = state.entries.get(addr)?;
        let evacuating = entry.endpoint.evacuating();
        Some(DrainState {
            addr: Arc::clone(&entry.endpoint.addr),
            why: entry.why,
            member: entry.member(),
            by_hand: state.by_hand.contains(addr),
            evacuating,
            inflight: entry.endpoint.load.requests(),
            draining_for: now.saturating_duration_since(entry.since),
            evacuate_in: (!evacuating).then(|| entry.deadline.saturating_duration_since(now)),
        })
    }

    fn insert(
        &self,
        state: &mut State,
        endpoint: &Arc<Endpoint>,
        why: Why,
        since: Instant,
        deadline: Instant,
    ) {
        state.next_id += 1;
        let id = state.next_id;
        state.entries.insert(
            Arc::clone(&endpoint.addr),
            Entry {
                endpoint: Arc::clone(endpoint),
                why,
                since,
                deadline,
                id,
                task: Some(self.spawn(endpoint, deadline, id)),
            },
        );
    }

    /// Replace an entry's task after its deadline moved.
    fn restart(&self, state: &mut State, addr: &str) {
        state.next_id += 1;
        let id = state.next_id;
        if let Some(entry) = state.entries.get_mut(addr) {
            entry.id = id;
            entry.task = Some(self.spawn(&entry.endpoint, entry.deadline, id));
        }
    }

    fn spawn(&self, endpoint: &Arc<Endpoint>, deadline: Instant, id: u64) -> Task {
        let endpoint = Arc::clone(endpoint);
        let tracker = Finisher {
            pool: Arc::clone(&self.pool),
            series: self.series.clone(),
            state: Arc::downgrade(&self.state),
        };
        // On Tokio's clock, which tests may pause.
        let deadline =
            tokio::time::Instant::now() + deadline.saturating_duration_since(Instant::now());
        Task(Some(tokio::spawn(async move {
            tokio::select! {
                // An idle replica is never evacuated, whatever the deadline.
                biased;
                () = endpoint.idle() => {}
                () = tokio::time::sleep_until(deadline) => {
                    if !endpoint.evacuating() {
                        tracing::info!(
                            pool = %tracker.pool,
                            replica = %endpoint.addr,
                            inflight = endpoint.load.requests(),
                            "drain deadline: the replica's requests in flight move to other replicas"
                        );
                        endpoint.evacuate();
                    }
                    endpoint.idle().await;
                }
            }
            tracker.finished(&endpoint.addr, id);
        })))
    }

    fn forget_series(&self, addr: &str) {
        self.series.forget(&self.pool, addr);
    }
}

impl DrainGauges for Drains {
    fn leaving(&self) -> (usize, usize) {
        self.leaving_counts()
    }
}

/// What a drain task reports to when its replica is idle; it holds the
/// tracker weakly, so a pool that is gone stops nothing.
struct Finisher {
    pool: Arc<str>,
    series: EndpointSeries,
    state: Weak<Mutex<State>>,
}

impl Finisher {
    /// The replica of task `id` has nothing in flight: forget it if it
    /// left the pool, else (drained by hand) it just stays drained.
    fn finished(&self, addr: &str, id: u64) {
        let Some(state) = self.state.upgrade() else {
            return;
        };
        let mut state = state.lock();
        let Some(entry) = state.entries.get_mut(addr).filter(|e| e.id == id) else {
            // Replaced or cancelled meanwhile.
            return;
        };
        // Its own handle, let go rather than aborting this very task.
        if let Some(task) = entry.task.take() {
            task.let_go();
        }
        if entry.member() {
            tracing::info!(pool = %self.pool, replica = %addr, "replica drained: nothing in flight");
            return;
        }
        state.entries.remove(addr);
        self.series.forget(&self.pool, addr);
        tracing::info!(pool = %self.pool, replica = %addr, "replica left the pool: its last request ended");
    }
}
