//! `scripts/soak`: a soak test of the release binary, on 127.0.0.1 only.
//!
//! Starts simulated replicas (`infergate sim`, one process each, so that one
//! can be killed and restarted on its own port) and the gateway
//! (`infergate serve`) in front of them; sends a steady, seeded mix of chat
//! completions for `--minutes` while faults are injected on a schedule;
//! prints one line a minute; and at the end checks that
//!
//! - the gateway's RSS and open descriptors stayed flat after warm-up;
//! - every request ended in exactly one outcome, and the gateway's
//!   `infergate_requests_total` agrees with the client's count;
//! - no client connection or task outlived the traffic.
//!
//! Exit status 0 when every check passes, 1 when one fails, 2 when the soak
//! could not run. Every duration scales with `--minutes`:
//!
//! | | 30 min | 3 min |
//! |---|---|---|
//! | warm-up (T/10, at least 1 min) | 3 min | 1 min |
//! | baseline window (T/6 after warm-up) | min 3–8 | 1:00–1:30 |
//! | final window (last T/6) | min 25–30 | 2:30–3:00 |
//! | fault cycle (T/6): a kill, a metrics fault, a slowdown | 5 min | 30 s |
//!
//! The config, the logs, `samples.csv` (a row every 5 s) and `summary.md`
//! are kept in `target/soak/<run>/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::{Bytes, BytesMut};
use clap::Parser;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;

/// Soak test: the release gateway in front of simulated replicas under
/// steady traffic and scheduled faults, checked for leaks at the end.
#[derive(Parser, Debug, Clone)]
struct Args {
    /// Minutes of traffic; warm-up, windows and fault cycles scale with it.
    #[arg(long, default_value_t = 30.0)]
    minutes: f64,
    /// The infergate binary (gateway and replicas).
    #[arg(long, default_value = "target/release/infergate")]
    infergate: PathBuf,
    /// Mean request rate per second (Poisson arrivals).
    #[arg(long, default_value_t = 30.0)]
    rate: f64,
    /// Simulated replicas, one process each (at least 3: one killed, one
    /// faulty and one healthy at any time).
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Engine seconds per wall second of the replicas.
    #[arg(long, default_value_t = 2.0)]
    time_scale: f64,
    /// Slowloris connections held at once, of each kind (trickling a
    /// request head, silent).
    #[arg(long, default_value_t = 4)]
    slowloris: usize,
    /// Seeds the traffic mix, the arrivals and the replicas.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Where each run keeps its config, logs and samples.
    #[arg(long, default_value = "target/soak")]
    out: PathBuf,
}

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A request not over after this long is unanswered. Normal ones take a
/// few hundred ms; the slowest legitimate path (the standard band's 10 s
/// wait in flow control, then a replica slowed down 4×) stays well under.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How often RSS, descriptors and the gateway's gauges are sampled: twelve
/// samples a minute give the windows' medians something to be robust with.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Requests in flight beyond this are not sent (and fail the run): a
/// gateway that stops answering must not make the client grow without end.
const MAX_IN_FLIGHT: u64 = 2_000;
/// A trickling slowloris client sends one byte this often.
const TRICKLE_EVERY: Duration = Duration::from_secs(3);
/// Connections each slowloris slot may open per minute of the run, on
/// average: each is held until the gateway closes it (15 s or more, then a
/// 1 s pause), so this is never the limit, but it bounds the count
/// whatever the gateway does.
const SLOWLORIS_PER_SLOT_MINUTE: f64 = 6.0;
/// The gateway must close a slowloris connection within this. Its 15 s
/// header timeout (`limits.headerTimeout`) should close both kinds; the
/// bound is looser, its 75 s keep-alive idle timeout twice over plus the
/// header timeout, because what is checked here is that they are closed
/// at all (no connection held for ever), not the timeout's precision,
/// which the gateway's own tests check.
const SLOWLORIS_BOUND: Duration = Duration::from_secs(165);
/// After traffic stops and every client socket is closed, the gateway's
/// open connections must reach 0 within this. It sees each close at once;
/// the same loose bound as above, because a connection it only reaps by
/// a timeout is bounded, not leaked.
const SETTLE_BOUND: Duration = Duration::from_secs(165);

/// RSS may grow from the baseline window's median to the final window's by
/// 20 % or 16 MiB, whichever is larger. mimalloc returns freed pages after
/// a second, so RSS follows live memory, which moves with the requests in
/// flight (more during a slowdown or after a kill): a few MiB. A leak of
/// ~0.5 KB per request over a 30-minute run at 30 req/s (~40,000 requests
/// between the windows) exceeds it.
const RSS_GROWTH_FRACTION: f64 = 0.20;
const RSS_GROWTH_MIB: f64 = 16.0;
/// Descriptors are the listeners, the client connections (the client's
/// pool, the slowloris ones) and pooled replica connections per worker,
/// which follow the requests in flight; 50 covers that swing, while a
/// descriptor leaked per request, or per failed scrape of a faulty replica
/// (20 a second), exceeds it within seconds.
const FD_GROWTH: f64 = 50.0;
/// Alive tasks after the traffic may exceed the idle baseline by this many
/// or 10 %: scrapes in flight, and the admin connection this tool scrapes
/// on, come and go; a task leaked per request or connection does not fit.
const TASK_SLACK: f64 = 8.0;

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------- timeline

/// The run's durations, all derived from `--minutes`.
#[derive(Debug, Clone, Copy)]
struct Timeline {
    traffic: Duration,
    warmup: Duration,
    window: Duration,
    cycle: Duration,
}

impl Timeline {
    fn new(minutes: f64) -> Self {
        let traffic = Duration::from_secs_f64(minutes * 60.0);
        Self {
            traffic,
            // Pools fill, the allocator reaches its working size and every
            // fault has happened once within the first tenth.
            warmup: Duration::from_secs_f64((minutes / 10.0).max(1.0) * 60.0),
            window: traffic / 6,
            cycle: traffic / 6,
        }
    }

    fn baseline(&self) -> (f64, f64) {
        let start = self.warmup.as_secs_f64();
        (start, start + self.window.as_secs_f64())
    }

    fn last(&self) -> (f64, f64) {
        let end = self.traffic.as_secs_f64();
        (end - self.window.as_secs_f64(), end)
    }
}

// ------------------------------------------------------------------ faults

#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Kill the replica's process; through `POST /admin/crash` first (the
    /// replica drops every connection itself) or with SIGKILL alone.
    Kill {
        replica: usize,
        via_admin: bool,
    },
    Restart {
        replica: usize,
    },
    Metrics {
        replica: usize,
        mode: &'static str,
    },
    Slowdown {
        replica: usize,
        factor: f64,
    },
}

const METRICS_FAULTS: [&str; 4] = ["garbage", "dead", "hang", "frozen"];
const SLOWDOWN: f64 = 4.0;

/// Each cycle kills a replica and restarts it, then switches another's
/// metrics to a fault for a fifth of the cycle, then slows a third down
/// for a fifth of the cycle; the targets rotate.
fn fault_schedule(t: &Timeline, replicas: usize) -> Vec<(Duration, Fault)> {
    let mut events = Vec::new();
    let down = t.cycle.mul_f64(0.1).max(Duration::from_secs(3));
    for k in 0.. {
        let start = t.cycle * k;
        if start >= t.traffic {
            break;
        }
        let at = |f: f64| start + t.cycle.mul_f64(f);
        let k = k as usize;
        let (killed, faulty, slow) = (k % replicas, (k + 1) % replicas, (k + 2) % replicas);
        let kill_at = at(0.1);
        events.push((
            kill_at,
            Fault::Kill {
                replica: killed,
                via_admin: k % 2 == 1,
            },
        ));
        events.push((kill_at + down, Fault::Restart { replica: killed }));
        let mode = METRICS_FAULTS[k % METRICS_FAULTS.len()];
        events.push((
            at(0.35),
            Fault::Metrics {
                replica: faulty,
                mode,
            },
        ));
        events.push((
            at(0.55),
            Fault::Metrics {
                replica: faulty,
                mode: "ok",
            },
        ));
        events.push((
            at(0.65),
            Fault::Slowdown {
                replica: slow,
                factor: SLOWDOWN,
            },
        ));
        events.push((
            at(0.85),
            Fault::Slowdown {
                replica: slow,
                factor: 1.0,
            },
        ));
    }
    events.retain(|(at, _)| *at < t.traffic);
    events.sort_by_key(|(at, _)| *at);
    events
}

#[derive(Debug, Default)]
struct FaultLog {
    kills_admin: u32,
    kills_sigkill: u32,
    restarts: u32,
    metrics: Vec<&'static str>,
    slowdowns: u32,
    failures: u32,
}

// ------------------------------------------------------------------- fleet

/// The simulated replicas, one `infergate sim` process each.
struct Fleet {
    binary: PathBuf,
    dir: PathBuf,
    time_scale: f64,
    seed: u64,
    ports: Vec<u16>,
    children: Vec<Option<Child>>,
    http: reqwest::Client,
}

impl Fleet {
    async fn start(args: &Args, dir: &Path, ports: Vec<u16>) -> anyhow::Result<Self> {
        let mut fleet = Fleet {
            binary: args.infergate.clone(),
            dir: dir.to_owned(),
            time_scale: args.time_scale,
            seed: args.seed,
            children: ports.iter().map(|_| None).collect(),
            ports,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()?,
        };
        for i in 0..fleet.ports.len() {
            fleet.spawn(i).await?;
        }
        Ok(fleet)
    }

    fn endpoints(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// Starts replica `i` on its port and waits for its `/health`.
    async fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let port = self.ports[i];
        let log_path = self.dir.join(format!("replica-{i}.log"));
        // A port just released can be briefly refused; try a few times.
        for attempt in 1..=3 {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)?;
            let mut child = Command::new(&self.binary)
                .arg("sim")
                .args(["--replicas", "1", "--hardware", "h100"])
                .args(["--base-port", &port.to_string()])
                .args(["--time-scale", &self.time_scale.to_string()])
                .args(["--seed", &(self.seed + i as u64).to_string()])
                .env("INFERGATE_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .kill_on_drop(true)
                .spawn()
                .with_context(|| format!("running {}", self.binary.display()))?;
            let url = format!("http://127.0.0.1:{port}/health");
            let deadline = Instant::now() + Duration::from_secs(15);
            let mut exited = false;
            while Instant::now() < deadline {
                if child.try_wait()?.is_some() {
                    exited = true;
                    break;
                }
                if let Ok(r) = self.http.get(&url).send().await
                    && r.status().is_success()
                {
                    self.children[i] = Some(child);
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = child.kill().await;
            if !exited || attempt == 3 {
                bail!(
                    "replica {i} did not become healthy on port {port}:\n{}",
                    log_tail(&log_path)
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        unreachable!("the last attempt returns")
    }

    async fn kill(&mut self, i: usize, via_admin: bool) -> anyhow::Result<()> {
        if via_admin {
            let url = format!("http://127.0.0.1:{}/admin/crash", self.ports[i]);
            self.http
                .post(url)
                .send()
                .await?
                .error_for_status()
                .context("POST /admin/crash")?;
        }
        // The crash only stops the replica's server; the process goes too,
        // so the replica can come back as a fresh one on the same port.
        if let Some(mut child) = self.children[i].take() {
            child.kill().await?;
        }
        Ok(())
    }

    async fn set_faults(&self, i: usize, faults: serde_json::Value) -> anyhow::Result<()> {
        let url = format!("http://127.0.0.1:{}/admin/faults", self.ports[i]);
        self.http
            .post(url)
            .json(&faults)
            .send()
            .await?
            .error_for_status()
            .context("POST /admin/faults")?;
        Ok(())
    }

    async fn apply(&mut self, fault: Fault, log: &mut FaultLog) -> anyhow::Result<String> {
        let ports = self.ports.clone();
        let addr = |i: usize| format!("replica {i} (127.0.0.1:{})", ports[i]);
        Ok(match fault {
            Fault::Kill { replica, via_admin } => {
                let what = format!(
                    "kill {} {}",
                    addr(replica),
                    if via_admin {
                        "with POST /admin/crash, then SIGKILL"
                    } else {
                        "with SIGKILL"
                    }
                );
                self.kill(replica, via_admin).await?;
                if via_admin {
                    log.kills_admin += 1;
                } else {
                    log.kills_sigkill += 1;
                }
                what
            }
            Fault::Restart { replica } => {
                self.spawn(replica).await?;
                log.restarts += 1;
                format!("restart {}", addr(replica))
            }
            Fault::Metrics { replica, mode } => {
                self.set_faults(replica, json!({ "metrics": mode })).await?;
                if mode != "ok" {
                    log.metrics.push(mode);
                }
                format!("{}: /metrics {mode}", addr(replica))
            }
            Fault::Slowdown { replica, factor } => {
                self.set_faults(replica, json!({ "slowdown": factor }))
                    .await?;
                if factor != 1.0 {
                    log.slowdowns += 1;
                }
                format!("{}: slowdown {factor}", addr(replica))
            }
        })
    }

    /// Every replica up, with no fault in force.
    async fn restore(&mut self) -> anyhow::Result<()> {
        for i in 0..self.ports.len() {
            if self.children[i].is_none() {
                self.spawn(i).await?;
            } else {
                self.set_faults(i, json!({"metrics": "ok", "slowdown": 1.0}))
                    .await?;
            }
        }
        Ok(())
    }

    async fn shutdown(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill().await;
        }
    }
}

/// Runs the schedule until it ends or the soak stops, then restores the
/// fleet and hands it back.
async fn run_faults(
    mut fleet: Fleet,
    schedule: Vec<(Duration, Fault)>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> Fleet {
    for (at, fault) in schedule {
        tokio::select! {
            () = tokio::time::sleep_until(shared.start + at) => {}
            _ = stop.changed() => break,
        }
        if *stop.borrow() {
            break;
        }
        let mut log = std::mem::take(&mut *shared.faults.lock().unwrap());
        let result = fleet.apply(fault, &mut log).await;
        if result.is_err() {
            log.failures += 1;
        }
        *shared.faults.lock().unwrap() = log;
        match result {
            Ok(what) => println!("  {}  fault: {what}", clock(at)),
            Err(e) => println!("  {}  fault {fault:?} failed: {e:#}", clock(at)),
        }
    }
    if let Err(e) = fleet.restore().await {
        println!("  restoring the fleet failed: {e:#}");
        shared.faults.lock().unwrap().failures += 1;
    }
    fleet
}

// ----------------------------------------------------------------- gateway

struct Gateway {
    child: Child,
    pid: u32,
    addr: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
}

impl Gateway {
    async fn start(args: &Args, dir: &Path, endpoints: &[String]) -> anyhow::Result<Self> {
        let [addr, admin] = free_ports::<2>()?.map(|p| SocketAddr::from(([127, 0, 0, 1], p)));
        // Defaults everywhere else: the soak is of the gateway as shipped.
        let config = json!({
            "apiVersion": "infergate.dev/v1alpha1",
            "kind": "InferenceGatewayConfig",
            "metadata": {"name": "soak"},
            "spec": {
                "listeners": [{"name": "soak", "address": addr.to_string()}],
                "admin": {"address": admin.to_string()},
                "pools": [{
                    "name": "soak",
                    "engine": "vllm",
                    "models": [MODEL],
                    "endpoints": endpoints,
                }],
            },
        });
        let path = dir.join("gateway.yaml");
        // JSON is YAML.
        std::fs::write(&path, serde_json::to_string_pretty(&config)?)?;
        let log = dir.join("gateway.log");
        let child = Command::new(&args.infergate)
            .arg("serve")
            .arg("--config")
            .arg(&path)
            // Warnings (replicas failing, going stale) but no access log:
            // a line per request would cost the gateway CPU on 2 cores.
            .env("INFERGATE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("gateway.out"))?)
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", args.infergate.display()))?;
        let pid = child.id().context("the gateway exited at once")?;
        Ok(Gateway {
            child,
            pid,
            addr,
            admin,
            log,
        })
    }

    /// Waits until the gateway reports all `replicas` healthy.
    async fn wait_ready(&mut self, http: &reqwest::Client, replicas: usize) -> anyhow::Result<()> {
        let url = format!("http://{}/debug/pools", self.admin);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("the gateway exited with {status}:\n{}", log_tail(&self.log));
            }
            if let Ok(r) = http.get(&url).send().await
                && let Ok(pools) = r.json::<serde_json::Value>().await
                && healthy_endpoints(&pools) >= replicas
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the gateway did not report {replicas} healthy replicas in 30 s:\n{}",
                    log_tail(&self.log)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then the exit status of its drain (bounded by the 30 s
    /// default drain timeout and slack).
    async fn stop(mut self) -> String {
        // SAFETY: sends a signal to our own child, which has not been
        // reaped (we hold its handle), so the pid is still its.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) };
        match tokio::time::timeout(Duration::from_secs(40), self.child.wait()).await {
            Ok(Ok(status)) => status.to_string(),
            Ok(Err(e)) => format!("unknown ({e})"),
            Err(_) => {
                let _ = self.child.kill().await;
                "still running 40 s after SIGTERM: killed".to_owned()
            }
        }
    }
}

fn healthy_endpoints(pools: &serde_json::Value) -> usize {
    pools["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|pool| pool["endpoints"].as_array().into_iter().flatten())
        .filter(|e| e["health"] == "healthy" && e["reachable"] == true)
        .count()
}

/// `N` distinct loopback ports that were free a moment ago (held together
/// while chosen, so they differ).
fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("finding free ports")?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

// ------------------------------------------------------------ measurements

/// What the gateway's admin `/metrics` says; `None` for a series it does
/// not export.
#[derive(Debug, Clone, Default)]
struct GatewayMetrics {
    connections: Option<f64>,
    tasks: Option<f64>,
    requests: Option<f64>,
    by_code: BTreeMap<u16, f64>,
    retries: Option<f64>,
}

impl GatewayMetrics {
    fn parse(text: &str) -> Self {
        let mut m = GatewayMetrics::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, labels, value) = match line.find('{') {
                Some(open) => {
                    let Some(close) = line.rfind('}') else {
                        continue;
                    };
                    (&line[..open], &line[open + 1..close], &line[close + 1..])
                }
                None => match line.split_once(' ') {
                    Some((name, rest)) => (name, "", rest),
                    None => continue,
                },
            };
            let Some(Ok(value)) = value.split_whitespace().next().map(str::parse::<f64>) else {
                continue;
            };
            let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + value);
            match name {
                "infergate_client_connections" => add(&mut m.connections),
                "infergate_runtime_alive_tasks" => add(&mut m.tasks),
                "infergate_retries_total" => add(&mut m.retries),
                "infergate_requests_total" => {
                    add(&mut m.requests);
                    if let Some(code) = label(labels, "code").and_then(|c| c.parse().ok()) {
                        *m.by_code.entry(code).or_default() += value;
                    }
                }
                _ => {}
            }
        }
        m
    }
}

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"'))
    })
}

async fn scrape(http: &reqwest::Client, admin: SocketAddr) -> Option<GatewayMetrics> {
    let response = http
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .ok()?;
    let text = response.error_for_status().ok()?.text().await.ok()?;
    Some(GatewayMetrics::parse(&text))
}

/// CPU seconds (user and system) process `pid` has used.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which is in parentheses: the
    // state is the first, utime and stime the 12th and 13th.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_second > 0).then(|| ticks / per_second as f64)
}

/// VmRSS in MiB, and the open descriptors, of process `pid`.
fn process_usage(pid: u32) -> (Option<f64>, Option<f64>) {
    let rss = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib / 1024.0)
        });
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()
        .map(|dir| dir.count() as f64);
    (rss, fds)
}

/// Sockets the kernel holds for the gateway's side of client connections:
/// local port `port`, established or closed by the client but not yet by
/// the gateway (CLOSE_WAIT). Independent of what the gateway's gauges say.
fn kernel_connections(port: u16) -> Option<f64> {
    let mut open = None;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            *open.get_or_insert(0.0) += open_sockets(&text, port) as f64;
        }
    }
    open
}

/// Rows of a `/proc/net/tcp` table with local port `port` in state 01
/// (ESTABLISHED) or 08 (CLOSE_WAIT).
fn open_sockets(table: &str, port: u16) -> usize {
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local_port = fields
                .get(1)
                .and_then(|a| a.rsplit(':').next())
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && matches!(fields.get(3), Some(&("01" | "08")))
        })
        .count()
}

/// Whether `pid` is gone or a zombie (the gateway died).
fn process_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => status
            .lines()
            .find(|l| l.starts_with("State:"))
            .is_some_and(|l| l.contains('Z')),
        Err(_) => true,
    }
}

/// Where the gateway is observed from.
struct Probe {
    pid: u32,
    /// The public listener's port.
    port: u16,
    admin: SocketAddr,
    http: reqwest::Client,
}

#[derive(Debug, Clone)]
struct Sample {
    /// Seconds since traffic started.
    t: f64,
    rss_mib: Option<f64>,
    fds: Option<f64>,
    cpu_seconds: Option<f64>,
    /// Client connections open as the kernel sees them.
    sockets: Option<f64>,
    gateway: Option<GatewayMetrics>,
    /// The client's side: sent, complete, errors, in flight.
    client: [u64; 4],
}

impl Sample {
    async fn take(t: f64, probe: &Probe, shared: Option<&Shared>) -> Self {
        let (rss_mib, fds) = process_usage(probe.pid);
        let client = shared.map_or([0; 4], |shared| {
            let stats = shared.stats.lock().unwrap();
            [
                stats.sent,
                stats.count(|c| c == Class::Complete),
                stats.count(Class::is_error),
                shared.in_flight.load(Ordering::Relaxed),
            ]
        });
        Sample {
            t,
            rss_mib,
            fds,
            cpu_seconds: cpu_seconds(probe.pid),
            sockets: kernel_connections(probe.port),
            gateway: scrape(&probe.http, probe.admin).await,
            client,
        }
    }

    fn connections(&self) -> Option<f64> {
        self.gateway.as_ref()?.connections
    }

    fn tasks(&self) -> Option<f64> {
        self.gateway.as_ref()?.tasks
    }

    fn requests(&self) -> Option<f64> {
        self.gateway.as_ref()?.requests
    }
}

// ---------------------------------------------------------------- traffic

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Stream,
    /// Streams, and leaves after the first event.
    StreamThenLeave,
}

/// How one request ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Class {
    /// A whole answer: a completion, or a stream to `[DONE]`.
    Complete,
    /// The client left after the first event, on purpose.
    Left,
    /// An error status (the gateway's or a replica's).
    Status(u16),
    /// 200, but an error event, no `[DONE]`, or a body that is no completion.
    Incomplete,
    /// The connection broke after the response head.
    BrokenBody,
    /// The connection broke after connecting, before any response head.
    ResetBeforeHead,
    /// No connection: the request never reached the gateway.
    ConnectFailed,
    /// No outcome within [`REQUEST_TIMEOUT`]: unanswered.
    TimedOut { head: bool },
}

/// Whether the gateway saw a request (and so counted it).
#[derive(Debug, PartialEq, Eq)]
enum Reach {
    Yes,
    Maybe,
    No,
}

impl Class {
    fn reach(self) -> Reach {
        match self {
            Class::Complete
            | Class::Left
            | Class::Status(_)
            | Class::Incomplete
            | Class::BrokenBody
            | Class::TimedOut { head: true } => Reach::Yes,
            Class::ResetBeforeHead | Class::TimedOut { head: false } => Reach::Maybe,
            Class::ConnectFailed => Reach::No,
        }
    }

    fn is_error(self) -> bool {
        !matches!(self, Class::Complete | Class::Left)
    }

    fn name(self) -> String {
        match self {
            Class::Complete => "complete".into(),
            Class::Left => "left mid-stream".into(),
            Class::Status(code) => code.to_string(),
            Class::Incomplete => "incomplete".into(),
            Class::BrokenBody => "broken".into(),
            Class::ResetBeforeHead => "reset".into(),
            Class::ConnectFailed => "connect".into(),
            Class::TimedOut { head: true } => "timeout-after-head".into(),
            Class::TimedOut { head: false } => "timeout".into(),
        }
    }
}

#[derive(Debug, Default)]
struct Stats {
    sent: u64,
    /// Not sent: [`MAX_IN_FLIGHT`] were already in flight.
    skipped: u64,
    outcomes: BTreeMap<Class, u64>,
    /// End-to-end latency (ms) of complete answers this minute, and overall.
    minute: Vec<f64>,
    all: Vec<f64>,
}

impl Stats {
    fn count(&self, pick: impl Fn(Class) -> bool) -> u64 {
        self.outcomes
            .iter()
            .filter(|(c, _)| pick(**c))
            .map(|(_, n)| n)
            .sum()
    }

    fn errors_line(&self) -> String {
        let errors: Vec<String> = self
            .outcomes
            .iter()
            .filter(|(c, _)| c.is_error())
            .map(|(c, n)| format!("{}×{n}", c.name()))
            .collect();
        let total = self.count(Class::is_error);
        if errors.is_empty() {
            "err 0".into()
        } else {
            format!("err {total} [{}]", errors.join(" "))
        }
    }
}

/// State the tasks share.
struct Shared {
    /// When traffic started.
    start: Instant,
    stats: Mutex<Stats>,
    slow: Mutex<[SlowKind; 2]>,
    faults: Mutex<FaultLog>,
    in_flight: AtomicU64,
    gateway_died: AtomicBool,
}

/// The vocabulary of prompts (the simulator's tokenizer counts words).
const WORDS: &str = "the gateway routes each request to a replica with room in its cache and \
    queue model server token stream prefix shared document answer question about latency \
    throughput memory scheduler batch decode prefill adapter fleet metric window of for on \
    is how why when what does long short fast slow many";

/// The seeded request mix: 60 % streamed (5 % of those left after the
/// first event), half the prompts behind one of a few shared documents so
/// prefix affinity has something to find, answers of 8–96 tokens.
struct Workload {
    rng: SmallRng,
    documents: Vec<String>,
}

impl Workload {
    fn new(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let documents = (0..6)
            .map(|_| {
                let n = rng.gen_range(150..400);
                words(&mut rng, n)
            })
            .collect();
        Workload { rng, documents }
    }

    fn next(&mut self) -> (Kind, Bytes) {
        let rng = &mut self.rng;
        let stream = rng.gen_bool(0.6);
        let kind = match (stream, rng.gen_bool(0.05)) {
            (false, _) => Kind::Plain,
            (true, false) => Kind::Stream,
            (true, true) => Kind::StreamThenLeave,
        };
        let n = rng.gen_range(8..40);
        let question = words(rng, n);
        let messages = if rng.gen_bool(0.5) {
            let document = &self.documents[rng.gen_range(0..self.documents.len())];
            json!([
                {"role": "system", "content": document},
                {"role": "user", "content": question},
            ])
        } else {
            json!([{"role": "user", "content": question}])
        };
        let mut body = json!({
            "model": MODEL,
            "messages": messages,
            "max_tokens": rng.gen_range(8..=96),
            "stream": stream,
        });
        if stream {
            body["stream_options"] = json!({"include_usage": rng.gen_bool(0.5)});
        }
        (kind, Bytes::from(body.to_string()))
    }
}

fn words(rng: &mut SmallRng, n: usize) -> String {
    let vocabulary: Vec<&str> = WORDS.split_whitespace().collect();
    let picked: Vec<&str> = (0..n)
        .map(|_| vocabulary[rng.gen_range(0..vocabulary.len())])
        .collect();
    picked.join(" ")
}

/// Sends the mix at `rate` (Poisson arrivals) until `traffic` has passed
/// or the soak stops. Each request runs in its own task.
async fn run_traffic(
    shared: Arc<Shared>,
    url: Arc<str>,
    args: Args,
    traffic: Duration,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        // Shorter than the gateway's 75 s keep-alive timeout, so a pooled
        // connection is never reused just as the gateway closes it: that
        // race is a transport error that is nobody's fault.
        .pool_idle_timeout(Duration::from_secs(20))
        .build()?;
    let mut workload = Workload::new(args.seed);
    let mut arrivals = SmallRng::seed_from_u64(args.seed.wrapping_add(0x5eed));
    let end = shared.start + traffic;
    // A Poisson count exceeds its mean by 50 % practically never; this
    // bounds the request count whatever the clock does.
    let limit = (args.rate * traffic.as_secs_f64() * 1.5).ceil() as u64 + 10;
    let mut next = shared.start;
    for _ in 0..limit {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => break,
        }
        if next >= end || *stop.borrow() {
            break;
        }
        let (kind, body) = workload.next();
        if shared.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            shared.stats.lock().unwrap().skipped += 1;
        } else {
            shared.stats.lock().unwrap().sent += 1;
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            let (shared, client, url) = (shared.clone(), client.clone(), url.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let mut head = false;
                let ended = tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    exchange(&client, &url, kind, body, &mut head),
                )
                .await;
                let class = ended.unwrap_or(Class::TimedOut { head });
                let ms = started.elapsed().as_secs_f64() * 1e3;
                {
                    let mut stats = shared.stats.lock().unwrap();
                    *stats.outcomes.entry(class).or_default() += 1;
                    if class == Class::Complete {
                        stats.minute.push(ms);
                        stats.all.push(ms);
                    }
                }
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            });
        }
        let u: f64 = arrivals.gen_range(f64::EPSILON..1.0);
        next += Duration::from_secs_f64(-u.ln() / args.rate);
    }
    Ok(())
}

/// One request to its end; `head` is set once the response head arrived.
async fn exchange(
    client: &reqwest::Client,
    url: &str,
    kind: Kind,
    body: Bytes,
    head: &mut bool,
) -> Class {
    let sent = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Class::ConnectFailed,
        Err(_) => return Class::ResetBeforeHead,
    };
    *head = true;
    let status = response.status().as_u16();
    if status != 200 {
        // Read the error to its end: the exchange is over only then.
        return match response.bytes().await {
            Ok(_) => Class::Status(status),
            Err(_) => Class::BrokenBody,
        };
    }
    if kind == Kind::Plain {
        return match response.bytes().await {
            Ok(body) if is_completion(&body) => Class::Complete,
            Ok(_) => Class::Incomplete,
            Err(_) => Class::BrokenBody,
        };
    }
    let mut buffer = BytesMut::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => buffer.extend_from_slice(&chunk),
            Ok(None) => return Class::Incomplete,
            Err(_) => return Class::BrokenBody,
        }
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event = buffer.split_to(end + 2);
            let Some(data) = event[..]
                .split(|&b| b == b'\n')
                .find_map(|line| line.strip_prefix(b"data:"))
                .map(<[u8]>::trim_ascii)
            else {
                continue;
            };
            if data == b"[DONE]" {
                return Class::Complete;
            }
            if data.starts_with(b"{\"error\"") {
                return Class::Incomplete;
            }
            if kind == Kind::StreamThenLeave {
                // Dropping the response closes the connection mid-stream.
                return Class::Left;
            }
        }
    }
}

fn is_completion(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["choices"].as_array().map(|c| !c.is_empty()))
        .unwrap_or(false)
}

// --------------------------------------------------------------- slowloris

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slow {
    /// Sends a request head one byte every [`TRICKLE_EVERY`], never ending it.
    Trickle = 0,
    /// Connects and sends nothing.
    Silent = 1,
}

#[derive(Debug, Clone, Default)]
struct SlowKind {
    opened: u64,
    open: u64,
    /// Seconds each connection the gateway closed was open.
    closed_after: Vec<f64>,
    /// Status of what the gateway answered before closing (e.g. 408).
    statuses: BTreeMap<u16, u64>,
    /// Seconds each connection still open when the soak stopped had been.
    open_at_stop: Vec<f64>,
}

impl SlowKind {
    fn longest(&self) -> f64 {
        self.closed_after
            .iter()
            .chain(&self.open_at_stop)
            .fold(0.0, |a: f64, &b| a.max(b))
    }
}

enum SlowEnd {
    /// By the gateway, with the status it answered if any.
    Closed(Option<u16>),
    Stopped,
}

/// One slowloris slot: holds a connection of `kind` until the gateway
/// closes it, then opens another, until the soak stops.
async fn slowloris(
    addr: SocketAddr,
    kind: Slow,
    budget: u64,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let pause = Duration::from_secs(1);
    for _ in 0..budget {
        if *stop.borrow() {
            return;
        }
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::select! {
                () = tokio::time::sleep(pause) => continue,
                _ = stop.changed() => return,
            }
        };
        {
            let mut slow = shared.slow.lock().unwrap();
            slow[kind as usize].opened += 1;
            slow[kind as usize].open += 1;
        }
        let since = Instant::now();
        let end = hold(&mut stream, kind, &mut stop).await;
        let held = since.elapsed().as_secs_f64();
        drop(stream);
        {
            let mut slow = shared.slow.lock().unwrap();
            let k = &mut slow[kind as usize];
            k.open -= 1;
            match end {
                SlowEnd::Closed(status) => {
                    k.closed_after.push(held);
                    if let Some(status) = status {
                        *k.statuses.entry(status).or_default() += 1;
                    }
                }
                SlowEnd::Stopped => {
                    k.open_at_stop.push(held);
                    return;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
    }
}

async fn hold(stream: &mut TcpStream, kind: Slow, stop: &mut watch::Receiver<bool>) -> SlowEnd {
    // Never finished: the header value goes on for as long as it is sent.
    const HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
        Content-Type: application/json\r\nX-Slowloris: ";
    let mut sent = 0;
    let mut tick = tokio::time::interval(TRICKLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = [0u8; 1024];
    let mut answer = Vec::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return SlowEnd::Stopped,
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => return SlowEnd::Closed(status_of(&answer)),
                // An answer (a 408); the close follows.
                Ok(n) if answer.len() < 4096 => answer.extend_from_slice(&buf[..n]),
                Ok(_) => {}
            },
            _ = tick.tick(), if kind == Slow::Trickle => {
                let byte = HEAD.get(sent).copied().unwrap_or(b'a');
                if stream.write_all(&[byte]).await.is_err() {
                    return SlowEnd::Closed(status_of(&answer));
                }
                sent += 1;
            }
        }
    }
}

fn status_of(answer: &[u8]) -> Option<u16> {
    let rest = answer.strip_prefix(b"HTTP/1.1 ")?;
    std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()
}

// -------------------------------------------------------------- reporting

fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:2}:{:02}", s / 60, s % 60)
}

fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[i])
}

fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    percentile(&values, 0.5)
}

fn ms(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v >= 1000.0 => format!("{:.2}s", v / 1e3),
        Some(v) => format!("{v:.0}ms"),
    }
}

fn num(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0}"))
}

fn mib(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.1} MiB"))
}

/// One line a minute.
fn minute_line(shared: &Shared, sample: &Sample) -> String {
    let (line, mut minute) = {
        let mut stats = shared.stats.lock().unwrap();
        let line = format!(
            "sent {} ok {} left {} {} inflight {}",
            stats.sent,
            stats.count(|c| c == Class::Complete),
            stats.count(|c| c == Class::Left),
            stats.errors_line(),
            shared.in_flight.load(Ordering::Relaxed),
        );
        (line, std::mem::take(&mut stats.minute))
    };
    minute.sort_by(f64::total_cmp);
    let slow = shared.slow.lock().unwrap();
    format!(
        "{}  {line} | p50 {} p99 {} | rss {} fds {} conns {} (kernel {}) tasks {} | gw reqs {} | slowloris open {}",
        clock(Duration::from_secs_f64(sample.t)),
        ms(percentile(&minute, 0.5)),
        ms(percentile(&minute, 0.99)),
        mib(sample.rss_mib),
        num(sample.fds),
        num(sample.connections()),
        num(sample.sockets),
        num(sample.tasks()),
        num(sample.requests()),
        slow[0].open + slow[1].open,
    )
}

fn samples_csv(samples: &[Sample]) -> String {
    let mut out = String::from(
        "t_s,rss_mib,fds,cpu_s,client_connections,kernel_sockets,alive_tasks,gateway_requests,sent,complete,errors,in_flight\n",
    );
    let cell = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
    for s in samples {
        let _ = writeln!(
            out,
            "{:.1},{},{},{},{},{},{},{},{},{},{},{}",
            s.t,
            cell(s.rss_mib),
            cell(s.fds),
            cell(s.cpu_seconds),
            cell(s.connections()),
            cell(s.sockets),
            cell(s.tasks()),
            cell(s.requests()),
            s.client[0],
            s.client[1],
            s.client[2],
            s.client[3],
        );
    }
    out
}

/// One row of the checks table; `pass` is `None` when it cannot be judged
/// (a gauge the gateway does not export).
struct Check {
    name: &'static str,
    before: String,
    after: String,
    limit: String,
    pass: Option<bool>,
}

impl Check {
    fn result(&self) -> &'static str {
        match self.pass {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "n/a",
        }
    }
}

/// The median of `pick` over the samples within `[from, to]`.
fn window_median(
    samples: &[Sample],
    (from, to): (f64, f64),
    pick: impl Fn(&Sample) -> Option<f64>,
) -> Option<f64> {
    let values: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from && s.t <= to)
        .filter_map(pick)
        .collect();
    // Fewer than three samples make no median worth comparing.
    if values.len() < 3 {
        None
    } else {
        median(values)
    }
}

fn flat_check(
    name: &'static str,
    samples: &[Sample],
    timeline: &Timeline,
    pick: impl Fn(&Sample) -> Option<f64> + Copy,
    allowed: impl Fn(f64) -> f64,
    show: impl Fn(Option<f64>) -> String,
) -> Check {
    let before = window_median(samples, timeline.baseline(), pick);
    let after = window_median(samples, timeline.last(), pick);
    let limit = before.map(|b| b + allowed(b));
    let pass = match (after, limit) {
        (Some(a), Some(l)) => Some(a <= l),
        _ => Some(false),
    };
    let change = match (before, after) {
        (Some(b), Some(a)) if b > 0.0 => format!(" ({:+.1} %)", (a - b) / b * 100.0),
        _ => String::new(),
    };
    Check {
        name,
        before: show(before),
        after: format!("{}{change}", show(after)),
        limit: format!("≤ {}", show(limit)),
        pass,
    }
}

// -------------------------------------------------------------------- run

async fn run(args: Args) -> anyhow::Result<bool> {
    if args.minutes.is_nan() || args.minutes < 2.0 {
        bail!("--minutes must be at least 2 (a warm-up and two windows)");
    }
    if args.replicas < 3 {
        bail!("--replicas must be at least 3: one killed, one faulty, one healthy");
    }
    if args.rate.is_nan() || args.rate <= 0.0 {
        bail!("--rate must be positive");
    }
    if !args.infergate.is_file() {
        bail!(
            "{} not found: build it with cargo build --release -p infergate",
            args.infergate.display()
        );
    }
    let timeline = Timeline::new(args.minutes);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let dir = args.out.join(format!("soak-{stamp}"));
    std::fs::create_dir_all(&dir)?;

    println!(
        "soak: {} min of traffic at {} req/s, {} replicas (h100, time scale {}), seed {}; \
         warm-up {}, windows {} and {}, a fault cycle every {}; logs in {}",
        args.minutes,
        args.rate,
        args.replicas,
        args.time_scale,
        args.seed,
        clock(timeline.warmup).trim(),
        window_name(timeline.baseline()),
        window_name(timeline.last()),
        clock(timeline.cycle).trim(),
        dir.display(),
    );

    let ports = free_ports::<16>()?[..args.replicas.min(16)].to_vec();
    if ports.len() < args.replicas {
        bail!("at most 16 replicas");
    }
    let mut fleet = Fleet::start(&args, &dir, ports).await?;
    let mut gateway = Gateway::start(&args, &dir, &fleet.endpoints()).await?;
    let probe = Probe {
        pid: gateway.pid,
        port: gateway.addr.port(),
        admin: gateway.admin,
        // A connection per scrape, closed after it: this tool holds no
        // connection to the gateway between scrapes, whatever is counted.
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(3))
            .pool_max_idle_per_host(0)
            .build()?,
    };
    if let Err(e) = gateway.wait_ready(&probe.http, args.replicas).await {
        fleet.shutdown().await;
        return Err(e);
    }
    // The idle baseline: the gateway up, its replicas scraped, no traffic.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle = Sample::take(0.0, &probe, None).await;
    println!(
        "idle: rss {} fds {} conns {} (kernel {}) tasks {} (pid {}, http://{}, admin http://{})",
        mib(idle.rss_mib),
        num(idle.fds),
        num(idle.connections()),
        num(idle.sockets),
        num(idle.tasks()),
        gateway.pid,
        gateway.addr,
        gateway.admin,
    );

    let shared = Arc::new(Shared {
        start: Instant::now(),
        stats: Mutex::default(),
        slow: Mutex::default(),
        faults: Mutex::default(),
        in_flight: AtomicU64::new(0),
        gateway_died: AtomicBool::new(false),
    });
    let (stop_tx, stop) = watch::channel(false);
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let (stop_tx, interrupted) = (stop_tx.clone(), interrupted.clone());
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                println!("soak: interrupted; stopping and checking what ran");
                interrupted.store(true, Ordering::Relaxed);
                let _ = stop_tx.send(true);
            }
        });
    }
    let url: Arc<str> = Arc::from(format!("http://{}/v1/chat/completions", gateway.addr));
    let traffic = tokio::spawn(run_traffic(
        shared.clone(),
        url,
        args.clone(),
        timeline.traffic,
        stop.clone(),
    ));
    let faults = tokio::spawn(run_faults(
        fleet,
        fault_schedule(&timeline, args.replicas),
        shared.clone(),
        stop.clone(),
    ));
    let mut slow_slots = Vec::new();
    let budget = (args.minutes * SLOWLORIS_PER_SLOT_MINUTE).ceil() as u64;
    for kind in [Slow::Trickle, Slow::Silent] {
        for _ in 0..args.slowloris {
            slow_slots.push(tokio::spawn(slowloris(
                gateway.addr,
                kind,
                budget,
                shared.clone(),
                stop.clone(),
            )));
        }
    }

    // Sample every few seconds, print a line a minute, until the traffic
    // time is over (or the gateway dies, or Ctrl-C).
    let mut samples = Vec::new();
    let mut tick = 1u32;
    let mut stop_watch = stop.clone();
    loop {
        let at = SAMPLE_EVERY * tick;
        if at > timeline.traffic {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep_until(shared.start + at) => {}
            _ = stop_watch.changed() => break,
        }
        let t = at.as_secs_f64();
        let sample = Sample::take(t, &probe, Some(&shared)).await;
        if at.as_secs().is_multiple_of(60) {
            println!("{}", minute_line(&shared, &sample));
        }
        samples.push(sample);
        tick += 1;
        if process_dead(gateway.pid) {
            println!("soak: the gateway died:\n{}", log_tail(&gateway.log));
            shared.gateway_died.store(true, Ordering::Relaxed);
            break;
        }
    }

    // Traffic over: stop sending, close the slowloris connections, restore
    // the fleet, and give every request its full timeout to end.
    let _ = stop_tx.send(true);
    traffic.await??;
    for slot in slow_slots {
        let _ = slot.await;
    }
    let mut fleet = faults.await?;
    let grace = REQUEST_TIMEOUT + Duration::from_secs(5);
    let deadline = Instant::now() + grace;
    while shared.in_flight.load(Ordering::Relaxed) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let unanswered = shared.in_flight.load(Ordering::Relaxed);

    // Every client socket is closed now (the traffic client went with its
    // last request). Wait for the gateway's gauges and counter to settle.
    let (reached, maybe) = {
        let stats = shared.stats.lock().unwrap();
        (
            stats.count(|c| c.reach() == Reach::Yes),
            stats.count(|c| c.reach() == Reach::Maybe) + unanswered,
        )
    };
    let baseline_requests = idle.requests().unwrap_or(0.0);
    let task_limit = idle.tasks().map(|t| t + TASK_SLACK.max(t * 0.1));
    let counted = |s: &Sample| s.requests().map(|r| r - baseline_requests);
    // Kernel sockets, the connections gauge, tasks, the request counter;
    // a series the gateway does not export is settled.
    let conditions = |s: &Sample| {
        [
            s.sockets.is_none_or(|c| c == 0.0),
            s.connections().is_none_or(|c| c == 0.0),
            s.tasks().is_none_or(|t| task_limit.is_none_or(|l| t <= l)),
            counted(s).is_none_or(|r| r >= reached as f64 && r <= (reached + maybe) as f64),
        ]
    };
    let settle_start = Instant::now();
    // When each condition last became true (and stayed so).
    let mut settled_at = [None; 4];
    let mut end;
    loop {
        end = Sample::take(-1.0, &probe, Some(&shared)).await;
        let now = settle_start.elapsed().as_secs_f64();
        for (at, holds) in settled_at.iter_mut().zip(conditions(&end)) {
            *at = if holds { at.or(Some(now)) } else { None };
        }
        if settled_at.iter().all(Option::is_some) || settle_start.elapsed() >= SETTLE_BOUND {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let settled_in = |i: usize| {
        settled_at[i].map_or_else(
            || format!("not within {} s", SETTLE_BOUND.as_secs()),
            |t| format!("{t:.1} s after the clients left"),
        )
    };

    // ----- checks
    let stats = std::mem::take(&mut *shared.stats.lock().unwrap());
    let slow = shared.slow.lock().unwrap().clone();
    let fault_log = std::mem::take(&mut *shared.faults.lock().unwrap());
    let mut checks = vec![
        flat_check(
            "gateway RSS, median",
            &samples,
            &timeline,
            |s| s.rss_mib,
            |b| (b * RSS_GROWTH_FRACTION).max(RSS_GROWTH_MIB),
            mib,
        ),
        flat_check(
            "open descriptors, median",
            &samples,
            &timeline,
            |s| s.fds,
            |_| FD_GROWTH,
            num,
        ),
    ];
    let outcomes: u64 = stats.outcomes.values().sum();
    let timed_out = stats.count(|c| matches!(c, Class::TimedOut { .. }));
    checks.push(Check {
        name: "one outcome per request",
        before: format!("{} sent", stats.sent),
        after: format!(
            "{outcomes} ended, {timed_out} timed out, {unanswered} still open, {} not sent",
            stats.skipped
        ),
        limit: "all ended, none timed out".into(),
        pass: Some(
            outcomes == stats.sent && timed_out == 0 && unanswered == 0 && stats.skipped == 0,
        ),
    });
    let gw_count = counted(&end);
    checks.push(Check {
        name: "infergate_requests_total",
        before: format!("client: {reached} reached the gateway, {maybe} may have"),
        after: format!("{}, {}", num(gw_count), settled_in(3)),
        limit: format!("{reached}..={}", reached + maybe),
        pass: Some(gw_count.is_some_and(|r| r >= reached as f64 && r <= (reached + maybe) as f64)),
    });
    checks.push(Check {
        name: "client connections (kernel: sockets on the public port)",
        before: format!("idle {}", num(idle.sockets)),
        after: format!("{}, {}", num(end.sockets), settled_in(0)),
        limit: format!("0 within {} s", SETTLE_BOUND.as_secs()),
        pass: end.sockets.map(|c| c == 0.0),
    });
    // The idle reading is taken before any client connected: anything but
    // 0 there is the gauge counting something else, said so in the table.
    let idle_note = match idle.connections() {
        Some(c) if c != 0.0 => " (not 0 before any client connected)",
        _ => "",
    };
    checks.push(Check {
        name: "infergate_client_connections",
        before: format!("idle {}{idle_note}", num(idle.connections())),
        after: format!("{}, {}", num(end.connections()), settled_in(1)),
        limit: format!("0 within {} s", SETTLE_BOUND.as_secs()),
        pass: end.connections().map(|c| c == 0.0),
    });
    checks.push(Check {
        name: "infergate_runtime_alive_tasks",
        before: format!("idle {}", num(idle.tasks())),
        after: format!("{}, {}", num(end.tasks()), settled_in(2)),
        limit: task_limit.map_or("n/a".into(), |l| format!("≤ {l:.0}")),
        pass: match (end.tasks(), task_limit) {
            (Some(t), Some(l)) => Some(t <= l),
            _ => None,
        },
    });
    let longest = slow[0].longest().max(slow[1].longest());
    checks.push(Check {
        name: "slowloris closed by the gateway",
        before: format!(
            "{} trickling, {} silent opened",
            slow[0].opened, slow[1].opened
        ),
        after: format!("longest held {longest:.0} s"),
        limit: format!("≤ {} s", SLOWLORIS_BOUND.as_secs()),
        pass: Some(longest <= SLOWLORIS_BOUND.as_secs_f64()),
    });
    let died = shared.gateway_died.load(Ordering::Relaxed);
    let was_interrupted = interrupted.load(Ordering::Relaxed);
    let passed = !died
        && !was_interrupted
        && fault_log.failures == 0
        && checks.iter().all(|c| c.pass != Some(false));

    let exit = gateway.stop().await;
    fleet.shutdown().await;

    let cpu = samples
        .last()
        .and_then(|last| Some((last.cpu_seconds? - idle.cpu_seconds?) / last.t));
    let summary = summary(&SummaryInput {
        args: &args,
        cpu,
        timeline: &timeline,
        stats: &stats,
        slow: &slow,
        faults: &fault_log,
        end: &end,
        checks: &checks,
        exit: &exit,
        passed,
        died,
        interrupted: was_interrupted,
    });
    println!("\n{summary}");
    std::fs::write(dir.join("summary.md"), &summary)?;
    std::fs::write(dir.join("samples.csv"), samples_csv(&samples))?;
    println!(
        "soak: {} (logs in {})",
        if passed { "PASS" } else { "FAIL" },
        dir.display()
    );
    Ok(passed)
}

fn window_name((from, to): (f64, f64)) -> String {
    let c = |s: f64| clock(Duration::from_secs_f64(s)).trim().to_owned();
    format!("{}–{}", c(from), c(to))
}

struct SummaryInput<'a> {
    args: &'a Args,
    /// Seconds of CPU the gateway used per second of traffic.
    cpu: Option<f64>,
    timeline: &'a Timeline,
    stats: &'a Stats,
    slow: &'a [SlowKind; 2],
    faults: &'a FaultLog,
    end: &'a Sample,
    checks: &'a [Check],
    exit: &'a str,
    passed: bool,
    died: bool,
    interrupted: bool,
}

/// The tables for BENCHMARKS.md.
fn summary(s: &SummaryInput<'_>) -> String {
    let mut out = String::new();
    let a = s.args;
    let stats = s.stats;
    let mut all = stats.all.clone();
    all.sort_by(f64::total_cmp);
    let p = |q| ms(percentile(&all, q));
    let _ = writeln!(
        out,
        "Soak: `scripts/soak --minutes {} --rate {} --seed {}`: {} simulated H100 replicas \
         (time scale {}), the gateway with its default config.\n",
        a.minutes, a.rate, a.seed, a.replicas, a.time_scale
    );
    out.push_str("| run | |\n|---|---|\n");
    let complete = stats.count(|c| c == Class::Complete);
    let _ = writeln!(
        out,
        "| requests | {} sent: {complete} complete, {} left mid-stream on purpose, {} |",
        stats.sent,
        stats.count(|c| c == Class::Left),
        stats.errors_line().replacen("err", "errors", 1),
    );
    let _ = writeln!(
        out,
        "| latency of complete answers | p50 {}, p90 {}, p99 {}, max {} |",
        p(0.5),
        p(0.9),
        p(0.99),
        p(1.0)
    );
    let by_code = s
        .end
        .gateway
        .as_ref()
        .map(|g| {
            g.by_code
                .iter()
                .map(|(code, n)| format!("{code}×{n:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "n/a".into());
    let _ = writeln!(
        out,
        "| gateway's count by status | {by_code}; retries {} |",
        num(s.end.gateway.as_ref().and_then(|g| g.retries))
    );
    let f = s.faults;
    let _ = writeln!(
        out,
        "| faults | {} replica kills ({} via /admin/crash), {} restarts; {} /metrics faults ({}); \
         {} slowdowns ×{SLOWDOWN}; {} failed |",
        f.kills_admin + f.kills_sigkill,
        f.kills_admin,
        f.restarts,
        f.metrics.len(),
        f.metrics.join(", "),
        f.slowdowns,
        f.failures,
    );
    for (name, k) in [("trickling", &s.slow[0]), ("silent", &s.slow[1])] {
        let mut closed = k.closed_after.clone();
        closed.sort_by(f64::total_cmp);
        let statuses: Vec<String> = k.statuses.iter().map(|(c, n)| format!("{c}×{n}")).collect();
        let _ = writeln!(
            out,
            "| slowloris, {name} | {} opened; {} closed by the gateway after {}–{} s{}; {} open at the end |",
            k.opened,
            closed.len(),
            closed.first().map_or("–".into(), |v| format!("{v:.0}")),
            closed.last().map_or("–".into(), |v| format!("{v:.0}")),
            if statuses.is_empty() {
                String::new()
            } else {
                format!(" (answered {})", statuses.join(" "))
            },
            k.open_at_stop.len(),
        );
    }
    let _ = writeln!(
        out,
        "| gateway CPU | {} of a core, on average |",
        s.cpu
            .map_or("n/a".into(), |c| format!("{:.0} %", c * 100.0))
    );
    let _ = writeln!(out, "| gateway exit after SIGTERM | {} |", s.exit);
    let (b, l) = (s.timeline.baseline(), s.timeline.last());
    let _ = writeln!(
        out,
        "\n| check | before | after | limit | result |\n|---|---|---|---|---|"
    );
    for c in s.checks {
        let (before, after) = if c.name.ends_with("median") {
            (
                format!("{} (min {})", c.before, window_name(b)),
                format!("{} (min {})", c.after, window_name(l)),
            )
        } else {
            (c.before.clone(), c.after.clone())
        };
        let _ = writeln!(
            out,
            "| {} | {before} | {after} | {} | {} |",
            c.name,
            c.limit,
            c.result()
        );
    }
    let mut verdict = if s.passed { "PASS" } else { "FAIL" }.to_owned();
    if s.died {
        verdict.push_str(" (the gateway died)");
    }
    if s.interrupted {
        verdict.push_str(" (interrupted)");
    }
    if f.failures > 0 {
        verdict.push_str(" (a fault could not be injected)");
    }
    let _ = writeln!(out, "| **verdict** | | | | **{verdict}** |");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_gateway_exposition() {
        let text = "# TYPE infergate_requests counter\n\
            infergate_requests_total{pool=\"soak\",model=\"m\",code=\"200\"} 10\n\
            infergate_requests_total{pool=\"soak\",model=\"m\",code=\"503\"} 2\n\
            infergate_client_connections{listener=\"soak\"} 3\n\
            infergate_runtime_alive_tasks 41\n# EOF\n";
        let m = GatewayMetrics::parse(text);
        assert_eq!(m.requests, Some(12.0));
        assert_eq!(m.by_code[&503], 2.0);
        assert_eq!(m.connections, Some(3.0));
        assert_eq!(m.tasks, Some(41.0));
        assert_eq!(m.retries, None);
    }

    #[test]
    fn durations_scale_with_minutes() {
        let t = Timeline::new(30.0);
        assert_eq!(t.baseline(), (180.0, 480.0));
        assert_eq!(t.last(), (1500.0, 1800.0));
        let quick = Timeline::new(3.0);
        assert_eq!(quick.baseline(), (60.0, 90.0));
        assert_eq!(quick.last(), (150.0, 180.0));
        let schedule = fault_schedule(&quick, 4);
        let kills = schedule
            .iter()
            .filter(|(_, f)| matches!(f, Fault::Kill { .. }))
            .count();
        assert_eq!(kills, 6);
        assert!(schedule.iter().all(|(at, _)| *at < quick.traffic));
    }

    #[test]
    fn counts_the_gateways_sockets() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue\n\
            0: 0100007F:1F90 00000000:0000 0A 00000000:00000000\n\
            1: 0100007F:1F90 0100007F:D431 01 00000000:00000000\n\
            2: 0100007F:1F90 0100007F:D432 08 00000000:00000000\n\
            3: 0100007F:1F90 0100007F:D433 06 00000000:00000000\n\
            4: 0100007F:D431 0100007F:1F90 01 00000000:00000000\n";
        // Listening, TIME_WAIT and the client's own end are not counted.
        assert_eq!(open_sockets(table, 8080), 2);
    }

    #[test]
    fn slowloris_answers_are_read() {
        assert_eq!(status_of(b"HTTP/1.1 408 Request Timeout\r\n"), Some(408));
        assert_eq!(status_of(b""), None);
    }
}
