//! `infergate bench`: compare routing policies on simulated fleets.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::agreement;
use crate::cold_start::{self, ColdStartOptions};
use crate::disaggregation;
use crate::failover::{self, FailoverOptions};
use crate::live::GatewayLauncher;
use crate::policy;
use crate::report;
use crate::routers::RouterUnderTest;
use crate::scenario::{RunLength, Size};
use crate::suite::{self, Mode, SuiteOptions};

/// Compare routing policies (round-robin, least-request, scored, presets)
/// on identical requests and an identical simulated fleet, at several
/// loads; or, in `flow-control`, the scored policy with the gateway's
/// admission queue on and off. Prints a markdown table per scenario on
/// stdout, progress on stderr.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Scenario: mixed-fleet, bursty, shared-prefix, lora, uniform,
    /// fleet-scale (virtual mode only), flow-control (live mode only:
    /// bursts of critical, standard and sheddable requests, flow control on,
    /// flat, off and with engine priority, per band), prefix-pressure, heterogeneous, multi-turn,
    /// bursty-uneven, agent-loop, batch-cost (CPU replicas of two speeds, where a batch
    /// costs nearly its size in single steps, beside the best static
    /// allocation computed from the engine profiles); all (the first six
    /// that the mode can run) or peers (prefix-pressure to agent-loop,
    /// written for comparing routers); global-failover
    /// (live mode only, run by name: three member gateways behind a global
    /// router, one killed and restarted under streaming load; share over
    /// time, TTFT around the failure, failover and recovery times);
    /// cold-start (live mode only, run by name: a pool at zero replicas
    /// gets a burst, idles past the autoscaler's cooldown, gets another;
    /// woken by the gateway's first request vs an autoscaler polling its
    /// metrics every 15 s).
    #[arg(long)]
    pub scenario: String,
    /// live: the real gateway over HTTP in front of simulated replicas;
    /// virtual: the same engine model and picker in virtual time; both:
    /// live, then virtual on the same requests, and a table of how well
    /// the two agree.
    #[arg(long, value_enum, default_value_t = ModeArg::Live)]
    pub mode: ModeArg,
    /// Small runs (two loads, short traffic): about 15 seconds per scenario,
    /// too few requests for tail percentiles to mean much.
    #[arg(long)]
    pub quick: bool,
    /// Write NAME.json, NAME.md and NAME.svg for each scenario here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Seed of the requests and arrivals; the same seed gives every policy
    /// the same traffic.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run each scenario with this many seeds (SEED, SEED+1, ...) and add
    /// a table of the spread between them: the run-to-run noise.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub repeat: u64,
    /// Policies to compare: round-robin, least-request, random, scored,
    /// predicted (the scored candidates ranked by each replica's learned
    /// latency), or a weight preset (latency, throughput, or scored:PRESET);
    /// scored-events is scored with prefix affinity from the replicas' KV
    /// events (live: the simulated engines publish them over ZMQ and the
    /// gateway follows them; virtual: each replica's prefix cache as
    /// lossless events would report it). POLICY@N (live mode) starts N
    /// gateways in front of the same fleet, the clients splitting their
    /// requests between them round-robin.
    /// Round-robin is always included as the baseline.
    #[arg(long, default_value = "round-robin,least-request,scored")]
    pub policies: String,
    /// Live mode: compare routers instead of policies, each started by the
    /// bench in front of a fresh copy of the fleet with the same requests:
    /// infergate:POLICY (e.g. infergate:scored-events@2), nginx:least_conn,
    /// sglang-router:POLICY,
    /// vllm-router:POLICY, smg:POLICY (e.g.
    /// infergate:scored,nginx:least_conn,sglang-router:cache_aware). A
    /// peer that is not installed is skipped with the command that
    /// installs it. Peers are found on PATH (nginx also in /usr/sbin).
    #[arg(long, conflicts_with = "policies", value_name = "LIST")]
    pub routers: Option<String>,
    /// Offered loads as fractions of the estimated capacity, e.g. 0.5,0.8.
    #[arg(long, value_delimiter = ',')]
    pub loads: Option<Vec<f64>>,
    /// Simulated seconds of arrivals per run (instead of the scenario's).
    #[arg(long, conflicts_with = "requests")]
    pub duration: Option<f64>,
    /// Requests per run (instead of the scenario's length).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Replicas in the fleet (GPU types keep alternating as in the scenario).
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Hardware profiles of the replicas, cycled (h100, a100, a100-40gb,
    /// l4, a10g; cpu-1t, cpu-2t), instead of the scenario's.
    #[arg(long, value_delimiter = ',')]
    pub hardware: Option<Vec<String>>,
    /// Simulated seconds a client waits for a complete answer (default 60,
    /// 20 with --quick, 600 in batch-cost).
    #[arg(long)]
    pub client_timeout: Option<f64>,
    /// A JSON object merged into the scored policies' `scheduling` config,
    /// to try other weights or thresholds on the same traffic, e.g.
    /// '{"weights": {"lora": 8}, "saturation": {"queueDepth": 50}}'.
    #[arg(long, value_name = "JSON")]
    pub scheduling: Option<String>,
    /// Live mode: engine seconds per wall second of the replicas (default:
    /// chosen so the token stream stays within what this machine can
    /// carry without distorting the measurement).
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Live mode: the gateway to run, `BINARY` (started as `BINARY serve`)
    /// or `in-process`. Default: this infergate executable.
    #[arg(long, value_name = "BINARY|in-process")]
    pub gateway: Option<String>,
}

impl BenchArgs {
    /// The suite options these arguments describe.
    pub fn options(&self) -> anyhow::Result<SuiteOptions> {
        let size = if self.quick { Size::Quick } else { Size::Full };
        let mode = match self.mode {
            ModeArg::Virtual => Mode::Virtual,
            ModeArg::Live | ModeArg::Both => Mode::Live,
        };
        let mut options = SuiteOptions::new(mode, size, self.seed);
        options.policies = policy::parse_list(&self.policies)?;
        if let Some(list) = &self.routers {
            if self.mode != ModeArg::Live {
                bail!("--routers compares routers live (--mode live)");
            }
            options.routers = installed_routers(RouterUnderTest::parse_list(list)?)?;
        }
        options.loads = self.loads.clone();
        options.length = match (self.duration, self.requests) {
            (Some(seconds), _) => Some(RunLength::Seconds(seconds)),
            (None, Some(requests)) => Some(RunLength::Requests(requests)),
            (None, None) => None,
        };
        options.replicas = self.replicas;
        options.hardware = self.hardware.clone();
        if let Some(timeout) = self.client_timeout {
            if !(timeout.is_finite() && timeout > 0.0) {
                bail!("--client-timeout must be a positive number of seconds");
            }
            options.client_timeout = Some(timeout);
        }
        if let Some(scale) = self.time_scale
            && !(scale.is_finite() && scale > 0.0)
        {
            bail!("--time-scale must be positive");
        }
        options.time_scale = self.time_scale;
        if let Some(text) = &self.scheduling {
            let value: serde_json::Value =
                serde_json::from_str(text).context("--scheduling is not valid JSON")?;
            if !value.is_object() {
                bail!(
                    "--scheduling must be a JSON object, e.g. '{{\"weights\": {{\"lora\": 8}}}}'"
                );
            }
            options.scheduling = Some(value);
        }
        options.gateway = match self.gateway.as_deref() {
            Some("in-process") => GatewayLauncher::InProcess,
            Some(binary) => GatewayLauncher::Binary(PathBuf::from(binary)),
            None => GatewayLauncher::Binary(
                std::env::current_exe().context("locating the infergate executable")?,
            ),
        };
        Ok(options)
    }
}

/// The routers of `routers` that can run here; a line on stderr for each
/// peer that is not installed, saying how to install it.
fn installed_routers(routers: Vec<RouterUnderTest>) -> anyhow::Result<Vec<RouterUnderTest>> {
    let mut installed = Vec::with_capacity(routers.len());
    for router in routers {
        if router.is_peer() && router.locate().is_none() {
            eprintln!(
                "skipping {router}: not installed ({})",
                router.install_hint()
            );
        } else {
            installed.push(router);
        }
    }
    if installed.is_empty() {
        bail!("none of the routers of --routers is installed");
    }
    Ok(installed)
}

/// `--mode`: one of the suite's modes, or both of them compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModeArg {
    Live,
    Virtual,
    Both,
}

/// Run the scenarios: each one's table goes to stdout as soon as it is
/// done, and to `--out` if given.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.scenario == failover::NAME {
        return run_failover(&args).await;
    }
    if args.scenario == disaggregation::NAME {
        return run_disaggregation(&args);
    }
    if args.scenario == cold_start::NAME {
        return run_cold_start(&args).await;
    }
    let options = args.options()?;
    let mut names = suite::names(&args.scenario, options.mode)?;
    if args.mode == ModeArg::Both {
        // Only scenarios that run both ways can be compared.
        let virtual_names = suite::names(&args.scenario, Mode::Virtual)?;
        names.retain(|n| virtual_names.contains(n));
    }
    // Refuse a bad combination before spending minutes on the others.
    for name in &names {
        suite::scenario(name, &options)?;
        if args.mode == ModeArg::Both {
            suite::scenario(name, &virtual_twin(name, &options)?)?;
        }
    }
    for name in names {
        let mut reports = Vec::new();
        for k in 0..args.repeat {
            let seed = options.seed + k;
            let seeded = SuiteOptions {
                seed,
                ..options.clone()
            };
            let report = suite::run_scenario(name, &seeded).await?;
            let suffix = if args.mode == ModeArg::Both {
                "-live"
            } else {
                ""
            };
            emit(&report, &args, &stem(name, seed, args.repeat, suffix))?;
            if args.mode == ModeArg::Both {
                let virtual_ = suite::run_scenario(name, &virtual_twin(name, &seeded)?).await?;
                emit(&virtual_, &args, &stem(name, seed, args.repeat, "-virtual"))?;
                let agreement = agreement::markdown(&report, &virtual_);
                print(&agreement)?;
                if let Some(dir) = &args.out {
                    let path = dir.join(format!(
                        "{}.md",
                        stem(name, seed, args.repeat, "-agreement")
                    ));
                    std::fs::write(&path, &agreement)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
            }
            reports.push(report);
        }
        if reports.len() > 1 {
            let spread = report::spread_markdown(&reports);
            print(&spread)?;
            if let Some(dir) = &args.out {
                let path = dir.join(format!("{name}-spread.md"));
                std::fs::write(&path, &spread)
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
    }
    Ok(())
}

/// `--scenario global-failover`: its own tier and report; of the other
/// options only `--quick`, `--seed`, `--repeat` and `--out` apply.
async fn run_failover(args: &BenchArgs) -> anyhow::Result<()> {
    if args.mode != ModeArg::Live {
        bail!("{} runs in live mode only (--mode live)", failover::NAME);
    }
    let size = if args.quick { Size::Quick } else { Size::Full };
    for k in 0..args.repeat {
        let seed = args.seed + k;
        let report = failover::run(&FailoverOptions::new(size, seed)).await?;
        print(&report.markdown())?;
        if let Some(dir) = &args.out {
            let stem = stem(failover::NAME, seed, args.repeat, "");
            report.write(dir, &stem)?;
            eprintln!(
                "[{}] wrote {1}/{stem}.json, {1}/{stem}.md, {1}/{stem}.svg",
                failover::NAME,
                dir.display()
            );
        }
    }
    Ok(())
}

/// `--scenario disaggregation`: virtual time only; of the other options
/// `--quick`, `--requests`, `--seed` and `--out` apply.
fn run_disaggregation(args: &BenchArgs) -> anyhow::Result<()> {
    if args.mode == ModeArg::Live || args.mode == ModeArg::Both {
        bail!(
            "{} runs in virtual time only (--mode virtual)",
            disaggregation::NAME
        );
    }
    let count = args
        .requests
        .map_or(if args.quick { 400 } else { 3000 }, |n| n as usize);
    let rows = disaggregation::rows(count, args.seed);
    let table = disaggregation::markdown(&rows, count, args.seed);
    print(&table)?;
    if let Some(dir) = &args.out {
        let path = dir.join(format!("{}.md", disaggregation::NAME));
        std::fs::write(&path, &table).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn run_cold_start(args: &BenchArgs) -> anyhow::Result<()> {
    if args.mode != ModeArg::Live {
        bail!("{} runs in live mode only (--mode live)", cold_start::NAME);
    }
    for k in 0..args.repeat {
        let seed = args.seed + k;
        let report = cold_start::run(&ColdStartOptions::new(args.quick, seed)).await?;
        let markdown = report.markdown();
        print(&markdown)?;
        if let Some(dir) = &args.out {
            let path = dir.join(format!(
                "{}.md",
                stem(cold_start::NAME, seed, args.repeat, "")
            ));
            std::fs::write(&path, &markdown)
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    Ok(())
}

/// The virtual-mode run that repeats `live`'s: same scenario, seed and
/// requests (live mode's run length), in virtual time.
fn virtual_twin(name: &str, live: &SuiteOptions) -> anyhow::Result<SuiteOptions> {
    let length = suite::scenario(name, live)?.length;
    Ok(SuiteOptions {
        mode: Mode::Virtual,
        length: Some(length),
        ..live.clone()
    })
}

/// File stem of one run's outputs.
fn stem(name: &str, seed: u64, repeat: u64, suffix: &str) -> String {
    if repeat > 1 {
        format!("{name}{suffix}-seed{seed}")
    } else {
        format!("{name}{suffix}")
    }
}

/// Print a run's table, and write its files to `--out` if given.
fn emit(report: &report::ScenarioReport, args: &BenchArgs, stem: &str) -> anyhow::Result<()> {
    print(&report.markdown())?;
    if let Some(dir) = &args.out {
        report.write(dir, stem)?;
        eprintln!(
            "[{}] wrote {1}/{stem}.json, {1}/{stem}.md, {1}/{stem}.svg",
            report.scenario,
            dir.display()
        );
    }
    Ok(())
}

fn print(markdown: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{markdown}")?;
    stdout.flush()?;
    Ok(())
}
