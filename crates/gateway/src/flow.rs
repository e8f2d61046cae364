//! The admit stage: flow control in front of the picker.
//!
//! When the picker finds a replica with room, the request goes straight
//! through. When every replica is saturated, the request waits here instead
//! of being refused: strict priority between bands, round-robin between
//! fairness keys, FIFO within a key. A dispatcher per pool hands waiting
//! requests a replica as soon as one has room — woken by fresh signals from
//! a scrape or by an in-flight request finishing, never by a polling tick.
//! Every waiting request ends in exactly one outcome: dispatched, refused
//! with a reason, or removed because its client left.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use config::Priority;
use config::defaults::BAND_ACTIVITY_WINDOW;
use parking_lot::Mutex;
use picker::flow::{FlowKey, Queue};
use picker::{Decision, LoadGuard, PickError, PickRequest};
use prometheus_client::metrics::histogram::Histogram;
use tokio::sync::{Notify, oneshot};

use crate::generation::wake::{self, ScalerSlot, Wake};

use crate::auth::Identity;
use crate::error::{ApiError, DropReason};
use crate::telemetry::ColdStats;

pub const PRIORITY_HEADER: &str = "x-infergate-priority";
pub const FAIRNESS_HEADER: &str = "x-infergate-fairness-id";
/// Longest fairness id kept; longer ids are cut (they only group requests).
const MAX_FAIRNESS_ID: usize = 128;

thread_local! {
    static NO_KEY: Arc<str> = Arc::from("");
}

/// A request's place in flow control: its band, its fairness key (its
/// tenant, and the client's key within it), the bytes it holds while
/// waiting, and its band's limits as the request's generation of the
/// config sets them.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub band: Priority,
    pub key: FlowKey,
    pub bytes: u64,
    /// Share of a replica's saturation queue depth the band may fill.
    pub queue_share: f64,
    max_wait: Duration,
    max_queued: usize,
    max_queued_bytes: u64,
}

impl Ticket {
    /// The band comes from the model's objective; the header may lower it,
    /// and raise it only when the config allows; neither lifts it above
    /// what the caller's tenant (and token) may use. The client's fairness
    /// id only divides its own tenant's turns.
    pub fn from_request(
        headers: &http::HeaderMap,
        model: &str,
        objectives: &BTreeMap<String, Priority>,
        flow_control: &config::FlowControl,
        bytes: u64,
        caller: &Identity,
    ) -> Result<Self, ApiError> {
        let configured = objectives.get(model).copied().unwrap_or_default();
        let band = match headers.get(PRIORITY_HEADER).map(|v| v.as_bytes()) {
            None => configured,
            Some(v) => {
                let asked = std::str::from_utf8(v)
                    .ok()
                    .and_then(Priority::parse)
                    .ok_or_else(|| {
                        ApiError::invalid_request(format!(
                            "{PRIORITY_HEADER} must be critical, standard or sheddable"
                        ))
                    })?;
                if asked < configured && !flow_control.header_may_raise {
                    configured
                } else {
                    asked
                }
            }
        };
        // `Critical` is the least: the ceiling is the most urgent allowed.
        let band = band.max(caller.max_priority());
        let key = match headers.get(FAIRNESS_HEADER).map(|v| v.as_bytes()) {
            Some(b) => Arc::from(String::from_utf8_lossy(&b[..b.len().min(MAX_FAIRNESS_ID)])),
            // Most requests carry no key: they share one, without an
            // allocation each.
            None => NO_KEY.with(Arc::clone),
        };
        let key = caller.flow_key(key);
        let limits = flow_control.band(band);
        Ok(Self {
            band,
            key,
            bytes,
            queue_share: limits.queue_share(band),
            max_wait: limits.max_wait(band),
            max_queued: limits.max_queued(),
            max_queued_bytes: limits.max_queued_bytes(),
        })
    }
}

/// What a waiting request needs the dispatcher to pick for it.
#[derive(Debug, Clone)]
pub struct OwnedPick {
    pub adapter: Option<String>,
    pub prefix_hashes: Arc<[u64]>,
    pub estimated_tokens: u64,
    /// Prompt and completion tokens the replica must hold.
    pub context_tokens: u64,
    pub explain: bool,
    /// The request's session key, hashed.
    pub session: Option<u64>,
    /// Its band's share of the saturation queue depth.
    pub queue_share: Option<f64>,
    /// What the replicas' KV-cache events say they hold of the prompt,
    /// for a pool that follows them.
    pub exact_prefix: Option<Arc<dyn picker::ExactPrefix>>,
    /// Estimated prompt tokens, and the completion's expected length (0:
    /// unknown), for the latency predictions.
    pub prompt_tokens: u64,
    pub expected_output_tokens: u64,
    /// The request's latency objectives.
    pub slo: Option<picker::Slo>,
}

impl OwnedPick {
    pub fn as_request(&self) -> PickRequest<'_> {
        PickRequest {
            adapter: self.adapter.as_deref(),
            prefix_hashes: &self.prefix_hashes,
            estimated_tokens: self.estimated_tokens,
            context_tokens: self.context_tokens,
            explain: self.explain,
            session: self.session,
            queue_share: self.queue_share,
            exact_prefix: self.exact_prefix.as_deref(),
            prompt_tokens: self.prompt_tokens,
            expected_output_tokens: self.expected_output_tokens,
            slo: self.slo,
        }
    }
}

/// A replica chosen for a request, with the request's load on it.
pub struct Admitted {
    pub decision: Decision,
    pub lease: Lease,
    pub queue_wait: Duration,
}

/// The request's share of its replica's load. When it drops (the response
/// ended, failed, or the client left) the load is released and waiting
/// requests get a chance at the freed room.
pub struct Lease {
    load: Option<LoadGuard>,
    admission: Arc<Admission>,
}

impl Lease {
    /// The replica sent the first byte of its response; see
    /// [`LoadGuard::answered`].
    pub fn answered(&mut self) {
        if let Some(load) = &mut self.load {
            load.answered();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        drop(self.load.take());
        self.admission.wake();
    }
}

struct Waiter {
    tx: oneshot::Sender<Admitted>,
    pick: OwnedPick,
    /// Replicas it must not go to: a continuation's, which failed it.
    tried: Vec<usize>,
    since: Instant,
}

/// What requests do while the pool has no ready replica (config
/// `coldStart`).
#[derive(Clone, Default)]
pub struct ColdStart {
    /// How long a request waits for a cold pool; zero refuses at once.
    pub timeout: Duration,
    /// How the pool is woken, once per cold start.
    pub wake: Option<Wake>,
    /// How often a streaming request held for the cold pool hears from
    /// the gateway.
    pub heartbeat: Option<Duration>,
    /// What scales a Kubernetes workload up.
    pub scaler: ScalerSlot,
}

impl ColdStart {
    pub fn new(spec: &config::ColdStart, scaler: &ScalerSlot) -> Self {
        Self {
            timeout: spec.timeout(),
            wake: spec.wake.as_ref().and_then(Wake::new),
            heartbeat: spec.heartbeat,
            scaler: Arc::clone(scaler),
        }
    }
}

/// Counters for the observability stage.
#[derive(Debug, Default)]
pub struct FlowStats {
    /// Requests that waited and were dispatched. (Refusals are counted by
    /// reason in the request metrics, from the error's dropped reason.)
    pub dispatched: AtomicU64,
    /// Requests whose client left while they waited.
    pub abandoned: AtomicU64,
}

/// Flow control for one pool.
pub struct Admission {
    picker: Arc<picker::Picker>,
    queue: Mutex<Queue<Waiter>>,
    /// Waiting requests per band, readable without the lock.
    waiting: [AtomicUsize; 3],
    /// When a request of each band last arrived, in ms since `epoch` plus
    /// one (0: never), for the bands' queue shares.
    arrived: [AtomicU64; 3],
    epoch: Instant,
    wake: Notify,
    pick_duration: Histogram,
    stats: FlowStats,
    cold: arc_swap::ArcSwap<ColdStart>,
    /// A wake-up was asked for since the pool last had a ready replica.
    woken: AtomicBool,
    cold_waiting: AtomicUsize,
    cold_starts: AtomicU64,
    /// When the cold start under way began; the durations of those done.
    cold_since: Mutex<Option<Instant>>,
    cold_durations: Mutex<(Option<f64>, f64)>,
    /// When the last request arrived, in ms since `epoch` plus one (0:
    /// never).
    last_request: AtomicU64,
}

impl crate::telemetry::FlowGauges for Admission {
    fn queued(&self, band: Priority) -> (usize, u64) {
        Admission::queued(self, band)
    }
    fn dispatched(&self) -> u64 {
        self.stats.dispatched.load(Ordering::Relaxed)
    }
    fn abandoned(&self) -> u64 {
        self.stats.abandoned.load(Ordering::Relaxed)
    }
    fn cold(&self) -> ColdStats {
        let last = self.last_request.load(Ordering::Relaxed);
        let (last_duration, durations_sum) = *self.cold_durations.lock();
        ColdStats {
            last_duration,
            durations_sum,
            waiting: self.cold_waiting.load(Ordering::Relaxed),
            starts: self.cold_starts.load(Ordering::Relaxed),
            idle_seconds: (last > 0).then(|| {
                let now = self.epoch.elapsed().as_millis() as u64 + 1;
                now.saturating_sub(last) as f64 / 1e3
            }),
        }
    }
}

impl Admission {
    /// `pick_duration` times every pick: a request's first, its retries,
    /// and those the dispatcher makes for waiting requests.
    pub fn new(picker: Arc<picker::Picker>, pick_duration: Histogram) -> Arc<Self> {
        Arc::new(Self {
            picker,
            pick_duration,
            queue: Mutex::new(Queue::default()),
            waiting: Default::default(),
            arrived: Default::default(),
            epoch: Instant::now(),
            wake: Notify::new(),
            stats: FlowStats::default(),
            cold: arc_swap::ArcSwap::from_pointee(ColdStart::default()),
            woken: AtomicBool::new(false),
            cold_waiting: AtomicUsize::new(0),
            cold_starts: AtomicU64::new(0),
            cold_since: Mutex::new(None),
            cold_durations: Mutex::new((None, 0.0)),
            last_request: AtomicU64::new(0),
        })
    }

    /// Apply a generation's `coldStart` settings.
    pub fn set_cold_start(&self, cold: ColdStart) {
        self.cold.store(Arc::new(cold));
    }

    /// How long requests wait for the pool while it has no ready replica
    /// (reachable and not draining); `None` while it has one, or when
    /// requests do not wait for a cold pool.
    fn cold_wait(&self) -> Option<Duration> {
        let timeout = self.cold.load().timeout;
        let warm = self
            .picker
            .endpoints()
            .iter()
            .any(|e| e.is_reachable() && !e.draining());
        (!warm && !timeout.is_zero()).then_some(timeout)
    }

    /// While the pool is cold and requests wait for it: how often a
    /// waiting stream gets a heartbeat, when the pool sends them.
    pub fn cold_heartbeat(&self) -> Option<Duration> {
        self.cold_wait()?;
        self.cold.load().heartbeat
    }

    /// Wake the cold pool, once per cold start: the pool's webhook is
    /// called in the background, with a bounded retry. Without one, an
    /// external autoscaler brings the replicas (reading the metrics).
    fn wake_cold_pool(&self, pool_name: &str) {
        if self.woken.swap(true, Ordering::Relaxed) {
            return;
        }
        self.cold_starts.fetch_add(1, Ordering::Relaxed);
        *self.cold_since.lock() = Some(Instant::now());
        tracing::info!(
            pool = pool_name,
            "requests wait for the pool's first ready replica"
        );
        let cold = self.cold.load();
        if let Some(how) = cold.wake.clone() {
            tokio::spawn(wake::wake(
                Arc::from(pool_name),
                how,
                Arc::clone(&cold.scaler),
            ));
        }
    }

    /// Waiting requests and their bytes in `band`.
    pub fn queued(&self, band: Priority) -> (usize, u64) {
        let q = self.queue.lock();
        (q.len(band), q.bytes(band))
    }

    /// Something may have freed room (new signals, a finished request).
    pub fn wake(&self) {
        if self.waiting.iter().any(|w| w.load(Ordering::Relaxed) > 0) {
            self.wake.notify_one();
        }
    }

    /// The share of replica queues `ticket`'s request may fill: its band's,
    /// while a request of a higher band has arrived at the pool within
    /// [`BAND_ACTIVITY_WINDOW`]; all of it otherwise, since room kept for
    /// traffic that does not come is capacity lost.
    fn queue_share(&self, ticket: &Ticket) -> Option<f64> {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let band = ticket.band as usize;
        self.arrived[band].store(now, Ordering::Relaxed);
        let window = BAND_ACTIVITY_WINDOW.as_millis() as u64;
        let higher_active = self.arrived[..band].iter().any(|at| {
            let at = at.load(Ordering::Relaxed);
            at != 0 && now.saturating_sub(at) <= window
        });
        (higher_active && ticket.queue_share < 1.0).then_some(ticket.queue_share)
    }

    /// Pick a replica now, skipping `tried`; no queueing (retries use it).
    pub fn pick_now(
        self: &Arc<Self>,
        pick: &PickRequest<'_>,
        tried: &[usize],
    ) -> Result<Admitted, PickError> {
        let started = Instant::now();
        let picked = self
            .picker
            .pick(pick, started, tried, &mut rand::thread_rng());
        self.pick_duration.observe(started.elapsed().as_secs_f64());
        let decision = picked?;
        // The pool has a ready replica: a later cold start wakes it again.
        if self.woken.load(Ordering::Relaxed) {
            self.woken.store(false, Ordering::Relaxed);
            if let Some(since) = self.cold_since.lock().take() {
                let took = since.elapsed().as_secs_f64();
                let mut durations = self.cold_durations.lock();
                *durations = (Some(took), durations.1 + took);
            }
        }
        let load = decision.acquire();
        self.picker.record(decision.index(), pick.prefix_hashes);
        Ok(Admitted {
            decision,
            lease: Lease {
                load: Some(load),
                admission: Arc::clone(self),
            },
            queue_wait: Duration::ZERO,
        })
    }

    /// Admit a request: straight to a replica when one has room and nobody
    /// of the same or a higher band is waiting; otherwise wait in line.
    /// `tried` names replicas it must not go to (a continuation's; empty
    /// for a new request).
    pub async fn admit(
        self: &Arc<Self>,
        pool_name: &str,
        ticket: &Ticket,
        mut pick: OwnedPick,
        tried: &[usize],
    ) -> Result<Admitted, ApiError> {
        pick.queue_share = self.queue_share(ticket);
        self.last_request.store(
            self.epoch.elapsed().as_millis() as u64 + 1,
            Ordering::Relaxed,
        );
        let line_ahead = self.waiting[..=ticket.band as usize]
            .iter()
            .any(|w| w.load(Ordering::Relaxed) > 0);
        if !line_ahead {
            match self.pick_now(&pick.as_request(), tried) {
                Ok(admitted) => return Ok(admitted),
                // No replica is predicted to meet the request's
                // objectives: its band decides. Critical work goes to the
                // best replica anyway; standard work waits for one that
                // can meet them; sheddable work is refused before anything
                // is spent on it.
                Err(PickError::SloUnmet { retry_after, best }) => match ticket.band {
                    Priority::Critical => {
                        pick.slo = None;
                        return self.pick_now(&pick.as_request(), tried).map_err(|e| {
                            self.refuse(
                                DropReason::NoReplicas,
                                ApiError::no_replicas(pool_name, &e.to_string()),
                            )
                        });
                    }
                    Priority::Standard => {}
                    Priority::Sheddable => {
                        return Err(self.refuse(
                            DropReason::SloUnmet,
                            ApiError::slo_unmet(pool_name, &best, retry_after),
                        ));
                    }
                },
                Err(PickError::Saturated { retry_after, .. }) => {
                    if ticket.max_wait.is_zero() {
                        return Err(self.refuse(
                            DropReason::Saturated,
                            ApiError::saturated(pool_name, retry_after),
                        ));
                    }
                }
                // A cold pool: wait in line for its first ready replica.
                Err(_) if self.cold_wait().is_some() => {}
                Err(e) => {
                    return Err(self.refuse(
                        DropReason::NoReplicas,
                        ApiError::no_replicas(pool_name, &e.to_string()),
                    ));
                }
            }
        }
        // Boxed: the waiting path's state would otherwise be part of every
        // request's future, which is moved several times before it runs.
        Box::pin(self.wait_in_line(pool_name, ticket, pick, tried.to_vec())).await
    }

    async fn wait_in_line(
        self: &Arc<Self>,
        pool_name: &str,
        ticket: &Ticket,
        pick: OwnedPick,
        tried: Vec<usize>,
    ) -> Result<Admitted, ApiError> {
        // A cold pool's requests, of every band, wait for its first ready
        // replica as long as its cold start may take.
        let cold = self.cold_wait();
        let max_wait = cold.unwrap_or(ticket.max_wait);
        let _cold_waiting = cold.map(|_| {
            self.wake_cold_pool(pool_name);
            ColdWaiting::new(&self.cold_waiting)
        });
        if max_wait.is_zero() {
            // A band that never waits cannot overtake the line either.
            return Err(self.refuse(
                DropReason::Saturated,
                ApiError::saturated(pool_name, self.retry_after_estimate()),
            ));
        }
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut q = self.queue.lock();
            if q.len(ticket.band) >= ticket.max_queued
                || q.bytes(ticket.band) + ticket.bytes > ticket.max_queued_bytes
            {
                drop(q);
                return Err(self.refuse(
                    DropReason::QueueFull,
                    ApiError::queue_full(
                        pool_name,
                        ticket.band.as_str(),
                        self.retry_after_estimate(),
                    ),
                ));
            }
            let waiter = Waiter {
                tx,
                pick,
                tried,
                since: Instant::now(),
            };
            let id = q.push(ticket.band, &ticket.key, ticket.bytes, waiter);
            self.waiting[ticket.band as usize].fetch_add(1, Ordering::Relaxed);
            id
        };
        // Removes the entry if this future ends early: the client left, or
        // the wait expired.
        let place = Place {
            admission: self,
            ticket,
            id,
        };
        self.wake.notify_one();
        match tokio::time::timeout(max_wait, rx).await {
            Ok(Ok(admitted)) => {
                self.stats.dispatched.fetch_add(1, Ordering::Relaxed);
                Ok(admitted)
            }
            // The dispatcher is gone: the gateway is shutting down.
            Ok(Err(_)) => Err(ApiError::shutting_down()),
            Err(_elapsed) => {
                drop(place);
                if cold.is_some() && self.cold_wait().is_some() {
                    return Err(self.refuse(
                        DropReason::ColdStartTimeout,
                        ApiError::cold_start_timeout(
                            pool_name,
                            max_wait,
                            self.retry_after_estimate(),
                        ),
                    ));
                }
                let usable = self
                    .picker
                    .endpoints()
                    .iter()
                    .any(|e| e.is_reachable() && !e.draining());
                Err(if usable {
                    self.refuse(
                        DropReason::WaitExpired,
                        ApiError::wait_expired(pool_name, max_wait, self.retry_after_estimate()),
                    )
                } else {
                    self.refuse(
                        DropReason::NoReplicas,
                        ApiError::no_replicas(pool_name, "no replica is reachable"),
                    )
                })
            }
        }
    }

    fn refuse(&self, reason: DropReason, error: ApiError) -> ApiError {
        error.with_dropped_reason(reason)
    }

    fn retry_after_estimate(&self) -> Duration {
        let waiting: usize = self.waiting.iter().map(|w| w.load(Ordering::Relaxed)).sum();
        let rate = self
            .picker
            .drain_rate()
            .unwrap_or_else(|| picker::retry_after::assumed_drain(self.picker.endpoints().len()));
        picker::estimate_retry_after(waiting as u64, rate)
    }

    /// Hand waiting requests to replicas while the picker finds room. Runs
    /// until the pool is dropped.
    pub async fn dispatch_forever(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            self.dispatch_ready();
        }
    }

    fn dispatch_ready(self: &Arc<Self>) {
        loop {
            // Look at the head without holding the lock during the pick.
            let (band, key_pick, tried, id) = {
                let mut q = self.queue.lock();
                let Some((band, entry)) = q.head() else {
                    return;
                };
                if entry.item.tx.is_closed() {
                    // Its client left just now; take it out of line here
                    // rather than wait for its own guard to.
                    q.pop_head();
                    self.waiting[band as usize].fetch_sub(1, Ordering::Relaxed);
                    self.stats.abandoned.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                (
                    band,
                    entry.item.pick.clone(),
                    entry.item.tried.clone(),
                    entry.id,
                )
            };
            let admitted = match self.pick_now(&key_pick.as_request(), &tried) {
                Ok(admitted) => admitted,
                // No room yet (or no replica): wait for the next wake-up.
                Err(_) => return,
            };
            let waiter = {
                let mut q = self.queue.lock();
                match q.head() {
                    Some((_, e)) if e.id == id => {
                        self.waiting[band as usize].fetch_sub(1, Ordering::Relaxed);
                        q.pop_head().map(|e| e.item)
                    }
                    // The head changed meanwhile; the pick is released and
                    // the loop looks again.
                    _ => None,
                }
            };
            if let Some(waiter) = waiter {
                let admitted = Admitted {
                    queue_wait: waiter.since.elapsed(),
                    ..admitted
                };
                // If the client has just left, dropping the admission
                // releases the load again.
                let _ = waiter.tx.send(admitted);
            }
        }
    }
}

/// Counts one request in `cold_waiting` while it lives.
struct ColdWaiting<'a>(&'a AtomicUsize);

impl<'a> ColdWaiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count)
    }
}

impl Drop for ColdWaiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A request's place in line; leaving early removes it at once.
struct Place<'a> {
    admission: &'a Admission,
    ticket: &'a Ticket,
    id: u64,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let removed =
            self.admission
                .queue
                .lock()
                .remove(self.ticket.band, &self.ticket.key, self.id);
        if removed.is_some() {
            self.admission.waiting[self.ticket.band as usize].fetch_sub(1, Ordering::Relaxed);
            self.admission
                .stats
                .abandoned
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}
