//! Replica, pool and queue gauges, read from the live state when
//! `/metrics` is scraped rather than updated on the request path: the
//! endpoints already hold their latest observation and in-flight load, and
//! the admission its queue.

use std::sync::Arc;
use std::time::Instant;

use config::Priority;
use parking_lot::RwLock;
use picker::Health;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::labels::Name;

/// What the gauges read of a pool's flow control, so telemetry needs
/// nothing else of admission.
pub trait FlowGauges: Send + Sync {
    /// Requests waiting in `band`, and their bytes.
    fn queued(&self, band: Priority) -> (usize, u64);
    /// Waiting requests handed a replica so far.
    fn dispatched(&self) -> u64;
    /// Waiting requests whose client left.
    fn abandoned(&self) -> u64;
    /// The pool's cold starts and the requests waiting for one.
    fn cold(&self) -> ColdStats;
}

/// A cold pool's figures, for the autoscaling metrics.
#[derive(Debug, Clone, Copy, Default)]
pub struct ColdStats {
    /// Requests waiting now for the pool's first ready replica.
    pub waiting: usize,
    /// Times a request found the pool cold and woke it.
    pub starts: u64,
    /// Seconds since the pool's last request; `None` before the first.
    pub idle_seconds: Option<f64>,
    /// Seconds from a request finding the pool cold to its first ready
    /// replica: the last cold start's, and all of them added up.
    pub last_duration: Option<f64>,
    pub durations_sum: f64,
}

/// What the gauges read of a pool's replicas that left it and still
/// drain (they are no longer in the picker's membership).
pub trait DrainGauges: Send + Sync {
    /// Replicas that left the pool with requests still in flight, and of
    /// those the evacuating ones.
    fn leaving(&self) -> (usize, usize);
}

/// A pool as the collector sees it.
pub(super) struct LivePool {
    pub name: Name,
    pub picker: Arc<picker::Picker>,
    pub admission: Arc<dyn FlowGauges>,
    /// What the replicas' KV-cache events say; no publisher in it unless
    /// the pool follows them.
    pub prefix_index: Arc<kv_events::index::PoolIndex>,
    /// Replicas that left the pool and still drain.
    pub drains: Arc<dyn DrainGauges>,
}

#[derive(Debug)]
pub(super) struct LiveGauges {
    pools: Arc<RwLock<Vec<LivePool>>>,
}

impl std::fmt::Debug for LivePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LivePool")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LiveGauges {
    pub fn new(pools: Arc<RwLock<Vec<LivePool>>>) -> Self {
        Self { pools }
    }
}

/// One replica's state, read once per scrape so every gauge of a replica
/// describes the same moment.
struct Row {
    pool: Name,
    endpoint: String,
    inflight: u64,
    unanswered: u64,
    waiting: Option<u64>,
    running: Option<u64>,
    kv_usage: Option<f64>,
    stale: bool,
    ready: bool,
    /// Over the pool's saturation thresholds.
    saturated: bool,
    /// Seconds since the last good scrape; `None` before the first.
    age: Option<f64>,
    resident: Vec<String>,
    /// The replica's learned latency model: its recent prediction errors
    /// (mean absolute percentage, a fraction) of TTFT and of time per
    /// output token, and whether the `predicted` policy trusts it.
    ttft_mape: Option<f64>,
    itl_mape: Option<f64>,
    model_trusted: bool,
}

/// One replica rank's KV-events stream.
struct KvRow {
    pool: Name,
    endpoint: String,
    status: kv_events::index::PublisherStatus,
}

struct PoolRow {
    pool: Name,
    endpoints: usize,
    ready: usize,
    /// Members drained by hand and replicas still leaving; of those, the
    /// evacuating ones.
    draining: usize,
    evacuating: usize,
    kv_usage_avg: Option<f64>,
    waiting_avg: Option<f64>,
    /// Waiting requests and their bytes, by [`Priority`] order.
    queued: [(usize, u64); 3],
    dispatched: u64,
    abandoned: u64,
    cold: ColdStats,
    /// Share of the ready replicas that are saturated; 1 with none ready.
    saturation: f64,
}

/// Every followed replica rank's stream, labelled by the replica's address.
fn read_kv_events(pools: &[LivePool]) -> Vec<KvRow> {
    let mut rows = Vec::new();
    for pool in pools {
        let endpoints = pool.picker.endpoints();
        for status in pool.prefix_index.statuses() {
            if let Some(e) = endpoints
                .iter()
                .find(|e| e.index as u64 == status.id.replica)
            {
                rows.push(KvRow {
                    pool: pool.name.clone(),
                    endpoint: e.addr.to_string(),
                    status,
                });
            }
        }
    }
    rows
}

fn kv_labels(r: &KvRow) -> Vec<(&'static str, String)> {
    vec![
        ("pool", r.pool.to_string()),
        ("endpoint", r.endpoint.clone()),
        ("rank", r.status.id.rank.to_string()),
    ]
}

/// A KV-events counter: its name, its help, and where a row keeps it.
type KvCounter = (&'static str, &'static str, fn(&KvRow) -> u64);

/// The KV-events streams' gauges and counters.
fn encode_kv_events(e: &mut DescriptorEncoder, rows: &[KvRow]) -> std::fmt::Result {
    gauge(
        e,
        "infergate_kv_events_in_step",
        "1 while the gateway's index of the replica rank's KV cache follows every event since a known state (exact), 0 while unsure",
        rows,
        kv_labels,
        |r| {
            Some(i64::from(
                r.status.source == kv_events::index::Source::Events,
            ))
        },
    )?;
    gauge(
        e,
        "infergate_kv_events_gpu_blocks",
        "Blocks the replica rank's engine holds in GPU memory, as its events say",
        rows,
        kv_labels,
        |r| Some(r.status.gpu_blocks as i64),
    )?;
    gauge(
        e,
        "infergate_kv_events_offload_blocks",
        "Blocks the replica rank's engine holds in an offload tier, as its events say",
        rows,
        kv_labels,
        |r| Some(r.status.offload_blocks as i64),
    )?;
    let counters: [KvCounter; 6] = [
        (
            "infergate_kv_events_events",
            "KV-cache events applied from the replica rank",
            |r| r.status.events,
        ),
        (
            "infergate_kv_events_unknown_events",
            "KV-cache events of kinds the gateway does not know (ignored)",
            |r| r.status.unknown_events,
        ),
        (
            "infergate_kv_events_gaps",
            "Holes in the replica rank's event sequence numbers",
            |r| r.status.gaps,
        ),
        (
            "infergate_kv_events_replays",
            "Replays asked of the replica rank's replay socket",
            |r| r.status.replays,
        ),
        (
            "infergate_kv_events_restarts",
            "Times the replica rank's event sequence went back (its engine restarted)",
            |r| r.status.restarts,
        ),
        (
            "infergate_kv_events_decode_errors",
            "Event batches from the replica rank that could not be decoded",
            |r| r.status.decode_errors,
        ),
    ];
    for (name, help, value) in counters {
        counter(e, name, help, rows, kv_labels, value)?;
    }
    Ok(())
}

fn read(pools: &[LivePool]) -> (Vec<Row>, Vec<PoolRow>) {
    let now = Instant::now();
    let mut rows = Vec::new();
    let mut pool_rows = Vec::with_capacity(pools.len());
    for pool in pools {
        let config = pool.picker.config();
        let stale_after = config.stale_after;
        let first = rows.len();
        let (mut draining, mut evacuating) = pool.drains.leaving();
        for e in pool.picker.endpoints().iter() {
            draining += usize::from(e.draining());
            evacuating += usize::from(e.evacuating());
            let obs = e.observation();
            let healthy = picker::health(&obs, now, stale_after) == Health::Healthy;
            let s = obs.state.as_deref();
            let latency = e.latency().summary();
            rows.push(Row {
                pool: pool.name.clone(),
                endpoint: e.addr.to_string(),
                inflight: e.load.requests(),
                unanswered: e.load.unanswered(),
                waiting: s.and_then(|s| s.waiting),
                running: s.and_then(|s| s.running),
                kv_usage: s.and_then(|s| s.kv_usage),
                stale: !healthy,
                ready: picker::is_ready(e, &config, now),
                saturated: config
                    .saturation
                    .is_saturated(s.and_then(|s| s.waiting), s.and_then(|s| s.kv_usage)),
                age: obs
                    .last_good
                    .map(|t| now.saturating_duration_since(t).as_secs_f64()),
                resident: s.map(|s| s.resident_adapters.clone()).unwrap_or_default(),
                ttft_mape: latency.ttft.mape,
                itl_mape: latency.itl.mape,
                model_trusted: latency.trusted,
            });
        }
        let mine = &rows[first..];
        // Averages over replicas whose numbers can be trusted right now.
        let fresh = || mine.iter().filter(|r| !r.stale);
        let mean = |values: Vec<f64>| {
            (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
        };
        let ready = mine.iter().filter(|r| r.ready).count();
        pool_rows.push(PoolRow {
            pool: pool.name.clone(),
            endpoints: mine.len(),
            ready,
            draining,
            evacuating,
            kv_usage_avg: mean(fresh().filter_map(|r| r.kv_usage).collect()),
            waiting_avg: mean(
                fresh()
                    .filter_map(|r| r.waiting)
                    .map(|w| w as f64)
                    .collect(),
            ),
            queued: Priority::ALL.map(|band| pool.admission.queued(band)),
            dispatched: pool.admission.dispatched(),
            abandoned: pool.admission.abandoned(),
            cold: pool.admission.cold(),
            saturation: if ready == 0 {
                1.0
            } else {
                mine.iter().filter(|r| r.ready && r.saturated).count() as f64 / ready as f64
            },
        });
    }
    (rows, pool_rows)
}

/// The signals autoscalers read: the endpoint-picker ecosystem's names
/// (label `name`, the pool), so KEDA and HPA recipes written for it work
/// unchanged, each reported at zero replicas too; then infergate's own
/// cold-start figures.
fn encode_autoscaling(
    e: &mut DescriptorEncoder,
    pools: &[PoolRow],
    rows: &[Row],
) -> std::fmt::Result {
    let name = |p: &PoolRow| vec![("name", p.pool.to_string())];
    gauge(
        e,
        "inference_pool_ready_pods",
        "Replicas of the pool that can take requests (as infergate_pool_ready_endpoints)",
        pools,
        name,
        |p| Some(p.ready as i64),
    )?;
    gauge(
        e,
        "inference_pool_average_queue_size",
        "Mean engine queue length over the pool's replicas with fresh metrics; 0 with none",
        pools,
        name,
        |p| Some(p.waiting_avg.unwrap_or(0.0)),
    )?;
    gauge(
        e,
        "inference_pool_average_kv_cache_utilization",
        "Mean KV cache usage over the pool's replicas with fresh metrics; 0 with none",
        pools,
        name,
        |p| Some(p.kv_usage_avg.unwrap_or(0.0)),
    )?;
    gauge(
        e,
        "inference_pool_per_pod_queue_size",
        "Each replica's engine queue length",
        rows,
        |r| {
            vec![
                ("name", r.pool.to_string()),
                ("model_server_pod", r.endpoint.clone()),
            ]
        },
        |r| r.waiting.map(|w| w as i64),
    )?;
    gauge(
        e,
        "inference_extension_flow_control_queue_size",
        "Requests waiting in the gateway's flow control, every band",
        pools,
        name,
        |p| Some(p.queued.iter().map(|(n, _)| *n as i64).sum::<i64>()),
    )?;
    gauge(
        e,
        "infergate_cold_waiting_requests",
        "Requests waiting for the pool's first ready replica (the pool is cold)",
        pools,
        pool_labels,
        |p| Some(p.cold.waiting as i64),
    )?;
    counter(
        e,
        "infergate_cold_starts",
        "Times a request found the pool with no ready replica and woke it",
        pools,
        pool_labels,
        |p| p.cold.starts,
    )?;
    gauge(
        e,
        "infergate_cold_start_last_seconds",
        "How long the pool's last cold start took: from a request finding it cold to its first ready replica",
        pools,
        pool_labels,
        |p| p.cold.last_duration,
    )?;
    counter(
        e,
        "infergate_cold_start_seconds",
        "Seconds of every cold start of the pool added up (divided by infergate_cold_starts_total, the mean; starts still under way are not in it)",
        pools,
        pool_labels,
        |p| p.cold.durations_sum,
    )?;
    gauge(
        e,
        "inference_extension_flow_control_pool_saturation",
        "Share of the pool's ready replicas that are saturated (over its saturation thresholds); 1 with none ready",
        pools,
        name,
        |p| Some(p.saturation),
    )?;
    gauge(
        e,
        "infergate_pool_idle_seconds",
        "Seconds since the pool's last request, for scaling it down; absent before the first",
        pools,
        pool_labels,
        |p| p.cold.idle_seconds,
    )?;
    Ok(())
}

/// Write one gauge family: `value` returns `None` to leave a series out
/// (a signal the replica's engine does not report).
fn gauge<T, V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    items: &[T],
    labels: impl Fn(&T) -> Vec<(&'static str, String)>,
    value: impl Fn(&T) -> Option<V>,
) -> std::fmt::Result
where
    ConstGauge<V>: EncodeMetric,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for item in items {
        if let Some(v) = value(item) {
            let labels = labels(item);
            ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

fn counter<T, N>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    items: &[T],
    labels: impl Fn(&T) -> Vec<(&'static str, String)>,
    value: impl Fn(&T) -> N,
) -> std::fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for item in items {
        let labels = labels(item);
        ConstCounter::new(value(item)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn endpoint_labels(r: &Row) -> Vec<(&'static str, String)> {
    vec![
        ("pool", r.pool.to_string()),
        ("endpoint", r.endpoint.clone()),
    ]
}

fn pool_labels(p: &PoolRow) -> Vec<(&'static str, String)> {
    vec![("pool", p.pool.to_string())]
}

/// One gauge of the gateway itself: name, help, value.
pub type ServerGauge = (&'static str, &'static str, i64);

/// Reads the gateway's own gauges; set once the gateway runs.
pub type ServerGaugeSource =
    Arc<std::sync::OnceLock<Box<dyn Fn() -> Vec<ServerGauge> + Send + Sync>>>;

/// Gauges of the gateway as a server (open connections, live tasks,
/// buffered request bytes), read from their sources when scraped. The
/// sources exist only once the gateway runs, so they are set then.
#[derive(Default)]
pub(super) struct ServerGauges {
    pub read: ServerGaugeSource,
}

impl std::fmt::Debug for ServerGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerGauges")
    }
}

impl Collector for ServerGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(read) = self.read.get() else {
            return Ok(());
        };
        for (name, help, value) in read() {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)?;
        }
        Ok(())
    }
}

impl Collector for LiveGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let (rows, pools, kv_rows) = {
            let live = self.pools.read();
            let (rows, pools) = read(&live);
            (rows, pools, read_kv_events(&live))
        };
        let e = &mut encoder;
        encode_kv_events(e, &kv_rows)?;
        gauge(
            e,
            "infergate_endpoint_inflight",
            "Requests this gateway has in flight to the replica",
            &rows,
            endpoint_labels,
            |r| Some(r.inflight as i64),
        )?;
        gauge(
            e,
            "infergate_endpoint_unanswered",
            "Of the requests in flight to the replica, those it has not sent a first byte for (queued or in prefill)",
            &rows,
            endpoint_labels,
            |r| Some(r.unanswered as i64),
        )?;
        gauge(
            e,
            "infergate_endpoint_kv_usage",
            "Fraction of the replica's KV cache in use (0..1), from its last good scrape",
            &rows,
            endpoint_labels,
            |r| r.kv_usage,
        )?;
        gauge(
            e,
            "infergate_endpoint_waiting",
            "Requests waiting in the replica's engine queue, from its last good scrape",
            &rows,
            endpoint_labels,
            |r| r.waiting.map(|w| w as i64),
        )?;
        gauge(
            e,
            "infergate_endpoint_running",
            "Requests in the replica's running batch, from its last good scrape",
            &rows,
            endpoint_labels,
            |r| r.running.map(|w| w as i64),
        )?;
        gauge(
            e,
            "infergate_endpoint_stale",
            "1 when the picker does not trust the replica's metrics (stale or failing scrape)",
            &rows,
            endpoint_labels,
            |r| Some(i64::from(r.stale)),
        )?;
        gauge(
            e,
            "infergate_latency_prediction_error",
            "Recent mean absolute percentage error (a fraction) of the replica's learned latency model, per target: ttft, or itl (time per output token); each prediction measured before the model learned from its observation",
            &rows
                .iter()
                .flat_map(|r| [(r, "ttft", r.ttft_mape), (r, "itl", r.itl_mape)])
                .collect::<Vec<_>>(),
            |(r, target, _)| {
                let mut labels = endpoint_labels(r);
                labels.push(("target", (*target).to_owned()));
                labels
            },
            |(_, _, mape)| *mape,
        )?;
        gauge(
            e,
            "infergate_latency_model_trusted",
            "1 when the replica's learned latency model is trusted: the predicted policy ranks by it rather than by the scored fallback",
            &rows,
            endpoint_labels,
            |r| Some(i64::from(r.model_trusted)),
        )?;
        gauge(
            e,
            "infergate_endpoint_metrics_age_seconds",
            "Age of the replica's last good scrape",
            &rows,
            endpoint_labels,
            |r| r.age,
        )?;
        {
            let mut family = e.encode_descriptor(
                "infergate_endpoint_adapter",
                "LoRA adapters resident in the replica's GPU memory, one series per adapter",
                None,
                MetricType::Info,
            )?;
            for r in &rows {
                for adapter in &r.resident {
                    let labels = [
                        ("pool", r.pool.as_str()),
                        ("endpoint", r.endpoint.as_str()),
                        ("adapter", adapter.as_str()),
                    ];
                    family.encode_info(&labels)?;
                }
            }
        }
        gauge(
            e,
            "infergate_pool_endpoints",
            "Replicas in the pool",
            &pools,
            pool_labels,
            |p| Some(p.endpoints as i64),
        )?;
        gauge(
            e,
            "infergate_pool_ready_endpoints",
            "Replicas that can take requests: reachable, not draining, with fresh metrics when the pool refuses to pick without them",
            &pools,
            pool_labels,
            |p| Some(p.ready as i64),
        )?;
        gauge(
            e,
            "infergate_pool_draining_endpoints",
            "Replicas taking no new requests while those in flight finish: drained by hand, or leaving the pool (removed or terminating) with requests still in flight; evacuating ones included",
            &pools,
            pool_labels,
            |p| Some(p.draining as i64),
        )?;
        gauge(
            e,
            "infergate_pool_evacuating_endpoints",
            "Draining replicas whose streams move to other replicas (past the drain deadline, or drained with evacuate)",
            &pools,
            pool_labels,
            |p| Some(p.evacuating as i64),
        )?;
        gauge(
            e,
            "infergate_pool_kv_usage_avg",
            "Mean KV cache usage over replicas with fresh metrics",
            &pools,
            pool_labels,
            |p| p.kv_usage_avg,
        )?;
        gauge(
            e,
            "infergate_pool_waiting_avg",
            "Mean engine queue length over replicas with fresh metrics",
            &pools,
            pool_labels,
            |p| p.waiting_avg,
        )?;
        encode_autoscaling(e, &pools, &rows)?;
        let bands: Vec<(&PoolRow, Priority)> = pools
            .iter()
            .flat_map(|p| Priority::ALL.map(|band| (p, band)))
            .collect();
        let band_labels = |(p, band): &(&PoolRow, Priority)| {
            vec![
                ("pool", p.pool.to_string()),
                ("priority", band.as_str().to_owned()),
            ]
        };
        gauge(
            e,
            "infergate_queue_requests",
            "Requests waiting in the gateway's flow-control queue",
            &bands,
            band_labels,
            |(p, band)| Some(p.queued[*band as usize].0 as i64),
        )?;
        gauge(
            e,
            "infergate_queue_bytes",
            "Request body bytes held by waiting requests",
            &bands,
            band_labels,
            |(p, band)| Some(p.queued[*band as usize].1 as i64),
        )?;
        counter(
            e,
            "infergate_queue_dispatched",
            "Requests that waited in flow control and were then sent to a replica",
            &pools,
            pool_labels,
            |p| p.dispatched,
        )?;
        counter(
            e,
            "infergate_queue_abandoned",
            "Requests whose client left while they waited in flow control",
            &pools,
            pool_labels,
            |p| p.abandoned,
        )?;
        Ok(())
    }
}
