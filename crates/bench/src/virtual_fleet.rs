//! A fleet in virtual time: the simulator's engine model per replica, the
//! gateway's picker and flow control, and a modelled scrape loop, driven by
//! one discrete-event loop.
//!
//! What is modelled, and how it maps to the live gateway:
//! - **Replicas**: one [`Engine`] each, configured exactly as a simulated
//!   replica with the same spec (per-token events off: first token and
//!   completion are enough for every reported figure).
//! - **Picking**: the gateway's own [`picker::Picker`], given the picker
//!   config the gateway derives from the same config document, a clock
//!   that is a fixed `Instant` plus the virtual time, and a seeded RNG for
//!   ties. The load guard of each request is held until its engine reports
//!   it finished, as the gateway holds it until the response body ends.
//! - **Features**: every replica is scraped every `scrape_interval`, each at
//!   its own phase. A scrape is a snapshot of the engine's stats mapped the
//!   way the vLLM dialect reads `/metrics`; the picker sees it
//!   `scrape_delay` later and keeps it until the next one.
//! - **Flow control**: when the picker finds every replica saturated, the
//!   request waits in the gateway's own queue ([`picker::flow::Queue`]) and
//!   is dispatched as soon as a replica has room (new signals or a finished
//!   request), or refused with 429 when its wait expires or the queue is
//!   full: the gateway's defaults for one priority band and one fairness
//!   key, so first come first served.
//! - **Latency models**: when a request ends, the chosen replica's latency
//!   model learns its features at the pick with the observed time to first
//!   token (from sending it to the replica) and mean time per later token,
//!   as the gateway teaches it after each answer; the `predicted` policy
//!   ranks replicas by these models.
//! - **Clients**: abort a request that has not completed within the client
//!   timeout.
//! - **KV events** (`exact_prefix`): the picker asks each candidate's
//!   engine what its prefix cache holds of the prompt at the moment of the
//!   pick, as the gateway's event index would know it if every replica
//!   published its events and none were lost or late: the best case of
//!   routing on events.
//!
//! Each event costs O(log n) heap work plus the engine step or the pick
//! itself; idle replicas cost nothing between their scrapes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use picker::flow::{FlowKey, Priority, Queue};
use picker::{
    Endpoint, EngineState, ExactPrefix, LatencyFeatures, LoadGuard, Observation, PickError,
    PickRequest, PickerConfig, PrefixConfig,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use sim::engine::{Engine, EngineConfig, EngineEvent, EngineStats, FinishReason, SimRequest};

use crate::flow::FlowLimits;
use crate::stats::Outcome;
use crate::workload::RequestPlan;

/// Timing of the modelled gateway and clients, in simulated seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct VirtualOptions {
    /// Scrape period per replica (the gateway's `metrics.interval`).
    pub scrape_interval: f64,
    /// From the scrape's snapshot to the picker seeing it (request, render,
    /// parse).
    pub scrape_delay: f64,
    /// Clients give up after this long.
    pub client_timeout: f64,
    /// The gateway's admission queue, or `None` to refuse at once.
    pub flow_control: Option<FlowLimits>,
    /// Seeds the picker's tie-breaking.
    pub seed: u64,
    /// Prefix matches from the engines' caches (lossless KV events) in
    /// place of the gateway's approximate index.
    pub exact_prefix: bool,
}

/// A request with everything the gateway and the engine derive from its
/// body, computed ahead of the event loop (on another thread).
#[derive(Debug, Clone)]
pub struct Prepared {
    pub id: u64,
    pub at: f64,
    pub adapter: Option<Arc<str>>,
    pub prompt: Vec<u32>,
    pub prefix_hashes: Vec<u64>,
    pub estimated_tokens: u64,
    pub max_tokens: u32,
    /// Body size, for the admission queue's byte bound.
    pub body_bytes: u64,
    /// The session key the gateway would hash from the body's `user`,
    /// when the policy keeps sessions on their replica.
    pub session: Option<u64>,
}

/// The gateway's guess of a request's tokens: prompt characters / 4 plus
/// the requested output (`gateway::request`).
const CHARS_PER_TOKEN: u64 = 4;
/// JSON framing around the prompt text of a body, roughly.
const BODY_OVERHEAD_BYTES: u64 = 160;

impl Prepared {
    /// What the gateway computes from `plan`'s body: prompt hashes under
    /// `prefix`, the in-flight token estimate; and the token ids a
    /// simulated replica computes.
    pub fn new(plan: &RequestPlan, prefix: &PrefixConfig) -> Self {
        let body = plan.body(true);
        let prefix_hashes =
            picker::prompt_hashes(&plan.model, plan.adapter.as_deref(), &body, prefix);
        let chars = plan.prompt_chars();
        Prepared {
            id: plan.id,
            at: plan.at,
            adapter: plan.adapter.clone(),
            prompt: plan.prompt_ids(),
            prefix_hashes,
            estimated_tokens: chars / CHARS_PER_TOKEN + u64::from(plan.max_tokens),
            max_tokens: plan.max_tokens,
            body_bytes: chars + BODY_OVERHEAD_BYTES,
            session: None,
        }
    }
}

/// The engine state the gateway's vLLM dialect reads from a replica's
/// `/metrics` with these stats (a test checks it against the real render
/// and parse).
pub fn scraped_state(stats: &EngineStats) -> EngineState {
    EngineState {
        waiting: Some(stats.waiting),
        running: Some(stats.running),
        kv_usage: Some(stats.kv_usage),
        block_size: Some(stats.block_size),
        kv_capacity_blocks: Some(stats.num_gpu_blocks),
        resident_adapters: stats.running_adapters.clone(),
        waiting_adapters: stats.waiting_adapters.clone(),
        max_adapters: Some(stats.max_loras),
    }
}

/// Replicas, in fleet order.
pub struct VirtualFleet {
    pub engines: Vec<EngineConfig>,
    /// Adapters registered on every replica.
    pub adapters: Vec<String>,
}

/// What happens at a point in virtual time. The order of the variants is
/// the order at equal times: steps complete before anything looks at the
/// engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// An engine's `next_event_at` (a step ends or starts).
    EngineDue,
    /// A scrape's snapshot becomes visible to the picker.
    Publish,
    /// A scrape takes its snapshot.
    Scrape,
    /// A queued request's wait expires; the target is its queue entry.
    QueueExpiry,
    /// A client gives up.
    ClientTimeout,
}

/// A heap entry: time (as ordered bits of a non-negative f64), kind, and
/// the replica, request or queue entry it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    at: u64,
    kind: Kind,
    target: u64,
}

impl Event {
    fn new(at: f64, kind: Kind, target: u64) -> Self {
        debug_assert!(at >= 0.0 && at.is_finite(), "event time {at}");
        Event {
            at: at.to_bits(),
            kind,
            target,
        }
    }

    fn at(&self) -> f64 {
        f64::from_bits(self.at)
    }
}

struct InFlight {
    arrival: f64,
    /// When it went to its replica (later than `arrival` after a wait in
    /// flow control).
    sent: f64,
    replica: usize,
    first_token: Option<f64>,
    /// Released when the request ends, as the gateway releases it when the
    /// response body ends.
    load: LoadGuard,
    /// The replica's latency features at the pick, which its latency model
    /// learns from with the observed latencies when the request ends.
    latency: Option<LatencyFeatures>,
}

/// The band every request waits in: the one [`FlowLimits`] describes.
const BAND: Priority = Priority::Standard;

/// Run `requests` (in arrival order, ids 0, 1, 2, ...) through the fleet
/// under `picker`; returns one outcome per request, in id order.
pub fn run(
    fleet: &VirtualFleet,
    picker: PickerConfig,
    requests: impl Iterator<Item = Prepared>,
    options: &VirtualOptions,
) -> Vec<Outcome> {
    let mut sim = Simulation::new(fleet, picker, options);
    sim.run(requests);
    sim.outcomes
}

struct Simulation<'a> {
    options: &'a VirtualOptions,
    engines: Vec<Engine>,
    /// The time each engine's live heap entry is for; other entries of
    /// that engine are stale and skipped.
    scheduled: Vec<Option<f64>>,
    endpoints: Vec<Arc<Endpoint>>,
    pool: picker::Picker,
    scrapes: bool,
    /// Snapshots taken and not yet visible.
    unpublished: Vec<Option<EngineState>>,
    /// Engine and scrape events: a few per replica.
    heap: BinaryHeap<Reverse<Event>>,
    /// Queue expiries and client timeouts. Each is its request's arrival
    /// plus a constant, so they come due in the order they were set: a
    /// FIFO each, which keeps the heap small (a million pending timeouts
    /// would make every heap operation a string of cache misses).
    expiries: VecDeque<Event>,
    timeouts: VecDeque<Event>,
    in_flight: HashMap<u64, InFlight>,
    line: Queue<Prepared>,
    /// The one fairness key: requests carry no fairness id.
    line_key: FlowKey,
    outcomes: Vec<Outcome>,
    /// Stands for virtual time 0 on the picker's clock.
    epoch: Instant,
    rng: SmallRng,
    events: Vec<EngineEvent>,
    /// With `exact_prefix`: the fleet's block sizes, and for each the
    /// engine block hashes of the prompt being picked for.
    prompt_hashes: Option<Vec<(u32, Vec<u64>)>>,
}

impl<'a> Simulation<'a> {
    fn new(fleet: &VirtualFleet, picker: PickerConfig, options: &'a VirtualOptions) -> Self {
        let engines: Vec<Engine> = fleet
            .engines
            .iter()
            .map(|cfg| {
                let mut engine = Engine::new(cfg.clone());
                engine.set_token_events(false);
                for adapter in &fleet.adapters {
                    engine.register_adapter(adapter);
                }
                engine
            })
            .collect();
        let endpoints: Vec<Arc<Endpoint>> = (0..engines.len())
            .map(|i| Endpoint::new(i, format!("replica-{i}")))
            .collect();
        let scrapes = picker.policy.uses_signals();
        let n = engines.len();
        let prompt_hashes = options.exact_prefix.then(|| {
            let mut sizes: Vec<u32> = engines.iter().map(|e| e.config().block_size).collect();
            sizes.sort_unstable();
            sizes.dedup();
            sizes.into_iter().map(|size| (size, Vec::new())).collect()
        });
        Simulation {
            options,
            scheduled: vec![None; n],
            pool: picker::Picker::new(picker, endpoints.clone()),
            endpoints,
            engines,
            scrapes,
            unpublished: vec![None; n],
            heap: BinaryHeap::new(),
            expiries: VecDeque::new(),
            timeouts: VecDeque::new(),
            in_flight: HashMap::new(),
            line: Queue::default(),
            line_key: FlowKey::plain(Arc::from("")),
            outcomes: Vec::new(),
            epoch: Instant::now(),
            rng: SmallRng::seed_from_u64(options.seed),
            events: Vec::new(),
            prompt_hashes,
        }
    }

    fn clock(&self, at: f64) -> Instant {
        self.epoch + Duration::from_secs_f64(at)
    }

    fn run(&mut self, requests: impl Iterator<Item = Prepared>) {
        let mut requests = requests.peekable();
        if self.scrapes {
            // The gateway starts routing once every replica has reported
            // (the live runner waits for that too); later scrapes are
            // spread evenly over the interval.
            let n = self.engines.len();
            for replica in 0..n {
                self.publish(replica, 0.0, scraped_state(&self.engines[replica].stats()));
                let phase = self.options.scrape_interval * (replica as f64 + 1.0) / n as f64;
                self.push(phase, Kind::Scrape, replica as u64);
            }
        }
        loop {
            let next_event = self.next_event();
            let next_arrival = requests.peek().map(|r| r.at);
            match (next_arrival, next_event) {
                (Some(a), Some(e)) if a < e.at() => {
                    let request = requests.next().expect("peeked");
                    self.arrive(request);
                }
                (Some(_), None) => {
                    let request = requests.next().expect("peeked");
                    self.arrive(request);
                }
                (_, Some(event)) => {
                    if next_arrival.is_none() && self.in_flight.is_empty() && self.line.is_empty() {
                        // Only scrapes and stale entries are left.
                        break;
                    }
                    self.take(event);
                    self.handle(event);
                }
                (None, None) => break,
            }
        }
    }

    /// The earliest pending event, from the heap or either FIFO.
    fn next_event(&self) -> Option<Event> {
        [
            self.heap.peek().map(|Reverse(e)| *e),
            self.expiries.front().copied(),
            self.timeouts.front().copied(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Remove `event`, the one [`Simulation::next_event`] returned.
    fn take(&mut self, event: Event) {
        match event.kind {
            Kind::QueueExpiry => self.expiries.pop_front(),
            Kind::ClientTimeout => self.timeouts.pop_front(),
            _ => self.heap.pop().map(|Reverse(e)| e),
        };
    }

    fn push(&mut self, at: f64, kind: Kind, target: u64) {
        let event = Event::new(at, kind, target);
        let fifo = match kind {
            Kind::QueueExpiry => &mut self.expiries,
            Kind::ClientTimeout => &mut self.timeouts,
            _ => {
                self.heap.push(Reverse(event));
                return;
            }
        };
        // Requests are queued and dispatched in arrival order, so their
        // deadlines (arrival + a constant) never go backwards.
        debug_assert!(fifo.back().is_none_or(|last| last.at <= event.at));
        fifo.push_back(event);
    }

    fn handle(&mut self, event: Event) {
        let at = event.at();
        match event.kind {
            Kind::EngineDue => self.step(event.target as usize, at),
            Kind::Publish => {
                let replica = event.target as usize;
                if let Some(state) = self.unpublished[replica].take() {
                    self.publish(replica, at, state);
                }
                self.dispatch_line(at);
            }
            Kind::Scrape => {
                let replica = event.target as usize;
                let state = scraped_state(&self.engines[replica].stats());
                self.unpublished[replica] = Some(state);
                self.push(at + self.options.scrape_delay, Kind::Publish, event.target);
                self.push(
                    at + self.options.scrape_interval,
                    Kind::Scrape,
                    event.target,
                );
            }
            Kind::QueueExpiry => {
                if let Some(entry) = self.line.remove(BAND, &self.line_key, event.target) {
                    let request = entry.item;
                    self.outcomes[request.id as usize] = Outcome::rejected(request.at);
                }
            }
            Kind::ClientTimeout => {
                if let Some(flight) = self.in_flight.get(&event.target) {
                    let replica = flight.replica;
                    self.engines[replica].abort(at, event.target);
                    self.reschedule(replica);
                }
            }
        }
    }

    fn publish(&mut self, replica: usize, at: f64, state: EngineState) {
        let observation = Observation {
            state: Some(Arc::new(state)),
            last_good: Some(self.clock(at)),
            last_error: None,
        };
        self.endpoints[replica].observe(observation);
    }

    fn arrive(&mut self, request: Prepared) {
        debug_assert_eq!(request.id as usize, self.outcomes.len(), "ids in order");
        let at = request.at;
        // A placeholder until the request ends.
        self.outcomes.push(Outcome::failed(at));
        if !self.line.is_empty() {
            // Nobody overtakes the line.
            self.enqueue(request);
            return;
        }
        match self.pick(&request, at) {
            Ok(decision) => self.dispatch(request, decision, at),
            // No request carries objectives here; a standard request that
            // none can meet would wait, as for room.
            Err(PickError::Saturated { .. } | PickError::SloUnmet { .. })
                if self.options.flow_control.is_some() =>
            {
                self.enqueue(request);
            }
            Err(PickError::Saturated { .. } | PickError::SloUnmet { .. }) => {
                self.outcomes[request.id as usize] = Outcome::rejected(at);
            }
            Err(PickError::NoReplicas | PickError::NoHealthyReplicas { .. }) => {}
        }
    }

    fn pick(&mut self, request: &Prepared, at: f64) -> Result<picker::Decision, PickError> {
        let now = self.clock(at);
        let exact = holdings(&self.engines, self.prompt_hashes.as_mut(), request);
        pick(&self.pool, &mut self.rng, now, request, exact.as_ref())
    }

    fn dispatch(&mut self, request: Prepared, decision: picker::Decision, at: f64) {
        let load = decision.acquire();
        let latency = decision.latency.map(|(features, _)| features);
        let replica = decision.index();
        self.pool.record(replica, &request.prefix_hashes);
        let id = request.id;
        self.engines[replica].submit(
            at,
            SimRequest {
                id,
                prompt: request.prompt,
                max_tokens: request.max_tokens,
                adapter: request.adapter.as_deref().map(str::to_owned),
                priority: 0,
            },
        );
        self.reschedule(replica);
        self.in_flight.insert(
            id,
            InFlight {
                arrival: request.at,
                sent: at,
                replica,
                first_token: None,
                load,
                latency,
            },
        );
        self.push(
            request.at + self.options.client_timeout,
            Kind::ClientTimeout,
            id,
        );
    }

    fn enqueue(&mut self, request: Prepared) {
        let limits = self
            .options
            .flow_control
            .expect("only queued with flow control");
        if self.line.len(BAND) >= limits.max_queued
            || self.line.bytes(BAND) + request.body_bytes > limits.max_queued_bytes
        {
            self.outcomes[request.id as usize] = Outcome::rejected(request.at);
            return;
        }
        let expires = request.at + limits.max_wait;
        let entry = self
            .line
            .push(BAND, &self.line_key, request.body_bytes, request);
        self.push(expires, Kind::QueueExpiry, entry);
    }

    /// Hand waiting requests to replicas while the picker finds room.
    fn dispatch_line(&mut self, at: f64) {
        let now = self.clock(at);
        while let Some((_, head)) = self.line.head() {
            let exact = holdings(&self.engines, self.prompt_hashes.as_mut(), &head.item);
            match pick(&self.pool, &mut self.rng, now, &head.item, exact.as_ref()) {
                Ok(decision) => {
                    let entry = self.line.pop_head().expect("head exists");
                    self.dispatch(entry.item, decision, at);
                }
                Err(_) => return,
            }
        }
    }

    /// Keep one live heap entry per engine, at its `next_event_at`.
    fn reschedule(&mut self, replica: usize) {
        let next = self.engines[replica].next_event_at();
        if next != self.scheduled[replica] {
            self.scheduled[replica] = next;
            if let Some(at) = next {
                self.push(at, Kind::EngineDue, replica as u64);
            }
        }
    }

    fn step(&mut self, replica: usize, at: f64) {
        if self.scheduled[replica] != Some(at) {
            return; // superseded entry
        }
        self.scheduled[replica] = None;
        let mut events = std::mem::take(&mut self.events);
        self.engines[replica].advance(at, &mut events);
        let mut released = false;
        for event in events.drain(..) {
            released |= self.on_engine_event(event);
        }
        self.events = events;
        self.reschedule(replica);
        if released {
            self.dispatch_line(at);
        }
    }

    /// Returns whether a request ended (and released its load).
    fn on_engine_event(&mut self, event: EngineEvent) -> bool {
        match event {
            EngineEvent::FirstToken { id, at, .. } => {
                if let Some(flight) = self.in_flight.get_mut(&id) {
                    flight.first_token = Some(at);
                    flight.load.answered();
                }
                false
            }
            EngineEvent::Token { .. } => false,
            EngineEvent::Finished {
                id,
                at,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                reason,
            } => {
                let Some(flight) = self.in_flight.remove(&id) else {
                    return false;
                };
                let arrival = flight.arrival;
                let ttft = flight.first_token.map(|t| t - arrival);
                // What the gateway measures of the replica's speed, as
                // `Record` does at the end of an answer.
                let endpoint = flight.load.endpoint();
                endpoint.observe_answer(at - flight.sent, u64::from(completion_tokens));
                // And what it measures of the replica's latency, from
                // sending the request: the first token, then the mean gap
                // between the others.
                if let Some(features) = &flight.latency {
                    let first = flight.first_token;
                    let replica_ttft = first.map(|t| t - flight.sent);
                    let itl = first
                        .filter(|_| completion_tokens > 1)
                        .map(|t| (at - t) / f64::from(completion_tokens - 1));
                    endpoint.latency().observe(features, replica_ttft, itl);
                }
                self.outcomes[id as usize] = match (reason, ttft) {
                    (FinishReason::Length, Some(ttft)) => Outcome::completed(
                        arrival,
                        ttft,
                        at - arrival,
                        completion_tokens,
                        prompt_tokens,
                        cached_tokens,
                    ),
                    _ => Outcome::timed_out(arrival, ttft),
                };
                true
            }
            EngineEvent::Rejected { id, .. } => {
                if let Some(flight) = self.in_flight.remove(&id) {
                    self.outcomes[id as usize] = Outcome::failed(flight.arrival);
                }
                true
            }
        }
    }
}

/// What each engine's prefix cache holds of one prompt, read at the pick:
/// the share of the prompt's blocks lossless KV events would report.
struct EngineHoldings<'a> {
    /// By endpoint index (the fleet's order).
    engines: &'a [Engine],
    /// The prompt's block hashes per block size of the fleet.
    hashes: &'a [(u32, Vec<u64>)],
}

impl ExactPrefix for EngineHoldings<'_> {
    fn shares(&self, endpoints: &[usize], out: &mut [Option<f64>]) {
        for (&index, share) in endpoints.iter().zip(out.iter_mut()) {
            let engine = &self.engines[index];
            let size = engine.config().block_size;
            let Some((_, hashes)) = self.hashes.iter().find(|(s, _)| *s == size) else {
                continue;
            };
            // A prompt of no full block is held by everyone alike.
            *share = Some(match hashes.len() {
                0 => 1.0,
                blocks => engine.cached_prefix_blocks(hashes) as f64 / blocks as f64,
            });
        }
    }
}

/// With `exact_prefix` (`hashes` kept), what `engines` hold of
/// `request`'s prompt.
fn holdings<'a>(
    engines: &'a [Engine],
    hashes: Option<&'a mut Vec<(u32, Vec<u64>)>>,
    request: &Prepared,
) -> Option<EngineHoldings<'a>> {
    let hashes = hashes?;
    for (size, hashes) in hashes.iter_mut() {
        *hashes = Engine::prompt_block_hashes(&request.prompt, request.adapter.as_deref(), *size);
    }
    Some(EngineHoldings { engines, hashes })
}

impl std::fmt::Debug for EngineHoldings<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineHoldings")
            .field("engines", &self.engines.len())
            .field("hashes", &self.hashes)
            .finish()
    }
}

fn pick(
    pool: &picker::Picker,
    rng: &mut SmallRng,
    now: Instant,
    request: &Prepared,
    exact_prefix: Option<&EngineHoldings<'_>>,
) -> Result<picker::Decision, PickError> {
    let pick = PickRequest {
        adapter: request.adapter.as_deref(),
        prefix_hashes: &request.prefix_hashes,
        estimated_tokens: request.estimated_tokens,
        context_tokens: 0,
        explain: false,
        session: request.session,
        // One band, filling replicas to the pool's bound (live runs put
        // the bench's requests in `standard`, which stops short of it).
        queue_share: None,
        exact_prefix: exact_prefix.map(|e| e as &dyn ExactPrefix),
        prompt_tokens: request
            .estimated_tokens
            .saturating_sub(u64::from(request.max_tokens)),
        expected_output_tokens: u64::from(request.max_tokens),
        slo: None,
    };
    pool.pick(&pick, now, &[], rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Status;

    #[test]
    fn scraped_state_matches_what_the_gateway_parses_from_metrics() {
        let mut stats = EngineStats {
            waiting: 3,
            running: 17,
            kv_usage: 0.421_875,
            num_gpu_blocks: 25_919,
            block_size: 16,
            running_adapters: vec!["lora-01".into(), "lora-03".into()],
            waiting_adapters: vec!["lora-07".into()],
            max_loras: 4,
            ..EngineStats::default()
        };
        let identity = sim::metrics::ReplicaIdentity {
            model_name: "meta-llama/Llama-3.1-8B-Instruct".into(),
            max_model_len: 131_072,
            gpu_memory_utilization: 0.9,
            enable_prefix_caching: true,
            started_unix: 1_700_000_000.0,
        };
        let mut exporter = sim::metrics::Exporter::new(sim::Dialect::Vllm, identity.clone());
        let requests = sim::metrics::RequestTracker::new(
            sim::metrics::latency_buckets(sim::Dialect::Vllm),
            131_072,
        );
        let text = exporter.render(&stats, requests.totals(), 1_700_000_100.0);
        let parsed = signals::Dialect::Vllm.extract(&text).unwrap();
        assert_eq!(parsed, scraped_state(&stats));

        // And without LoRA in use.
        stats.running_adapters.clear();
        stats.waiting_adapters.clear();
        stats.max_loras = 1;
        let mut exporter = sim::metrics::Exporter::new(sim::Dialect::Vllm, identity);
        let text = exporter.render(&stats, requests.totals(), 1_700_000_200.0);
        let parsed = signals::Dialect::Vllm.extract(&text).unwrap();
        assert_eq!(parsed, scraped_state(&stats));
    }

    fn fleet(replicas: usize) -> VirtualFleet {
        let cfg = EngineConfig::new("h100", "llama-3.1-8b", None).unwrap();
        VirtualFleet {
            engines: vec![cfg; replicas],
            adapters: Vec::new(),
        }
    }

    fn options() -> VirtualOptions {
        VirtualOptions {
            scrape_interval: 0.05,
            scrape_delay: 0.002,
            client_timeout: 60.0,
            flow_control: None,
            seed: 1,
            exact_prefix: false,
        }
    }

    fn request(id: u64, at: f64, prompt_tokens: u32, max_tokens: u32) -> Prepared {
        Prepared {
            id,
            at,
            adapter: None,
            prompt: (0..prompt_tokens)
                .map(|t| (id as u32) * 100_000 + t)
                .collect(),
            prefix_hashes: Vec::new(),
            estimated_tokens: u64::from(prompt_tokens + max_tokens),
            max_tokens,
            body_bytes: 1000,
            session: None,
        }
    }

    #[test]
    fn every_request_completes_with_consistent_timings() {
        let requests: Vec<Prepared> = (0..200)
            .map(|i| request(i, i as f64 * 0.02, 300, 40))
            .collect();
        for policy in [picker::Policy::RoundRobin, picker::Policy::Scored] {
            let config = PickerConfig {
                policy,
                ..PickerConfig::default()
            };
            let outcomes = run(&fleet(3), config, requests.clone().into_iter(), &options());
            assert_eq!(outcomes.len(), 200);
            for o in &outcomes {
                assert_eq!(o.status, Status::Completed, "{policy}: {o:?}");
                let (ttft, e2e) = (o.ttft.unwrap(), o.e2e.unwrap());
                assert!(ttft > 0.0 && ttft < e2e, "{o:?}");
                assert_eq!(o.output_tokens, 40);
                let itl = o.itl.unwrap();
                // An H100 decode step of an 8B model takes milliseconds.
                assert!((0.001..0.05).contains(&itl), "itl {itl}");
            }
        }
    }

    #[test]
    fn same_inputs_same_outcomes() {
        let requests: Vec<Prepared> = (0..300)
            .map(|i| request(i, i as f64 * 0.005, 200 + (i as u32 % 7) * 100, 30))
            .collect();
        let config = PickerConfig::default();
        let a = run(
            &fleet(4),
            config.clone(),
            requests.clone().into_iter(),
            &options(),
        );
        let b = run(&fleet(4), config, requests.into_iter(), &options());
        assert_eq!(a, b);
    }

    #[test]
    fn scored_sends_a_shared_prefix_back_to_the_replica_that_cached_it() {
        use crate::workload::{Message, Role, Text};
        use rand::SeedableRng;

        let mut rng = SmallRng::seed_from_u64(5);
        let document = Arc::new(Text::random(2000, &mut rng));
        let plan = |id: u64, at: f64, rng: &mut SmallRng| RequestPlan {
            id,
            at,
            model: Arc::from("m"),
            adapter: None,
            messages: vec![
                Message {
                    role: Role::System,
                    content: Arc::clone(&document),
                },
                Message {
                    role: Role::User,
                    content: Arc::new(Text::random(50, rng)),
                },
            ],
            max_tokens: 10,
            session: id,
        };
        let prefix = PrefixConfig::default();
        let requests: Vec<Prepared> = (0..4)
            .map(|i| Prepared::new(&plan(i, i as f64, &mut rng), &prefix))
            .collect();
        let cached = |policy| {
            let config = PickerConfig {
                policy,
                ..PickerConfig::default()
            };
            run(&fleet(4), config, requests.clone().into_iter(), &options())
                .iter()
                .map(|o| o.cached_tokens)
                .collect::<Vec<_>>()
        };
        // Round-robin sends each request to a new replica: nothing cached.
        assert_eq!(cached(picker::Policy::RoundRobin), [0, 0, 0, 0]);
        // Scored follows the document: every later request hits it.
        let scored = cached(picker::Policy::Scored);
        assert_eq!(scored[0], 0);
        assert!(scored[1..].iter().all(|&c| c >= 1984), "{scored:?}");
    }

    #[test]
    fn scored_events_finds_a_prompt_where_the_engine_holds_it() {
        // Each prompt twice, the second time under prefix hashes unrelated
        // to the first's: the approximate index cannot follow it, the
        // engines' caches can.
        let prompts = 8;
        let mut requests: Vec<Prepared> = (0..prompts)
            .map(|k| Prepared {
                prefix_hashes: (0..32).map(|b| 1_000 * k + b + 1).collect(),
                ..request(k, k as f64, 512, 4)
            })
            .collect();
        for k in 0..prompts {
            requests.push(Prepared {
                prompt: requests[k as usize].prompt.clone(),
                prefix_hashes: (0..32).map(|b| 1_000_000 + 1_000 * k + b).collect(),
                ..request(prompts + k, 20.0 + k as f64, 512, 4)
            });
        }
        let hits = |exact_prefix| {
            let options = VirtualOptions {
                exact_prefix,
                ..options()
            };
            let outcomes = run(
                &fleet(4),
                PickerConfig::default(),
                requests.clone().into_iter(),
                &options,
            );
            assert!(outcomes.iter().all(|o| o.status == Status::Completed));
            outcomes[prompts as usize..]
                .iter()
                .filter(|o| o.cached_tokens >= 496)
                .count()
        };
        assert_eq!(
            hits(true),
            prompts as usize,
            "every repeat finds its prompt"
        );
        assert!(hits(false) < prompts as usize, "the guess cannot");
    }

    #[test]
    fn engine_holdings_are_shares_of_the_prompts_blocks() {
        let cfg = EngineConfig::new("h100", "llama-3.1-8b", None).unwrap();
        let mut engines = vec![Engine::new(cfg.clone()), Engine::new(cfg)];
        let prompt: Vec<u32> = (0..640).collect();
        engines[1].submit(
            0.0,
            SimRequest {
                id: 1,
                prompt: prompt[..320].to_vec(),
                max_tokens: 1,
                adapter: None,
                priority: 0,
            },
        );
        while let Some(t) = engines[1].next_event_at() {
            engines[1].advance(t, &mut Vec::new());
        }
        let mut hashes = vec![(16, Vec::new())];
        let request = Prepared {
            prompt,
            ..request(2, 1.0, 0, 1)
        };
        let held = holdings(&engines, Some(&mut hashes), &request).unwrap();
        let mut shares = [None; 2];
        held.shares(&[1, 0], &mut shares);
        assert_eq!(shares, [Some(0.5), Some(0.0)]);
        assert!(holdings(&engines, None, &request).is_none());
    }

    #[test]
    fn client_timeout_aborts_and_counts_the_request() {
        let requests = vec![request(0, 0.0, 100, 5000)];
        let options = VirtualOptions {
            client_timeout: 1.0,
            ..options()
        };
        let outcomes = run(
            &fleet(1),
            PickerConfig::default(),
            requests.into_iter(),
            &options,
        );
        assert_eq!(outcomes[0].status, Status::TimedOut);
        assert!(outcomes[0].ttft.is_some(), "the first token came in time");
    }

    #[test]
    fn saturated_fleet_queues_then_refuses_or_dispatches() {
        // A tiny KV cache saturates after a few requests.
        let mut cfg = EngineConfig::new("h100", "llama-3.1-8b", None).unwrap();
        cfg.num_gpu_blocks_override = Some(200);
        let fleet = VirtualFleet {
            engines: vec![cfg],
            adapters: Vec::new(),
        };
        let requests: Vec<Prepared> = (0..60)
            .map(|i| request(i, 0.0005 * i as f64, 600, 200))
            .collect();
        let refuse = run(
            &fleet,
            PickerConfig::default(),
            requests.clone().into_iter(),
            &options(),
        );
        let rejected = refuse
            .iter()
            .filter(|o| o.status == Status::Rejected)
            .count();
        assert!(rejected > 0, "some requests see a saturated fleet");

        let queue = VirtualOptions {
            flow_control: Some(FlowLimits {
                max_wait: 600.0,
                max_queued: 10_000,
                max_queued_bytes: u64::MAX,
            }),
            client_timeout: 1_000.0,
            ..options()
        };
        let queued = run(
            &fleet,
            PickerConfig::default(),
            requests.into_iter(),
            &queue,
        );
        assert!(
            queued.iter().all(|o| o.status == Status::Completed),
            "with a patient queue every request is served"
        );
    }
}
