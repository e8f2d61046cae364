//! Proxy overhead, side by side in one run on loopback: an instant replica
//! reached directly, through infergate, and through nginx as a plain
//! reverse proxy.
//!
//! - Maximum rate: `wrk` with 32 connections against each target.
//! - Added latency: an open-loop load at a fixed rate (default 1,000 req/s)
//!   of small non-streaming requests. Latency runs from the moment a request
//!   is due (after the timer fired, whose millisecond granularity would
//!   otherwise dominate) and includes any wait for a free connection, so a
//!   stalled target is not hidden by sending later.
//!
//! - CPU per request: the proxy process's user+system CPU time over each
//!   run divided by the requests it served, with the user part apart. Unlike latency, it barely moves
//!   when other work shares the cores, so it is the figure to compare
//!   changes by.
//!
//! Each measurement runs in slices (`--slices`, default 5), the targets
//! taking turns slice by slice, so that a change in the machine's load
//! during a run falls on every target alike instead of on whichever ran
//! then: the p50 of a replica reached directly moves by tens of
//! microseconds from one run to the next, which compared one after the
//! other swamped the differences being measured.
//!
//! `--baseline BIN` adds a second infergate (another build, say the one
//! before a change) as one more target of the same run, so two builds are
//! compared under the same load, slice by slice.
//!
//! `--security` adds infergate with each security feature on (rate limits
//! counted locally and in Redis, an API key with local limits, JWT) as more targets, each
//! compared with plain infergate in the same run; it starts its own
//! `redis-server`.
//!
//! `--callgrind` measures instead what one request costs in instructions:
//! the gateway runs under valgrind's callgrind, and after a warm-up a fixed
//! number of requests (`--requests`, default 5,000, over `--connections`,
//! default 4, one after another on each) is counted; it prints the
//! instructions per request and where they go: by where they run (hyper's
//! server, the pipeline, hyper's client, the runtime), by whose code they
//! are, and by function. Instruction counts do not move with the machine's
//! load, so they are the figure to decide data-plane changes by
//! (`scripts/profile-request` builds the binary and runs this).
//!
//! The replica is nginx answering a fixed JSON body (the fastest backend
//! available), so what is measured is the proxies. Needs `nginx` and `wrk`
//! on the PATH and a release build of `infergate`; `scripts/bench-overhead`
//! installs and builds everything and runs this.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

const BODY: &str =
    r#"{"model":"m","messages":[{"role":"user","content":"Say hi"}],"max_tokens":1}"#;
const REPLY: &str = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;

struct Args {
    infergate: PathBuf,
    /// Another infergate build to measure beside it.
    baseline: Option<PathBuf>,
    rate: u32,
    seconds: u64,
    connections: usize,
    /// Skip the wrk runs (latency and CPU at the fixed rate only).
    skip_max: bool,
    /// Turns each target takes, in each measurement.
    slices: u32,
    /// Add infergate with rate limits (local and Redis) and authentication
    /// as more targets, to measure what each costs.
    security: bool,
    /// Count the gateway's instructions per request under callgrind
    /// instead of timing the targets.
    callgrind: bool,
    /// Requests counted under callgrind.
    requests: u64,
    /// Functions listed under callgrind.
    top: usize,
    /// Where the callgrind dump is kept, to be read again (say, by
    /// `callgrind_annotate`).
    dump: PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        infergate: PathBuf::from("target/release/infergate"),
        baseline: None,
        rate: 1000,
        seconds: 10,
        connections: 32,
        skip_max: false,
        slices: 5,
        security: false,
        callgrind: false,
        requests: 5_000,
        top: 40,
        dump: PathBuf::from("target/callgrind-request.out"),
    };
    let mut connections = None;
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        if flag == "--skip-max" {
            a.skip_max = true;
            continue;
        }
        if flag == "--security" {
            a.security = true;
            continue;
        }
        if flag == "--callgrind" {
            a.callgrind = true;
            continue;
        }
        let value = argv.next().unwrap_or_default();
        match flag.as_str() {
            "--infergate" => a.infergate = value.into(),
            "--baseline" => a.baseline = Some(value.into()),
            "--rate" => a.rate = value.parse().expect("--rate N"),
            "--seconds" => a.seconds = value.parse().expect("--seconds N"),
            "--connections" => connections = Some(value.parse().expect("--connections N")),
            "--requests" => a.requests = value.parse().expect("--requests N"),
            "--top" => a.top = value.parse().expect("--top N"),
            "--dump" => a.dump = value.into(),
            "--slices" => a.slices = value.parse::<u32>().expect("--slices N").max(1),
            other => panic!("unknown argument {other}"),
        }
    }
    // Under callgrind, a few connections: the profile of a request at a
    // modest load, not of a saturated gateway batching its wake-ups.
    a.connections = connections.unwrap_or(if a.callgrind { 4 } else { 32 });
    a
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed when dropped.
struct Proc(Child);

/// CPU time: user and system (kernel) apart, since a proxy's system time is
/// mostly the kernel's TCP work, much the same for any proxy, and its user
/// time is its own.
#[derive(Clone, Copy, Default)]
struct Cpu {
    user: Duration,
    system: Duration,
}

impl std::ops::Sub for Cpu {
    type Output = Cpu;
    fn sub(self, rhs: Cpu) -> Cpu {
        Cpu {
            user: self.user.saturating_sub(rhs.user),
            system: self.system.saturating_sub(rhs.system),
        }
    }
}

impl std::ops::AddAssign for Cpu {
    fn add_assign(&mut self, rhs: Cpu) {
        self.user += rhs.user;
        self.system += rhs.system;
    }
}

impl Cpu {
    fn per(self, requests: usize) -> Cpu {
        let n = requests.max(1) as u32;
        Cpu {
            user: self.user / n,
            system: self.system / n,
        }
    }
}

impl Proc {
    /// User and system CPU time the process has used so far, all threads.
    fn cpu(&self) -> Cpu {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id()))
            .expect("the process is running and /proc is mounted");
        // Fields after the command name (which may hold spaces): utime and
        // stime are the 12th and 13th, in clock ticks.
        let after = &stat[stat.rfind(')').expect("stat has a command name") + 2..];
        let mut ticks = after
            .split(' ')
            .skip(11)
            .map(|f| f.parse::<u64>().expect("numeric tick counts"))
            .map(|t| Duration::from_secs_f64(t as f64 / clock_ticks_per_second()));
        Cpu {
            user: ticks.next().expect("utime"),
            system: ticks.next().expect("stime"),
        }
    }
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn nginx(dir: &Path, name: &str, server_block: &str) -> Proc {
    let prefix = dir.join(name);
    std::fs::create_dir_all(prefix.join("logs")).unwrap();
    let conf = prefix.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off;\nmaster_process off;\nworker_processes 1;\npid {pid};\nerror_log {err} crit;\nevents {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {tmp};\n  proxy_temp_path {tmp};\n  {server_block}\n}}\n",
            pid = prefix.join("nginx.pid").display(),
            err = prefix.join("logs/error.log").display(),
            tmp = prefix.display(),
        ),
    )
    .unwrap();
    let child = Command::new("nginx")
        .args(["-p"])
        .arg(&prefix)
        .args(["-c"])
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nginx not found; run scripts/bench-overhead, which installs it");
    Proc(child)
}

fn wait_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{addr} never started listening");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Requests per second at saturation and requests sent, by wrk.
fn wrk(
    url: &str,
    connections: usize,
    seconds: u64,
    dir: &Path,
    header: Option<&Header>,
) -> (f64, u64) {
    let script = dir.join("post.lua");
    let extra = header.map_or(String::new(), |(name, value)| {
        format!("wrk.headers[\"{name}\"] = \"{value}\"\n")
    });
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.body = '{BODY}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n{extra}"
        ),
    )
    .unwrap();
    let out = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{connections}"),
            &format!("-d{seconds}s"),
            "-s",
        ])
        .arg(&script)
        .arg(url)
        .output()
        .expect("wrk not found; run scripts/bench-overhead, which installs it");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("Requests/sec:"))
        .unwrap_or_else(|| panic!("unexpected wrk output:\n{text}"));
    if text.contains("Non-2xx") {
        panic!("wrk saw errors against {url}:\n{text}");
    }
    let rate = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let requests = text
        .lines()
        .find(|l| l.contains(" requests in "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected wrk output:\n{text}"));
    (rate, requests)
}

/// Latencies of the requests that succeeded, and how many failed.
#[derive(Default)]
struct Latencies {
    ok: Vec<Duration>,
    errors: usize,
}

impl Latencies {
    fn requests(&self) -> usize {
        self.ok.len() + self.errors
    }

    /// The `q` quantile; `ok` must be sorted.
    fn at(&self, q: f64) -> Duration {
        self.ok
            .get(((self.ok.len().max(1) - 1) as f64 * q) as usize)
            .copied()
            .unwrap_or_default()
    }
}

/// A request header a target needs (its credential).
type Header = (&'static str, String);

/// Open-loop load at `rate` req/s over a few keep-alive connections.
async fn fixed_rate(
    target: (SocketAddr, Option<&Header>),
    path: &str,
    rate: u32,
    seconds: f64,
    into: &mut Latencies,
) {
    let (addr, header) = target;
    const CONNECTIONS: usize = 16;
    let mut senders = Vec::new();
    for _ in 0..CONNECTIONS {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        senders.push(sender);
    }
    let (free_tx, mut free_rx) = tokio::sync::mpsc::unbounded_channel();
    for s in senders {
        free_tx.send(s).unwrap();
    }
    let total = (rate as f64 * seconds) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = tokio::time::Instant::now();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let uri: hyper::Uri = format!("http://{addr}{path}").parse().unwrap();
    for i in 0..total {
        let scheduled = start + interval * i as u32;
        tokio::time::sleep_until(scheduled).await;
        let due = tokio::time::Instant::now();
        // Every connection busy means the target is behind; the request
        // waits for one, and that wait counts in its latency.
        let mut sender = free_rx.recv().await.unwrap();
        let mut req = Request::post(uri.clone())
            .header("host", addr.to_string())
            .header("content-type", "application/json");
        if let Some((name, value)) = header {
            req = req.header(*name, value);
        }
        let req = req
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .unwrap();
        let free_tx = free_tx.clone();
        let done_tx = done_tx.clone();
        tokio::spawn(async move {
            let ok = match sender.send_request(req).await {
                Ok(resp) => {
                    let status = resp.status();
                    resp.into_body().collect().await.is_ok() && status.is_success()
                }
                Err(_) => false,
            };
            let _ = done_tx.send((due.elapsed(), ok));
            let _ = free_tx.send(sender);
        });
    }
    drop(done_tx);
    while let Some((latency, ok)) = done_rx.recv().await {
        if ok {
            into.ok.push(latency);
        } else {
            into.errors += 1;
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args = args();
    let dir = tempfile::tempdir().unwrap();
    if args.callgrind {
        profile::run(&args, dir.path());
        return;
    }
    let (replica, via_infergate, via_nginx, via_baseline) =
        (free_port(), free_port(), free_port(), free_port());
    let addr = |port| SocketAddr::from(([127, 0, 0, 1], port));

    let _replica = nginx(
        dir.path(),
        "replica",
        &format!(
            "server {{ listen 127.0.0.1:{replica}; keepalive_requests 1000000; location / {{ default_type application/json; return 200 '{REPLY}'; }} }}"
        ),
    );
    let _nginx_proxy = nginx(
        dir.path(),
        "proxy",
        &format!(
            "upstream replica {{ server 127.0.0.1:{replica}; keepalive 64; }}\n  \
             server {{ listen 127.0.0.1:{via_nginx}; keepalive_requests 1000000; location / {{ proxy_pass http://replica; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }} }}"
        ),
    );
    let _gateway = gateway(
        &args.infergate,
        dir.path(),
        "gateway",
        via_infergate,
        replica,
        "",
    );
    let baseline = args
        .baseline
        .as_ref()
        .map(|bin| gateway(bin, dir.path(), "baseline", via_baseline, replica, ""));
    for port in [replica, via_infergate, via_nginx] {
        wait_listening(addr(port));
    }
    let mut targets = vec![
        Target::new("replica direct", replica, None),
        Target::new("infergate", via_infergate, Some(&_gateway)),
        Target::new("nginx proxy", via_nginx, Some(&_nginx_proxy)),
    ];
    if let Some(baseline) = &baseline {
        wait_listening(addr(via_baseline));
        targets.push(Target::new(
            "infergate (baseline)",
            via_baseline,
            Some(baseline),
        ));
    }
    let redis = args.security.then(|| Redis::start(dir.path()));
    let variants: Vec<(Variant, u16, Proc)> = redis
        .iter()
        .flat_map(|redis| security_variants(&redis.url, dir.path()))
        .map(|v| {
            let port = free_port();
            let name = v.name.replace(' ', "-");
            let proc = gateway(&args.infergate, dir.path(), &name, port, replica, &v.spec);
            wait_listening(addr(port));
            (v, port, proc)
        })
        .collect();
    for (v, port, proc) in &variants {
        targets.push(Target {
            name: v.name,
            port: *port,
            proc: Some(proc),
            header: v.header.clone(),
        });
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let path = "/v1/chat/completions";
    eprintln!("warming up");
    for t in &targets {
        runtime.block_on(fixed_rate(
            (addr(t.port), t.header.as_ref()),
            path,
            args.rate,
            1.0,
            &mut Latencies::default(),
        ));
    }
    let slice = args.seconds as f64 / args.slices as f64;
    let mut rows: Vec<Row> = targets
        .iter()
        .map(|t| Row {
            name: t.name,
            max: None,
            lat: Latencies::default(),
            p50: Duration::ZERO,
            p99: Duration::ZERO,
            cpu: None,
        })
        .collect();
    // Proxy CPU time and requests served, per target, summed over slices.
    if !args.skip_max {
        eprintln!(
            "max rate ({} connections), {} slices of {slice:.1} s per target",
            args.connections, args.slices
        );
        let mut totals = vec![(0u64, 0.0f64, Cpu::default()); targets.len()];
        for _ in 0..args.slices {
            for (i, t) in targets.iter().enumerate() {
                let (port, proc) = (t.port, t.proc);
                let before = proc.map(Proc::cpu);
                let url = format!("http://127.0.0.1:{port}{path}");
                // wrk takes whole seconds.
                let seconds = (slice.round() as u64).max(1);
                let (_, requests) = wrk(
                    &url,
                    args.connections,
                    seconds,
                    dir.path(),
                    t.header.as_ref(),
                );
                totals[i].0 += requests;
                totals[i].1 += seconds as f64;
                totals[i].2 += proc
                    .zip(before)
                    .map_or(Cpu::default(), |(p, b)| p.cpu() - b);
            }
        }
        for (row, (t, (requests, seconds, cpu))) in rows.iter_mut().zip(targets.iter().zip(totals))
        {
            let cpu = t.proc.map(|_| cpu.per(requests as usize));
            row.max = Some((requests as f64 / seconds, cpu));
        }
    }
    eprintln!(
        "latency at {} req/s, {} slices of {slice:.1} s per target",
        args.rate, args.slices
    );
    let mut cpu = vec![Cpu::default(); targets.len()];
    for _ in 0..args.slices {
        for (i, t) in targets.iter().enumerate() {
            let proc = t.proc;
            let before = proc.map(Proc::cpu);
            runtime.block_on(fixed_rate(
                (addr(t.port), t.header.as_ref()),
                path,
                args.rate,
                slice,
                &mut rows[i].lat,
            ));
            cpu[i] += proc
                .zip(before)
                .map_or(Cpu::default(), |(p, b)| p.cpu() - b);
        }
    }
    for (row, (t, cpu)) in rows.iter_mut().zip(targets.iter().zip(cpu)) {
        row.cpu = t.proc.map(|_| cpu.per(row.lat.requests()));
        row.lat.ok.sort_unstable();
        row.p50 = row.lat.at(0.50);
        row.p99 = row.lat.at(0.99);
    }

    let direct = &rows[0];
    let nginx = &rows[2];
    let rate = |r: &Row| r.max.map(|(rate, _)| rate);
    let cpu = |c: Option<Cpu>| {
        c.map_or("—".to_owned(), |c| {
            format!("{:.1} µs (user {:.1})", us(c.user + c.system), us(c.user))
        })
    };
    println!(
        "| target | max req/s ({} conns) | vs nginx proxy | CPU/req at max | p50 at {} req/s | p99 | added p50 | added p99 | CPU/req at {} req/s | errors |",
        args.connections, args.rate, args.rate
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {:.0} µs | {:.0} µs | {:+.0} µs | {:+.0} µs | {} | {} |",
            row.name,
            rate(row).map_or("—".to_owned(), |r| format!("{r:.0}")),
            rate(row)
                .zip(rate(nginx))
                .map_or("—".to_owned(), |(r, n)| format!("{:.2}×", r / n)),
            cpu(row.max.and_then(|(_, c)| c)),
            us(row.p50),
            us(row.p99),
            us(row.p50) - us(direct.p50),
            us(row.p99) - us(direct.p99),
            cpu(row.cpu),
            row.lat.errors,
        );
    }
    let gw = &rows[1];
    println!();
    if let (Some(g), Some(n), Some(d)) = (rate(gw), rate(nginx), rate(direct)) {
        println!(
            "infergate: {:.2}× nginx's proxied rate ({:.2}× the direct rate)",
            g / n,
            g / d
        );
    }
    println!(
        "infergate: added latency p50 {:+.0} µs (nginx {:+.0} µs), p99 {:+.0} µs (nginx {:+.0} µs); CPU per request at {} req/s {} (nginx {})",
        us(gw.p50) - us(direct.p50),
        us(nginx.p50) - us(direct.p50),
        us(gw.p99) - us(direct.p99),
        us(nginx.p99) - us(direct.p99),
        args.rate,
        cpu(gw.cpu),
        cpu(nginx.cpu),
    );
    if let Some(base) = rows.iter().find(|r| r.name == "infergate (baseline)") {
        let ratio = rate(gw)
            .zip(rate(base))
            .map_or("—".to_owned(), |(g, b)| format!("{:.2}×", g / b));
        println!(
            "infergate against the baseline build: max rate {ratio}, p50 {:+.0} µs, p99 {:+.0} µs; CPU per request at {} req/s {} (baseline {})",
            us(gw.p50) - us(base.p50),
            us(gw.p99) - us(base.p99),
            args.rate,
            cpu(gw.cpu),
            cpu(base.cpu),
        );
    }
    for (v, _, _) in &variants {
        let row = rows
            .iter()
            .find(|r| r.name == v.name)
            .expect("a row per target");
        let ratio = rate(row)
            .zip(rate(gw))
            .map_or("—".to_owned(), |(r, g)| format!("{:.2}×", r / g));
        let cpu_ratio = |a: Option<Cpu>, b: Option<Cpu>| {
            a.zip(b).map_or("—".to_owned(), |(a, b)| {
                format!("{:.2}×", us(a.user + a.system) / us(b.user + b.system))
            })
        };
        println!(
            "{}: max rate {ratio} of infergate's, CPU per request {} at max and {} at {} req/s, added p50 {:+.0} µs, p99 {:+.0} µs",
            v.name,
            cpu_ratio(row.max.and_then(|(_, c)| c), gw.max.and_then(|(_, c)| c)),
            cpu_ratio(row.cpu, gw.cpu),
            args.rate,
            us(row.p50) - us(gw.p50),
            us(row.p99) - us(gw.p99),
        );
    }
}

/// One process the load is sent to.
struct Target<'a> {
    name: &'static str,
    port: u16,
    /// Its process, whose CPU time is measured (none for the replica).
    proc: Option<&'a Proc>,
    header: Option<Header>,
}

impl<'a> Target<'a> {
    fn new(name: &'static str, port: u16, proc: Option<&'a Proc>) -> Self {
        Self {
            name,
            port,
            proc,
            header: None,
        }
    }
}

/// infergate with one security feature on: its config lines and the
/// header its requests carry.
struct Variant {
    name: &'static str,
    spec: String,
    header: Option<Header>,
}

/// Limits high enough never to refuse: what is measured is their cost.
/// The API key and the token are checked on every request (the token's
/// signature once, then from the gateway's cache, as for a real client
/// that reuses its token).
fn security_variants(redis_url: &str, dir: &Path) -> Vec<Variant> {
    const NEVER: &str = "{requestsPerSecond: 1000000000, tokensPerMinute: 1000000000000}";
    const KEY: &str = "ig-bench-0123456789abcdefghijklmnopqrstuvwxyz";
    let key_sha256: String = {
        use sha2::Digest as _;
        sha2::Sha256::digest(KEY.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let (jwks, token) = jwt();
    let jwks_file = dir.join("jwks.json");
    std::fs::write(&jwks_file, jwks).unwrap();
    let bearer = |credential: &str| Some(("authorization", format!("Bearer {credential}")));
    vec![
        Variant {
            name: "infergate + local limits",
            spec: format!("  rateLimits: {{global: {NEVER}}}\n"),
            header: None,
        },
        Variant {
            name: "infergate + Redis limits",
            spec: format!(
                "  rateLimits: {{backend: redis, redis: {{url: \"{redis_url}\", timeout: 100ms}}, global: {NEVER}}}\n"
            ),
            header: None,
        },
        Variant {
            name: "infergate + API key + local limits",
            spec: format!(
                "  auth: {{apiKeys: {{keys: [{{tenant: t, sha256: {key_sha256}}}]}}}}\n  rateLimits: {{global: {NEVER}}}\n"
            ),
            header: bearer(KEY),
        },
        Variant {
            name: "infergate + JWT",
            spec: format!(
                "  auth: {{jwt: {{issuers: [{{issuer: \"https://issuer.bench\", audiences: [infergate], jwksFile: \"{}\", algorithms: [ES256]}}]}}}}\n",
                jwks_file.display()
            ),
            header: bearer(&token),
        },
    ]
}

/// A JWKS with one fresh P-256 key, and a token it signs, valid for a day.
fn jwt() -> (String, String) {
    use base64::Engine as _;
    use p256::pkcs8::EncodePrivateKey as _;
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    let mut scalar = [0u8; 32];
    getrandom::fill(&mut scalar).unwrap();
    let key = p256::ecdsa::SigningKey::from_slice(&scalar).unwrap();
    let point = key.verifying_key().to_sec1_point(false);
    let point = point.as_bytes();
    let jwks = serde_json::json!({"keys": [
        {"kid": "bench", "kty": "EC", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65])},
    ]});
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({"iss": "https://issuer.bench", "aud": "infergate", "sub": "bench", "exp": now + 86_400});
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("bench".to_owned());
    let encoding = jsonwebtoken::EncodingKey::from_ec_der(key.to_pkcs8_der().unwrap().as_bytes());
    let token = jsonwebtoken::encode(&header, &claims, &encoding).unwrap();
    (jwks.to_string(), token)
}

/// A `redis-server` on a free port, for the Redis limits.
struct Redis {
    url: String,
    _proc: Proc,
}

impl Redis {
    fn start(dir: &Path) -> Self {
        let port = free_port();
        let proc = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server not found; run scripts/bench-overhead, which installs it");
        wait_listening(SocketAddr::from(([127, 0, 0, 1], port)));
        Self {
            url: format!("redis://127.0.0.1:{port}"),
            _proc: Proc(proc),
        }
    }
}

/// An infergate process with one pool in front of `replica`.
fn gateway(bin: &Path, dir: &Path, name: &str, port: u16, replica: u16, extra: &str) -> Proc {
    let config = gateway_config(dir, name, port, replica, extra);
    Proc(
        Command::new(bin)
            .args(["serve", "--config"])
            .arg(&config)
            .env("INFERGATE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display())),
    )
}

/// The config file of a gateway with one pool in front of `replica`.
fn gateway_config(dir: &Path, name: &str, port: u16, replica: u16, extra: &str) -> PathBuf {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: public, address: \"127.0.0.1:{port}\"}}]\n{extra}  pools:\n    - {{name: p, engine: none, models: [m], endpoints: [\"127.0.0.1:{replica}\"], scheduling: {{policy: round-robin}}}}\n"
        ),
    )
    .unwrap();
    config
}

struct Row {
    name: &'static str,
    /// Maximum rate and the proxy's CPU per request at it.
    max: Option<(f64, Option<Cpu>)>,
    lat: Latencies,
    p50: Duration,
    p99: Duration,
    /// The proxy's CPU per request at the fixed rate.
    cpu: Option<Cpu>,
}

/// `--callgrind`: instructions per request, and where they go.
#[path = "overhead/profile.rs"]
mod profile;
