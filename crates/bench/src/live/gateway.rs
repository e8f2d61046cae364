//! Starting the gateway under test: the real `infergate` binary as a child
//! process (what `infergate bench` does), or the gateway library in this
//! process (what the harness's own test does, having no binary to run).

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::{Child, Command};

use crate::policy::PolicyUnderTest;

/// How to start a gateway.
#[derive(Debug, Clone)]
pub enum GatewayLauncher {
    /// `BINARY serve --config FILE`.
    Binary(PathBuf),
    /// `gateway::Gateway::start` on the current runtime.
    InProcess,
}

/// A gateway serving one benchmark run.
pub struct RunningGateway {
    addr: SocketAddr,
    admin: SocketAddr,
    kind: Running,
}

enum Running {
    Child {
        child: Child,
        /// Holds the config file and the gateway's log until the run ends.
        workdir: tempfile::TempDir,
    },
    InProcess(gateway::Gateway),
}

/// One gateway replica's account of a run, read from its admin listener.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GatewayView {
    /// Requests the clients sent it that completed.
    pub completed: u64,
    /// Each replica's `prefixSource` on `/debug/pools` (`events`,
    /// `unsure`, `approximate`), in the pool's order.
    pub prefix_sources: Vec<String>,
    /// Blocks its events index holds, over every replica and tier.
    pub indexed_blocks: u64,
    /// Picks by the source that scored the chosen replica's prefix
    /// (`infergate_prefix_source_total`).
    pub picks_by_source: BTreeMap<String, u64>,
}

/// What a gateway must report before a run's first request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    /// Replicas healthy and reachable.
    pub replicas: usize,
    /// Every replica's KV-events stream in step (`prefixSource: events`),
    /// so the run's first requests are scored by the events as all later
    /// ones are.
    pub events: bool,
}

/// A loopback address with a port that was free a moment ago. The gateway
/// binds it right after; on a quiet loopback nothing else takes it.
pub fn free_local_addr() -> anyhow::Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.to_string())
}

impl GatewayLauncher {
    /// Start a gateway with `config` (`text` is the same document as YAML).
    pub async fn start(
        &self,
        text: &str,
        config: &config::InferenceGatewayConfig,
        policy: &PolicyUnderTest,
    ) -> anyhow::Result<RunningGateway> {
        let addr: SocketAddr = config.spec.listeners[0].address.parse()?;
        let admin: SocketAddr = config
            .spec
            .admin
            .as_ref()
            .context("the benchmark config has an admin listener")?
            .address
            .parse()?;
        let kind = match self {
            GatewayLauncher::Binary(binary) => {
                let workdir = tempfile::Builder::new()
                    .prefix("infergate-bench-")
                    .tempdir()?;
                let config_path = workdir
                    .path()
                    .join(format!("{policy}.yaml").replace(':', "-"));
                std::fs::write(&config_path, text)?;
                let log = std::fs::File::create(workdir.path().join("gateway.log"))?;
                let child = Command::new(binary)
                    .arg("serve")
                    .arg("--config")
                    .arg(&config_path)
                    .env("INFERGATE_LOG", "warn")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(log)
                    // Its own group, so its CPU time can be read apart
                    // from the bench's (`cpu_seconds`).
                    .process_group(0)
                    .kill_on_drop(true)
                    .spawn()
                    .with_context(|| format!("running {}", binary.display()))?;
                Running::Child { child, workdir }
            }
            GatewayLauncher::InProcess => {
                Running::InProcess(gateway::Gateway::start(config).await?)
            }
        };
        let addr = match &kind {
            Running::InProcess(g) => g.addr(),
            Running::Child { .. } => addr,
        };
        let admin = match &kind {
            Running::InProcess(g) => g.admin_addr().unwrap_or(admin),
            Running::Child { .. } => admin,
        };
        Ok(RunningGateway { addr, admin, kind })
    }
}

impl RunningGateway {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// CPU seconds the gateway process has used so far; `None` for a
    /// gateway in this process.
    pub fn cpu_seconds(&self) -> Option<f64> {
        match &self.kind {
            Running::Child { child, .. } => {
                crate::routers::process::group_cpu_seconds(i32::try_from(child.id()?).ok()?)
            }
            Running::InProcess(_) => None,
        }
    }

    /// Wait until the gateway reports what `need` says (so the first
    /// requests of the run are routed as all later ones are), or fail after
    /// `timeout` with the gateway's log.
    pub async fn wait_ready(&mut self, need: Readiness, timeout: Duration) -> anyhow::Result<()> {
        let replicas = need.replicas;
        let url = format!("http://{}/debug/pools", self.admin);
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + timeout;
        // The admin endpoint offers no notification; poll it, briefly.
        let poll = Duration::from_millis(20);
        loop {
            if let Running::Child { child, workdir } = &mut self.kind
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "the gateway exited with {status} before it was ready:\n{}",
                    log_tail(workdir.path())
                );
            }
            if let Ok(response) = client.get(&url).send().await
                && let Ok(pools) = response.json::<serde_json::Value>().await
                && healthy_endpoints(&pools) >= replicas
                && (!need.events || events_in_step(&pools) >= replicas)
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let log = match &self.kind {
                    Running::Child { workdir, .. } => log_tail(workdir.path()),
                    Running::InProcess(_) => String::new(),
                };
                let events = if need.events {
                    " with their KV events in step"
                } else {
                    ""
                };
                bail!(
                    "the gateway did not report {replicas} healthy replicas{events} within {timeout:?}\n{log}"
                );
            }
            tokio::time::sleep(poll).await;
        }
    }

    /// What the gateway's admin listener says of its prefix index and its
    /// picks; empty where it does not answer.
    pub async fn view(&self) -> GatewayView {
        let client = reqwest::Client::new();
        let get = |path: &str| client.get(format!("http://{}{path}", self.admin)).send();
        let pools = match get("/debug/pools").await {
            Ok(response) => response.json().await.unwrap_or_default(),
            Err(_) => serde_json::Value::Null,
        };
        let metrics = match get("/metrics").await {
            Ok(response) => response.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        view_of(&pools, &metrics)
    }

    /// Stop the gateway (the run is over; nothing is in flight).
    pub async fn stop(self) {
        match self.kind {
            Running::Child { mut child, .. } => {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            Running::InProcess(gateway) => {
                gateway.shutdown().await;
            }
        }
    }
}

fn healthy_endpoints(pools: &serde_json::Value) -> usize {
    endpoints(pools)
        .filter(|e| e["health"] == "healthy" && e["reachable"] == true)
        .count()
}

/// Replicas whose KV-events stream the gateway follows in step.
fn events_in_step(pools: &serde_json::Value) -> usize {
    endpoints(pools)
        .filter(|e| e["prefixSource"] == "events")
        .count()
}

fn endpoints(pools: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    pools["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|pool| pool["endpoints"].as_array().into_iter().flatten())
}

/// A gateway's view from its `/debug/pools` and `/metrics`.
fn view_of(pools: &serde_json::Value, metrics: &str) -> GatewayView {
    let prefix_sources = endpoints(pools)
        .map(|e| e["prefixSource"].as_str().unwrap_or("").to_owned())
        .collect();
    let indexed_blocks = endpoints(pools)
        .flat_map(|e| e["kvEvents"].as_array().into_iter().flatten())
        .map(|rank| {
            rank["gpuBlocks"].as_u64().unwrap_or(0) + rank["offloadBlocks"].as_u64().unwrap_or(0)
        })
        .sum();
    let mut picks_by_source = BTreeMap::new();
    for line in metrics.lines() {
        let Some(labels) = line.strip_prefix("infergate_prefix_source_total{") else {
            continue;
        };
        let Some((labels, value)) = labels.rsplit_once("} ") else {
            continue;
        };
        let source = labels
            .split(',')
            .find_map(|l| l.strip_prefix("source=\""))
            .and_then(|s| s.strip_suffix('"'));
        if let (Some(source), Ok(value)) = (source, value.trim().parse::<f64>()) {
            *picks_by_source.entry(source.to_owned()).or_default() += value as u64;
        }
    }
    GatewayView {
        completed: 0,
        prefix_sources,
        indexed_blocks,
        picks_by_source,
    }
}

/// The last lines of the gateway's log, for error messages.
fn log_tail(dir: &std::path::Path) -> String {
    let text = std::fs::read_to_string(dir.join("gateway.log")).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_healthy_reachable_endpoints() {
        let pools = serde_json::json!({"pools": [{"endpoints": [
            {"health": "healthy", "reachable": true},
            {"health": "stale", "reachable": true},
            {"health": "healthy", "reachable": false},
            {"health": "healthy", "reachable": true},
        ]}]});
        assert_eq!(healthy_endpoints(&pools), 2);
        assert_eq!(healthy_endpoints(&serde_json::json!({})), 0);
    }

    #[test]
    fn reads_the_prefix_sources_blocks_and_picks() {
        let pools = serde_json::json!({"pools": [{"endpoints": [
            {"prefixSource": "events", "kvEvents": [{"gpuBlocks": 10, "offloadBlocks": 2}]},
            {"prefixSource": "unsure", "kvEvents": [{"gpuBlocks": 5}]},
        ]}]});
        let metrics = "# TYPE infergate_prefix_source_total counter\n\
            infergate_prefix_source_total{pool=\"bench\",source=\"events\"} 41\n\
            infergate_prefix_source_total{pool=\"bench\",source=\"approximate\"} 3\n\
            infergate_requests_total{pool=\"bench\"} 44\n";
        let view = view_of(&pools, metrics);
        assert_eq!(view.prefix_sources, ["events", "unsure"]);
        assert_eq!(view.indexed_blocks, 17);
        assert_eq!(view.picks_by_source["events"], 41);
        assert_eq!(view.picks_by_source["approximate"], 3);
        assert_eq!(events_in_step(&pools), 1);
        assert_eq!(
            view_of(&serde_json::Value::Null, ""),
            GatewayView::default()
        );
    }
}
