//! A pool as one generation of the config sees it ([`Pool`]), over its
//! [`Runtime`]: what carries over from one generation of the config
//! to the next, found again by the pool's name — its replicas with their
//! in-flight load, the picker with its prefix index, flow control, each
//! worker's connections, its TLS to `https://` replicas, one scraper
//! per replica, and the replicas draining (drain.rs).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use parking_lot::Mutex;
use picker::Endpoint;
use tokio::task::JoinHandle;

use super::drain::{DrainState, Drains, Why};
use super::prefills::{PrefillReplicas, Prefills, set_prefill_addresses};
use super::prefix_events::{EventsSource, Subscriptions};
use crate::error::ApiError;
use crate::flow::{Admission, OwnedPick};
use crate::inbound::parse::InferenceRequest;
use crate::inbound::server::WorkerId;
use crate::outbound::Connections;
use crate::outbound::connections::Settings;
use crate::telemetry::{Metrics, PoolMetrics};
use crate::tls::client::PoolTls;

pub struct Runtime {
    name: Arc<str>,
    /// Connections are made for one protocol: a pool whose protocol
    /// changes gets a new runtime.
    protocol: config::Protocol,
    picker: Arc<picker::Picker>,
    /// Flow control in front of the picker.
    admission: Arc<Admission>,
    /// One connection pool per worker thread: a connection is only used by
    /// the thread that drives it.
    connections: Vec<Connections>,
    /// TLS to the `https://` replicas, for every worker's connections and
    /// the scrapers; replaced when a generation changes it.
    tls: Arc<ArcSwapOption<PoolTls>>,
    replicas: Mutex<Replicas>,
    dispatcher: JoinHandle<()>,
    /// What the replicas' KV-cache events say they hold; empty unless the
    /// pool follows them. Outlives generations, as the caches do.
    prefix_index: Arc<kv_events::index::PoolIndex>,
    /// A disaggregated pool's prefill replicas, static or discovered.
    prefill_replicas: PrefillReplicas,
    /// How requests are matched against it, when the pool follows events.
    events: ArcSwapOption<EventsSource>,
    /// Replicas draining: leaving the pool, or drained by hand.
    drains: Arc<Drains>,
}

/// Who is in the pool, and what watches them.
#[derive(Default)]
struct Replicas {
    /// One per replica, by address, with the dialect it scrapes; each
    /// stops its task when dropped.
    scrapers: HashMap<Arc<str>, (signals::Scraper, signals::Dialect)>,
    /// How the scrapers run; they restart when it changes.
    scrape: Option<signals::ScrapeConfig>,
    /// The generation's connect timeout, for changes between generations.
    connect_timeout: Duration,
    /// Replicas whose metrics dialect is not the pool's `engine` (found
    /// in Kubernetes with an `infergate.dev/engine` label).
    engines: HashMap<String, signals::Dialect>,
    /// The next replica's id. Ids are never reused, so the prefix index
    /// and a request's list of tried replicas never mistake a newcomer for
    /// a replica that left.
    next_id: usize,
    /// The generation's `prefixCache` when it follows events.
    prefix_events: Option<config::PrefixCache>,
    /// One per replica while the pool follows events.
    subscriptions: Subscriptions,
    /// The generation's `drain.deadline`.
    drain_deadline: Duration,
}

/// Replicas whose pods are terminating, by address, with the time the
/// kubelet kills them (the pod's `deletionTimestamp`).
pub type Terminating = HashMap<String, SystemTime>;

/// A terminating replica is evacuated this long before its pod's grace
/// period ends (less its drain deadline), so its streams move before the
/// kill: time for the streams to notice, and for the clocks of the API
/// server and this gateway to disagree a little.
pub const KILL_MARGIN: Duration = Duration::from_secs(2);

impl Runtime {
    /// An empty pool; [`Runtime::configure`] gives it its replicas. Needs a
    /// Tokio runtime (the flow-control dispatcher starts here).
    pub fn new(
        spec: &config::Pool,
        connect_timeout: Duration,
        metrics: &Metrics,
        workers: usize,
    ) -> Arc<Self> {
        let picker = Arc::new(picker::Picker::new(picker_config(spec), Vec::new()));
        let admission = Admission::new(Arc::clone(&picker), metrics.pick_duration(&spec.name));
        let tls: Arc<ArcSwapOption<PoolTls>> = Arc::default();
        let settings = Settings {
            tls: Arc::clone(&tls),
            ..Settings::new(spec.protocol, connect_timeout)
        };
        Arc::new(Self {
            name: Arc::from(spec.name.as_str()),
            protocol: spec.protocol,
            dispatcher: tokio::spawn(Arc::clone(&admission).dispatch_forever()),
            admission,
            picker,
            connections: (0..workers.max(1))
                .map(|_| Connections::new(settings.clone()))
                .collect(),
            tls,
            replicas: Mutex::default(),
            prefix_index: kv_events::index::PoolIndex::new(),
            prefill_replicas: PrefillReplicas::default(),
            events: ArcSwapOption::empty(),
            drains: Arc::new(Drains::new(
                Arc::from(spec.name.as_str()),
                metrics.endpoint_series(),
            )),
        })
    }

    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Whether this runtime can serve `spec` (else the pool starts afresh).
    pub fn fits(&self, spec: &config::Pool) -> bool {
        self.protocol == spec.protocol
    }

    pub fn picker(&self) -> &Arc<picker::Picker> {
        &self.picker
    }

    pub fn admission(&self) -> &Arc<Admission> {
        &self.admission
    }

    /// The connections of the worker thread serving a request.
    pub fn connections(&self, worker: WorkerId) -> &Connections {
        &self.connections[worker % self.connections.len()]
    }

    /// What the picker needs of `request`: its prompt is hashed for prefix
    /// affinity only when the pool's policy looks at it.
    pub fn pick_request(
        &self,
        request: &InferenceRequest<'_>,
        adapter: Option<&str>,
        explain: bool,
    ) -> OwnedPick {
        let config = self.picker.config();
        let prefix_hashes = if config.uses_prompt_hashes(explain) {
            request.prompt_hashes(adapter, &config.prefix).into()
        } else {
            Arc::default()
        };
        OwnedPick {
            adapter: adapter.map(str::to_owned),
            prefix_hashes,
            estimated_tokens: request.estimated_tokens,
            context_tokens: request.prompt_tokens + request.max_output.unwrap_or(1),
            explain,
            session: None,
            queue_share: None,
            exact_prefix: None,
            prompt_tokens: request.prompt_tokens,
            expected_output_tokens: request.max_output.unwrap_or(0),
            slo: None,
        }
    }

    /// Apply one generation's settings of this pool: the picker's
    /// configuration, TLS to its replicas (built by the caller, who can
    /// still refuse the generation when that fails), and the membership
    /// `addrs` (and `terminating`, replicas leaving as their pods end).
    pub fn configure(
        &self,
        spec: &config::Pool,
        addrs: &[String],
        terminating: &Terminating,
        metrics: &Metrics,
        connect_timeout: Duration,
        tls: Option<PoolTls>,
    ) {
        self.picker.set_config(picker_config(spec));
        let m = &spec.scheduling.metrics;
        let scrape = signals::ScrapeConfig {
            dialect: spec.engine,
            interval: m.interval(),
            timeout: m.timeout(),
        };
        let tls_changed = self.set_tls(tls);
        self.set_prefix_events(&spec.prefix_cache, metrics);
        self.replicas.lock().drain_deadline = spec.drain.deadline();
        let membership = Membership { addrs, terminating };
        self.reconcile(membership, scrape, metrics, connect_timeout, tls_changed);
    }

    /// Follow the replicas' KV-cache events under `settings`, or stop.
    fn set_prefix_events(&self, settings: &config::PrefixCache, metrics: &Metrics) {
        let follow = (settings.source == config::PrefixSource::Events).then(|| settings.clone());
        let mut replicas = self.replicas.lock();
        if replicas.prefix_events == follow {
            return;
        }
        self.events.store(follow.clone().map(|settings| {
            let index = Arc::clone(&self.prefix_index);
            Arc::new(EventsSource::new(index, settings, &self.name, metrics))
        }));
        replicas.prefix_events = follow;
    }

    /// What each replica holds of `request`'s prompt as its engine's
    /// events report it, when the pool follows them and the prompt can be
    /// matched; else the picker guesses.
    pub async fn exact_prefix(
        &self,
        body: &Bytes,
        request: &InferenceRequest<'_>,
        adapter: Option<&str>,
    ) -> Option<Arc<dyn picker::ExactPrefix>> {
        let events = self.events.load_full()?;
        let replicas = self.picker.endpoints();
        events
            .match_request(body, adapter, request.prompt_tokens, &replicas)
            .await
    }

    /// The index of the replicas' KV-cache events (empty unless the pool
    /// follows them).
    /// A disaggregated pool's prefill replicas are now those at `addrs`.
    pub fn set_prefill_addresses(&self, addrs: &[String]) {
        set_prefill_addresses(&self.prefill_replicas, addrs);
    }

    pub fn prefix_index(&self) -> &Arc<kv_events::index::PoolIndex> {
        &self.prefix_index
    }

    /// Each replica's KV-events stream, for `/debug/pools`; empty unless
    /// the pool follows them.
    pub fn prefix_events(&self) -> Vec<kv_events::index::PublisherStatus> {
        match self.events.load().as_ref() {
            Some(_) => self.prefix_index.statuses(),
            None => Vec::new(),
        }
    }

    /// Replicas whose metrics dialect is not the pool's `engine`, for the
    /// next [`Runtime::configure`].
    pub fn set_engines(&self, engines: HashMap<String, signals::Dialect>) {
        self.replicas.lock().engines = engines;
    }

    /// Replace the membership between generations (replicas discovered in
    /// Kubernetes), under the scrape settings of the generation in force;
    /// `engines` gives replicas whose metrics dialect is not the pool's,
    /// `terminating` those whose pods are ending.
    /// Does nothing before the first [`Runtime::configure`].
    pub fn set_replicas(
        &self,
        addrs: &[String],
        terminating: &Terminating,
        engines: HashMap<String, signals::Dialect>,
        metrics: &Metrics,
    ) {
        let (scrape, connect_timeout) = {
            let mut replicas = self.replicas.lock();
            replicas.engines = engines;
            match replicas.scrape {
                Some(scrape) => (scrape, replicas.connect_timeout),
                None => return,
            }
        };
        let membership = Membership { addrs, terminating };
        self.reconcile(membership, scrape, metrics, connect_timeout, false);
    }

    /// Put `tls` in force unless the same settings and files already are;
    /// whether it changed. Connections opened under the old settings are
    /// not reused from now on (see `upstream::connections`).
    fn set_tls(&self, tls: Option<PoolTls>) -> bool {
        let current = self.tls.load();
        let same = match (current.as_deref(), &tls) {
            (None, None) => true,
            (Some(old), Some(new)) => old.same_as(new),
            _ => false,
        };
        if !same {
            self.tls.store(tls.map(Arc::new));
        }
        !same
    }

    /// The one way membership changes. A replica that stays keeps its
    /// endpoint (its load, its id, its scraper); a newcomer gets a fresh
    /// id and a scraper; a leaver drains (drain.rs): it is no longer
    /// picked, its scraper stops, and its requests in flight run to their
    /// end (they hold its endpoint) or move at the drain deadline, after
    /// which its idle connections expire. A leaver that comes back while
    /// it drains is the same endpoint again.
    /// Scrapers restart when how they scrape changes, TLS included.
    fn reconcile(
        &self,
        membership: Membership<'_>,
        scrape: signals::ScrapeConfig,
        metrics: &Metrics,
        connect_timeout: Duration,
        tls_changed: bool,
    ) {
        let mut replicas = self.replicas.lock();
        let old = self.picker.endpoints();
        if replicas.scrape.as_ref() != Some(&scrape) || tls_changed {
            replicas.scrapers.clear();
            replicas.scrape = Some(scrape);
        }
        replicas.connect_timeout = connect_timeout;
        let Membership { addrs, terminating } = membership;
        let mut endpoints: Vec<Arc<Endpoint>> = Vec::with_capacity(addrs.len());
        for addr in addrs {
            if endpoints.iter().any(|e| &*e.addr == addr.as_str()) {
                continue;
            }
            let endpoint = match old.iter().find(|e| &*e.addr == addr.as_str()) {
                Some(kept) => Arc::clone(kept),
                None => match self.drains.rejoin(addr) {
                    Some(back) => back,
                    None => {
                        let id = replicas.next_id;
                        replicas.next_id += 1;
                        let endpoint = Endpoint::new(id, addr.as_str());
                        self.drains.admit(&endpoint);
                        endpoint
                    }
                },
            };
            endpoints.push(endpoint);
        }
        let dialect_of = |engines: &HashMap<String, signals::Dialect>, addr: &str| {
            engines.get(addr).copied().unwrap_or(scrape.dialect)
        };
        let Replicas {
            scrapers,
            engines,
            prefix_events,
            subscriptions,
            ..
        } = &mut *replicas;
        subscriptions.reconcile(&self.prefix_index, prefix_events.as_ref(), &endpoints);
        scrapers.retain(|addr, (_, dialect)| {
            endpoints.iter().any(|e| e.addr == *addr) && *dialect == dialect_of(engines, addr)
        });
        // Below the scrape timeout, so a replica that never answers the
        // handshake shows as unreachable rather than slow.
        let mut client = signals::ScrapeClient::new(scrape.timeout.min(connect_timeout));
        if let Some(tls) = self.tls.load_full() {
            client = client.with_tls(tls.scrape());
        }
        for e in &endpoints {
            if scrapers.contains_key(&e.addr) {
                continue;
            }
            let dialect = dialect_of(engines, &e.addr);
            // Fresh signals may show room for requests waiting in line.
            let admission = Arc::clone(&self.admission);
            let metrics = metrics.endpoint(&self.name, &e.addr);
            let scraper = signals::spawn_reporting_scraper(
                Arc::clone(e),
                signals::ScrapeConfig { dialect, ..scrape },
                client.clone(),
                move |_, report| {
                    metrics.observe_scrape(report);
                    admission.wake()
                },
            );
            scrapers.insert(Arc::clone(&e.addr), (scraper, dialect));
        }
        let deadline = replicas.drain_deadline;
        let kill_at = |addr: &str| {
            let at = terminating.get(addr)?;
            let left = at.duration_since(SystemTime::now()).unwrap_or_default();
            Some(Instant::now() + left.saturating_sub(KILL_MARGIN))
        };
        let member = |addr: &str| endpoints.iter().any(|e| &*e.addr == addr);
        for gone in old.iter().filter(|o| !member(&o.addr)) {
            let kill = kill_at(&gone.addr);
            let why = if kill.is_some() {
                Why::Terminating
            } else {
                Why::Removed
            };
            self.drains.leave(gone, why, deadline, kill);
        }
        // Replicas that left before their pods started terminating: their
        // end comes sooner now.
        for addr in terminating.keys().filter(|a| !member(a)) {
            if let Some(leaving) = self.drains.leaving(addr) {
                self.drains
                    .leave(&leaving, Why::Terminating, deadline, kill_at(addr));
            }
        }
        self.picker.replace_endpoints(endpoints);
        // Newcomers may have room for requests waiting in line.
        self.admission.wake();
    }

    /// Drain replica `addr` by hand (a member, or a replica still leaving
    /// the pool): no new requests from now on, and its streams move to
    /// other replicas now with `evacuate`, else at the pool's drain
    /// deadline. `None` when the pool has no such replica.
    pub fn drain(&self, addr: &str, evacuate: bool) -> Option<ReplicaState> {
        let replicas = self.replicas.lock();
        let (endpoint, member) = self.find(addr)?;
        self.drains
            .drain_by_hand(&endpoint, member, evacuate, replicas.drain_deadline);
        Some(self.replica_state(&endpoint, member))
    }

    /// Replica `addr`'s state: a member, or a replica still leaving the
    /// pool; `None` when the pool has no such replica.
    pub fn replica(&self, addr: &str) -> Option<ReplicaState> {
        let (endpoint, member) = self.find(addr)?;
        Some(self.replica_state(&endpoint, member))
    }

    /// Undo a drain by hand: a member takes new requests again; a replica
    /// that has left the pool goes on leaving. `None` when the pool has no
    /// such replica.
    pub fn undrain(&self, addr: &str) -> Option<ReplicaState> {
        let _replicas = self.replicas.lock();
        let (endpoint, member) = self.find(addr)?;
        self.drains.undrain_by_hand(&endpoint);
        // Requests waiting in line may go there now.
        self.admission.wake();
        Some(self.replica_state(&endpoint, member))
    }

    /// The replicas draining, for the gauges.
    pub fn drains(&self) -> &Arc<Drains> {
        &self.drains
    }

    /// Every replica draining: members drained by hand, and replicas that
    /// left the pool with requests still in flight.
    pub fn draining(&self) -> Vec<DrainState> {
        self.drains.states()
    }

    /// Replicas draining and of those evacuating, members and leavers.
    pub fn draining_counts(&self) -> (usize, usize) {
        let (mut draining, mut evacuating) = self.drains.leaving_counts();
        for e in self.picker.endpoints().iter() {
            draining += usize::from(e.draining());
            evacuating += usize::from(e.evacuating());
        }
        (draining, evacuating)
    }

    /// A member of the pool, or a replica still leaving it, by address.
    fn find(&self, addr: &str) -> Option<(Arc<Endpoint>, bool)> {
        let members = self.picker.endpoints();
        match members.iter().find(|e| &*e.addr == addr) {
            Some(member) => Some((Arc::clone(member), true)),
            None => self.drains.leaving(addr).map(|e| (e, false)),
        }
    }

    fn replica_state(&self, endpoint: &Arc<Endpoint>, member: bool) -> ReplicaState {
        ReplicaState {
            pool: Arc::clone(&self.name),
            addr: Arc::clone(&endpoint.addr),
            member,
            draining: endpoint.draining(),
            evacuating: endpoint.evacuating(),
            inflight: endpoint.load.requests(),
            drain: self.drains.state_of(&endpoint.addr),
        }
    }

    /// Ready when at least one replica can be picked: it is reachable, not
    /// draining, and, if the pool scores on metrics, reports them — or the
    /// pool falls back to least-request when metrics are missing, so a
    /// metrics outage does not take the gateway out of service.
    pub fn is_ready(&self, now: Instant) -> bool {
        self.ready_replicas(now) > 0
    }

    /// Replicas that can take requests now ([`picker::is_ready`]).
    pub fn ready_replicas(&self, now: Instant) -> usize {
        let config = self.picker.config();
        self.picker
            .endpoints()
            .iter()
            .filter(|e| picker::is_ready(e, &config, now))
            .count()
    }
}

/// What a generation (or discovery) says the pool's replicas are.
struct Membership<'a> {
    addrs: &'a [String],
    terminating: &'a Terminating,
}

/// One replica's draining state, as the admin listener answers it.
#[derive(Debug, Clone)]
pub struct ReplicaState {
    pub pool: Arc<str>,
    pub addr: Arc<str>,
    /// A member of the pool (else it has left and drains until idle).
    pub member: bool,
    pub draining: bool,
    pub evacuating: bool,
    pub inflight: u64,
    /// Why and since when it drains; `None` while it does not.
    pub drain: Option<DrainState>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.dispatcher.abort();
    }
}

/// A pool as this generation configures it, over the runtime it shares
/// with the generations before and after it.
pub struct Pool {
    runtime: Arc<Runtime>,
    metrics: PoolMetrics,
    engine: signals::Dialect,
    max_retries: usize,
    /// The replicas schedule by priority: bodies carry the band.
    engine_priority: bool,
    continuation: Continuation,
    /// The prefill replicas of a disaggregated pool.
    disaggregation: Option<Arc<Prefills>>,
}

impl Pool {
    pub fn new(runtime: Arc<Runtime>, metrics: PoolMetrics, spec: &config::Pool) -> Self {
        let disaggregation = spec
            .disaggregation
            .as_ref()
            .map(|d| Arc::new(Prefills::new(d, Arc::clone(&runtime.prefill_replicas))));
        Self {
            runtime,
            metrics,
            engine: spec.engine,
            max_retries: spec.retry.max_retries() as usize,
            engine_priority: spec.engine_priority(),
            continuation: Continuation::new(&spec.continuation),
            disaggregation,
        }
    }

    /// The prefill replicas, for a disaggregated pool.
    pub fn disaggregation(&self) -> Option<&Arc<Prefills>> {
        self.disaggregation.as_ref()
    }

    /// How answers its replicas fail midway go on.
    pub fn continuation(&self) -> &Continuation {
        &self.continuation
    }

    pub fn name(&self) -> &Arc<str> {
        self.runtime.name()
    }

    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Metric handles for this pool, its models and its replicas.
    pub fn metrics(&self) -> &PoolMetrics {
        &self.metrics
    }

    pub fn engine(&self) -> signals::Dialect {
        self.engine
    }

    /// Other replicas a request may try when none of it was sent.
    pub fn max_retries(&self) -> usize {
        self.max_retries
    }

    /// The body a request of `band` is sent to the replicas with: with the
    /// band's `priority` in place of any the client sent when they
    /// schedule by it (`enginePriority`), else as it is.
    pub fn engine_body(&self, body: Bytes, band: config::Priority) -> Result<Bytes, ApiError> {
        if !self.engine_priority {
            return Ok(body);
        }
        // The parse stage has accepted the body as a JSON object.
        crate::route::rewrite::model_field::with_priority(&body, engine_priority(band))
            .ok_or_else(|| ApiError::invalid_request("The request body must be a JSON object."))
    }
}

/// A pool's continuation settings (see `outbound::continuation`).
#[derive(Debug, Clone, Copy)]
pub struct Continuation {
    pub enabled: bool,
    pub max_attempts: u32,
    pub idle_timeout: Duration,
    pub max_text_bytes: usize,
}

impl Continuation {
    pub fn new(spec: &config::Continuation) -> Self {
        Self {
            enabled: spec.enabled(),
            max_attempts: spec.max_attempts(),
            idle_timeout: spec.idle_timeout(),
            max_text_bytes: usize::try_from(spec.max_text_bytes()).unwrap_or(usize::MAX),
        }
    }
}

/// vLLM's `priority` for a band: lower is served first, and 0 (what a
/// request without the field gets) is the most urgent value the gateway
/// sends. Consecutive values, so each band is one step ahead of the next
/// and nothing else is implied.
pub fn engine_priority(band: config::Priority) -> i64 {
    match band {
        config::Priority::Critical => 0,
        config::Priority::Standard => 1,
        config::Priority::Sheddable => 2,
    }
}

/// The picker's view of a pool's `scheduling` section; defaults come from
/// the picker crate.
pub fn picker_config(spec: &config::Pool) -> picker::PickerConfig {
    let s = &spec.scheduling;
    let defaults = picker::PickerConfig::default();
    let weights = s.picker_weights();
    let mut saturation = defaults.saturation;
    if let Some(sat) = &s.saturation {
        saturation.queue_depth = sat.queue_depth.unwrap_or(saturation.queue_depth);
        saturation.kv_cache = sat.kv_cache.unwrap_or(saturation.kv_cache);
    }
    picker::PickerConfig {
        policy: spec.policy(),
        weights,
        saturation,
        stale_after: s.metrics.stale_after.unwrap_or(defaults.stale_after),
        fallback: s.fallback,
        context_length: spec.max_model_len,
        ..defaults
    }
}
