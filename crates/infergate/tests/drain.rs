//! Taking things out of service as an operator does: a replica with
//! `infergate drain`, and the gateway itself with SIGTERM under load.

#[path = "support/served.rs"]
mod served;

use std::process::Command;
use std::time::Duration;

use futures_util::StreamExt;
use served::{Served, infergate, write_config};

/// A simulated pool of `replicas` behind a gateway with an admin listener
/// on a free port; `time_scale` 1.0 generates in real time.
fn config(replicas: u32, time_scale: f64) -> (String, std::net::SocketAddr) {
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]\n  admin: {{address: \"{admin}\"}}\n  pools:\n    - {{name: p, models: [m], simulated: {{replicas: {replicas}, hardware: [a10g], model: llama-3.1-8b, timeScale: {time_scale}}}}}\n"
    );
    (yaml, admin)
}

fn get(url: &str) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10"])
        .arg(url)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

fn endpoints(admin: std::net::SocketAddr) -> Vec<serde_json::Value> {
    let pools: serde_json::Value =
        serde_json::from_str(&get(&format!("http://{admin}/debug/pools"))).unwrap();
    pools["pools"][0]["endpoints"].as_array().unwrap().clone()
}

fn drain(args: &[&str]) -> (bool, String, String) {
    let out = infergate().arg("drain").args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn infergate_drain_takes_a_replica_out_of_service_and_puts_it_back() {
    let (yaml, admin) = config(2, 0.01);
    let file = write_config(&yaml);
    let _served = Served::start(file.path());
    let url = format!("http://{admin}");
    let replicas = endpoints(admin);
    let addr = replicas[0]["address"].as_str().unwrap().to_owned();

    let (ok, out, err) = drain(&[&addr, "--admin", &url]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("pool p: {addr} draining")),
        "{out}"
    );
    let shown = endpoints(admin);
    assert_eq!(shown[0]["draining"], true, "{shown:?}");
    assert_eq!(shown[1]["draining"], false, "{shown:?}");

    let (ok, out, err) = drain(&[
        &addr,
        "--pool",
        "p",
        "--evacuate",
        "--wait",
        "--json",
        "--admin",
        &url,
    ]);
    assert!(ok, "{err}");
    let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(answer["evacuating"], true, "{answer}");
    assert_eq!(answer["inflightRequests"], 0, "{answer}");

    let (ok, out, err) = drain(&[&addr, "--undo", "--admin", &url]);
    assert!(ok, "{err}");
    assert!(out.contains("serving"), "{out}");
    assert_eq!(endpoints(admin)[0]["draining"], false);

    let (ok, _, err) = drain(&["10.9.9.9:1", "--admin", &url]);
    assert!(!ok);
    assert!(err.contains("404") && err.contains("10.9.9.9:1"), "{err}");
}

/// SIGTERM while streams run: readiness goes at once, new connections are
/// refused, and every stream in flight runs to its `[DONE]`; the process
/// then exits 0.
#[test]
fn sigterm_under_load_loses_no_stream() {
    // Real time: each answer takes a second or two.
    let (yaml, admin) = config(2, 1.0);
    let file = write_config(&yaml);
    let mut served = Served::start(file.path());
    let addr = served.addr.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    const STREAMS: usize = 8;
    let (started_tx, mut started) = tokio::sync::mpsc::channel(STREAMS);
    let streams: Vec<_> = (0..STREAMS)
        .map(|_| {
            let url = format!("http://{addr}/v1/chat/completions");
            let started = started_tx.clone();
            runtime.spawn(async move {
                let resp = reqwest::Client::new()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(r#"{"model": "m", "stream": true, "max_tokens": 60, "messages": [{"role": "user", "content": "Tell me about the sea."}]}"#)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 200);
                let mut body = resp.bytes_stream();
                let mut text = String::new();
                let mut told = false;
                while let Some(chunk) = body.next().await {
                    text.push_str(std::str::from_utf8(&chunk.expect("the stream is not cut")).unwrap());
                    if !told && text.contains("data: ") {
                        told = true;
                        started.send(()).await.unwrap();
                    }
                }
                text
            })
        })
        .collect();
    runtime.block_on(async {
        for _ in 0..STREAMS {
            started.recv().await.unwrap();
        }
    });

    served.signal("TERM");
    served.wait_for("shutting down");
    // The listeners close: a new connection is refused, and the readiness
    // probe with it (an open connection would be answered 503). Nothing
    // outside the process says when, so look every few milliseconds.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_ok() || std::net::TcpStream::connect(admin).is_ok()
    {
        assert!(std::time::Instant::now() < deadline, "still accepting");
        std::thread::sleep(Duration::from_millis(5));
    }

    for stream in streams {
        let text = runtime.block_on(stream).unwrap();
        assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        assert!(!text.contains("\"error\""), "{text}");
    }
    let status = served.child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "every request finished in time");
}
