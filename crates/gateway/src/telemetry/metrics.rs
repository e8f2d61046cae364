//! The gateway's Prometheus metrics: one registry, families with bounded
//! labels, and handles resolved once per pool, model and replica so the
//! request path never builds a label set or allocates to count something.
//!
//! Replica and pool gauges (in-flight, KV usage, queue, staleness) are not
//! kept here: they are read from the live endpoints when `/metrics` is
//! scraped (see [`super::gauges`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use config::Priority;
use parking_lot::RwLock;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::gauges::{
    DrainGauges, FlowGauges, LiveGauges, LivePool, ServerGauge, ServerGaugeSource, ServerGauges,
};
use super::labels::{Name, TenantLabel};
use super::outcomes::{OutcomeBook, Outcomes};

/// Request latencies: 5 ms (a fast decode step) to 60 s (a long
/// generation), about three buckets per decade so quantiles stay within
/// ~30 % anywhere in that range.
const LATENCY_BUCKETS: [f64; 22] = [
    0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 4.0,
    6.0, 10.0, 15.0, 25.0, 40.0, 60.0,
];
/// One pick costs microseconds; anything near a millisecond is a problem.
const PICK_BUCKETS: [f64; 12] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2,
];
/// A `/metrics` scrape on a local network takes around a millisecond;
/// the default scrape timeout is 500 ms.
const SCRAPE_BUCKETS: [f64; 11] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}
fn pick_histogram() -> Histogram {
    Histogram::new(PICK_BUCKETS)
}
fn scrape_histogram() -> Histogram {
    Histogram::new(SCRAPE_BUCKETS)
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabels {
    member: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberOutcomeLabels {
    member: Name,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    pool: Name,
    model: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    pool: Name,
    model: Name,
    tenant: Name,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigReloadLabels {
    /// `applied` or `refused`.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantRouteLabels {
    pool: Name,
    model: Name,
    tenant: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SloLabels {
    pool: Name,
    model: Name,
    tenant: Name,
    band: &'static str,
    objective: &'static str,
    /// `met`, `missed`, or `unjudged` (an answer too short to tell).
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AuthFailureLabels {
    credential: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    pool: Name,
    endpoint: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    pool: Name,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: Name,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    listener: Name,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrefixUnmatchedLabels {
    pool: Name,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PrefixSourceLabels {
    pool: Name,
    source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabels {
    pool: Name,
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LegLabels {
    pool: Name,
    role: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    pool: Name,
    role: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigrationLabels {
    pool: Name,
    reason: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabels {
    pool: Name,
    priority: &'static str,
}

/// Every registered family. Families share their series through an `Arc`,
/// so these clones and the registry's see the same values.
#[derive(Clone)]
struct Families {
    requests: Family<RequestLabels, Counter>,
    request_duration: HistogramFamily<RouteLabels>,
    ttft: HistogramFamily<RouteLabels>,
    inter_token: HistogramFamily<RouteLabels>,
    prompt_tokens: Family<TenantRouteLabels, Counter>,
    completion_tokens: Family<TenantRouteLabels, Counter>,
    slo: Family<SloLabels, Counter>,
    refused: Family<RefusedLabels, Counter>,
    auth_failures: Family<AuthFailureLabels, Counter>,
    retries: Family<PoolLabels, Counter>,
    pick_duration: HistogramFamily<PoolLabels>,
    pick_fallbacks: Family<PoolLabels, Counter>,
    prefix_sources: Family<PrefixSourceLabels, Counter>,
    picks_by: Family<PolicyLabels, Counter>,
    migrations: Family<MigrationLabels, Counter>,
    migrating: Family<PoolLabels, Gauge>,
    disaggregation_legs: Family<LegLabels, Counter>,
    disaggregation_leg_seconds: HistogramFamily<RoleLabels>,
    prefix_unmatched: Family<PrefixUnmatchedLabels, Counter>,
    routing_decisions: Family<EndpointLabels, Counter>,
    scrape_errors: Family<EndpointLabels, Counter>,
    scrape_duration: HistogramFamily<EndpointLabels>,
    queue_wait: HistogramFamily<QueueLabels>,
    limit_backend_errors: Counter,
    config_reloads: Family<ConfigReloadLabels, Counter>,
    tls_reloads: Family<ReloadLabels, Counter>,
    tls_expiry: Family<ListenerLabels, Gauge>,
    tls_handshake_failures: Family<ListenerLabels, Counter>,
    discovery_up: Family<PoolLabels, Gauge>,
    discovery_errors: Family<PoolLabels, Counter>,
    member_up: Family<MemberLabels, Gauge>,
    member_rtt: Family<MemberLabels, Gauge<f64, AtomicU64>>,
    member_requests: Family<MemberOutcomeLabels, Counter>,
    member_failovers: Family<MemberLabels, Counter>,
    /// Not exported: read by the load summary.
    outcomes: OutcomeBook,
}

impl Families {
    /// Counters are registered without `_total`: the OpenMetrics encoder
    /// appends it.
    fn register(registry: &mut Registry) -> Self {
        let f = Self {
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_histogram),
            ttft: Family::new_with_constructor(latency_histogram),
            inter_token: Family::new_with_constructor(latency_histogram),
            prompt_tokens: Family::default(),
            completion_tokens: Family::default(),
            slo: Family::default(),
            refused: Family::default(),
            auth_failures: Family::default(),
            retries: Family::default(),
            pick_duration: Family::new_with_constructor(pick_histogram),
            pick_fallbacks: Family::default(),
            prefix_sources: Family::default(),
            picks_by: Family::default(),
            migrations: Family::default(),
            migrating: Family::default(),
            disaggregation_legs: Family::default(),
            disaggregation_leg_seconds: Family::new_with_constructor(latency_histogram),
            prefix_unmatched: Family::default(),
            routing_decisions: Family::default(),
            scrape_errors: Family::default(),
            scrape_duration: Family::new_with_constructor(scrape_histogram),
            queue_wait: Family::new_with_constructor(latency_histogram),
            limit_backend_errors: Counter::default(),
            config_reloads: Family::default(),
            tls_reloads: Family::default(),
            tls_expiry: Family::default(),
            tls_handshake_failures: Family::default(),
            discovery_up: Family::default(),
            discovery_errors: Family::default(),
            member_up: Family::default(),
            member_rtt: Family::default(),
            member_requests: Family::default(),
            member_failovers: Family::default(),
            outcomes: OutcomeBook::default(),
        };
        registry.register(
            "infergate_config_reloads",
            "Attempts to put a changed config in force (file change, SIGHUP), by result: applied, or refused with the running config kept",
            f.config_reloads.clone(),
        );
        registry.register(
            "infergate_rate_limit_backend_errors",
            "Admissions whose rate limits the backend (Redis) did not answer in time; rateLimits.onBackendError decided them",
            f.limit_backend_errors.clone(),
        );
        registry.register(
            "infergate_requests",
            "Requests that reached routing, by tenant and final HTTP status (pool and model empty when the model is unknown)",
            f.requests.clone(),
        );
        registry.register(
            "infergate_request_duration_seconds",
            "From the request's arrival to the end of its response body",
            f.request_duration.clone(),
        );
        registry.register(
            "infergate_ttft_seconds",
            "Time to first token at the gateway: first streamed event, or the whole body when not streaming (successful responses only)",
            f.ttft.clone(),
        );
        registry.register(
            "infergate_inter_token_seconds",
            "Time between consecutive streamed events of a response",
            f.inter_token.clone(),
        );
        registry.register(
            "infergate_prompt_tokens",
            "Prompt tokens, from the usage the replica reported",
            f.prompt_tokens.clone(),
        );
        registry.register(
            "infergate_completion_tokens",
            "Completion tokens, from the usage the replica reported",
            f.completion_tokens.clone(),
        );
        registry.register(
            "infergate_slo_requests",
            "Requests with a latency objective (header or tenant), by objective (ttft, itl) and outcome: met, missed (a refused or failed request misses), or unjudged (no first token, or fewer than two streamed events for itl); attainment is met / (met + missed)",
            f.slo.clone(),
        );
        registry.register(
            "infergate_refused",
            "Requests the gateway answered itself with an error after routing, by reason",
            f.refused.clone(),
        );
        registry.register(
            "infergate_auth_failures",
            "Requests refused because their credential was missing or invalid, by credential kind and reason",
            f.auth_failures.clone(),
        );
        registry.register(
            "infergate_retries",
            "Requests sent to another replica after a replica failed before answering",
            f.retries.clone(),
        );
        registry.register(
            "infergate_pick_duration_seconds",
            "Time the endpoint picker took to choose a replica",
            f.pick_duration.clone(),
        );
        registry.register(
            "infergate_pick_fallbacks",
            "Replicas chosen by least-request because no replica had fresh metrics",
            f.pick_fallbacks.clone(),
        );
        registry.register(
            "infergate_prefix_unmatched",
            "Requests to a pool that follows KV-cache events whose prompt was not matched against them, by reason; their prefix is guessed",
            f.prefix_unmatched.clone(),
        );
        registry.register(
            "infergate_prefix_source",
            "Picks whose chosen replica's prefix affinity was scored by the engines' KV-cache events or by the gateway's guess",
            f.prefix_sources.clone(),
        );
        registry.register(
            "infergate_picks_by_policy",
            "Picks by the policy that decided them: under the predicted policy, `predicted` where the latency predictions (or exploring an unmeasured replica) chose, `scored` where it fell back to the weighted scores",
            f.picks_by.clone(),
        );
        registry.register(
            "infergate_migrations",
            "Answers whose replica failed them after they started (reason: broken, stalled, evacuated; or, before the answer started, not_here, a replica that refused what another may serve), by what became of them (continued or resent on another replica, completed, not_continued, failed)",
            f.migrations.clone(),
        );
        registry.register(
            "infergate_disaggregation_legs",
            "Legs of requests to disaggregated pools by role (prefill, decode) and outcome: for prefill, sent (its KV went to the decode), failed (another prefill or the decode alone took over) or skipped (the decider let the decode prefill a short uncached prompt); for decode, remote (its prompt came from a prefill) or local",
            f.disaggregation_legs.clone(),
        );
        registry.register(
            "infergate_disaggregation_leg_seconds",
            "Time of the legs of disaggregated requests by role: prefill, from sending the prefill leg to its answer (queue and prompt computation)",
            f.disaggregation_leg_seconds.clone(),
        );
        registry.register(
            "infergate_migrating",
            "Answers whose replica failed them, now waiting for another replica to take the rest",
            f.migrating.clone(),
        );
        registry.register(
            "infergate_routing_decisions",
            "Requests sent to each replica (retries included)",
            f.routing_decisions.clone(),
        );
        registry.register(
            "infergate_endpoint_scrape_errors",
            "Failed scrapes of the replica's metrics (or failed probes)",
            f.scrape_errors.clone(),
        );
        registry.register(
            "infergate_endpoint_scrape_duration_seconds",
            "Time one scrape of the replica's metrics took",
            f.scrape_duration.clone(),
        );
        registry.register(
            "infergate_queue_wait_seconds",
            "Time admitted requests waited in flow control (0 when a replica had room at once)",
            f.queue_wait.clone(),
        );
        registry.register(
            "infergate_tls_certificate_reloads",
            "Changes of a TLS listener's certificate, key or client CA files, by whether the new files were put in force (loaded) or refused and the old ones kept (failed)",
            f.tls_reloads.clone(),
        );
        registry.register(
            "infergate_tls_certificate_expiry_timestamp_seconds",
            "When the certificate a TLS listener serves expires (notAfter), in seconds since the Unix epoch",
            f.tls_expiry.clone(),
        );
        registry.register(
            "infergate_tls_handshake_failures",
            "TLS handshakes with clients that failed (no shared version or cipher, a refused client certificate, a client gone mid-handshake)",
            f.tls_handshake_failures.clone(),
        );
        registry.register(
            "infergate_discovery_up",
            "1 while the Kubernetes watches of a pool (endpointSelector, inferencePool) reach the API server, 0 while they fail and the pool keeps its last known replicas",
            f.discovery_up.clone(),
        );
        registry.register(
            "infergate_discovery_errors",
            "Failed lists and watches of a pool's Kubernetes discovery (each retried with backoff)",
            f.discovery_errors.clone(),
        );
        registry.register(
            "infergate_member_up",
            "1 while a global member takes new requests (healthy or ramping back), 0 while it is out of rotation",
            f.member_up.clone(),
        );
        registry.register(
            "infergate_member_rtt_seconds",
            "Round trip to a global member as this router measures it (a small request, timed; the lowest of the last few)",
            f.member_rtt.clone(),
        );
        registry.register(
            "infergate_member_requests",
            "Attempts to send a request to a global member, by outcome: answered, throttled (429), failed (no connection, 5xx, or cut mid-answer)",
            f.member_requests.clone(),
        );
        registry.register(
            "infergate_member_failovers",
            "Requests that failed at a global member before its first response byte and were retried on the next member, by the member that failed",
            f.member_failovers.clone(),
        );
        f
    }
}

/// The gateway's metrics registry. Built before the pools, which register
/// themselves with [`Metrics::pool`]; encoded on every `/metrics` scrape.
pub struct Metrics {
    registry: Registry,
    families: Families,
    live: Arc<RwLock<Vec<LivePool>>>,
    server: ServerGaugeSource,
    /// Series for requests whose model no pool serves; made on first use so
    /// a gateway that never sees one exports no empty series for it.
    unrouted: OnceLock<Arc<RouteMetrics>>,
    /// Rewrites' targets and mirrors.
    pub rollout: super::rollout::RolloutMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let families = Families::register(&mut registry);
        let rollout = super::rollout::RolloutMetrics::register(&mut registry);
        let live = Arc::new(RwLock::new(Vec::new()));
        registry.register_collector(Box::new(LiveGauges::new(Arc::clone(&live))));
        let server = ServerGauges::default();
        let server_gauges = Arc::clone(&server.read);
        registry.register_collector(Box::new(server));
        Self {
            registry,
            families,
            live,
            server: server_gauges,
            unrouted: OnceLock::new(),
            rollout,
        }
    }

    /// How each (pool, model)'s requests ended, for the load summary.
    pub fn outcomes(&self) -> &OutcomeBook {
        &self.families.outcomes
    }

    /// Whether the Kubernetes discovery of `pool` reaches the API server.
    pub fn set_discovery_up(&self, pool: &str, up: bool) {
        self.families
            .discovery_up
            .get_or_create(&PoolLabels {
                pool: Name::new(pool.to_owned()),
            })
            .set(i64::from(up));
    }

    /// Whether global member `member` takes new requests.
    pub fn set_member_up(&self, member: &str, up: bool) {
        self.families
            .member_up
            .get_or_create(&MemberLabels {
                member: Name::new(member.to_owned()),
            })
            .set(i64::from(up));
    }

    /// The round trip to global member `member`.
    pub fn set_member_rtt(&self, member: &str, rtt: Duration) {
        self.families
            .member_rtt
            .get_or_create(&MemberLabels {
                member: Name::new(member.to_owned()),
            })
            .set(rtt.as_secs_f64());
    }

    /// One attempt to send a request to global member `member`.
    pub fn count_member_request(&self, member: &str, outcome: &'static str) {
        self.families
            .member_requests
            .get_or_create(&MemberOutcomeLabels {
                member: Name::new(member.to_owned()),
                outcome,
            })
            .inc();
    }

    /// A request that failed at `member` before any byte came back and
    /// was retried on the next member.
    pub fn count_member_failover(&self, member: &str) {
        self.families
            .member_failovers
            .get_or_create(&MemberLabels {
                member: Name::new(member.to_owned()),
            })
            .inc();
    }

    /// One failed list or watch of `pool`'s Kubernetes discovery.
    pub fn count_discovery_error(&self, pool: &str) {
        self.families
            .discovery_errors
            .get_or_create(&PoolLabels {
                pool: Name::new(pool.to_owned()),
            })
            .inc();
    }

    /// The per-replica series, for removing those of replicas that left.
    pub fn endpoint_series(&self) -> EndpointSeries {
        EndpointSeries(self.families.clone())
    }

    /// Counts one attempt to put a changed config in force.
    pub fn count_reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.families
            .config_reloads
            .get_or_create(&ConfigReloadLabels { result })
            .inc();
    }

    /// Counts admissions the rate-limit backend did not answer.
    pub fn limit_backend_errors(&self) -> Counter {
        self.families.limit_backend_errors.clone()
    }

    /// Counts requests of pool `name` whose prompt was not matched against
    /// the engines' KV-cache events, by reason.
    pub fn prefix_unmatched(&self, name: &str, reason: &'static str) -> Counter {
        self.families
            .prefix_unmatched
            .get_or_create(&PrefixUnmatchedLabels {
                pool: Name::new(name.to_owned()),
                reason,
            })
            .clone()
    }

    /// The pick-time histogram of pool `name` (flow control times picks).
    pub fn pick_duration(&self, name: &str) -> Histogram {
        self.families
            .pick_duration
            .get_or_create(&PoolLabels {
                pool: Name::new(name.to_owned()),
            })
            .clone()
    }

    /// Handles of a TLS listener's certificates and handshakes.
    pub fn listener_tls(&self, listener: &str) -> ListenerTlsMetrics {
        let f = &self.families;
        let name = Name::new(listener.to_owned());
        let reloads = |outcome| {
            f.tls_reloads
                .get_or_create(&ReloadLabels {
                    listener: name.clone(),
                    outcome,
                })
                .clone()
        };
        let labels = ListenerLabels {
            listener: name.clone(),
        };
        ListenerTlsMetrics {
            loaded: reloads("loaded"),
            failed: reloads("failed"),
            expiry: f.tls_expiry.get_or_create(&labels).clone(),
            handshake_failures: f.tls_handshake_failures.get_or_create(&labels).clone(),
        }
    }

    /// Handles of one replica of pool `pool`.
    pub fn endpoint(&self, pool: &str, addr: &str) -> EndpointMetrics {
        EndpointMetrics::new(&self.families, &Name::new(pool.to_owned()), addr)
    }

    /// Stop exporting the live state of pools not in `keep` (pools that
    /// left the config). Their counters stay, as counters do.
    pub fn retain_pools(&self, keep: impl Fn(&str) -> bool) {
        self.live.write().retain(|p| keep(&p.name));
    }

    /// Resolve every handle a pool needs, and export its replicas' and
    /// queues' live state from now on (in place of what a pool of the same
    /// name exported before).
    pub fn pool(
        &self,
        spec: &config::Pool,
        picker: &Arc<picker::Picker>,
        admission: Arc<dyn FlowGauges>,
        prefix_index: Arc<kv_events::index::PoolIndex>,
        drains: Arc<dyn DrainGauges>,
    ) -> PoolMetrics {
        let pool = Name::new(spec.name.clone());
        let f = &self.families;
        let retries = f
            .retries
            .get_or_create(&PoolLabels { pool: pool.clone() })
            .clone();
        let queue_wait = Priority::ALL.map(|band| {
            f.queue_wait
                .get_or_create(&QueueLabels {
                    pool: pool.clone(),
                    priority: band.as_str(),
                })
                .clone()
        });
        let routes = spec
            .models
            .iter()
            .chain(&spec.adapters)
            .map(|model| {
                let pool_handles = PoolHandles {
                    retries: &retries,
                    queue_wait: &queue_wait,
                };
                let route =
                    RouteMetrics::new(f, pool.clone(), Name::new(model.clone()), pool_handles);
                (model.clone(), Arc::new(route))
            })
            .collect();
        let endpoints = picker
            .endpoints()
            .iter()
            .map(|e| EndpointMetrics::new(f, &pool, &e.addr))
            .collect();
        let mut live = self.live.write();
        live.retain(|p| p.name != pool);
        live.push(LivePool {
            name: pool.clone(),
            picker: Arc::clone(picker),
            admission,
            prefix_index,
            drains,
        });
        let prefix_sources = [
            picker::PrefixSource::Approximate,
            picker::PrefixSource::Events,
        ]
        .map(|source| {
            f.prefix_sources
                .get_or_create(&PrefixSourceLabels {
                    pool: pool.clone(),
                    source: source.as_str(),
                })
                .clone()
        });
        let picks_by = picker::Policy::ALL.map(|policy| {
            f.picks_by
                .get_or_create(&PolicyLabels {
                    pool: pool.clone(),
                    policy: policy.name(),
                })
                .clone()
        });
        PoolMetrics {
            picks_by,
            pick_fallbacks: f
                .pick_fallbacks
                .get_or_create(&PoolLabels { pool: pool.clone() })
                .clone(),
            migrating: f
                .migrating
                .get_or_create(&PoolLabels { pool: pool.clone() })
                .clone(),
            prefix_sources,
            name: pool,
            families: f.clone(),
            routes,
            endpoints,
        }
    }

    /// Handles for a request whose model no pool serves: counted under
    /// `pool=""`, `model=""`, never under the unknown name (label values
    /// must stay bounded).
    pub fn unrouted(&self) -> Arc<RouteMetrics> {
        Arc::clone(self.unrouted.get_or_init(|| {
            // Never refused, retried or queued: no pool is known. These
            // handles are not registered.
            let detached = PoolHandles {
                retries: &Counter::default(),
                queue_wait: &std::array::from_fn(|_| latency_histogram()),
            };
            let none = Name::default();
            Arc::new(RouteMetrics::new(
                &self.families,
                none.clone(),
                none,
                detached,
            ))
        }))
    }

    /// A request was refused at authentication: `credential` is `api_key`
    /// or `token`, `reason` the word the client was told (both from fixed
    /// sets).
    pub fn count_auth_failure(&self, credential: &'static str, reason: &'static str) {
        self.families
            .auth_failures
            .get_or_create(&AuthFailureLabels { credential, reason })
            .inc();
    }

    /// Where the gateway's own gauges are read from, once it runs; later
    /// calls are ignored.
    pub fn read_server_gauges(&self, read: impl Fn() -> Vec<ServerGauge> + Send + Sync + 'static) {
        let _ = self.server.set(Box::new(read));
    }

    /// The OpenMetrics text exposition of everything, `# EOF` included.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(64 * 1024);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// A TLS listener's handles.
#[derive(Clone, Default)]
pub struct ListenerTlsMetrics {
    /// New files put in force.
    pub loaded: Counter,
    /// New files refused; the old ones stay.
    pub failed: Counter,
    /// The served certificate's notAfter, Unix seconds.
    pub expiry: Gauge,
    pub handshake_failures: Counter,
}

/// A pool's handles, resolved at startup.
pub struct PoolMetrics {
    name: Name,
    families: Families,
    /// By model or adapter name, as clients write it.
    routes: HashMap<String, Arc<RouteMetrics>>,
    /// By endpoint index, for the membership the pool started with.
    endpoints: Vec<EndpointMetrics>,
    pick_fallbacks: Counter,
    /// Answers now being moved to another replica.
    migrating: Gauge,
    /// Picks by the source that scored the winner's prefix, approximate
    /// then events.
    prefix_sources: [Counter; 2],
    /// Picks by the policy that decided, in [`picker::Policy::ALL`]'s order.
    picks_by: [Counter; picker::Policy::ALL.len()],
}

/// Counts one answer in `infergate_migrating` while it lives.
pub struct Migrating(Gauge);

impl Drop for Migrating {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl PoolMetrics {
    /// Handles for requests naming `model` (a model or adapter this pool
    /// serves).
    pub fn route(&self, model: &str) -> Option<Arc<RouteMetrics>> {
        self.routes.get(model).cloned()
    }

    /// Handles of one replica. Replicas that joined after startup get
    /// theirs from the family (a label lookup, only for them).
    pub fn endpoint(&self, endpoint: &picker::Endpoint) -> EndpointMetrics {
        match self.endpoints.get(endpoint.index) {
            Some(m) if m.addr.as_str() == &*endpoint.addr => m.clone(),
            _ => EndpointMetrics::new(&self.families, &self.name, &endpoint.addr),
        }
    }

    /// An answer moved, or could not move, off a replica that failed it.
    pub fn count_migration(&self, reason: &'static str, outcome: &'static str) {
        self.families
            .migrations
            .get_or_create(&MigrationLabels {
                pool: self.name.clone(),
                reason,
                outcome,
            })
            .inc();
    }

    /// One leg of a disaggregated request (`role`: prefill or decode).
    pub fn count_leg(&self, role: &'static str, outcome: &'static str) {
        self.families
            .disaggregation_legs
            .get_or_create(&LegLabels {
                pool: self.name.clone(),
                role,
                outcome,
            })
            .inc();
    }

    /// How long one leg of a disaggregated request took.
    pub fn observe_leg(&self, role: &'static str, took: std::time::Duration) {
        self.families
            .disaggregation_leg_seconds
            .get_or_create(&RoleLabels {
                pool: self.name.clone(),
                role,
            })
            .observe(took.as_secs_f64());
    }

    /// An answer is being moved to another replica until the guard drops.
    pub fn migrating(&self) -> Migrating {
        self.migrating.inc();
        Migrating(self.migrating.clone())
    }

    /// One request was sent to the replica `decision` chose.
    pub fn count_decision(&self, decision: &picker::Decision) {
        if decision.fallback {
            self.pick_fallbacks.inc();
        }
        let source = match decision.prefix_source {
            picker::PrefixSource::Approximate => 0,
            picker::PrefixSource::Events => 1,
        };
        self.prefix_sources[source].inc();
        if let Some(i) = picker::Policy::ALL
            .iter()
            .position(|p| *p == decision.policy)
        {
            self.picks_by[i].inc();
        }
        let endpoint = &*decision.endpoint;
        match self.endpoints.get(endpoint.index) {
            Some(m) if m.addr.as_str() == &*endpoint.addr => {
                m.decisions.inc();
            }
            _ => {
                self.endpoint(endpoint).decisions.inc();
            }
        }
    }
}

/// A pool's handles every route of the pool shares.
#[derive(Clone, Copy)]
struct PoolHandles<'a> {
    retries: &'a Counter,
    /// By [`Priority`] order.
    queue_wait: &'a [Histogram; 3],
}

/// The series each replica has, by pool and address.
#[derive(Clone)]
pub struct EndpointSeries(Families);

impl EndpointSeries {
    /// Stop exporting the series of replica `addr` of `pool`.
    pub fn forget(&self, pool: &str, addr: &str) {
        let labels = EndpointLabels {
            pool: Name::new(pool.to_owned()),
            endpoint: Name::new(addr.to_owned()),
        };
        self.0.routing_decisions.remove(&labels);
        self.0.scrape_errors.remove(&labels);
        self.0.scrape_duration.remove(&labels);
    }
}

/// One replica's handles.
#[derive(Clone)]
pub struct EndpointMetrics {
    addr: Name,
    decisions: Counter,
    scrape_errors: Counter,
    scrape_duration: Histogram,
}

impl EndpointMetrics {
    fn new(f: &Families, pool: &Name, addr: &str) -> Self {
        let labels = EndpointLabels {
            pool: pool.clone(),
            endpoint: Name::new(addr.to_owned()),
        };
        Self {
            decisions: f.routing_decisions.get_or_create(&labels).clone(),
            scrape_errors: f.scrape_errors.get_or_create(&labels).clone(),
            scrape_duration: f.scrape_duration.get_or_create(&labels).clone(),
            addr: labels.endpoint,
        }
    }

    /// Called by the replica's scraper after every scrape.
    pub fn observe_scrape(&self, report: signals::ScrapeReport) {
        self.scrape_duration.observe(report.duration.as_secs_f64());
        if report.failed {
            self.scrape_errors.inc();
        }
    }

    pub fn scrape_errors(&self) -> u64 {
        self.scrape_errors.get()
    }
}

/// Handles for one (pool, model) pair, carried by a request's record from
/// routing to the end of its response.
pub struct RouteMetrics {
    pool: Name,
    model: Name,
    requests: Family<RequestLabels, Counter>,
    outcomes: Arc<Outcomes>,
    refused: Family<RefusedLabels, Counter>,
    retries: Counter,
    queue_wait: [Histogram; 3],
    duration: Histogram,
    ttft: Histogram,
    inter_token: Histogram,
    prompt_tokens: Family<TenantRouteLabels, Counter>,
    completion_tokens: Family<TenantRouteLabels, Counter>,
    slo: Family<SloLabels, Counter>,
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics")
            .field("pool", &self.pool)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl RouteMetrics {
    fn new(f: &Families, pool: Name, model: Name, shared: PoolHandles<'_>) -> Self {
        let labels = RouteLabels {
            pool: pool.clone(),
            model: model.clone(),
        };
        Self {
            requests: f.requests.clone(),
            outcomes: f.outcomes.of(&pool, &model),
            refused: f.refused.clone(),
            retries: shared.retries.clone(),
            queue_wait: shared.queue_wait.clone(),
            duration: f.request_duration.get_or_create(&labels).clone(),
            ttft: f.ttft.get_or_create(&labels).clone(),
            inter_token: f.inter_token.get_or_create(&labels).clone(),
            prompt_tokens: f.prompt_tokens.clone(),
            completion_tokens: f.completion_tokens.clone(),
            slo: f.slo.clone(),
            pool,
            model,
        }
    }

    /// The pool's name; empty for a model no pool serves.
    pub fn pool(&self) -> &str {
        &self.pool
    }

    /// The request's final status. A lookup in the family by tenant and
    /// status code: no allocation once the pair has been seen.
    pub fn count_request(&self, tenant: &TenantLabel, code: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                pool: self.pool.clone(),
                model: self.model.clone(),
                tenant: tenant.0.clone(),
                code,
            })
            .inc();
        self.outcomes.count(code);
    }

    /// The gateway refused the request for `reason` (one of a fixed set).
    /// Not counted when no pool is known.
    pub fn count_refusal(&self, reason: &'static str) {
        if self.pool.is_empty() {
            return;
        }
        self.refused
            .get_or_create(&RefusedLabels {
                pool: self.pool.clone(),
                reason,
            })
            .inc();
    }

    pub fn count_retries(&self, retries: u32) {
        if retries > 0 {
            self.retries.inc_by(u64::from(retries));
        }
    }

    pub fn observe_queue_wait(&self, band: Priority, waited: Duration) {
        self.queue_wait[band as usize].observe(waited.as_secs_f64());
    }

    pub fn observe_duration(&self, d: Duration) {
        self.duration.observe(d.as_secs_f64());
    }

    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    pub fn observe_inter_token(&self, d: Duration) {
        self.inter_token.observe(d.as_secs_f64());
    }

    pub fn count_tokens(&self, tenant: &TenantLabel, prompt: Option<u64>, completion: Option<u64>) {
        let labels = || TenantRouteLabels {
            pool: self.pool.clone(),
            model: self.model.clone(),
            tenant: tenant.0.clone(),
        };
        if let Some(n) = prompt {
            self.prompt_tokens.get_or_create(&labels()).inc_by(n);
        }
        if let Some(n) = completion {
            self.completion_tokens.get_or_create(&labels()).inc_by(n);
        }
    }
}

impl RouteMetrics {
    /// One objective of a request judged: met (`Some(true)`), missed, or
    /// not judged.
    pub fn count_slo(
        &self,
        tenant: &TenantLabel,
        band: config::Priority,
        objective: &'static str,
        met: Option<bool>,
    ) {
        self.slo
            .get_or_create(&SloLabels {
                pool: self.pool.clone(),
                model: self.model.clone(),
                tenant: tenant.0.clone(),
                band: band.as_str(),
                objective,
                outcome: match met {
                    Some(true) => "met",
                    Some(false) => "missed",
                    None => "unjudged",
                },
            })
            .inc();
    }
}

/// A refusal's `reason` label: flow control's own reason when it refused,
/// otherwise one named after the error's code. Always one of a fixed set.
pub fn refusal_reason(error: &crate::error::ApiError) -> &'static str {
    if let Some(reason) = error.dropped_reason {
        return reason.as_str();
    }
    match error.code {
        Some("pool_saturated") => "saturated",
        Some("queue_full") => "queue-full",
        Some("wait_expired") => "wait-expired",
        Some("no_replicas") => "no-replicas",
        Some("upstream_timeout") => "upstream-timeout",
        Some("upstream_error") => "upstream-failed",
        Some("shutting_down") => "shutting-down",
        Some("model_not_found") => "model-not-found",
        Some("rate_limit_exceeded") => "rate-limited",
        Some("limits_unavailable") => "limits-unavailable",
        Some("model_not_allowed") => "model-not-allowed",
        _ if error.status == http::StatusCode::BAD_REQUEST => "invalid-request",
        _ => "other",
    }
}

/// Names the exposition of `encoded` contains, as sample lines write them
/// (`_total`, `_bucket`, `_info` suffixes included).
pub fn sample_names(encoded: &str) -> std::collections::BTreeSet<&str> {
    encoded
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(encoded: &'a str, prefix: &str) -> Option<&'a str> {
        encoded.lines().find(|l| l.starts_with(prefix))
    }

    #[test]
    fn counters_and_histograms_encode_with_their_labels() {
        let metrics = Metrics::new();
        let queue_wait = std::array::from_fn(|_| latency_histogram());
        let shared = PoolHandles {
            retries: &Counter::default(),
            queue_wait: &queue_wait,
        };
        let route = RouteMetrics::new(
            &metrics.families,
            Name::new("p".into()),
            Name::new("m".into()),
            shared,
        );
        let (a, other) = (TenantLabel::new("a"), TenantLabel::new("other"));
        route.count_request(&a, 200);
        route.count_request(&a, 200);
        route.count_request(&other, 200);
        route.count_request(&a, 404);
        route.count_refusal("saturated");
        route.observe_ttft(Duration::from_millis(30));
        route.count_tokens(&a, Some(7), None);
        metrics.count_auth_failure("token", "expired");
        let out = metrics.encode();
        assert!(out.ends_with("# EOF\n"), "{out}");
        assert_eq!(
            line(
                &out,
                "infergate_requests_total{pool=\"p\",model=\"m\",tenant=\"a\",code=\"200\"}"
            ),
            Some("infergate_requests_total{pool=\"p\",model=\"m\",tenant=\"a\",code=\"200\"} 2")
        );
        assert!(out.contains(
            "infergate_requests_total{pool=\"p\",model=\"m\",tenant=\"other\",code=\"200\"} 1"
        ));
        assert!(out.contains(
            "infergate_requests_total{pool=\"p\",model=\"m\",tenant=\"a\",code=\"404\"} 1"
        ));
        assert!(
            out.contains(
                "infergate_auth_failures_total{credential=\"token\",reason=\"expired\"} 1"
            )
        );
        assert!(out.contains("infergate_refused_total{pool=\"p\",reason=\"saturated\"} 1"));
        assert!(
            out.contains("infergate_ttft_seconds_bucket{le=\"0.035\",pool=\"p\",model=\"m\"} 1")
        );
        assert!(
            out.contains("infergate_ttft_seconds_bucket{le=\"0.02\",pool=\"p\",model=\"m\"} 0")
        );
        assert!(out.contains("infergate_ttft_seconds_count{pool=\"p\",model=\"m\"} 1"));
        assert!(
            out.contains("infergate_prompt_tokens_total{pool=\"p\",model=\"m\",tenant=\"a\"} 7")
        );
    }

    #[test]
    fn unrouted_requests_have_empty_labels_and_no_refusals() {
        let metrics = Metrics::new();
        let unrouted = metrics.unrouted();
        unrouted.count_request(&TenantLabel::new("anonymous"), 404);
        unrouted.count_refusal("model-not-found");
        assert!(Arc::ptr_eq(&unrouted, &metrics.unrouted()));
        let out = metrics.encode();
        assert!(out.contains(
            "infergate_requests_total{pool=\"\",model=\"\",tenant=\"anonymous\",code=\"404\"} 1"
        ));
        assert!(!out.contains("infergate_refused_total{"), "{out}");
    }

    #[test]
    fn sample_names_keep_suffixes() {
        let names = sample_names(
            "# TYPE a counter\na_total{x=\"1\"} 1\nb_bucket{le=\"1\"} 0\nc 3\n# EOF\n",
        );
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["a_total", "b_bucket", "c"]
        );
    }

    #[test]
    fn latency_buckets_resolve_10ms_to_60s() {
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        const { assert!(LATENCY_BUCKETS[0] <= 0.01) };
        assert_eq!(*LATENCY_BUCKETS.last().unwrap(), 60.0);
        // No gap wider than a factor of 2.5 between neighbours.
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[1] / w[0] <= 2.5));
    }
}
