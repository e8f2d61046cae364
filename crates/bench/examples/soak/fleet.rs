//! The simulated replicas, each its own process, and the faults injected
//! into them on a schedule.

use super::*;

#[derive(Debug, Clone, Copy)]
pub(crate) enum Fault {
    /// SIGKILL the replica's process: its connections close at once, as
    /// when an engine is OOM-killed or its pod evicted.
    Kill {
        replica: usize,
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

pub(crate) const METRICS_FAULTS: [&str; 4] = ["garbage", "dead", "hang", "frozen"];
pub(crate) const SLOWDOWN: f64 = 4.0;

/// A replica killed is down this share of the kill period (at least 3 s)
/// before it is restarted on its port.
const DOWN: f64 = 0.1;

/// Every kill period (`--minutes` × 4 s: 2 minutes in 30), in its
/// middle, a replica is SIGKILLed, and restarted a tenth of the period
/// later. Every fault cycle (a sixth of the run) another's metrics switch
/// to a fault for a fifth of the cycle, then a third is slowed down for a
/// fifth of the cycle. The targets rotate; a kill skips the replica a
/// metrics fault or a slowdown is on (both are set through the replica's
/// admin API, which a dead replica does not answer).
pub(crate) fn fault_schedule(t: &Timeline, replicas: usize) -> Vec<(Duration, Fault)> {
    let mut events = Vec::new();
    // Each metrics fault and slowdown: from, to, replica.
    let mut busy = Vec::new();
    for k in 0.. {
        let start = t.cycle * k;
        if start >= t.traffic {
            break;
        }
        let at = |f: f64| start + t.cycle.mul_f64(f);
        let k = k as usize;
        let (faulty, slow) = ((k + 1) % replicas, (k + 2) % replicas);
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
        busy.push((at(0.35), at(0.55), faulty));
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
        busy.push((at(0.65), at(0.85), slow));
    }
    let down = t.kill_every.mul_f64(DOWN).max(Duration::from_secs(3));
    // A second either side: the admin calls take a moment.
    let margin = Duration::from_secs(1);
    let mut next = 0;
    for k in 0.. {
        let kill_at = t.kill_every * k + t.kill_every / 2;
        if kill_at >= t.traffic {
            break;
        }
        let back_at = kill_at + down;
        let is_busy = |replica: usize| {
            busy.iter().any(|&(from, to, r)| {
                r == replica && from <= back_at + margin && kill_at <= to + margin
            })
        };
        let Some(killed) = (0..replicas)
            .map(|i| (next + i) % replicas)
            .find(|&r| !is_busy(r))
        else {
            continue;
        };
        next = killed + 1;
        events.push((kill_at, Fault::Kill { replica: killed }));
        events.push((back_at, Fault::Restart { replica: killed }));
    }
    events.retain(|(at, _)| *at < t.traffic);
    events.sort_by_key(|(at, _)| *at);
    events
}

#[derive(Debug, Default)]
pub(crate) struct FaultLog {
    pub(crate) kills: u32,
    pub(crate) restarts: u32,
    pub(crate) metrics: Vec<&'static str>,
    pub(crate) slowdowns: u32,
    pub(crate) failures: u32,
}

/// The simulated replicas, one `infergate sim` process each.
pub(crate) struct Fleet {
    pub(crate) binary: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) time_scale: f64,
    pub(crate) seed: u64,
    pub(crate) ports: Vec<u16>,
    pub(crate) children: Vec<Option<Child>>,
    pub(crate) http: reqwest::Client,
}

impl Fleet {
    pub(crate) async fn start(args: &Args, dir: &Path, ports: Vec<u16>) -> anyhow::Result<Self> {
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

    pub(crate) fn endpoints(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect()
    }

    /// Starts replica `i` on its port and waits for its `/health`.
    pub(crate) async fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
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

    /// SIGKILL replica `i`'s process.
    pub(crate) async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(mut child) = self.children[i].take() {
            child.kill().await?;
        }
        Ok(())
    }

    pub(crate) async fn set_faults(
        &self,
        i: usize,
        faults: serde_json::Value,
    ) -> anyhow::Result<()> {
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

    pub(crate) async fn apply(
        &mut self,
        fault: Fault,
        log: &mut FaultLog,
    ) -> anyhow::Result<String> {
        let ports = self.ports.clone();
        let addr = |i: usize| format!("replica {i} (127.0.0.1:{})", ports[i]);
        Ok(match fault {
            Fault::Kill { replica } => {
                self.kill(replica).await?;
                log.kills += 1;
                format!("kill {} with SIGKILL", addr(replica))
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
    pub(crate) async fn restore(&mut self) -> anyhow::Result<()> {
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

    pub(crate) async fn shutdown(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill().await;
        }
    }
}

/// Runs the schedule until it ends or the soak stops, then restores the
/// fleet and hands it back.
pub(crate) async fn run_faults(
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
