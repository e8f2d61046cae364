//! Running a scenario: estimate the fleet's capacity, then run every policy
//! (or, in `flow-control`, the scored policy with flow control on and off)
//! at every load on the same requests, in virtual time or live, and
//! summarize.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use anyhow::bail;

use crate::allocation::{RequestShape, StaticAllocation};
use crate::capacity::{self, Calibration, FleetCapacity};
use crate::flow::FlowMode;
use crate::live::{self, GatewayLauncher, LiveOptions};
use crate::policy::{self, PolicyUnderTest, PoolDocument};
use crate::report::{FleetReport, ReplicaCapacityReport, RunDetail, ScenarioReport, Setup};
use crate::routers::{self, RouterUnderTest};
use crate::scenario::{self as scenarios, Compare, RunLength, Scenario, Size};
use crate::stats::{self, Outcome, Summary};
use crate::virtual_fleet::{self, Prepared, VirtualFleet, VirtualOptions};
use crate::workload::Workload;

/// Live over HTTP, or in virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Live,
    Virtual,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Live => "live",
            Mode::Virtual => "virtual",
        }
    }
}

/// Everything that shapes a benchmark run besides the scenario.
#[derive(Debug, Clone)]
pub struct SuiteOptions {
    pub mode: Mode,
    pub size: Size,
    pub seed: u64,
    pub policies: Vec<PolicyUnderTest>,
    /// Routers to compare instead of `policies` (live mode): infergate
    /// policies and peer routers, each named as on the command line.
    pub routers: Vec<RouterUnderTest>,
    /// Replace the scenario's load levels.
    pub loads: Option<Vec<f64>>,
    /// Replace the scenario's run length.
    pub length: Option<RunLength>,
    /// Replace the scenario's replica count (GPU profiles keep cycling).
    pub replicas: Option<usize>,
    /// Replace the scenario's GPU profiles (cycled over the replicas).
    pub hardware: Option<Vec<String>>,
    /// Simulated seconds a client waits for a complete answer; `None`: the
    /// scenario's own wait, else [`DEFAULT_CLIENT_TIMEOUT`]
    /// ([`QUICK_CLIENT_TIMEOUT`] with `--quick`).
    pub client_timeout: Option<f64>,
    /// Scrape period and delay of the modelled gateway (virtual mode).
    pub scrape_interval: f64,
    pub scrape_delay: f64,
    pub gateway: GatewayLauncher,
    /// Live mode: engine seconds per wall second; chosen from the fleet's
    /// token rate when `None`.
    pub time_scale: Option<f64>,
    /// Live mode: the SSE events per wall second the automatic time scale
    /// aims at (each output token is one event on each hop).
    pub live_token_budget: f64,
    /// Merged into the scored policies' `scheduling` config (weights,
    /// saturation, ...): tuning experiments on the same traffic.
    pub scheduling: Option<serde_json::Value>,
}

impl SuiteOptions {
    pub fn new(mode: Mode, size: Size, seed: u64) -> Self {
        SuiteOptions {
            mode,
            size,
            seed,
            policies: PolicyUnderTest::defaults(),
            routers: Vec::new(),
            loads: None,
            length: None,
            replicas: None,
            hardware: None,
            client_timeout: None,
            scrape_interval: config::defaults::SCRAPE_INTERVAL.as_secs_f64(),
            scrape_delay: DEFAULT_SCRAPE_DELAY,
            gateway: GatewayLauncher::InProcess,
            time_scale: None,
            live_token_budget: DEFAULT_LIVE_TOKEN_BUDGET,
            scheduling: None,
        }
    }

    /// Simulated seconds a client of `scenario` waits for a complete answer.
    pub fn client_timeout(&self, scenario: &Scenario) -> f64 {
        self.client_timeout
            .or(scenario.client_timeout)
            .unwrap_or(match self.size {
                Size::Full => DEFAULT_CLIENT_TIMEOUT,
                Size::Quick => QUICK_CLIENT_TIMEOUT,
            })
    }
}

/// How long a client waits for its answer, unless the scenario or
/// `--client-timeout` says otherwise.
pub const DEFAULT_CLIENT_TIMEOUT: f64 = 60.0;
/// The same with `--quick`: short runs, where long answers on slow GPUs
/// would dominate.
pub const QUICK_CLIENT_TIMEOUT: f64 = 20.0;
/// Requests whose mean lengths the best static allocation is modelled for.
const SHAPE_SAMPLE: usize = 4000;

/// From a replica taking its snapshot to the picker seeing it: an HTTP
/// round trip on a local network plus rendering and parsing the text.
pub const DEFAULT_SCRAPE_DELAY: f64 = 0.002;
/// Output tokens per wall second live mode aims for at each load: what the
/// replicas, the gateway and the load generator stream together on two
/// cores (about 40 µs of CPU per token across the three) while leaving
/// most of the machine idle, so the benchmark's own CPU use does not
/// distort its latencies.
pub const DEFAULT_LIVE_TOKEN_BUDGET: f64 = 12_000.0;
/// Fastest live replicas: beyond this the HTTP path's own delays
/// (loopback round trips, timer wake-ups of about a millisecond) stop
/// being negligible in engine time. `--quick` runs at this pace.
const MAX_TIME_SCALE: f64 = 10.0;
/// Requests prepared per message from the request thread to the event
/// loop.
const BATCH: usize = 256;

/// The scenario `name` with `options`' overrides applied.
pub fn scenario(name: &str, options: &SuiteOptions) -> anyhow::Result<Scenario> {
    let mut scenario = Scenario::named(name, options.size)?;
    if options.mode == Mode::Live {
        scenario.length = scenario.live_length;
    }
    if let Some(loads) = &options.loads {
        scenario.loads = loads.clone();
    }
    if let Some(length) = options.length {
        scenario.length = length;
    }
    if let Some(replicas) = options.replicas {
        scenario.fleet.replicas = replicas;
    }
    if let Some(hardware) = &options.hardware {
        if hardware.is_empty() {
            bail!("--hardware needs at least one GPU profile");
        }
        scenario.fleet.hardware = hardware.clone();
    }
    if scenario.fleet.replicas == 0 {
        bail!("a fleet needs at least one replica");
    }
    // Unknown GPUs, or a model that does not fit them, fail here.
    scenario.fleet.engine_configs()?;
    if options.mode == Mode::Live && !scenario.live {
        bail!(
            "{} runs in virtual mode only (--mode virtual)",
            scenario.name
        );
    }
    if options.mode == Mode::Virtual
        && let Some(split) = runs(&scenario, options)
            .iter()
            .find(|r| matches!(r, RouterUnderTest::Infergate(p) if p.gateways() > 1))
    {
        bail!(
            "{split} runs in live mode only (--mode live): virtual mode models one gateway's picker"
        );
    }
    if options.mode == Mode::Virtual
        && let Some(peer) = options.routers.iter().find(|r| r.is_peer())
    {
        bail!(
            "{peer} runs in live mode only (--mode live): virtual mode models infergate's picker"
        );
    }
    if options.mode == Mode::Virtual && !scenario.virtual_time {
        bail!(
            "{} runs in live mode only (--mode live): virtual mode models one priority band's queue",
            scenario.name
        );
    }
    if runs(&scenario, options).is_empty() {
        bail!(
            "{} compares scored policies with flow control on and off (only they report a pool saturated); --policies names none",
            scenario.name
        );
    }
    if scenario.loads.iter().any(|l| !(l.is_finite() && *l > 0.0)) {
        bail!("loads must be positive fractions of capacity, e.g. 0.5,0.8");
    }
    Ok(scenario)
}

/// Scenario names from `--scenario` for `mode`: `all` is every scenario of
/// [`scenarios::ALL`] the mode can run.
pub fn names(scenario: &str, mode: Mode) -> anyhow::Result<Vec<&'static str>> {
    scenarios::expand(scenario, mode == Mode::Live)
}

/// The runs of each load of `scenario`, in order: one per policy (or
/// router, with `--routers`); each scored policy with session affinity
/// added; or each scored policy with flow control on, then off.
pub fn runs(scenario: &Scenario, options: &SuiteOptions) -> Vec<RouterUnderTest> {
    let routers: Vec<RouterUnderTest> = if options.routers.is_empty() {
        options
            .policies
            .iter()
            .cloned()
            .map(RouterUnderTest::Infergate)
            .collect()
    } else {
        options.routers.clone()
    };
    match scenario.compare {
        Compare::Policies => routers,
        // Each router, then each infergate policy that scores with session
        // affinity added.
        Compare::Sessions => {
            let with_sessions: Vec<RouterUnderTest> = routers
                .iter()
                .filter_map(|r| match r {
                    RouterUnderTest::Infergate(p) if p.uses_signals() && !p.sessions() => {
                        Some(RouterUnderTest::Infergate(p.clone().with_sessions()))
                    }
                    _ => None,
                })
                .collect();
            routers.into_iter().chain(with_sessions).collect()
        }
        Compare::FlowControl => routers
            .into_iter()
            .filter_map(|r| match r {
                RouterUnderTest::Infergate(p) if p.uses_signals() => Some(p),
                _ => None,
            })
            .flat_map(|p| FlowMode::ALL.map(|flow| p.clone().with_flow(flow)))
            .map(RouterUnderTest::Infergate)
            .collect(),
    }
}

/// The name of a run's row: the policy alone when only infergate's
/// policies are compared (`--policies`), the router's full name with
/// `--routers`.
fn label(router: &RouterUnderTest, options: &SuiteOptions) -> String {
    match router {
        RouterUnderTest::Infergate(policy) if options.routers.is_empty() => policy.to_string(),
        router => router.to_string(),
    }
}

/// "Routers: nginx 1.22.1, sglang-router 0.3.2." — the installed versions
/// of the peers compared, for the report.
fn router_versions(options: &SuiteOptions) -> Option<String> {
    let versions: Vec<String> = options
        .routers
        .iter()
        .filter(|r| r.is_peer())
        .filter_map(|r| {
            let program = r.locate()?;
            let version = routers::installed_version(r, &program)
                .unwrap_or_else(|| "(version unknown)".to_owned());
            Some(format!("{r} {version}"))
        })
        .collect();
    (!versions.is_empty()).then(|| {
        format!(
            "Peer routers (each started by the bench for its run, at its defaults, on loopback): {}. Router CPU is the router's processes' user + system time while the requests ran (from /proc).",
            versions.join(", ")
        )
    })
}

/// Run one scenario: every policy at every load. Progress goes to stderr.
pub async fn run_scenario(name: &str, options: &SuiteOptions) -> anyhow::Result<ScenarioReport> {
    let scenario = scenario(name, options)?;
    let client_timeout = options.client_timeout(&scenario);
    let options = &SuiteOptions {
        client_timeout: Some(client_timeout),
        ..options.clone()
    };
    let engines = scenario.fleet.engine_configs()?;
    let workload = Arc::new(Workload::new(scenario.workload.clone(), options.seed));
    let calibration = match options.size {
        Size::Full => Calibration::FULL,
        Size::Quick => Calibration::QUICK,
    };

    eprintln!(
        "[{}] {} — estimating capacity ...",
        scenario.name,
        scenario.fleet.describe()
    );
    let capacity = {
        let engines = engines.clone();
        let workload = Arc::clone(&workload);
        let adapters = scenario.fleet.adapters.clone();
        tokio::task::spawn_blocking(move || {
            let needed = engines
                .iter()
                .map(|cfg| calibration.requests_needed(cfg))
                .max()
                .unwrap_or(0);
            let sample = workload.sample(needed);
            capacity::fleet_capacity(&engines, &adapters, &sample, calibration)
        })
        .await??
    };
    eprintln!(
        "[{}] capacity ≈ {:.1} req/s",
        scenario.name, capacity.requests_per_s
    );

    let static_allocation = if scenario.static_allocation {
        let engines = engines.clone();
        let workload = Arc::clone(&workload);
        let loads = scenario.loads.clone();
        let fleet_rate = capacity.requests_per_s;
        tokio::task::spawn_blocking(move || {
            let shape =
                RequestShape::of(&workload.sample(SHAPE_SAMPLE)).expect("a workload has requests");
            loads
                .iter()
                .map(|&load| StaticAllocation::compute(&engines, shape, load, load * fleet_rate))
                .collect()
        })
        .await?
    } else {
        Vec::new()
    };

    let mut results = Vec::new();
    let mut setup = Setup {
        about: scenario.about.to_owned(),
        length: scenario.length.to_string(),
        client_timeout,
        scheduling: options.scheduling.as_ref().map(ToString::to_string),
        notes: notes(&scenario),
        routers: !options.routers.is_empty(),
        ..Setup::default()
    };
    setup.notes.extend(router_versions(options));
    let runs = runs(&scenario, options);
    for &load in &scenario.loads {
        let rate = load * capacity.requests_per_s;
        let duration = scenario.length.seconds_at(rate);
        let mut requests = None;
        // Live mode sends bodies it serialized before the clock starts, to
        // replicas running at a pace the machine can stream.
        let live = match options.mode {
            Mode::Live => {
                let plans: Vec<_> = workload.stream(rate, duration).collect();
                let time_scale = options.time_scale.unwrap_or_else(|| match options.size {
                    Size::Quick => MAX_TIME_SCALE,
                    Size::Full => {
                        auto_time_scale(&capacity, &engines, load, options.live_token_budget)
                    }
                });
                setup.time_scales.push((load, time_scale));
                Some((live::planned(&workload, &plans), time_scale))
            }
            Mode::Virtual => None,
        };
        for router in &runs {
            let started = Instant::now();
            let mut router_cpu_s = None;
            let outcomes = match &live {
                Some((planned, time_scale)) => {
                    let live_options = LiveOptions {
                        gateway: options.gateway.clone(),
                        time_scale: *time_scale,
                        client_timeout,
                        ready_timeout: std::time::Duration::from_secs(20),
                        seed: options.seed,
                        scheduling: options.scheduling.clone(),
                    };
                    let run =
                        live::run(&scenario.fleet, router, planned.clone(), &live_options).await?;
                    router_cpu_s = run.router_cpu_seconds;
                    if let Some(note) = gateways_note(&label(router, options), load, &run.gateways)
                    {
                        setup.notes.push(note);
                    }
                    run.outcomes
                }
                None => {
                    let RouterUnderTest::Infergate(policy) = router else {
                        bail!("{router} runs in live mode only");
                    };
                    let fleet = VirtualFleet {
                        engines: engines.clone(),
                        adapters: scenario.fleet.adapters.clone(),
                    };
                    let workload = Arc::clone(&workload);
                    let policy = policy.clone();
                    let model = scenario.workload.model.clone();
                    let adapters = scenario.fleet.adapters.clone();
                    let endpoints = placeholder_endpoints(engines.len());
                    let options = options.clone();
                    tokio::task::spawn_blocking(move || {
                        let pool = PoolDocument {
                            model: &model,
                            adapters: &adapters,
                            endpoints: &endpoints,
                            time_scale: 1.0,
                            scored_overrides: options.scheduling.as_ref(),
                            // Virtual mode sends no headers.
                            priorities: false,
                            // Exact prefixes come from the virtual engines.
                            kv_events: None,
                        };
                        run_virtual(&fleet, &policy, &pool, &workload, rate, duration, &options)
                    })
                    .await??
                }
            };
            let wall = started.elapsed().as_secs_f64();
            requests.get_or_insert(outcomes.len());
            let mut summary =
                stats::summarize(&label(router, options), load, &outcomes, client_timeout);
            summary.router_cpu_s = router_cpu_s;
            if scenario.compare == Compare::FlowControl
                && let RouterUnderTest::Infergate(policy) = router
            {
                summary.flow_control = Some(policy.flow());
            }
            let detail = RunDetail::of(&outcomes);
            eprintln!(
                "{}",
                progress_line(scenario.name, &summary, &detail, outcomes.len(), wall)
            );
            setup.wall_seconds.push(wall);
            setup.runs.push(detail);
            results.push(summary);
        }
        setup
            .requests_per_load
            .push((load, requests.unwrap_or_default()));
    }

    Ok(ScenarioReport {
        scenario: scenario.name.to_owned(),
        mode: options.mode.as_str().to_owned(),
        seed: options.seed,
        fleet: fleet_report(&scenario, &engines, &capacity),
        results,
        static_allocation,
        setup,
    })
}

/// Run one policy on the workload in virtual time. Requests are prepared
/// (bodies hashed, prompts tokenized) on a second thread while the event
/// loop runs.
pub fn run_virtual(
    fleet: &VirtualFleet,
    policy: &PolicyUnderTest,
    pool: &PoolDocument<'_>,
    workload: &Workload,
    rate: f64,
    duration: f64,
    options: &SuiteOptions,
) -> anyhow::Result<Vec<Outcome>> {
    let (picker, flow_control) = policy::virtual_gateway(policy, pool)?;
    let prefix = picker.prefix;
    // The key the gateway hashes from the body's `user` (an anonymous
    // caller's), when the policy keys sessions.
    let sessions = policy.sessions();
    let session_key = move |plan: &crate::workload::RequestPlan| {
        sessions.then(|| picker::session_key(format!("anonymous\0{}", plan.user()).as_bytes()))
    };
    let virtual_options = VirtualOptions {
        scrape_interval: options.scrape_interval,
        scrape_delay: options.scrape_delay,
        client_timeout: options.client_timeout.unwrap_or(DEFAULT_CLIENT_TIMEOUT),
        flow_control,
        seed: options.seed,
        exact_prefix: policy.exact_prefix(),
    };
    Ok(std::thread::scope(|scope| {
        let (tx, rx) = sync_channel::<Vec<Prepared>>(8);
        let producer = move || {
            let mut batch = Vec::with_capacity(BATCH);
            for plan in workload.stream(rate, duration) {
                let mut prepared = Prepared::new(&plan, &prefix);
                prepared.session = session_key(&plan);
                batch.push(prepared);
                if batch.len() == BATCH {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                    if tx.send(full).is_err() {
                        return;
                    }
                }
            }
            let _ = tx.send(batch);
        };
        std::thread::Builder::new()
            .name("bench-requests".into())
            .spawn_scoped(scope, producer)
            .expect("cannot start a thread");
        virtual_fleet::run(fleet, picker, rx.into_iter().flatten(), &virtual_options)
    }))
}

/// A time scale that keeps live mode's token stream within `budget`
/// tokens per wall second at `load` (beyond capacity the fleet streams no
/// faster than at capacity).
fn auto_time_scale(
    capacity: &FleetCapacity,
    engines: &[sim::engine::EngineConfig],
    load: f64,
    budget: f64,
) -> f64 {
    let tokens_per_s: f64 = engines
        .iter()
        .filter_map(|cfg| capacity.per_replica.get(cfg.hardware.name))
        .map(|c| c.output_tokens_per_s)
        .sum();
    let scale = budget / (tokens_per_s * load.min(1.0)).max(1.0);
    // Two significant digits, so the report shows a readable number.
    let magnitude = 10f64.powf(scale.log10().floor() - 1.0);
    let rounded = (scale / magnitude).round() * magnitude;
    let rounded: f64 = format!("{rounded:.3}").parse().unwrap_or(rounded);
    rounded.clamp(0.01, MAX_TIME_SCALE)
}

/// Addresses for the config document of a virtual fleet (validated like
/// any other, never dialled).
fn placeholder_endpoints(replicas: usize) -> Vec<String> {
    (0..replicas)
        .map(|i| format!("127.0.{}.{}:8000", i / 250, 1 + i % 250))
        .collect()
}

fn fleet_report(
    scenario: &Scenario,
    engines: &[sim::engine::EngineConfig],
    capacity: &FleetCapacity,
) -> FleetReport {
    let first = engines.first();
    FleetReport {
        description: scenario.fleet.describe(),
        replicas: scenario.fleet.replicas,
        hardware: scenario.fleet.replica_hardware(),
        model: scenario.fleet.model.clone(),
        tensor_parallel: first.map_or(1, |e| e.tensor_parallel),
        adapters: scenario.fleet.adapters.len(),
        max_loras: first.map_or(0, |e| e.max_loras),
        capacity_requests_per_s: capacity.requests_per_s,
        replica_capacity: capacity
            .per_replica
            .iter()
            .map(|(hw, c)| {
                (
                    hw.clone(),
                    ReplicaCapacityReport {
                        requests_per_s: c.requests_per_s,
                        output_tokens_per_s: c.output_tokens_per_s,
                    },
                )
            })
            .collect(),
    }
}

/// Setup lines of a scenario's report beyond the fleet and the lengths.
/// What the gateways of a run that follows KV events, or of several
/// gateway replicas, said of it: requests each served, the picks whose
/// prefix the events scored, the blocks each indexed. `None` for one
/// gateway on the approximate index (nothing to add) or a peer.
fn gateways_note(name: &str, load: f64, views: &[live::GatewayView]) -> Option<String> {
    let events = views
        .iter()
        .flat_map(|v| &v.prefix_sources)
        .any(|s| s != "approximate");
    if views.len() < 2 && !events {
        return None;
    }
    let each: Vec<String> = views
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let picks: u64 = v.picks_by_source.values().sum();
            let by_events = v.picks_by_source.get("events").copied().unwrap_or(0);
            let mut line = format!("gateway {}: {} completed", i + 1, v.completed);
            if events {
                let _ = write!(
                    line,
                    ", {by_events} of {picks} picks scored by the events, {} blocks indexed at the end",
                    v.indexed_blocks
                );
            }
            line
        })
        .collect();
    Some(format!(
        "{name} at {:.0} %: {}.",
        load * 100.0,
        each.join("; ")
    ))
}

fn notes(scenario: &Scenario) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(bands) = scenario.workload.bands {
        let shares = config::Priority::ALL
            .map(|band| format!("{:.0} % {}", bands.share(band) * 100.0, band.as_str()))
            .join(", ");
        notes.push(format!(
            "Bands: {shares}, sent as `x-infergate-priority` (the gateway runs with `flowControl.headerMayRaise: true`); queue waits from `x-infergate-queue-wait-ms`."
        ));
    }
    if scenario.compare == Compare::FlowControl {
        let defaults = config::FlowControl::default();
        let waits = config::Priority::ALL
            .map(|band| {
                let wait = defaults.band(band).max_wait(band);
                format!("{} {} s", band.as_str(), wait.as_secs_f64())
            })
            .join(", ");
        notes.push(format!(
            "Flow control **on**: the gateway's defaults (`maxWait` {waits}); **flat**: the defaults but every band `queueShare: 1`; **off**: every band `maxWait: 0s`, refused at once while the pool is saturated; **priority**: the defaults plus `enginePriority: true`, the replicas scheduling by the band's `priority` (vLLM's `--scheduling-policy priority`)."
        ));
    }
    notes
}

fn progress_line(
    scenario: &str,
    s: &Summary,
    detail: &RunDetail,
    requests: usize,
    wall: f64,
) -> String {
    let policy = match s.flow_control {
        Some(flow) => format!("{}, flow {}", s.policy, flow.as_str()),
        None => s.policy.clone(),
    };
    let timed_out = detail.timed_out_before_first_token + detail.timed_out_mid_answer;
    let errors = if s.errors == 0 {
        "0".to_owned()
    } else {
        format!(
            "{} ({timed_out} client timeouts, {} failed)",
            s.errors, detail.failed
        )
    };
    let mut line = format!(
        "[{scenario}] load {:>3.0} % {policy:<16} {requests:>7} requests in {wall:>6.1} s wall: TTFT p95 {}, completed {}, errors {errors}, 429s {}",
        s.load * 100.0,
        crate::report::ms(s.ttft_p95_ms),
        s.completed,
        s.rejected_429,
    );
    for band in &s.bands {
        line.push_str(&format!(
            "\n[{scenario}]   {:<9} sent {} = completed {} + refused {} + errors {}{}",
            band.band,
            band.requests,
            band.completed,
            band.refused,
            band.errors,
            if band.accounted() { "" } else { "  (MISMATCH)" },
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scored_events_runs_in_both_modes_and_several_gateways_live_only() {
        let mut options = SuiteOptions::new(Mode::Live, Size::Quick, 1);
        options.policies = policy::parse_list("scored,scored-events,scored-events@2").unwrap();
        assert!(scenario("shared-prefix", &options).is_ok());
        options.mode = Mode::Virtual;
        let error = scenario("shared-prefix", &options).unwrap_err().to_string();
        assert!(
            error.contains("scored-events@2 runs in live mode only"),
            "{error}"
        );
        options.policies = policy::parse_list("scored,scored-events").unwrap();
        assert!(scenario("shared-prefix", &options).is_ok());
    }

    #[test]
    fn gateway_notes_say_what_each_replica_served() {
        let view = |completed, events| live::GatewayView {
            completed,
            prefix_sources: vec![if events { "events" } else { "approximate" }.to_owned()],
            indexed_blocks: 7,
            picks_by_source: [("events".to_owned(), 3), ("approximate".to_owned(), 1)].into(),
        };
        assert_eq!(gateways_note("a", 0.5, &[view(4, false)]), None);
        assert_eq!(gateways_note("a", 0.5, &[]), None);
        let two = gateways_note("x@2", 0.6, &[view(4, false), view(5, false)]).unwrap();
        assert_eq!(
            two,
            "x@2 at 60 %: gateway 1: 4 completed; gateway 2: 5 completed."
        );
        let one = gateways_note("e", 0.6, &[view(4, true)]).unwrap();
        assert!(
            one.contains("3 of 4 picks scored by the events, 7 blocks indexed"),
            "{one}"
        );
    }
}
