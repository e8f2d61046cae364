//! The data plane: listeners, the request pipeline, proxying to replicas.
//!
//! Read [`pipeline`] first: it is the whole request path in order.

// The request path, in the order a request meets it (pipeline.rs reads
// it top to bottom).
pub mod auth;
mod flow;
mod inbound;
mod members;
mod outbound;
pub mod pipeline;
mod rate_limits;
mod record;
mod route;
// Shared by the stages: the one error type and the one place answers
// are rendered.
pub mod error;
mod headers;
mod respond;
// Around the path: the config's generations and what handlers share, the
// admin listener, TLS, telemetry.
mod admin;
pub mod file_watch;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod generation;
mod state;
pub mod telemetry;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::generation::reload::Reload;
use crate::inbound::drain::Drain;
use crate::inbound::server::{self, Workers};
use crate::state::State;

pub use crate::error::DropReason;
pub use crate::generation::reload::{DiscoveredReplica, Discovery};
pub use crate::generation::wake::{ScaledUp, Scaler, Workload};

/// Connections the admin listener serves at once, apart from the public
/// listeners' limit: a flood of clients must not shut out the probes and
/// the metrics scraper.
const ADMIN_MAX_CONNECTIONS: u32 = 64;
pub use crate::generation::pool::picker_config;
pub use crate::inbound::server::raise_descriptor_limit;

/// A running gateway. Dropping it stops everything abruptly; call
/// [`Gateway::shutdown`] to drain.
pub struct Gateway {
    state: Arc<State>,
    listeners: Vec<(String, SocketAddr)>,
    admin: Option<SocketAddr>,
    stop: watch::Sender<bool>,
    drain: Arc<Drain>,
    accept_loops: Vec<JoinHandle<()>>,
    drain_timeout: Duration,
    /// What a new config goes through; discovery's handles share it.
    reload: Arc<Reload>,
    // After `state` and `reload`, whose pools' upstream clients run on the
    // workers.
    _workers: Arc<Workers>,
}

/// The gateway's own gauges on `/metrics`: what a soak test watches for
/// leaks.
fn watch_server(state: &Arc<State>, slots: &server::ConnectionSlots, workers: &Arc<Workers>) {
    let (slots, workers) = (slots.clone(), Arc::clone(workers));
    let weak = Arc::downgrade(state);
    let main = tokio::runtime::Handle::current();
    state.metrics.read_server_gauges(move || {
        let tasks = workers.alive_tasks() + main.metrics().num_alive_tasks();
        let buffered = weak.upgrade().map_or(0, |s| s.body_budget.held());
        vec![
            (
                "infergate_client_connections",
                "Client connections open on the public listeners",
                slots.open() as i64,
            ),
            (
                "infergate_runtime_alive_tasks",
                "Tasks alive on the gateway's runtimes (connections, streams, scrapers, timers)",
                tasks as i64,
            ),
            (
                "infergate_buffered_body_bytes",
                "Request body bytes held in memory (limits.maxBufferedBodyBytes bounds them)",
                buffered as i64,
            ),
        ]
    });
}

/// A listener's TLS, its files read and watched from now on.
fn listener_tls(
    name: &str,
    spec: Option<&config::ListenerTls>,
    state: &State,
) -> anyhow::Result<Option<Arc<tls::server::Acceptor>>> {
    spec.map(|spec| tls::server::Acceptor::start(name, spec, state.metrics.listener_tls(name)))
        .transpose()
}

/// What every listener is served with.
struct Serving<'a> {
    state: &'a Arc<State>,
    workers: &'a Arc<Workers>,
    stop: &'a watch::Receiver<bool>,
    drain: &'a Arc<Drain>,
    timeouts: server::Timeouts,
}

impl Serving<'_> {
    /// Bind `address` and serve it with `handler`: its accept loop and the
    /// address it got.
    async fn listen<H, F>(
        &self,
        name: &str,
        address: &str,
        tls: Option<&config::ListenerTls>,
        slots: server::ConnectionSlots,
        handler: H,
    ) -> anyhow::Result<(JoinHandle<()>, SocketAddr)>
    where
        H: Fn(server::WorkerId, server::Request) -> F + Clone + Send + Sync + 'static,
        F: std::future::Future<Output = http::Response<outbound::response_body::ResponseBody>>
            + Send
            + 'static,
    {
        let tls = listener_tls(name, tls, self.state)?;
        let (listener, addr) = server::bind(address).await?;
        let accept = server::serve(
            listener,
            Arc::clone(self.workers),
            handler,
            self.stop.clone(),
            Arc::clone(self.drain),
            self.timeouts,
            slots,
            tls,
        );
        Ok((accept, addr))
    }
}

impl Gateway {
    /// Start every listener and every pool's scrapers. The config must
    /// already be validated.
    pub async fn start(config: &config::InferenceGatewayConfig) -> anyhow::Result<Self> {
        let spec = &config.spec;
        let workers = Arc::new(Workers::start(Workers::default_count())?);
        let reload = Arc::new(Reload::start(spec, workers.len())?);
        let state = Arc::clone(reload.state());

        let (stop, stop_rx) = watch::channel(false);
        let drain = Arc::new(Drain::new());
        let mut listeners = Vec::new();
        let mut accept_loops = Vec::new();
        let slots = server::ConnectionSlots::new(
            spec.limits.max_connections(),
            spec.limits.max_connections_per_client,
        );
        watch_server(&state, &slots, &workers);
        let serving = Serving {
            state: &state,
            workers: &workers,
            stop: &stop_rx,
            drain: &drain,
            timeouts: server::Timeouts::new(spec.limits.header_timeout()),
        };
        for l in &spec.listeners {
            let st = Arc::clone(&state);
            let handler = move |worker, req| pipeline::handle(Arc::clone(&st), worker, req);
            let tls = l.tls.as_ref();
            let (accept, addr) = serving
                .listen(&l.name, &l.address, tls, slots.clone(), handler)
                .await?;
            accept_loops.push(accept);
            tracing::info!(listener = %l.name, %addr, tls = l.tls.is_some(), "listening");
            listeners.push((l.name.clone(), addr));
        }
        let admin = match &spec.admin {
            Some(a) => {
                let st = Arc::clone(&state);
                let handler = move |_, req| admin::handle(Arc::clone(&st), req);
                let slots = server::ConnectionSlots::new(ADMIN_MAX_CONNECTIONS, None);
                let (accept, addr) = serving
                    .listen("admin", &a.address, a.tls.as_ref(), slots, handler)
                    .await?;
                accept_loops.push(accept);
                tracing::info!(%addr, tls = a.tls.is_some(), "admin listening");
                Some(addr)
            }
            None => None,
        };
        Ok(Self {
            state,
            listeners,
            admin,
            stop,
            drain,
            accept_loops,
            drain_timeout: spec.shutdown.drain_timeout(),
            reload,
            _workers: workers,
        })
    }

    /// Put a new config in force: routes, pools and their replicas,
    /// limits, objectives. Requests already running finish under the
    /// config they started with; pools that stay keep their replicas'
    /// load, connections and prefix index; a pool's TLS settings and files
    /// hold for connections opened from now on. Listeners (their TLS on or
    /// off too; their certificate files are watched anyway), the admin
    /// listener, connection limits and the body budget are fixed at start:
    /// a config that changes them is refused, naming them. The config must
    /// be validated, with simulated pools started.
    pub fn apply(&self, config: &config::InferenceGatewayConfig) -> anyhow::Result<()> {
        self.reload.apply(&config.spec)
    }

    /// What wakes a cold pool whose `coldStart.wake` names a Kubernetes
    /// workload: set by whoever holds a Kubernetes client.
    pub fn set_scaler(&self, scaler: Box<dyn Scaler>) {
        self.reload.set_scaler(scaler);
    }

    /// Where discovery reports the replicas of pools found in Kubernetes.
    pub fn discovery(&self) -> Discovery {
        self.reload.discovery()
    }

    /// Say where the config comes from (`/debug/config` shows it).
    pub fn set_config_source(&self, source: impl Into<String>) {
        *self.state.config_source.lock() = source.into();
    }

    /// Count an attempt to put a changed config in force
    /// (`infergate_config_reloads_total`).
    pub fn count_reload(&self, applied: bool) {
        self.state.metrics.count_reload(applied);
    }

    /// Addresses of the public listeners, by name, in config order.
    pub fn listeners(&self) -> &[(String, SocketAddr)] {
        &self.listeners
    }

    /// The first public listener's address.
    pub fn addr(&self) -> SocketAddr {
        self.listeners[0].1
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// Replica addresses per pool, in config order (useful when replicas
    /// are simulated on OS-chosen ports).
    pub fn pool_endpoints(&self) -> Vec<(String, Vec<String>)> {
        self.state
            .generation()
            .pools
            .iter()
            .map(|p| {
                let addrs = p
                    .runtime()
                    .picker()
                    .endpoints()
                    .iter()
                    .map(|e| e.addr.to_string())
                    .collect();
                (p.name().to_string(), addrs)
            })
            .collect()
    }

    /// Requests waiting in a pool's flow-control queue, per band
    /// (critical, standard, sheddable). `None` for an unknown pool.
    pub fn queued(&self, pool: &str) -> Option<[usize; 3]> {
        let generation = self.state.generation();
        let admission = generation.pool(pool)?.runtime().admission();
        Some(config::Priority::ALL.map(|band| admission.queued(band).0))
    }

    /// What `/readyz` answers: `Err` with the reason when not ready.
    pub fn readiness(&self) -> Result<(), String> {
        self.state.readiness()
    }

    /// Each pool's replicas that can take requests now
    /// ([`picker::is_ready`], as `/readyz`, `/debug/pools` and
    /// `infergate_pool_ready_endpoints` count them), in config order.
    pub fn ready_endpoints(&self) -> Vec<(String, usize)> {
        let now = std::time::Instant::now();
        self.state
            .generation()
            .pools
            .iter()
            .map(|p| (p.name().to_string(), p.runtime().ready_replicas(now)))
            .collect()
    }

    /// Stop accepting, answer new requests on open connections with 503,
    /// and wait up to the drain timeout for in-flight requests to finish.
    /// Returns whether everything finished in time.
    pub async fn shutdown(self) -> bool {
        self.state.begin_shutdown();
        let _ = self.stop.send(true);
        for task in self.accept_loops {
            let _ = task.await;
        }
        self.drain.start();
        let drained = tokio::time::timeout(self.drain_timeout, self.drain.finished())
            .await
            .is_ok();
        if !drained {
            tracing::warn!(timeout = ?self.drain_timeout, "drain timed out; closing remaining connections");
        }
        drained
    }
}
