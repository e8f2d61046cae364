//! Starting simulated replicas: one ([`start_replica`]) or a fleet of them on
//! consecutive ports ([`start_fleet`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, bail};
use kv_events::publisher::Publisher;
use parking_lot::Mutex;
use tokio::net::TcpSocket;
use tokio::sync::watch;

use crate::disaggregation::{DisaggregationSpec, Role};
use crate::engine::{Engine, EngineConfig, KvLink, SchedulingPolicy};
use crate::faults::{FaultState, Faults, FaultsUpdate};
use crate::http::{self, AppState, Drain, StopMode, StopSignal};
use crate::kv_cache_events::{self, KvEventSink, KvEventsSpec};
use crate::metrics::{self, Dialect, Exporter, ReplicaIdentity};
use crate::replica::EngineClient;

/// How long a graceful shutdown lets open requests run before closing them.
pub const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// One simulated model server.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    /// GPU profile: `h100`, `a100`, `l4`, `a10g` (see `engine::hardware_names`).
    pub hardware: String,
    /// Model profile: `llama-3.1-8b`, `qwen3-32b`, `llama-3.1-70b` or an HF id.
    pub model: String,
    /// The name clients send as `model`; defaults to the model's HF id, as
    /// vLLM serves under the model path it was started with.
    pub served_model_name: Option<String>,
    /// GPUs per replica; defaults to the model profile's usual TP.
    pub tensor_parallel: Option<u32>,
    /// LoRA adapters loaded at start (vLLM's `--lora-modules`).
    pub adapters: Vec<String>,
    /// Adapters per batch (GPU slots); vLLM's default when `None`.
    pub max_loras: Option<u32>,
    /// Sequences per batch; vLLM's default for the GPU when `None`.
    pub max_num_seqs: Option<u32>,
    /// vLLM's `--scheduling-policy`: `fcfs` (its default) refuses requests
    /// with a non-zero `priority`, `priority` serves them by it.
    pub scheduling_policy: SchedulingPolicy,
    /// Which engine's `/metrics` names to speak: one of
    /// [`metrics::DIALECTS`].
    pub dialect: Dialect,
    /// Engine seconds per wall second (10 runs the simulated GPU 10× faster
    /// than real time). Latencies in responses' pacing shrink by this factor;
    /// `/metrics` reports engine seconds.
    pub time_scale: f64,
    /// Seeds answer lengths, answer words and injected-error draws.
    pub seed: u64,
    /// Faults in force from the start.
    pub faults: Faults,
    /// vLLM's `--num-gpu-blocks-override`: this many KV blocks instead of
    /// what the memory plan leaves (small caches evict sooner, for tests).
    pub num_gpu_blocks_override: Option<u64>,
    /// Publish KV-cache events as vLLM's `--kv-events-config` does; off
    /// when `None`.
    pub kv_events: Option<KvEventsSpec>,
    /// Prefill or decode role, KV link and bootstrap port
    /// (see [`crate::disaggregation`]).
    pub disaggregation: DisaggregationSpec,
    /// How long the replica loads before it listens; connections are
    /// refused until then.
    pub load_time: LoadTime,
    /// Scaled to zero: the replica starts loading only once this turns
    /// true (its fleet's wake endpoint, [`Fleet::wake_url`]), refusing
    /// connections until loaded.
    pub asleep: Option<watch::Receiver<bool>>,
}

/// Engine time from a replica's start until it listens: its weights
/// loading and its engine starting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LoadTime {
    /// This long; zero listens at once.
    Fixed(Duration),
    /// The model's weights at [`LOAD_BANDWIDTH`], then [`ENGINE_INIT`]
    /// ([`calibrated_load_time`]).
    Calibrated,
}

impl Default for LoadTime {
    fn default() -> Self {
        LoadTime::Fixed(Duration::ZERO)
    }
}

impl std::str::FromStr for LoadTime {
    type Err = String;
    /// `calibrated`, or a duration (`90s`, `2m`).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "calibrated" {
            return Ok(LoadTime::Calibrated);
        }
        humantime::parse_duration(s)
            .map(LoadTime::Fixed)
            .map_err(|e| format!("{s:?} is neither `calibrated` nor a duration: {e}"))
    }
}

impl LoadTime {
    /// Engine time for a replica of `config`.
    pub fn of(self, config: &EngineConfig) -> Duration {
        match self {
            LoadTime::Fixed(d) => d,
            LoadTime::Calibrated => calibrated_load_time(config),
        }
    }
}

impl Default for ReplicaSpec {
    fn default() -> Self {
        Self {
            hardware: "h100".into(),
            model: "llama-3.1-8b".into(),
            served_model_name: None,
            tensor_parallel: None,
            adapters: Vec::new(),
            max_loras: None,
            max_num_seqs: None,
            scheduling_policy: SchedulingPolicy::default(),
            dialect: Dialect::Vllm,
            time_scale: 1.0,
            seed: 0,
            faults: Faults::default(),
            num_gpu_blocks_override: None,
            kv_events: None,
            disaggregation: DisaggregationSpec::default(),
            load_time: LoadTime::default(),
            asleep: None,
        }
    }
}

impl ReplicaSpec {
    pub fn new(hardware: impl Into<String>, model: impl Into<String>) -> Self {
        Self {
            hardware: hardware.into(),
            model: model.into(),
            ..Self::default()
        }
    }

    /// The engine configuration this spec describes, or a clear error
    /// (unknown names, a model that does not fit, bad settings).
    pub fn engine_config(&self) -> anyhow::Result<EngineConfig> {
        let describe = || format!("{} on {}", self.model, self.hardware);
        // The profile error stays in the chain, so a caller can tell which
        // setting is at fault (`downcast_ref::<ProfileError>()`).
        let mut config = EngineConfig::new(&self.hardware, &self.model, self.tensor_parallel)
            .with_context(describe)?;
        if let Some(max_loras) = self.max_loras {
            config.max_loras = max_loras;
        }
        if let Some(max_num_seqs) = self.max_num_seqs {
            config.max_num_seqs = max_num_seqs;
            config.max_num_batched_tokens = config.max_num_batched_tokens.max(max_num_seqs);
        }
        config.slowdown = self.faults.slowdown;
        config.scheduling_policy = self.scheduling_policy;
        if let Some(blocks) = self.num_gpu_blocks_override {
            config.num_gpu_blocks_override = Some(blocks);
            config.max_model_len = config.max_model_len.min(config.kv_capacity_tokens());
        }
        config.validate().with_context(describe)?;
        if !self.adapters.is_empty() && config.max_loras == 0 {
            bail!(
                "{}: adapters {:?} need max_loras > 0",
                describe(),
                self.adapters
            );
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            bail!(
                "time_scale must be a positive number, got {}",
                self.time_scale
            );
        }
        self.faults.validate().map_err(anyhow::Error::msg)?;
        self.disaggregation
            .link
            .validate()
            .map_err(anyhow::Error::msg)?;
        if let Some(kv_events) = &self.kv_events {
            kv_events.validate(1)?;
        }
        if !metrics::renders(self.dialect) {
            bail!(
                "the simulator does not render the {} metrics dialect (use vllm, sglang, tgi or llamacpp)",
                self.dialect
            );
        }
        Ok(config)
    }
}

/// What a started replica is (for logs and the CLI's table).
#[derive(Debug, Clone)]
pub struct ReplicaInfo {
    pub addr: SocketAddr,
    /// GPU profile name (`h100`).
    pub hardware: String,
    /// Model profile name (`llama-3.1-8b`).
    pub model: String,
    /// The `model` clients send.
    pub served_model: String,
    pub tensor_parallel: u32,
    pub num_gpu_blocks: u64,
    pub block_size: u32,
    pub max_model_len: u32,
    pub max_num_seqs: u32,
    pub max_loras: u32,
    pub dialect: Dialect,
    pub time_scale: f64,
    /// Where KV events are published (`tcp://host:port`), when enabled.
    pub kv_events_endpoint: Option<String>,
    /// Where their replays are answered, when enabled.
    pub kv_events_replay_endpoint: Option<String>,
}

/// A running replica. Dropping the handle stops the replica abruptly; use
/// [`shutdown`](Self::shutdown) for a graceful stop.
pub struct ReplicaHandle {
    info: ReplicaInfo,
    state: Arc<AppState>,
    stop: Arc<StopSignal>,
    stopped: watch::Receiver<bool>,
    engine: EngineClient,
    /// The replica's actor owns the publisher: it closes when the replica
    /// stops.
    kv_events: Option<Weak<Publisher>>,
}

impl ReplicaHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.info.addr
    }

    pub fn info(&self) -> &ReplicaInfo {
        &self.info
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.state.faults.current()
    }

    /// Changes the faults in force, as `POST /admin/faults` does with the
    /// same body; the faults now in force.
    pub fn set_faults(&self, update: &FaultsUpdate) -> anyhow::Result<Faults> {
        http::apply_faults(&self.state, update).map_err(|error| anyhow::anyhow!(error.message))
    }

    /// Begins a graceful stop, as `POST /admin/stop`: new inference
    /// requests get a 503 (and `/health` too), the ones in flight run to
    /// their end however long that takes, then the replica stops listening
    /// ([`stopped`](Self::stopped) resolves).
    pub fn drain(&self) {
        self.state.begin_drain();
    }

    /// Stops accepting, lets open requests finish (up to [`SHUTDOWN_DRAIN`]),
    /// then closes every connection.
    pub async fn shutdown(self) {
        self.stop.request(StopMode::Graceful);
        self.stopped().await;
    }

    /// Stops listening and drops every connection at once, as a crashed
    /// server would. Returns when the port is closed.
    pub async fn crash(&self) {
        self.stop.request(StopMode::Crash);
        self.stopped().await;
    }

    /// Resolves once the replica has stopped (shut down, crashed through
    /// [`crash`](Self::crash) or `POST /admin/crash`).
    pub async fn stopped(&self) {
        let mut stopped = self.stopped.clone();
        // An error means the server task is gone, which is stopped too.
        let _ = stopped.wait_for(|stopped| *stopped).await;
    }

    pub fn is_stopped(&self) -> bool {
        *self.stopped.borrow()
    }

    /// The chained hashes of the blocks in the engine's prefix cache, as of
    /// now; every KV event up to this state is queued for publishing when
    /// it returns. Empty once the replica has stopped.
    pub async fn cached_blocks(&self) -> Vec<u64> {
        self.engine.cached_blocks().await.unwrap_or_default()
    }

    /// Waits until every KV-event batch queued so far is published; the
    /// last batch's sequence number (`None` before the first, or without
    /// KV events).
    pub async fn kv_events_published(&self) -> Option<u64> {
        let publisher = self.kv_events.as_ref()?.upgrade()?;
        publisher.flush().await
    }
}

impl Drop for ReplicaHandle {
    fn drop(&mut self) {
        self.stop.request(StopMode::Crash);
    }
}

impl std::fmt::Debug for ReplicaHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaHandle")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

/// Starts one replica listening on `addr` (port 0 picks a free port).
pub async fn start_replica(addr: SocketAddr, spec: ReplicaSpec) -> anyhow::Result<ReplicaHandle> {
    let config = spec.engine_config()?;
    // Bound at once, so the address is the replica's from the start, but
    // listening only once the model is loaded: until then a connection is
    // refused, as it is by a model server still loading its weights.
    let socket = bind(addr).with_context(|| format!("cannot listen on {addr}"))?;
    let addr = socket.local_addr()?;
    let load_wall = spec.load_time.of(&config).div_f64(spec.time_scale);

    let served_model = spec
        .served_model_name
        .clone()
        .unwrap_or_else(|| config.model.hf_id.to_owned());
    let mut info = ReplicaInfo {
        addr,
        hardware: config.hardware.name.to_owned(),
        model: config.model.name.to_owned(),
        served_model: served_model.clone(),
        tensor_parallel: config.tensor_parallel,
        num_gpu_blocks: config.num_gpu_blocks(),
        block_size: config.block_size,
        max_model_len: config.max_model_len,
        max_num_seqs: config.max_num_seqs,
        max_loras: config.max_loras,
        dialect: spec.dialect,
        time_scale: spec.time_scale,
        kv_events_endpoint: None,
        kv_events_replay_endpoint: None,
    };
    let kv_events = match &spec.kv_events {
        Some(kv_spec) => {
            let publisher = kv_cache_events::bind(kv_spec, addr.ip(), spec.seed).await?;
            info.kv_events_endpoint = Some(publisher.endpoint().to_owned());
            info.kv_events_replay_endpoint = publisher.replay_endpoint().map(str::to_owned);
            Some(KvEventSink {
                publisher,
                block_size: config.block_size,
                bytes_hashes: kv_spec.bytes_hashes,
                scratch: Vec::new(),
            })
        }
        None => None,
    };
    let kv_publisher = kv_events
        .as_ref()
        .map(|sink| Arc::downgrade(&sink.publisher));
    let identity = ReplicaIdentity {
        model_name: served_model.clone(),
        max_model_len: config.max_model_len,
        gpu_memory_utilization: config.gpu_memory_utilization,
        enable_prefix_caching: config.enable_prefix_caching,
        started_unix: unix_seconds(),
    };
    let lora_enabled = config.max_loras > 0;
    let disaggregated = http::Disaggregated {
        spec: spec.disaggregation,
        engine_id: format!("sim-{}-{:016x}", addr.port(), rand::random::<u64>()),
        addr,
        block_size: config.block_size,
        tensor_parallel: config.tensor_parallel,
        time_scale: spec.time_scale,
    };
    let scheduling_policy = config.scheduling_policy;
    let model_root = config.model.hf_id;
    let max_model_len = config.max_model_len;
    let dialect = spec.dialect;
    let (engine, actor) = EngineClient::spawn(
        Engine::new(config),
        spec.time_scale,
        metrics::latency_buckets(spec.dialect),
        kv_events,
    );
    let handle_engine = engine.clone();

    let stop = Arc::new(StopSignal::new());
    let state = Arc::new(AppState {
        served_model,
        model_root: model_root.to_owned(),
        max_model_len,
        dialect,
        lora_enabled,
        seed: spec.seed,
        scheduling_policy,
        engine,
        adapters: Mutex::new(Vec::new()),
        faults: FaultState::new(spec.faults.clone(), spec.seed).map_err(anyhow::Error::msg)?,
        exporter: Mutex::new(Exporter::new(spec.dialect, identity)),
        last_metrics: Mutex::new(None),
        stop: stop.clone(),
        drain: Arc::new(Drain::default()),
        disaggregated,
    });
    for name in &spec.adapters {
        state
            .load_adapter(name, &format!("/adapters/{name}"))
            .map_err(|e| anyhow::anyhow!("adapter {name}: {}", e.message))?;
    }

    let (stopped_tx, stopped) = watch::channel(false);
    let handle_state = state.clone();
    // Without a load time it listens before this returns, so a client may
    // connect at once.
    let start = match spec.asleep {
        None if load_wall.is_zero() => Start::Listening(socket.listen(LISTEN_BACKLOG)?),
        asleep => Start::Loading(socket, asleep),
    };
    tokio::spawn(async move {
        let listener = match start {
            Start::Listening(listener) => Ok(listener),
            Start::Loading(socket, asleep) => {
                let mut stop = state.stop.subscribe();
                let woken = async {
                    if let Some(mut asleep) = asleep {
                        // A fleet dropped while asleep never wakes it.
                        if asleep.wait_for(|woken| *woken).await.is_err() {
                            std::future::pending::<()>().await;
                        }
                        tracing::info!(%addr, "replica woken: loading its model");
                    }
                    tokio::time::sleep(load_wall).await;
                };
                tokio::select! {
                    () = woken => {
                        tracing::info!(%addr, "replica loaded its model and listens");
                        socket.listen(LISTEN_BACKLOG)
                    }
                    // Stopped while loading: it never listens.
                    _ = stop.wait_for(|mode| *mode != StopMode::Running) => {
                        Err(std::io::ErrorKind::Interrupted.into())
                    }
                }
            }
        };
        match listener {
            Ok(listener) => http::serve(listener, state, SHUTDOWN_DRAIN).await,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => tracing::error!(%addr, %error, "replica cannot listen"),
        }
        actor.abort();
        let _ = stopped_tx.send(true);
    });
    tracing::info!(
        %addr, hardware = %info.hardware, model = %info.model, blocks = info.num_gpu_blocks,
        load_time_s = load_wall.as_secs_f64(),
        "replica started"
    );
    Ok(ReplicaHandle {
        info,
        state: handle_state,
        stop,
        stopped,
        engine: handle_engine,
        kv_events: kv_publisher,
    })
}

/// How a replica's server starts: listening at once, or once loaded
/// (woken first, when it is asleep).
enum Start {
    Listening(tokio::net::TcpListener),
    Loading(TcpSocket, Option<watch::Receiver<bool>>),
}

/// Pending connections a replica's listener holds.
const LISTEN_BACKLOG: u32 = 1024;

/// A socket bound to `addr` (with `SO_REUSEADDR`, as a listener is), not
/// yet listening.
fn bind(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

/// How long a model server takes from start to its first answer: its
/// weights read at [`LOAD_BANDWIDTH`] (split over tensor-parallel ranks,
/// which read theirs at once), then [`ENGINE_INIT`].
pub fn calibrated_load_time(config: &EngineConfig) -> Duration {
    let bytes = config.model.weight_bytes() / f64::from(config.tensor_parallel.max(1));
    Duration::from_secs_f64(bytes / LOAD_BANDWIDTH) + ENGINE_INIT
}

/// Bytes per second a model server reads its weights at with vLLM's default
/// safetensors loader from a network block volume: NVIDIA's Run:ai Model
/// Streamer benchmark loaded Llama-3-8B (~16 GB) in 47.99 s with it from
/// an AWS gp3 volume (g5.12xlarge, A10G), about 0.33 GB/s.
pub const LOAD_BANDWIDTH: f64 = 0.33e9;

/// Start-up work after the weights (torch.compile, CUDA graph capture,
/// profiling the KV cache, warm-up): ~40 s of vLLM's cold start in
/// published breakdowns; a rough figure, for the order of magnitude.
pub const ENGINE_INIT: Duration = Duration::from_secs(40);

/// A fleet of replicas of one model on (possibly) different GPUs.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub replicas: usize,
    /// GPU of each replica, cycled: `[h100, a10g]` gives h100, a10g, h100, ...
    pub hardware: Vec<String>,
    pub model: String,
    pub served_model_name: Option<String>,
    pub tensor_parallel: Option<u32>,
    /// Adapters every replica loads at start.
    pub adapters: Vec<String>,
    pub max_loras: Option<u32>,
    pub max_num_seqs: Option<u32>,
    /// As in [`ReplicaSpec::scheduling_policy`].
    pub scheduling_policy: SchedulingPolicy,
    pub time_scale: f64,
    pub dialect: Dialect,
    /// The same seed on every replica, so a prompt gets the same answer
    /// wherever it is routed.
    pub seed: u64,
    pub host: IpAddr,
    /// Replica `i` listens on `base_port + i`; `None` lets the OS pick.
    pub base_port: Option<u16>,
    pub faults: Faults,
    /// KV events from every replica; fixed ports move up by the replica's
    /// index ([`KvEventsSpec::for_replica`]).
    pub kv_events: Option<KvEventsSpec>,
    /// Role of replica `i` (prefill, decode); `both` past the list's end.
    pub roles: Vec<Role>,
    /// The link decode replicas pull KV over.
    pub kv_link: KvLink,
    /// As in [`ReplicaSpec::load_time`], for every replica.
    pub load_time: LoadTime,
    /// Start scaled to zero: every replica asleep until the fleet's wake
    /// endpoint is called ([`Fleet::wake_url`]).
    pub start_asleep: bool,
}

impl Default for FleetSpec {
    fn default() -> Self {
        Self {
            replicas: 1,
            hardware: vec!["h100".into()],
            model: "llama-3.1-8b".into(),
            served_model_name: None,
            tensor_parallel: None,
            adapters: Vec::new(),
            max_loras: None,
            max_num_seqs: None,
            scheduling_policy: SchedulingPolicy::default(),
            time_scale: 1.0,
            dialect: Dialect::Vllm,
            seed: 0,
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            base_port: None,
            faults: Faults::default(),
            kv_events: None,
            roles: Vec::new(),
            kv_link: KvLink::default(),
            load_time: LoadTime::default(),
            start_asleep: false,
        }
    }
}

impl FleetSpec {
    /// The spec of replica `index`.
    ///
    /// # Panics
    /// If `hardware` is empty.
    pub fn replica(&self, index: usize) -> ReplicaSpec {
        ReplicaSpec {
            hardware: self.hardware[index % self.hardware.len()].clone(),
            model: self.model.clone(),
            served_model_name: self.served_model_name.clone(),
            tensor_parallel: self.tensor_parallel,
            adapters: self.adapters.clone(),
            max_loras: self.max_loras,
            max_num_seqs: self.max_num_seqs,
            scheduling_policy: self.scheduling_policy,
            dialect: self.dialect,
            time_scale: self.time_scale,
            seed: self.seed,
            faults: self.faults.clone(),
            num_gpu_blocks_override: None,
            kv_events: self.kv_events.as_ref().map(|k| k.for_replica(index)),
            disaggregation: DisaggregationSpec {
                role: self.roles.get(index).copied().unwrap_or_default(),
                link: self.kv_link,
                ..DisaggregationSpec::default()
            },
            load_time: self.load_time,
            asleep: None,
        }
    }

    /// Every check [`start_fleet`] makes before it opens a port, without
    /// starting anything: the replica count, each GPU × model pair (the
    /// errors keep their [`ProfileError`](crate::engine::ProfileError)) and
    /// the adapter names every replica loads.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.replicas == 0 {
            bail!("a fleet needs at least one replica");
        }
        if self.hardware.is_empty() {
            bail!("a fleet needs at least one hardware profile");
        }
        if let Some(kv_events) = &self.kv_events {
            kv_events.validate(self.replicas)?;
        }
        let mut served_model = None;
        for index in 0..self.replicas.min(self.hardware.len()) {
            let config = self
                .replica(index)
                .engine_config()
                .with_context(|| format!("replica {index}"))?;
            served_model.get_or_insert(config.model.hf_id);
        }
        let served_model = self.served_model_name.as_deref().or(served_model);
        // What loading them at start would refuse.
        for (i, name) in self.adapters.iter().enumerate() {
            if Some(name.as_str()) == served_model {
                bail!("adapter {name:?} has the served model's name");
            }
            if self.adapters[..i].contains(name) {
                bail!("adapter {name:?} is listed twice");
            }
        }
        Ok(())
    }

    fn addr(&self, index: usize) -> anyhow::Result<SocketAddr> {
        let port = match self.base_port {
            None => 0,
            Some(base) => u16::try_from(usize::from(base) + index)
                .ok()
                .with_context(|| format!("port {base} + {index} is out of range"))?,
        };
        Ok(SocketAddr::new(self.host, port))
    }
}

/// Running replicas, in spec order.
#[derive(Debug)]
pub struct Fleet {
    replicas: Vec<ReplicaHandle>,
    /// A fleet started asleep: its wake endpoint.
    wake: Option<WakeEndpoint>,
}

/// `POST http://ADDR/wake` wakes a fleet started asleep, as an autoscaler
/// scaling a Deployment from zero would start its pods.
#[derive(Debug)]
struct WakeEndpoint {
    addr: SocketAddr,
    woken: watch::Sender<bool>,
    server: tokio::task::AbortHandle,
}

impl Drop for WakeEndpoint {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl WakeEndpoint {
    async fn start(woken: watch::Sender<bool>) -> anyhow::Result<WakeEndpoint> {
        use hyper::service::service_fn;
        use hyper_util::rt::TokioIo;
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let tx = woken.clone();
        let server = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                let service = service_fn(move |_request| {
                    tx.send_replace(true);
                    std::future::ready(Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Empty::<bytes::Bytes>::new(),
                    )))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        })
        .abort_handle();
        Ok(WakeEndpoint {
            addr,
            woken,
            server,
        })
    }
}

impl Fleet {
    /// Where a fleet started asleep is woken (any POST): a pool's
    /// `coldStart.wake.webhook`.
    pub fn wake_url(&self) -> Option<String> {
        self.wake
            .as_ref()
            .map(|w| format!("http://{}/wake", w.addr))
    }

    /// Wake a fleet started asleep, as its wake endpoint does.
    pub fn wake(&self) {
        if let Some(w) = &self.wake {
            w.woken.send_replace(true);
        }
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.replicas
            .iter()
            .map(ReplicaHandle::local_addr)
            .collect()
    }

    pub fn replicas(&self) -> &[ReplicaHandle] {
        &self.replicas
    }

    /// Gracefully stops every replica (all at once, so the drain periods
    /// overlap).
    pub async fn shutdown(self) {
        for replica in &self.replicas {
            replica.stop.request(StopMode::Graceful);
        }
        for replica in &self.replicas {
            replica.stopped().await;
        }
    }
}

/// Starts every replica of `spec`. Every profile is checked before any port
/// is opened; if a replica fails to start, the ones started are stopped.
pub async fn start_fleet(spec: FleetSpec) -> anyhow::Result<Fleet> {
    spec.validate()?;
    let wake = match spec.start_asleep {
        true => Some(WakeEndpoint::start(watch::Sender::new(false)).await?),
        false => None,
    };
    let mut fleet = Fleet {
        replicas: Vec::with_capacity(spec.replicas),
        wake,
    };
    for index in 0..spec.replicas {
        let started = match spec.addr(index) {
            Ok(addr) => {
                let replica = ReplicaSpec {
                    asleep: fleet.wake.as_ref().map(|w| w.woken.subscribe()),
                    ..spec.replica(index)
                };
                start_replica(addr, replica).await
            }
            Err(error) => Err(error),
        };
        match started {
            Ok(replica) => fleet.replicas.push(replica),
            Err(error) => {
                fleet.shutdown().await;
                return Err(error.context(format!("replica {index}")));
            }
        }
    }
    Ok(fleet)
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dialect_the_simulator_does_not_render_is_refused() {
        let spec = ReplicaSpec {
            dialect: Dialect::Triton,
            ..ReplicaSpec::default()
        };
        let message = format!("{:#}", spec.engine_config().unwrap_err());
        assert!(message.contains("triton"), "{message}");
    }

    #[test]
    fn a_fleet_is_validated_without_starting_and_keeps_the_profile_error() {
        use crate::engine::ProfileError;

        let good = FleetSpec {
            replicas: 2,
            hardware: vec!["h100".into(), "a10g".into()],
            adapters: vec!["sql".into()],
            ..FleetSpec::default()
        };
        good.validate().unwrap();

        // The second GPU is only checked because it is used.
        let unknown = FleetSpec {
            hardware: vec!["h100".into(), "b200".into()],
            ..good.clone()
        };
        let error = unknown.validate().unwrap_err();
        assert!(
            matches!(
                error.downcast_ref::<ProfileError>(),
                Some(ProfileError::UnknownHardware { name }) if name == "b200"
            ),
            "{error:#}"
        );
        assert!(format!("{error:#}").starts_with("replica 1: "), "{error:#}");
        FleetSpec {
            replicas: 1,
            ..unknown
        }
        .validate()
        .unwrap();

        let twice = FleetSpec {
            adapters: vec!["sql".into(), "sql".into()],
            ..good.clone()
        };
        let message = format!("{:#}", twice.validate().unwrap_err());
        assert!(message.contains("listed twice"), "{message}");
        let served = FleetSpec {
            served_model_name: Some("sql".into()),
            ..good
        };
        let message = format!("{:#}", served.validate().unwrap_err());
        assert!(message.contains("served model"), "{message}");
    }
}
