//! `--callgrind`: the gateway under valgrind's callgrind in front of an
//! instant replica; after a warm-up, a fixed number of requests counted,
//! and their instructions told apart by where they run.
//!
//! The dump is read here rather than by `callgrind_annotate`, which keys
//! functions by source file as well as by name (a function with code
//! inlined from several files comes out in pieces) and whose tree of
//! callers cannot be summed by part of the gateway.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

use super::{Args, BODY, Proc, REPLY, free_port, gateway_config, nginx};

pub fn run(args: &Args, dir: &Path) {
    let (replica, port) = (free_port(), free_port());
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let _replica = nginx(
        dir,
        "replica",
        &format!(
            "server {{ listen 127.0.0.1:{replica}; keepalive_requests 1000000; location / {{ default_type application/json; return 200 '{REPLY}'; }} }}"
        ),
    );
    let config = gateway_config(dir, "gateway", port, replica, "");
    let out = dir.join("callgrind.out");
    let gateway = Proc(
        Command::new("valgrind")
            .args(["--tool=callgrind", "--quiet"])
            .arg(format!("--callgrind-out-file={}", out.display()))
            .arg(&args.infergate)
            .args(["serve", "--config"])
            .arg(&config)
            .env("INFERGATE_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("valgrind not found; run scripts/profile-request, which installs it"),
    );
    let pid = gateway.0.id().to_string();
    wait_ready(addr);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Warm: every connection opened, everything built lazily built, so
    // that what is counted is the steady state.
    runtime.block_on(closed_loop(addr, args.connections, 500));
    callgrind_control(&["--zero", &pid]);
    let started = Instant::now();
    runtime.block_on(closed_loop(addr, args.connections, args.requests));
    let took = started.elapsed();
    callgrind_control(&["--dump", &pid]);
    let dumped = newest_dump(dir, &out);
    drop(gateway);
    if let Some(parent) = args.dump.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::copy(&dumped, &args.dump).expect("the dump copied");

    let profile = Profile::read(&args.dump);
    let n = args.requests as f64;
    let per = |ir: u64| ir as f64 / n;
    let share = |ir: u64| 100.0 * ir as f64 / profile.total as f64;
    println!(
        "{} requests over {} connections ({:.1} s under callgrind): {:.0} instructions per request",
        args.requests,
        args.connections,
        took.as_secs_f64(),
        per(profile.total)
    );
    println!("dump: {}", args.dump.display());

    println!("\n## Where they run (inclusive, instructions per request)\n");
    println!("| part | per request | share |");
    println!("|---|---:|---:|");
    for (part, ir) in profile.parts() {
        println!("| {part} | {:.0} | {:.1} % |", per(ir), share(ir));
    }

    println!("\n## Whose code (exclusive, instructions per request)\n");
    println!("| code | per request | share |");
    println!("|---|---:|---:|");
    let mut by: HashMap<&str, u64> = HashMap::new();
    for (f, &ir) in profile.names.iter().zip(&profile.own) {
        *by.entry(code(f)).or_default() += ir;
    }
    let mut by: Vec<_> = by.into_iter().collect();
    by.sort_by_key(|&(_, ir)| std::cmp::Reverse(ir));
    for (name, ir) in by {
        println!("| {name} | {:.0} | {:.1} % |", per(ir), share(ir));
    }

    for (title, costs) in [
        ("Functions, inclusive", profile.inclusive()),
        ("Functions, exclusive", profile.own.clone()),
    ] {
        println!("\n## {title} (instructions per request)\n");
        let mut rows: Vec<(u64, &str)> = costs
            .iter()
            .zip(&profile.names)
            .map(|(&ir, f)| (ir, f.as_str()))
            .collect();
        rows.sort_by_key(|&(ir, _)| std::cmp::Reverse(ir));
        for (ir, f) in rows.into_iter().take(args.top) {
            println!("{:>9.0}  {:5.1} %  {f}", per(ir), share(ir));
        }
    }
}

/// A callgrind dump, by function name: each one's own instructions and
/// what its calls to each other function cost, their callees included.
struct Profile {
    names: Vec<String>,
    own: Vec<u64>,
    calls: HashMap<(usize, usize), u64>,
    total: u64,
}

impl Profile {
    fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).expect("a callgrind dump");
        let mut p = Profile {
            names: Vec::new(),
            own: Vec::new(),
            calls: HashMap::new(),
            total: 0,
        };
        // Names are given once with their number, then by number alone.
        let mut by_id: HashMap<String, usize> = HashMap::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        let mut function = |spec: &str, p: &mut Profile| -> usize {
            let (id, name) = match spec.strip_prefix('(').and_then(|s| s.split_once(')')) {
                Some((id, name)) => (Some(id.to_owned()), name.trim()),
                None => (None, spec.trim()),
            };
            if name.is_empty()
                && let Some(&i) = id.as_ref().and_then(|id| by_id.get(id))
            {
                return i;
            }
            let i = *by_name.entry(name.to_owned()).or_insert_with(|| {
                p.names.push(name.to_owned());
                p.own.push(0);
                p.names.len() - 1
            });
            if let Some(id) = id {
                by_id.insert(id, i);
            }
            i
        };
        let (mut current, mut callee, mut in_call) = (0, 0, false);
        for line in text.lines() {
            if let Some(spec) = line.strip_prefix("fn=") {
                current = function(spec, &mut p);
            } else if let Some(spec) = line.strip_prefix("cfn=") {
                callee = function(spec, &mut p);
            } else if line.starts_with("calls=") {
                in_call = true;
            } else if let Some(total) = line
                .strip_prefix("totals:")
                .or_else(|| line.strip_prefix("summary:"))
            {
                p.total = total.trim().parse().unwrap_or(p.total);
            } else if line.starts_with(|c: char| c.is_ascii_digit() || "+-*".contains(c)) {
                let cost: u64 = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                if in_call {
                    *p.calls.entry((current, callee)).or_default() += cost;
                    in_call = false;
                } else {
                    p.own[current] += cost;
                }
            }
        }
        p
    }

    /// Each function's own instructions and its calls' (a function
    /// calling itself counted once).
    fn inclusive(&self) -> Vec<u64> {
        let mut inclusive = self.own.clone();
        for (&(caller, callee), &ir) in &self.calls {
            if caller != callee {
                inclusive[caller] += ir;
            }
        }
        inclusive
    }

    /// Inclusive instructions of the outermost of the functions whose
    /// names contain one of `patterns`: frames that nest, of which the
    /// optimiser may have inlined some into the others.
    fn outermost(&self, inclusive: &[u64], patterns: &[&str]) -> u64 {
        self.names
            .iter()
            .zip(inclusive)
            .filter(|(f, _)| patterns.iter().any(|p| f.contains(p)))
            .map(|(_, &ir)| ir)
            .max()
            .unwrap_or(0)
    }

    /// The request's instructions by where they run: the client
    /// connection's task (hyper's server, the pipeline within it, the
    /// response body), the replica connections' tasks (hyper's client),
    /// and the runtime around them. Found by the gateway's own frames,
    /// whichever the optimiser left standing.
    fn parts(&self) -> Vec<(&'static str, u64)> {
        let inc = self.inclusive();
        let under = |patterns: &[&str]| self.outermost(&inc, patterns);
        let client_task = under(&["inbound::server::serve::{{closure}}::{{closure}}"]);
        // The service's future, around the pipeline's.
        let pipeline = under(&[
            "inbound::server::connection::serve::{{closure}}::{{closure}}::{{closure}}",
            "CatchUnwind<Fut> as core::future::future::Future>::poll",
            "AssertUnwindSafe<F> as core::future::future::Future>::poll",
        ]);
        let parse = under(&["gateway::pipeline::parse"]);
        let outgoing = under(&["gateway::outbound::outgoing::Outgoing::http1"]);
        let futures: u64 = self
            .calls
            .iter()
            .filter(|((caller, callee), _)| {
                let caller = &self.names[*caller];
                self.names[*callee].contains("memcpy")
                    && (caller.contains("CatchUnwind")
                        || caller.contains("AssertUnwindSafe")
                        || caller.contains("gateway::pipeline::")
                        || caller.contains("gateway::outbound::forward::"))
            })
            .map(|(_, &ir)| ir)
            .sum();
        let body = under(&[
            "streams::Counted<B> as http_body::Body>::poll_frame",
            "response_body::ResponseBody as http_body::Body>::poll_frame",
        ]);
        let record = under(&["drop_in_place<gateway::record::Record>"]);
        let replica_tasks = under(&["outbound::connections::drive::{{closure}}"]);
        let sub = |a: u64, b: u64| a.saturating_sub(b);
        vec![
            ("client connections' task, all of it", client_task),
            (
                "  hyper's server (request parsed, response written, I/O)",
                sub(client_task, pipeline + body + record),
            ),
            ("  the pipeline (the service's future), all of it", pipeline),
            (
                "    of which futures copied as they are moved (memcpy)",
                futures,
            ),
            ("    of which the JSON body parsed", parse),
            ("    of which the replica's request built", outgoing),
            ("  the response body passed on", body),
            ("  the record settled (access log, metrics, limits)", record),
            (
                "replica connections' tasks: hyper's client (request written, response parsed, I/O)",
                replica_tasks,
            ),
            (
                "runtime: scheduling, epoll, timers",
                sub(self.total, client_task + replica_tasks),
            ),
        ]
    }
}

/// Whose code a function is, by its path.
fn code(function: &str) -> &'static str {
    let f = function.trim_start_matches('<');
    let krate = f.split("::").next().unwrap_or(f);
    match krate {
        "hyper" | "hyper_util" | "httparse" | "want" | "h2" => "hyper, httparse",
        "http" => "http (header maps, URIs)",
        "tokio" | "mio" => "tokio",
        "gateway" => "gateway",
        "picker" => "picker",
        "tracing" | "tracing_core" | "tracing_subscriber" => "tracing",
        "serde_json" | "serde_core" => "serde_json",
        "core" | "alloc" | "std" | "hashbrown" | "bytes" | "memchr" => {
            "core, alloc, std, bytes, memchr"
        }
        _ if f.contains("memcpy") || f.contains("memmove") || f.contains("memset") => {
            "memcpy, memset"
        }
        _ if f.starts_with("mi_") || f.starts_with("_mi_") || f.contains("mimalloc") => {
            "allocator (mimalloc)"
        }
        _ => "the rest (libc, system calls, other crates)",
    }
}

/// Up under valgrind, which starts it many times slower.
fn wait_ready(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{addr} never started listening");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn callgrind_control(args: &[&str]) {
    let status = Command::new("callgrind_control")
        .args(args)
        .stdout(Stdio::null())
        .status()
        .expect("callgrind_control not found (valgrind's)");
    assert!(status.success(), "callgrind_control {args:?} failed");
}

/// The dump `--dump` wrote: callgrind numbers them after the out file.
fn newest_dump(dir: &Path, out: &Path) -> PathBuf {
    let prefix = out.file_name().unwrap().to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let dump = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
            })
            .max();
        if let Some(dump) = dump {
            return dump;
        }
        assert!(Instant::now() < deadline, "callgrind wrote no dump");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `requests` requests over `connections` connections, each sending its
/// next when its last was answered.
async fn closed_loop(addr: SocketAddr, connections: usize, requests: u64) {
    let left = Arc::new(AtomicU64::new(requests));
    let uri: hyper::Uri = format!("http://{addr}/v1/chat/completions")
        .parse()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let (left, uri) = (Arc::clone(&left), uri.clone());
        tasks.push(tokio::spawn(async move {
            while left
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok()
            {
                let req = Request::post(uri.clone())
                    .header("host", addr.to_string())
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(BODY.as_bytes())))
                    .unwrap();
                let resp = sender.send_request(req).await.unwrap();
                assert!(
                    resp.status().is_success(),
                    "the gateway answered {}",
                    resp.status()
                );
                resp.into_body().collect().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}
