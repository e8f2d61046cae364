//! Starting a peer router (nginx, sglang-router, vllm-router, smg) in front
//! of a run's replicas, and knowing when it routes.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};

use super::gateway::free_local_addr;
use crate::routers::nginx;
use crate::routers::process::{Launch, RouterProcess};
use crate::routers::{PythonRouter, RouterUnderTest};

/// A peer router serving one run.
pub struct RunningPeer {
    addr: SocketAddr,
    process: RouterProcess,
    readiness: Readiness,
}

/// How to tell that a peer routes to every worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Readiness {
    /// `GET /v1/models` is passed to a worker and lists the model (nginx;
    /// vllm-router, which listens only once its workers are healthy).
    ModelsListed,
    /// `GET /workers` lists every worker healthy (sglang-router, smg:
    /// they listen at once, register workers in the background, and
    /// answer `/v1/models` themselves).
    WorkersHealthy,
}

impl RunningPeer {
    /// Start `router` (run by `program`) in front of `workers`
    /// (`host:port`), on a free loopback port.
    pub fn start(
        router: &RouterUnderTest,
        program: &Path,
        workers: &[String],
    ) -> anyhow::Result<Self> {
        let addr: SocketAddr = free_local_addr()?.parse()?;
        let workdir = tempfile::Builder::new()
            .prefix("infergate-bench-peer-")
            .tempdir()?;
        let readiness = match router {
            RouterUnderTest::Python {
                router: PythonRouter::SglangRouter | PythonRouter::Smg,
                ..
            } => Readiness::WorkersHealthy,
            _ => Readiness::ModelsListed,
        };
        let launch = match router {
            RouterUnderTest::Infergate(_) => bail!("infergate is not a peer router"),
            RouterUnderTest::NginxLeastConn => {
                let text = nginx::config(addr, workers, workdir.path());
                std::fs::write(workdir.path().join(nginx::CONFIG_FILE), text)?;
                Launch {
                    program: program.to_owned(),
                    args: nginx::args(workdir.path()),
                    env: Vec::new(),
                }
            }
            RouterUnderTest::Python { router, policy } => {
                let metrics: SocketAddr = free_local_addr()?.parse()?;
                Launch {
                    program: program.to_owned(),
                    args: router.args(policy, addr, metrics, workers),
                    env: router
                        .env()
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                }
            }
        };
        let process =
            RouterProcess::spawn(&launch, workdir).with_context(|| format!("starting {router}"))?;
        Ok(RunningPeer {
            addr,
            process,
            readiness,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// CPU seconds the router's processes have used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        self.process.cpu_seconds()
    }

    /// Wait until the router routes to all `workers` (see [`Readiness`]),
    /// or fail after `timeout` with the router's output.
    pub async fn wait_ready(
        &mut self,
        model: &str,
        workers: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let url = match self.readiness {
            Readiness::ModelsListed => format!("http://{}/v1/models", self.addr),
            Readiness::WorkersHealthy => format!("http://{}/workers", self.addr),
        };
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + timeout;
        // No router offers a readiness notification; poll, briefly.
        let poll = Duration::from_millis(50);
        loop {
            if let Some(status) = self.process.exited()? {
                bail!(
                    "the router exited with {status} before it was ready:\n{}",
                    self.process.log_tail()
                );
            }
            if let Ok(response) = client.get(&url).send().await
                && response.status().is_success()
                && let Ok(text) = response.text().await
                && match self.readiness {
                    Readiness::ModelsListed => text.contains(model),
                    Readiness::WorkersHealthy => healthy_workers(&text) >= workers,
                }
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "the router was not ready ({url}) within {timeout:?}:\n{}",
                    self.process.log_tail()
                );
            }
            tokio::time::sleep(poll).await;
        }
    }

    pub async fn stop(self) {
        self.process.stop().await;
    }
}

/// Healthy workers in a `GET /workers` answer of sglang-router or smg:
/// `{"workers": [{"url": ..., "is_healthy": true, ...}], ...}`.
fn healthy_workers(text: &str) -> usize {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return 0;
    };
    value["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["is_healthy"] == true)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_healthy_workers() {
        let text = r#"{"workers":[{"url":"http://127.0.0.1:1","is_healthy":true},
            {"url":"http://127.0.0.1:2","is_healthy":false},
            {"url":"http://127.0.0.1:3","is_healthy":true}],"total":3}"#;
        assert_eq!(healthy_workers(text), 2);
        assert_eq!(healthy_workers("not json"), 0);
        assert_eq!(healthy_workers("{}"), 0);
    }
}
