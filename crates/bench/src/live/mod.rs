//! Live mode: real simulated replicas over HTTP, the real gateway in front
//! of them, and a load generator, all on 127.0.0.1.
//!
//! Every run (one policy at one load) starts from scratch — a fresh fleet,
//! so no prefix cache or adapter carries over from the previous run, and a
//! fresh gateway with that policy's config — then sends the planned
//! requests and tears everything down. The replicas run `time_scale` times
//! faster than real time; every latency is reported in simulated seconds
//! (wall time × time scale), and the gateway's own timings (scrape
//! interval, staleness, queue wait) are scaled to match.

mod client;
mod gateway;
mod peer;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use bytes::Bytes;
use tracing::instrument::WithSubscriber;
use tracing::subscriber::NoSubscriber;

pub use client::{LoadGenerator, Planned};
pub use gateway::{GatewayLauncher, GatewayView, Readiness, RunningGateway};
pub use peer::RunningPeer;

use crate::policy::{self, PoolDocument};
use crate::routers::RouterUnderTest;
use crate::scenario::FleetPlan;
use crate::stats::{Outcome, Status};
use crate::workload::{RequestPlan, Workload};

/// How live runs are set up.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    pub gateway: GatewayLauncher,
    /// Engine seconds per wall second of the replicas.
    pub time_scale: f64,
    /// Simulated seconds a client waits for a complete answer.
    pub client_timeout: f64,
    /// Wall-clock bound on the gateway becoming ready.
    pub ready_timeout: Duration,
    /// Seeds the replicas (answer words; lengths are set by the requests).
    pub seed: u64,
    /// Merged into the scored policies' `scheduling` config.
    pub scheduling: Option<serde_json::Value>,
}

/// The bodies of `plans` from `workload`, serialized before the clock
/// starts, with their bands.
pub fn planned(workload: &Workload, plans: &[RequestPlan]) -> Vec<Planned> {
    plans
        .iter()
        .map(|p| Planned {
            at: p.at,
            body: Bytes::from(serde_json::to_vec(&p.body(true)).expect("bodies serialize")),
            band: workload.band(p.id),
        })
        .collect()
}

/// What one live run measured.
#[derive(Debug, Clone)]
pub struct LiveRun {
    /// One per planned request, in plan order.
    pub outcomes: Vec<Outcome>,
    /// CPU seconds the router used while the requests ran (from its
    /// arrival of the first request to the end of the last); `None` for a
    /// gateway in this process, whose CPU cannot be told from the bench's.
    pub router_cpu_seconds: Option<f64>,
    /// What each infergate gateway reported once the requests had run, in
    /// the order the clients' split sends to them (empty for a peer).
    pub gateways: Vec<GatewayView>,
}

/// One router over one set of requests on a fresh fleet: infergate with
/// its policy and fresh gateways (one, or `@N`), or a peer router started
/// for the run.
pub async fn run(
    fleet: &FleetPlan,
    router: &RouterUnderTest,
    requests: Vec<Planned>,
    options: &LiveOptions,
) -> anyhow::Result<LiveRun> {
    // A fleet per run would print a start-up line per replica each time.
    let mut spec = fleet.sim_spec(options.time_scale, options.seed);
    if let RouterUnderTest::Infergate(policy) = router {
        spec.scheduling_policy = policy.engine_scheduling();
        if policy.exact_prefix() {
            // Every replica publishes on ports of its own, with a replay
            // socket, as vLLM with `--kv-events-config` does.
            spec.kv_events = Some(sim::KvEventsSpec::default());
        }
    }
    let replicas = sim::start_fleet(spec)
        .with_subscriber(NoSubscriber::default())
        .await
        .context("starting the simulated replicas")?;
    let endpoints: Vec<String> = replicas.addrs().iter().map(ToString::to_string).collect();
    let publishers: BTreeMap<String, config::Publisher> = replicas
        .replicas()
        .iter()
        .filter_map(|r| {
            let info = r.info();
            Some((
                info.addr.to_string(),
                config::Publisher {
                    endpoint: info.kv_events_endpoint.clone()?,
                    replay_endpoint: info.kv_events_replay_endpoint.clone(),
                },
            ))
        })
        .collect();
    let model = fleet.served_model()?;
    let result = match router {
        RouterUnderTest::Infergate(policy) => {
            let pool = PoolDocument {
                model: &model,
                adapters: &fleet.adapters,
                endpoints: &endpoints,
                time_scale: options.time_scale,
                scored_overrides: options.scheduling.as_ref(),
                priorities: requests.iter().any(|r| r.band.is_some()),
                kv_events: (!publishers.is_empty()).then_some(&publishers),
            };
            let mut gateways = Vec::with_capacity(policy.gateways());
            let started = async {
                // Independent gateways with the same config, as replicas of
                // one Deployment: nothing is shared between them but the
                // engines they route to (and, with events, listen to).
                for _ in 0..policy.gateways() {
                    let listen = gateway::free_local_addr()?;
                    let admin = gateway::free_local_addr()?;
                    let (text, config) = policy::gateway_config(policy, &pool, &listen, &admin)?;
                    gateways.push(
                        options
                            .gateway
                            .start(&text, &config, policy)
                            .await
                            .with_context(|| format!("starting the gateway for {policy}"))?,
                    );
                }
                let need = Readiness {
                    replicas: endpoints.len(),
                    events: policy.exact_prefix(),
                };
                for gateway in &mut gateways {
                    gateway.wait_ready(need, options.ready_timeout).await?;
                }
                anyhow::Ok(())
            }
            .await;
            let addrs: Vec<_> = gateways.iter().map(RunningGateway::addr).collect();
            let measured = measure(
                started,
                &addrs,
                || {
                    gateways
                        .iter()
                        .map(RunningGateway::cpu_seconds)
                        .sum::<Option<f64>>()
                },
                requests,
                options,
            )
            .await;
            let measured = match measured {
                Ok(mut run) => {
                    for (i, gateway) in gateways.iter().enumerate() {
                        let mut view = gateway.view().await;
                        view.completed = run
                            .outcomes
                            .iter()
                            .skip(i)
                            .step_by(addrs.len())
                            .filter(|o| o.status == Status::Completed)
                            .count() as u64;
                        run.gateways.push(view);
                    }
                    Ok(run)
                }
                error => error,
            };
            for gateway in gateways {
                gateway.stop().await;
            }
            measured
        }
        peer => {
            async {
                let program = peer.locate().with_context(|| {
                    format!("{peer} is not installed ({})", peer.install_hint())
                })?;
                let mut running = RunningPeer::start(peer, &program, &endpoints)?;
                let ready = running
                    .wait_ready(&model, endpoints.len(), PEER_READY_TIMEOUT)
                    .await;
                let measured = measure(
                    ready,
                    &[running.addr()],
                    || running.cpu_seconds(),
                    requests,
                    options,
                )
                .await;
                running.stop().await;
                measured
            }
            .await
        }
    };
    replicas.shutdown().await;
    result
}

/// How long a peer router may take to start and find its workers: the
/// Python routers import their package first, slowly on a busy machine.
const PEER_READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Once the router at `addrs` is `ready`, send it the planned requests
/// (request `i` to `addrs[i % len]`: a client-side round-robin split, as a
/// Service in front of several gateway replicas makes) and take the CPU
/// time it used meanwhile (`cpu` reads its total).
async fn measure(
    ready: anyhow::Result<()>,
    addrs: &[std::net::SocketAddr],
    cpu: impl Fn() -> Option<f64>,
    requests: Vec<Planned>,
    options: &LiveOptions,
) -> anyhow::Result<LiveRun> {
    ready?;
    let before = cpu();
    let urls: Vec<String> = addrs
        .iter()
        .map(|addr| format!("http://{addr}/v1/chat/completions"))
        .collect();
    let load = LoadGenerator::split(&urls, options.time_scale, options.client_timeout)?;
    let outcomes = load.run(requests).await;
    Ok(LiveRun {
        outcomes,
        router_cpu_seconds: before.zip(cpu()).map(|(b, a)| (a - b).max(0.0)),
        gateways: Vec::new(),
    })
}
