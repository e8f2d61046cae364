//! `cold-start`: a pool scaled to zero receives a burst, stays idle past
//! the autoscaler's cooldown (so it is scaled to zero again), then
//! receives another burst. Two ways of waking it, side by side on the same
//! requests:
//!
//! - `gateway`: the gateway wakes the pool from the first request that
//!   finds it cold (its `coldStart.wake` webhook, answered here by starting
//!   the replica);
//! - `autoscaler`: no wake; an autoscaler polls the gateway's metrics
//!   every 15 s, as KEDA's Prometheus trigger does, and starts the replica
//!   when `infergate_cold_waiting_requests` is above zero.
//!
//! Either way the same autoscaler scales the pool to zero after its
//! cooldown without requests (`infergate_pool_idle_seconds`), as KEDA's
//! `cooldownPeriod` does. The replica is simulated with the model's
//! calibrated load time (weights at a network volume's speed, then the
//! engine's start-up), time-compressed; every time reported is simulated
//! time. Measured per burst: the first request's time to first token,
//! the burst's median, requests lost (any answer but a whole 200); and
//! over the run, how long the replica was kept up after its last answer
//! (time paid for nothing) and in all.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use gateway::Gateway;
use parking_lot::Mutex;
use tokio::net::TcpListener;

pub const NAME: &str = "cold-start";

/// The pool's model, as the simulated replica serves it.
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// How the run is shaped, in simulated seconds unless said otherwise.
#[derive(Debug, Clone)]
pub struct ColdStartOptions {
    /// Simulated seconds per wall second.
    pub time_scale: f64,
    /// Requests in each burst, sent at once.
    pub burst: usize,
    /// Idle time between the end of the first burst and the second.
    pub gap: f64,
    /// The autoscaler's polling interval.
    pub poll: f64,
    /// Idle time after which the autoscaler scales the pool to zero.
    pub cooldown: f64,
    pub seed: u64,
}

impl ColdStartOptions {
    /// KEDA's default cooldown (300 s), a 15 s poll, ten idle minutes
    /// between bursts; `quick` compresses time three times more.
    pub fn new(quick: bool, seed: u64) -> Self {
        Self {
            time_scale: if quick { 60.0 } else { 20.0 },
            burst: 8,
            gap: 600.0,
            poll: 15.0,
            cooldown: 300.0,
            seed,
        }
    }

    fn wall(&self, simulated: f64) -> Duration {
        Duration::from_secs_f64(simulated / self.time_scale)
    }

    fn simulated(&self, wall: Duration) -> f64 {
        wall.as_secs_f64() * self.time_scale
    }
}

/// Who wakes the cold pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waker {
    Gateway,
    Autoscaler,
}

impl Waker {
    fn name(self) -> &'static str {
        match self {
            Waker::Gateway => "gateway (wake webhook, first request)",
            Waker::Autoscaler => "autoscaler (polls the metrics every 15 s)",
        }
    }
}

/// One burst's outcome.
#[derive(Debug, Clone)]
pub struct Burst {
    /// The first request's time to first token (simulated seconds).
    pub first_ttft: Option<f64>,
    pub median_ttft: Option<f64>,
    pub lost: usize,
}

/// One way of waking, over the whole run.
#[derive(Debug, Clone)]
pub struct WakerRun {
    pub waker: &'static str,
    pub bursts: Vec<Burst>,
    /// Replica time after its last answer, before it was scaled away.
    pub kept_idle: f64,
    /// Replica time in all, loading included.
    pub replica_time: f64,
    pub cold_starts: usize,
}

#[derive(Debug, Clone)]
pub struct ColdStartReport {
    pub options: ColdStartOptions,
    pub load_time: f64,
    pub runs: Vec<WakerRun>,
}

pub async fn run(options: &ColdStartOptions) -> anyhow::Result<ColdStartReport> {
    let spec = sim::ReplicaSpec {
        time_scale: options.time_scale,
        seed: options.seed,
        load_time: sim::LoadTime::Calibrated,
        ..sim::ReplicaSpec::default()
    };
    let load_time = sim::calibrated_load_time(&spec.engine_config()?).as_secs_f64();
    let mut runs = Vec::new();
    for waker in [Waker::Gateway, Waker::Autoscaler] {
        eprintln!("[{NAME}] woken by the {}", waker.name());
        runs.push(run_one(options, &spec, waker).await?);
    }
    Ok(ColdStartReport {
        options: options.clone(),
        load_time,
        runs,
    })
}

async fn run_one(
    options: &ColdStartOptions,
    spec: &sim::ReplicaSpec,
    waker: Waker,
) -> anyhow::Result<WakerRun> {
    let replica_addr = free_addr().await?;
    let scaler = Arc::new(Scaler {
        addr: replica_addr,
        spec: spec.clone(),
        replica: Mutex::new(None),
        last_answer: Mutex::new(None),
        ledger: Mutex::new(Ledger::default()),
    });
    let hook = match waker {
        Waker::Gateway => Some(webhook(Arc::clone(&scaler)).await?),
        Waker::Autoscaler => None,
    };
    let wake = hook
        .map(|addr| format!(", wake: {{webhook: \"http://{addr}/wake\"}}"))
        .unwrap_or_default();
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  pools:
    - name: p
      models: [\"{MODEL}\"]
      endpoints: [\"{replica_addr}\"]
      scheduling: {{metrics: {{interval: 50ms}}}}
      coldStart: {{timeout: 1h{wake}}}
"
    );
    let config = config::from_yaml(&yaml).context("the cold-start gateway's config")?;
    let gateway = Gateway::start(&config).await?;
    let admin = gateway.admin_addr().context("admin listener")?;
    let autoscaler = tokio::spawn(autoscale(
        Arc::clone(&scaler),
        admin,
        options.clone(),
        waker == Waker::Autoscaler,
    ));
    let client = reqwest::Client::builder().no_proxy().build()?;
    let mut bursts = Vec::new();
    for index in 0..2 {
        if index > 0 {
            tokio::time::sleep(options.wall(options.gap)).await;
        }
        let burst = burst(&client, gateway.addr(), options).await;
        *scaler.last_answer.lock() = Some(Instant::now());
        eprintln!(
            "[{NAME}]   burst {}: first TTFT {:.1} s, lost {}",
            index + 1,
            burst.first_ttft.unwrap_or(f64::NAN),
            burst.lost
        );
        bursts.push(burst);
    }
    // The autoscaler's last scale-down closes the books.
    let end = Instant::now() + options.wall(options.cooldown + 4.0 * options.poll);
    while scaler.replica.lock().is_some() && Instant::now() < end {
        tokio::time::sleep(options.wall(options.poll)).await;
    }
    autoscaler.abort();
    scaler.scale_down();
    gateway.shutdown().await;
    let ledger = scaler.ledger.lock().clone();
    Ok(WakerRun {
        waker: waker.name(),
        bursts,
        kept_idle: options.simulated(ledger.kept_idle),
        replica_time: options.simulated(ledger.up),
        cold_starts: ledger.starts,
    })
}

/// The replica's comings and goings.
#[derive(Debug, Clone, Default)]
struct Ledger {
    starts: usize,
    /// Wall time the replica existed.
    up: Duration,
    /// Wall time from the last answer to the scale-down.
    kept_idle: Duration,
}

/// Starts and stops the pool's one replica, at a fixed address.
struct Scaler {
    addr: SocketAddr,
    spec: sim::ReplicaSpec,
    replica: Mutex<Option<(sim::ReplicaHandle, Instant)>>,
    last_answer: Mutex<Option<Instant>>,
    ledger: Mutex<Ledger>,
}

impl Scaler {
    async fn scale_up(&self) {
        if self.replica.lock().is_some() {
            return;
        }
        match sim::start_replica(self.addr, self.spec.clone()).await {
            Ok(handle) => {
                let mut replica = self.replica.lock();
                if replica.is_none() {
                    *replica = Some((handle, Instant::now()));
                    self.ledger.lock().starts += 1;
                }
            }
            Err(e) => eprintln!("[{NAME}] could not start the replica: {e:#}"),
        }
    }

    fn scale_down(&self) {
        let Some((handle, started)) = self.replica.lock().take() else {
            return;
        };
        let now = Instant::now();
        let mut ledger = self.ledger.lock();
        ledger.up += now - started;
        if let Some(last) = *self.last_answer.lock() {
            ledger.kept_idle += now.saturating_duration_since(last.max(started));
        }
        drop(handle);
    }
}

/// The autoscaler: every poll, scale up when requests wait for the cold
/// pool (if it wakes the pool), scale to zero after the cooldown without
/// requests.
async fn autoscale(scaler: Arc<Scaler>, admin: SocketAddr, options: ColdStartOptions, wakes: bool) {
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a plain HTTP client");
    let mut tick = tokio::time::interval(options.wall(options.poll));
    loop {
        tick.tick().await;
        let Ok(text) = async {
            client
                .get(format!("http://{admin}/metrics"))
                .send()
                .await?
                .text()
                .await
        }
        .await
        else {
            continue;
        };
        let waiting = value(&text, "infergate_cold_waiting_requests").unwrap_or(0.0);
        let idle = value(&text, "infergate_pool_idle_seconds");
        let up = scaler.replica.lock().is_some();
        if !up && wakes && waiting > 0.0 {
            scaler.scale_up().await;
        } else if up
            && waiting == 0.0
            && idle.is_some_and(|idle| idle * options.time_scale >= options.cooldown)
        {
            scaler.scale_down();
        }
    }
}

/// The value of `name`'s sample for pool `p` in the gateway's metrics.
fn value(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{pool=\"p\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok())
}

/// The pool's wake webhook: a POST starts the replica.
async fn webhook(scaler: Arc<Scaler>) -> anyhow::Result<SocketAddr> {
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let scaler = Arc::clone(&scaler);
            tokio::spawn(async move {
                let service = service_fn(move |_request| {
                    let scaler = Arc::clone(&scaler);
                    async move {
                        scaler.scale_up().await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Empty::<bytes::Bytes>::new(),
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

/// Send `options.burst` streaming requests at once; their first tokens'
/// times and how many did not come back whole.
async fn burst(client: &reqwest::Client, gateway: SocketAddr, options: &ColdStartOptions) -> Burst {
    let sent = Instant::now();
    // Longer than any wake could take: a request still unanswered by
    // then is lost.
    let limit = options.wall(4.0 * options.cooldown);
    let requests = (0..options.burst).map(|i| {
        let client = client.clone();
        let request = async move {
            let body = serde_json::json!({
                "model": MODEL,
                "stream": true,
                "max_tokens": 32,
                "messages": [{"role": "user", "content": format!("question {i}: what wakes a cold pool?")}],
            });
            let response = client
                .post(format!("http://{gateway}/v1/chat/completions"))
                .json(&body)
                .send()
                .await
                .ok()?;
            if !response.status().is_success() {
                return None;
            }
            let mut stream = response.bytes_stream();
            let mut first = None;
            let mut tail = Vec::new();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.ok()?;
                first.get_or_insert_with(|| sent.elapsed());
                tail.extend_from_slice(&chunk);
                let keep = tail.len().saturating_sub(64);
                tail.drain(..keep);
            }
            tail.ends_with(b"data: [DONE]\n\n").then_some(first?)
        };
        async move { tokio::time::timeout(limit, request).await.ok().flatten() }
    });
    let mut ttfts: Vec<Option<Duration>> = futures_util::future::join_all(requests).await;
    let lost = ttfts.iter().filter(|t| t.is_none()).count();
    let first_ttft = ttfts
        .first()
        .copied()
        .flatten()
        .map(|t| options.simulated(t));
    let mut whole: Vec<f64> = ttfts
        .drain(..)
        .flatten()
        .map(|t| options.simulated(t))
        .collect();
    whole.sort_by(f64::total_cmp);
    Burst {
        first_ttft,
        median_ttft: whole.get(whole.len() / 2).copied(),
        lost,
    }
}

async fn free_addr() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    Ok(listener.local_addr()?)
}

impl ColdStartReport {
    pub fn markdown(&self) -> String {
        let o = &self.options;
        let mut out = String::new();
        let _ = writeln!(out, "### {NAME}\n");
        let _ = writeln!(
            out,
            "One simulated Llama-3.1-8B replica on an H100 that loads for {:.0} s (calibrated: weights at 0.33 GB/s, then 40 s of engine start-up); \
             bursts of {} streaming requests {:.0} s apart; the autoscaler scales to zero after {:.0} s without requests. \
             Simulated seconds, at {}× wall time.\n",
            self.load_time, o.burst, o.gap, o.cooldown, o.time_scale
        );
        let _ = writeln!(
            out,
            "| woken by | burst | first TTFT (s) | median TTFT (s) | lost | cold starts | replica kept after its last answer (s) | replica time (s) |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        let cell = |x: Option<f64>| x.map_or("—".to_owned(), |x| format!("{x:.1}"));
        for run in &self.runs {
            for (i, burst) in run.bursts.iter().enumerate() {
                let totals = if i == 0 {
                    (
                        run.cold_starts.to_string(),
                        format!("{:.0}", run.kept_idle),
                        format!("{:.0}", run.replica_time),
                    )
                } else {
                    Default::default()
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} |",
                    if i == 0 { run.waker } else { "" },
                    i + 1,
                    cell(burst.first_ttft),
                    cell(burst.median_ttft),
                    burst.lost,
                    totals.0,
                    totals.1,
                    totals.2,
                );
            }
        }
        if let [gateway, autoscaler] = &self.runs[..] {
            let mean = |run: &WakerRun| {
                let t: Vec<f64> = run.bursts.iter().filter_map(|b| b.first_ttft).collect();
                t.iter().sum::<f64>() / t.len().max(1) as f64
            };
            let _ = writeln!(
                out,
                "\nFirst token after a cold start, mean of the bursts: {:.1} s woken by the gateway, {:.1} s by the polling autoscaler ({:.2}×).",
                mean(gateway),
                mean(autoscaler),
                mean(gateway) / mean(autoscaler).max(f64::MIN_POSITIVE)
            );
        }
        out
    }
}
