//! What scraping a fleet costs: CPU seconds per minute spent by the gateway
//! side to scrape N replicas every interval.
//!
//! ```text
//! cargo run --release -p infergate-signals --example scrape_cost -- \
//!     [--replicas 100] [--interval-ms 50] [--seconds 20]
//! ```
//!
//! The replicas (HTTP servers answering `/metrics` with the
//! `vllm-v1-llmd-none` capture) run in a child process, so the CPU time
//! this process reports with `getrusage(RUSAGE_SELF)` (all its threads,
//! user + system) is the scraping alone: the scrape runtime's workers,
//! the kernel's share of its sockets, and an idle main thread. The
//! replicas' own CPU is printed separately for reference.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Response;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use picker::Endpoint;
use signals::{Dialect, ScrapeClient, ScrapeConfig, spawn_scraper};
use tokio::net::TcpListener;

const BODY: &str = include_str!("../testdata/metrics/vllm-v1-llmd-none.prom");
const WARM_UP: Duration = Duration::from_secs(2);

struct Options {
    replicas: usize,
    interval: Duration,
    seconds: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve") {
        let replicas = args.get(1).and_then(|n| n.parse().ok()).expect("--serve N");
        serve(replicas);
        return;
    }
    let options = parse_options(&args);
    measure(&options);
}

fn parse_options(args: &[String]) -> Options {
    let mut options = Options {
        replicas: 100,
        interval: Duration::from_millis(50),
        seconds: 20,
    };
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let value = args.next().and_then(|v| v.parse::<u64>().ok());
        match (flag.as_str(), value) {
            ("--replicas", Some(n)) => options.replicas = n as usize,
            ("--interval-ms", Some(n)) => options.interval = Duration::from_millis(n),
            ("--seconds", Some(n)) => options.seconds = n,
            _ => {
                eprintln!("usage: scrape_cost [--replicas N] [--interval-ms N] [--seconds N]");
                std::process::exit(2);
            }
        }
    }
    options
}

/// CPU time of this process, all threads (user, system), and its peak RSS
/// in KiB.
fn own_usage() -> (Duration, Duration, u64) {
    // SAFETY: getrusage only writes into the struct we pass.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
        usage
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (
        time(usage.ru_utime),
        time(usage.ru_stime),
        usage.ru_maxrss as u64,
    )
}

fn measure(options: &Options) {
    let mut child = Command::new(std::env::current_exe().expect("own executable"))
        .args(["--serve", &options.replicas.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the replicas");
    let mut child_out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    child_out.read_line(&mut line).expect("replica ports");
    let ports: Vec<u16> = line
        .strip_prefix("PORTS ")
        .expect("PORTS line")
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let good = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (user, system, wall, scrapes, errors) = runtime.block_on(async {
        let client = ScrapeClient::new(Duration::from_millis(250));
        let cfg = ScrapeConfig {
            dialect: Dialect::Vllm,
            interval: options.interval,
            timeout: Duration::from_millis(500),
        };
        let scrapers: Vec<_> = ports
            .iter()
            .enumerate()
            .map(|(index, port)| {
                let endpoint = Endpoint::new(index, format!("127.0.0.1:{port}"));
                let (good, failed) = (Arc::clone(&good), Arc::clone(&failed));
                spawn_scraper(endpoint, cfg, client.clone(), move |endpoint| {
                    let counter = if endpoint.observation().last_error.is_none() {
                        &good
                    } else {
                        &failed
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                })
            })
            .collect();
        tokio::time::sleep(WARM_UP).await;
        let (user_start, system_start, _) = own_usage();
        let (good_start, failed_start) =
            (good.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(options.seconds)).await;
        let (user_end, system_end, _) = own_usage();
        let wall = started.elapsed();
        let scrapes = good.load(Ordering::Relaxed) - good_start;
        let errors = failed.load(Ordering::Relaxed) - failed_start;
        drop(scrapers);
        (
            user_end - user_start,
            system_end - system_start,
            wall,
            scrapes,
            errors,
        )
    });
    let (_, _, peak_rss_kib) = own_usage();

    drop(child.stdin.take());
    line.clear();
    child_out.read_line(&mut line).expect("replica stats");
    child.wait().expect("replicas exit");
    let stats: Vec<f64> = line
        .strip_prefix("STATS ")
        .expect("STATS line")
        .split_whitespace()
        .map(|v| v.parse().unwrap())
        .collect();
    let (connections, requests, server_cpu) = (stats[0], stats[1], stats[2]);

    let wall_s = wall.as_secs_f64();
    let cpu_s = (user + system).as_secs_f64();
    println!(
        "{} replicas, every {:?}, measured {:.1} s after {:?} warm-up",
        options.replicas, options.interval, wall_s, WARM_UP
    );
    println!(
        "scrapes: {scrapes} good ({:.0}/s, ideal {:.0}/s), {errors} failed",
        scrapes as f64 / wall_s,
        options.replicas as f64 / options.interval.as_secs_f64()
    );
    println!(
        "scraper CPU: {:.3} s in {:.1} s = {:.2} CPU-seconds per minute ({:.1}% of one core), {:.1} µs per scrape",
        cpu_s,
        wall_s,
        cpu_s / wall_s * 60.0,
        cpu_s / wall_s * 100.0,
        cpu_s * 1e6 / scrapes.max(1) as f64
    );
    println!(
        "  of which user {:.3} s, system (kernel: sockets, timers, wakeups) {:.3} s",
        user.as_secs_f64(),
        system.as_secs_f64()
    );
    println!("scraper peak RSS: {:.1} MiB", peak_rss_kib as f64 / 1024.0);
    println!(
        "replicas (child process, for reference): {connections} connections accepted, {requests} requests, {server_cpu:.2} CPU-seconds over their whole run"
    );
}

/// The child: `replicas` HTTP servers on 127.0.0.1, ports printed on
/// stdout; runs until stdin closes, then prints its totals.
fn serve(replicas: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let connections = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    runtime.block_on(async {
        let mut ports = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            ports.push(listener.local_addr().unwrap().port());
            let (connections, requests) = (Arc::clone(&connections), Arc::clone(&requests));
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let _ = stream.set_nodelay(true);
                    connections.fetch_add(1, Ordering::Relaxed);
                    let requests = Arc::clone(&requests);
                    let service = service_fn(move |_request| {
                        requests.fetch_add(1, Ordering::Relaxed);
                        let body = Full::new(Bytes::from_static(BODY.as_bytes()));
                        async move { Ok::<_, std::convert::Infallible>(Response::new(body)) }
                    });
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service),
                    );
                }
            });
        }
        let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "PORTS {}", ports.join(" ")).unwrap();
        stdout.flush().unwrap();
        drop(stdout);

        tokio::task::spawn_blocking(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
        })
        .await
        .unwrap();
    });
    let (user, system, _) = own_usage();
    println!(
        "STATS {} {} {:.3}",
        connections.load(Ordering::Relaxed),
        requests.load(Ordering::Relaxed),
        (user + system).as_secs_f64()
    );
}
