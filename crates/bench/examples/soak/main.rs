//! `scripts/soak`: a soak test of the release binary, on 127.0.0.1 only.
//!
//! Starts simulated replicas (`infergate sim`, one process each, so that one
//! can be killed and restarted on its own port) and the gateway
//! (`infergate serve`, continuation on) in front of them; sends a steady,
//! seeded mix of chat completions, most of them streamed, for `--minutes`
//! while a replica is SIGKILLed and restarted every kill period and other
//! faults are injected on a schedule; prints one line a minute; and at the
//! end checks that
//!
//! - every stream is whole: it ends with a `finish_reason` and
//!   `data: [DONE]`, has one `id` throughout, no error event, and exactly
//!   one usage event where it asked for one, counting every token sent
//!   (none is cut, even when its replica is killed mid-stream: the
//!   gateway continues it on another);
//! - no request is lost: every one not streamed is answered too;
//! - the gateway's RSS and open descriptors stayed flat after warm-up;
//! - every request ended in exactly one outcome, and the gateway's
//!   `infergate_requests_total` agrees with the client's count;
//! - no client connection or task outlived the traffic.
//!
//! The continuations the gateway made (`infergate_migrations_total`, by
//! reason and outcome) are scraped with every sample and reported.
//!
//! Exit status 0 when every check passes, 1 when one fails, 2 when the soak
//! could not run. Every duration scales with `--minutes`:
//!
//! | | 30 min | 3 min |
//! |---|---|---|
//! | warm-up (T/10, at least 1 min) | 3 min | 1 min |
//! | baseline window (T/6 after warm-up) | min 3–8 | 1:00–1:30 |
//! | final window (last T/6) | min 25–30 | 2:30–3:00 |
//! | kill period (T/15): a replica SIGKILLed, restarted T/150 later (≥ 3 s) | 2 min | 12 s |
//! | fault cycle (T/6): a metrics fault, a slowdown | 5 min | 30 s |
//!
//! The config, the logs (the gateway's with its access log), `samples.csv`
//! (a row every 5 s), `failures.jsonl` (each request not answered whole:
//! what was sent and what the client saw) and `summary.md` are kept in
//! `target/soak/<run>/`.

use std::collections::{BTreeMap, VecDeque};
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

mod fleet;
mod gateway;
mod report;
mod traffic;

use fleet::*;
use gateway::*;
use report::*;
use traffic::*;

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
    kill_every: Duration,
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
            // Every 2 minutes in 30.
            kill_every: traffic / 15,
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

/// The whole soak: start everything, drive it, stop it, check it.
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
    let commit = commit();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let dir = args.out.join(format!("soak-{stamp}"));
    std::fs::create_dir_all(&dir)?;

    println!(
        "soak at {commit}: {} min of traffic at {} req/s, {} replicas (h100, time scale {}), seed {}; \
         warm-up {}, windows {} and {}, a replica killed every {}, a fault cycle every {}; \
         logs in {}",
        args.minutes,
        args.rate,
        args.replicas,
        args.time_scale,
        args.seed,
        clock(timeline.warmup).trim(),
        window_name(timeline.baseline()),
        window_name(timeline.last()),
        clock(timeline.kill_every).trim(),
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
        failures: Mutex::default(),
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
    let cut = stats.count(Class::is_cut);
    let not_whole = stats.count(Class::is_not_whole);
    let left = stats.count(|c| c == Class::Left);
    let kinds = |pick: fn(Class) -> bool| {
        let kinds: Vec<String> = stats
            .outcomes
            .iter()
            .filter(|(c, _)| pick(**c))
            .map(|(c, n)| format!("{}×{n}", c.name()))
            .collect();
        if kinds.is_empty() {
            String::new()
        } else {
            format!(" ({})", kinds.join(", "))
        }
    };
    checks.push(Check {
        name: "streams whole",
        before: format!("{} streamed, {left} left on purpose", stats.streams_sent),
        after: format!(
            "{} whole; {cut} cut{}; {not_whole} not whole{}",
            stats.streams_whole,
            kinds(Class::is_cut),
            kinds(Class::is_not_whole)
        ),
        limit: "0 cut, 0 not whole".into(),
        pass: Some(cut == 0 && not_whole == 0),
    });
    let lost = stats.count(Class::is_lost) + unanswered;
    checks.push(Check {
        name: "requests lost",
        before: format!("{} sent", stats.sent),
        after: format!("{lost} lost{}", kinds(Class::is_lost)),
        limit: "0".into(),
        pass: Some(lost == 0),
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
        commit: &commit,
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
    let failures = std::mem::take(&mut *shared.failures.lock().unwrap());
    let lines: String = failures.iter().map(|l| format!("{l}\n")).collect();
    std::fs::write(dir.join("failures.jsonl"), lines)?;
    println!(
        "soak: {} (logs in {})",
        if passed { "PASS" } else { "FAIL" },
        dir.display()
    );
    Ok(passed)
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
        for (timeline, period) in [(t, 120), (quick, 12)] {
            for replicas in [3, 4] {
                let schedule = fault_schedule(&timeline, replicas);
                let kills: Vec<Duration> = schedule
                    .iter()
                    .filter(|(_, f)| matches!(f, Fault::Kill { .. }))
                    .map(|(at, _)| *at)
                    .collect();
                assert_eq!(kills.len(), 15, "a kill every {period} s");
                assert!(
                    kills
                        .windows(2)
                        .all(|w| w[1] - w[0] == Duration::from_secs(period))
                );
                let restarts = schedule
                    .iter()
                    .filter(|(_, f)| matches!(f, Fault::Restart { .. }))
                    .count();
                assert_eq!(restarts, 15);
                assert!(schedule.iter().all(|(at, _)| *at < timeline.traffic));
                assert_no_fault_on_a_dead_replica(&schedule, replicas);
            }
        }
    }

    /// No metrics fault or slowdown is set on a replica that is down.
    fn assert_no_fault_on_a_dead_replica(schedule: &[(Duration, Fault)], replicas: usize) {
        let mut down = vec![false; replicas];
        for (at, fault) in schedule {
            match *fault {
                Fault::Kill { replica } => down[replica] = true,
                Fault::Restart { replica } => down[replica] = false,
                Fault::Metrics { replica, .. } | Fault::Slowdown { replica, .. } => {
                    assert!(!down[replica], "{fault:?} at {at:?} on a dead replica");
                }
            }
        }
    }

    #[test]
    fn judges_streams() {
        let stream = |events: &[&str]| {
            let mut seen = Seen::default();
            for e in events {
                seen.event(e.as_bytes());
            }
            seen
        };
        let chunk = |id: &str, text: &str, finish: &str| {
            format!(
                r#"{{"id":"{id}","choices":[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":{finish}}}],"usage":null}}"#
            )
        };
        let usage = |n: u64| {
            format!(
                r#"{{"id":"a","choices":[],"usage":{{"prompt_tokens":5,"completion_tokens":{n}}}}}"#
            )
        };
        let (one, two, end) = (
            chunk("a", "x", "null"),
            chunk("a", " y", "null"),
            chunk("a", "", r#""stop""#),
        );
        let whole = stream(&[&one, &two, &end, &usage(2), "[DONE]"]);
        assert_eq!(whole.judge(true), Class::Complete);
        assert_eq!(whole.judge(false), Class::NotWhole(Defect::Usage));
        let miscounted = stream(&[&one, &two, &end, &usage(3), "[DONE]"]);
        assert_eq!(miscounted.judge(true), Class::NotWhole(Defect::UsageCount));
        let other_id = chunk("b", " z", "null");
        let ids = stream(&[&one, &other_id, &end, "[DONE]"]);
        assert_eq!(ids.judge(false), Class::NotWhole(Defect::Ids));
        let no_done = stream(&[&one, &two]);
        assert_eq!(no_done.judge(false), Class::Cut(Cut::NoDone));
        let no_finish = stream(&[&one, "[DONE]"]);
        assert_eq!(no_finish.judge(false), Class::Cut(Cut::NoFinish));
        let error = stream(&[
            &one,
            r#"{"error":{"message":"gone","code":"upstream_failed"}}"#,
        ]);
        assert_eq!(error.judge(false), Class::Cut(Cut::ErrorEvent));
        assert_eq!(error.errors, ["gone"]);
    }

    #[test]
    fn parses_migrations() {
        let text = "infergate_migrations_total{pool=\"soak\",reason=\"broken\",outcome=\"continued\"} 3\n\
            infergate_migrations_total{pool=\"soak\",reason=\"broken\",outcome=\"failed\"} 1\n\
            infergate_migrations_total{pool=\"soak\",reason=\"stalled\",outcome=\"continued\"} 0\n";
        let m = GatewayMetrics::parse(text);
        assert_eq!(
            migrations_line(Some(&m.migrations)),
            "broken: 3 continued, 1 failed"
        );
        assert_eq!(migrations_line(Some(&BTreeMap::new())), "none");
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
