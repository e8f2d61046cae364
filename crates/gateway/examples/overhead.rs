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
    rate: u32,
    seconds: u64,
    connections: usize,
}

fn args() -> Args {
    let mut a = Args {
        infergate: PathBuf::from("target/release/infergate"),
        rate: 1000,
        seconds: 10,
        connections: 32,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = pair.get(1).cloned().unwrap_or_default();
        match pair[0].as_str() {
            "--infergate" => a.infergate = value.into(),
            "--rate" => a.rate = value.parse().expect("--rate N"),
            "--seconds" => a.seconds = value.parse().expect("--seconds N"),
            "--connections" => a.connections = value.parse().expect("--connections N"),
            other => panic!("unknown argument {other}"),
        }
    }
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
            "daemon off;\nworker_processes 1;\npid {pid};\nerror_log {err} crit;\nevents {{ worker_connections 4096; }}\n\
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

/// Requests per second at saturation, by wrk.
fn wrk(url: &str, connections: usize, seconds: u64, dir: &Path) -> f64 {
    let script = dir.join("post.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"POST\"\nwrk.body = '{BODY}'\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
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
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

struct Latency {
    p50: Duration,
    p99: Duration,
    errors: usize,
}

/// Open-loop load at `rate` req/s over a few keep-alive connections.
async fn fixed_rate(addr: SocketAddr, path: &str, rate: u32, seconds: u64) -> Latency {
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
    let total = rate as u64 * seconds;
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
        let req = Request::post(uri.clone())
            .header("host", addr.to_string())
            .header("content-type", "application/json")
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
    let mut latencies = Vec::with_capacity(total as usize);
    let mut errors = 0;
    while let Some((latency, ok)) = done_rx.recv().await {
        if ok {
            latencies.push(latency);
        } else {
            errors += 1;
        }
    }
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    Latency {
        p50: at(0.50),
        p99: at(0.99),
        errors,
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args = args();
    let dir = tempfile::tempdir().unwrap();
    let (replica, via_infergate, via_nginx) = (free_port(), free_port(), free_port());
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
    let config = dir.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: public, address: \"127.0.0.1:{via_infergate}\"}}]\n  pools:\n    - {{name: p, engine: none, models: [m], endpoints: [\"127.0.0.1:{replica}\"], scheduling: {{policy: round-robin}}}}\n"
        ),
    )
    .unwrap();
    let _gateway = Proc(
        Command::new(&args.infergate)
            .args(["serve", "--config"])
            .arg(&config)
            .env("INFERGATE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", args.infergate.display())),
    );
    for port in [replica, via_infergate, via_nginx] {
        wait_listening(addr(port));
    }

    let targets = [
        ("replica direct", replica),
        ("infergate", via_infergate),
        ("nginx proxy", via_nginx),
    ];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let path = "/v1/chat/completions";
    eprintln!("warming up");
    for (_, port) in targets {
        runtime.block_on(fixed_rate(addr(port), path, args.rate, 1));
    }
    let mut rows = Vec::new();
    for (name, port) in targets {
        eprintln!("{name}: max rate ({} connections)", args.connections);
        let max = wrk(
            &format!("http://127.0.0.1:{port}{path}"),
            args.connections,
            args.seconds,
            dir.path(),
        );
        eprintln!("{name}: latency at {} req/s", args.rate);
        let lat = runtime.block_on(fixed_rate(addr(port), path, args.rate, args.seconds));
        rows.push((name, max, lat));
    }

    let (_, direct_max, direct) = &rows[0];
    let (_, nginx_max, nginx_lat) = &rows[2];
    println!(
        "| target | max req/s ({} conns) | vs nginx proxy | p50 at {} req/s | p99 | added p50 | added p99 | errors |",
        args.connections, args.rate
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, max, lat) in &rows {
        println!(
            "| {name} | {max:.0} | {:.2}× | {:.0} µs | {:.0} µs | {:+.0} µs | {:+.0} µs | {} |",
            max / nginx_max,
            us(lat.p50),
            us(lat.p99),
            us(lat.p50) - us(direct.p50),
            us(lat.p99) - us(direct.p99),
            lat.errors,
        );
    }
    let (_, gw_max, gw) = &rows[1];
    println!();
    println!(
        "infergate: {:.2}× nginx's proxied rate ({:.2}× the direct rate); added latency p50 {:+.0} µs (nginx {:+.0} µs), p99 {:+.0} µs (nginx {:+.0} µs)",
        gw_max / nginx_max,
        gw_max / direct_max,
        us(gw.p50) - us(direct.p50),
        us(nginx_lat.p50) - us(direct.p50),
        us(gw.p99) - us(direct.p99),
        us(nginx_lat.p99) - us(direct.p99),
    );
}
