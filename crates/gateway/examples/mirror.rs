//! Shadow traffic's cost to the primary, side by side in one run: the
//! client's TTFT through the gateway with no mirror and with a 100 %
//! mirror to a shadow pool that is 10× slower and fails a third of its
//! requests.
//!
//! Two gateways run at once in front of the same simulated primary pool
//! (2 × H100, llama-3.1-8b); the second also copies every request to the
//! shadow replica (one H100 with `slowdown: 10` and `error_rate: 0.3`).
//! The load is an open loop at a fixed rate of short streaming chats,
//! sent in slices that alternate between the two gateways, so a change in
//! the machine's load falls on both alike. The figures are the client's
//! TTFT (first streamed event) p50 and p99 per gateway, their ratio, and
//! what became of the copies.
//!
//! `cargo run --release -p infergate-gateway --example mirror -- [rate]
//! [seconds-per-slice] [slices]` (defaults: 40 req/s, 5 s, 6 slices).

use std::time::{Duration, Instant};

use gateway::Gateway;
use serde_json::json;

const TIME_SCALE: f64 = 10.0;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rate: f64 = args.first().map_or(Ok(40.0), |a| a.parse())?;
    let slice: f64 = args.get(1).map_or(Ok(5.0), |a| a.parse())?;
    let slices: usize = args.get(2).map_or(Ok(6), |a| a.parse())?;

    let replica = |name: &str, faults: sim::Faults| {
        sim::start_replica(
            "127.0.0.1:0".parse().unwrap(),
            sim::ReplicaSpec {
                served_model_name: Some(name.into()),
                time_scale: TIME_SCALE,
                faults,
                ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
            },
        )
    };
    let primary = [
        replica("m", sim::Faults::default()).await?,
        replica("m", sim::Faults::default()).await?,
    ];
    let shadow = replica(
        "m-shadow",
        sim::Faults {
            slowdown: 10.0,
            error_rate: 0.3,
            ..sim::Faults::default()
        },
    )
    .await?;
    let pools = format!(
        "    - {{name: primary, models: [m], endpoints: [\"{}\", \"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n    - {{name: shadow, models: [m-shadow], endpoints: [\"{}\"], scheduling: {{metrics: {{interval: 20ms}}}}}}\n",
        primary[0].local_addr(),
        primary[1].local_addr(),
        shadow.local_addr()
    );
    let config = |extra: &str| {
        let yaml = format!(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners:\n    - {{name: public, address: \"127.0.0.1:0\"}}\n  admin: {{address: \"127.0.0.1:0\"}}\n{extra}  pools:\n{pools}"
        );
        config::from_yaml(&yaml).map_err(|e| anyhow::anyhow!("{e}"))
    };
    let plain = Gateway::start(&config("")?).await?;
    let mirrored = Gateway::start(&config(
        "  mirrors:\n    - {model: m, targetModel: m-shadow, fraction: 1.0}\n",
    )?)
    .await?;
    let http = reqwest::Client::builder().no_proxy().build()?;
    // Let the scrapers see every replica before measuring.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut ttft: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut failed = [0usize; 2];
    for s in 0..slices * 2 {
        let which = s % 2;
        let gw = if which == 0 { &plain } else { &mirrored };
        let (t, f) = open_loop(&http, gw.addr(), rate, slice, s).await;
        ttft[which].extend(t);
        failed[which] += f;
    }
    let admin = mirrored.admin_addr().expect("admin listener");
    let metrics = http
        .get(format!("http://{admin}/metrics"))
        .send()
        .await?
        .text()
        .await?;

    println!("Shadow traffic: the primary's TTFT with and without a 100 % mirror");
    println!(
        "open loop {rate} req/s of streaming chats, {slices} × {slice} s slices per gateway, alternating; time scale {TIME_SCALE}"
    );
    println!("shadow: 1 × H100 with slowdown 10 and error_rate 0.3\n");
    println!("| gateway | requests | failed | TTFT p50 ms | TTFT p99 ms |");
    println!("|---|---|---|---|---|");
    let mut p = [(0.0, 0.0); 2];
    for (i, name) in ["no mirror", "100 % mirror"].iter().enumerate() {
        let v = &mut ttft[i];
        v.sort_by(f64::total_cmp);
        p[i] = (quantile(v, 0.5), quantile(v, 0.99));
        println!(
            "| {name} | {} | {} | {:.1} | {:.1} |",
            v.len() + failed[i],
            failed[i],
            p[i].0,
            p[i].1
        );
    }
    println!(
        "\nmirror / no mirror: p50 {:.2}×, p99 {:.2}×",
        p[1].0 / p[0].0,
        p[1].1 / p[0].1
    );
    println!("\ncopies:");
    for line in metrics.lines().filter(|l| {
        l.starts_with("infergate_mirror_copies_total")
            || l.starts_with("infergate_mirror_errors_total")
    }) {
        println!("  {line}");
    }
    Ok(())
}

/// Requests due every `1 / rate` s for `seconds`, each on its own task;
/// the TTFT of each answered one (ms, from when it was due) and how many
/// failed.
async fn open_loop(
    http: &reqwest::Client,
    addr: std::net::SocketAddr,
    rate: f64,
    seconds: f64,
    slice: usize,
) -> (Vec<f64>, usize) {
    let n = (rate * seconds) as usize;
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(due).await;
        let req = http.post(format!("http://{addr}/v1/chat/completions")).body(
            json!({"model": "m", "stream": true, "max_tokens": 16, "messages": [
                {"role": "user", "content": format!("slice {slice} question {i}: tell me about the sea")}
            ]})
            .to_string(),
        );
        tasks.push(tokio::spawn(async move {
            let due = Instant::now();
            let mut resp = req.send().await.ok()?;
            if resp.status() != 200 {
                return None;
            }
            let first = resp.chunk().await.ok()??;
            let ttft = due.elapsed().as_secs_f64() * 1e3;
            drop(first);
            while resp.chunk().await.ok()?.is_some() {}
            Some(ttft)
        }));
    }
    let mut ttft = Vec::with_capacity(n);
    let mut failed = 0;
    for t in tasks {
        match t.await.ok().flatten() {
            Some(ms) => ttft.push(ms),
            None => failed += 1,
        }
    }
    (ttft, failed)
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}
