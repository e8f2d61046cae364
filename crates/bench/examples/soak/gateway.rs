//! The gateway process, and what is read of it: its metrics, and its
//! memory, descriptors and sockets from /proc.

use super::*;

pub(crate) struct Gateway {
    pub(crate) child: Child,
    pub(crate) pid: u32,
    pub(crate) addr: SocketAddr,
    pub(crate) admin: SocketAddr,
    pub(crate) log: PathBuf,
}

impl Gateway {
    pub(crate) async fn start(
        args: &Args,
        dir: &Path,
        endpoints: &[String],
    ) -> anyhow::Result<Self> {
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
                    // The default, said here so the soak keeps testing
                    // continuation should the default change.
                    "continuation": {"enabled": true},
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
            // Warnings (replicas failing, going stale), each continuation
            // (`outbound` logs it at info) and the access log, whose
            // `request_id` is the client's `soak-<n>` and whose `moved`
            // says which replicas an answer left: what a cut stream needs
            // to be traced. The access log is written in batches by a
            // thread of its own: a few % of a core at 30 requests/s.
            .env(
                "INFERGATE_LOG",
                "warn,gateway::outbound=info,infergate::access=info",
            )
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
    pub(crate) async fn wait_ready(
        &mut self,
        http: &reqwest::Client,
        replicas: usize,
    ) -> anyhow::Result<()> {
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
    pub(crate) async fn stop(mut self) -> String {
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

pub(crate) fn healthy_endpoints(pools: &serde_json::Value) -> usize {
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
pub(crate) fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
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

pub(crate) fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// What the gateway's admin `/metrics` says; `None` for a series it does
/// not export.
#[derive(Debug, Clone, Default)]
pub(crate) struct GatewayMetrics {
    pub(crate) connections: Option<f64>,
    pub(crate) tasks: Option<f64>,
    pub(crate) requests: Option<f64>,
    pub(crate) by_code: BTreeMap<u16, f64>,
    pub(crate) retries: Option<f64>,
    /// `infergate_migrations_total` by `(reason, outcome)`, summed over
    /// pools: empty until an answer first moved.
    pub(crate) migrations: BTreeMap<(String, String), f64>,
}

impl GatewayMetrics {
    pub(crate) fn parse(text: &str) -> Self {
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
                "infergate_migrations_total" => {
                    let reason = label(labels, "reason").unwrap_or("?").to_owned();
                    let outcome = label(labels, "outcome").unwrap_or("?").to_owned();
                    *m.migrations.entry((reason, outcome)).or_default() += value;
                }
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

pub(crate) fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"'))
    })
}

pub(crate) async fn scrape(http: &reqwest::Client, admin: SocketAddr) -> Option<GatewayMetrics> {
    let response = http
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .ok()?;
    let text = response.error_for_status().ok()?.text().await.ok()?;
    Some(GatewayMetrics::parse(&text))
}

/// CPU seconds (user and system) process `pid` has used.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
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
pub(crate) fn process_usage(pid: u32) -> (Option<f64>, Option<f64>) {
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
pub(crate) fn kernel_connections(port: u16) -> Option<f64> {
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
pub(crate) fn open_sockets(table: &str, port: u16) -> usize {
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
pub(crate) fn process_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => status
            .lines()
            .find(|l| l.starts_with("State:"))
            .is_some_and(|l| l.contains('Z')),
        Err(_) => true,
    }
}
