//! `infergate serve --kubernetes` against the API server double: the
//! binary reads its config from the `InferenceGatewayConfig` object,
//! applies every change live without cutting a stream, refuses an invalid
//! one (the old config keeps serving) and says so in the object's status.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use infergate_kube::status::{ACCEPTED, ConfigStatus};
use infergate_kube::testing::{ApiServer, Resource};
use serde_json::{Value, json};

const NS: &str = "infergate";
const NAME: &str = "gw";
const DEADLINE: Duration = Duration::from_secs(60);

/// The config object: one simulated pool (slow enough that a stream of
/// a few tokens lasts seconds), and whatever `change` adds.
fn object(admin: &str, change: impl FnOnce(&mut Value)) -> Value {
    let mut object = json!({
        "apiVersion": "infergate.dev/v1alpha1",
        "kind": "InferenceGatewayConfig",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "listeners": [{"name": "public", "address": "127.0.0.1:0"}],
            "admin": {"address": admin},
            "pools": [{
                "name": "p",
                "models": ["model-a"],
                "simulated": {"replicas": 1, "hardware": ["a10g"], "model": "llama-3.1-8b", "timeScale": 0.1},
            }],
        },
    });
    change(&mut object);
    object
}

/// A kubeconfig that points a client at the double.
fn kubeconfig(server: &ApiServer) -> tempfile::NamedTempFile {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n  - name: double\n    cluster: {{server: \"{}\"}}\nusers:\n  - name: test\n    user: {{}}\ncontexts:\n  - name: double\n    context: {{cluster: double, user: test, namespace: {NS}}}\ncurrent-context: double\n",
        server.url()
    );
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, text.as_bytes()).unwrap();
    file
}

/// The running binary, its log lines on a channel.
struct Served {
    child: std::process::Child,
    logs: std::sync::mpsc::Receiver<String>,
    addr: String,
}

impl Served {
    fn start(kubeconfig: &std::path::Path) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["serve", "--log-format", "json", "--kubernetes"])
            .args(["--namespace", NS, "--name", NAME])
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAME", "gateway-0")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (tx, logs) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut served = Served {
            child,
            logs,
            addr: String::new(),
        };
        let line = served.wait_for("\"listening\"");
        let log: Value = serde_json::from_str(&line).unwrap();
        served.addr = log["fields"]["addr"]
            .as_str()
            .or(log["addr"].as_str())
            .unwrap_or_else(|| panic!("no addr in {line}"))
            .to_owned();
        served
    }

    /// The next log line containing `needle`.
    fn wait_for(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + DEADLINE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.logs.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle}: {e}"),
            }
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "30"])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn debug_config(admin: &str) -> Value {
    serde_json::from_str(&curl(&[&format!("http://{admin}/debug/config")])).unwrap()
}

fn chat(model: &str, stream: bool) -> String {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 12,
        "stream": stream,
    })
    .to_string()
}

fn status(server: &ApiServer) -> Option<ConfigStatus> {
    let object = server.get(&Resource::GATEWAY_CONFIGS, NS, NAME)?;
    serde_json::from_value(object.get("status")?.clone()).ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_object_is_applied_live_and_its_status_says_so() {
    let server = ApiServer::start().await;
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    server.put(&Resource::GATEWAY_CONFIGS, NS, object(&admin, |_| {}));
    let kubeconfig = kubeconfig(&server);
    let served = Served::start(kubeconfig.path());
    let config = debug_config(&admin);
    assert_eq!(config["generation"], 1, "{config}");
    assert_eq!(
        config["source"],
        format!("InferenceGatewayConfig {NS}/{NAME}"),
        "{config}"
    );
    server
        .wait_for("the first status", DEADLINE, |s| {
            status(s).is_some_and(|st| {
                st.observed_generation == Some(1)
                    && st.condition(ACCEPTED).is_some_and(|c| c.status == "True")
            })
        })
        .await;

    // A stream opened before the change runs to its end.
    let url = format!("http://{}/v1/chat/completions", served.addr);
    let mut curl_stream = Command::new("curl")
        .args([
            "-s",
            "-N",
            "--max-time",
            "60",
            "-H",
            "content-type: application/json",
        ])
        .args(["-d", &chat("model-a", true), &url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut events = BufReader::new(curl_stream.stdout.take().unwrap()).lines();
    // The first event has arrived before the object changes.
    let first = events.next().unwrap().unwrap();
    assert!(first.starts_with("data: "), "{first}");
    let stream = std::thread::spawn(move || {
        let rest: Vec<String> = events.map_while(Result::ok).collect();
        let _ = curl_stream.wait();
        rest.join("\n")
    });

    // Change the weights, add a pool, turn decision headers on.
    server.put(
        &Resource::GATEWAY_CONFIGS,
        NS,
        object(&admin, |o| {
            let spec = &mut o["spec"];
            spec["debug"] = json!({"decisionHeaders": true});
            spec["pools"][0]["scheduling"] = json!({"weights": {"queue": 7}});
            let mut second = spec["pools"][0].clone();
            second["name"] = json!("q");
            second["models"] = json!(["model-b"]);
            second["scheduling"] = json!({});
            spec["pools"].as_array_mut().unwrap().push(second);
        }),
    );
    let line = served.wait_for("\"trigger\":\"the object changed\"");
    assert!(line.contains("config reloaded"), "{line}");
    let config = debug_config(&admin);
    assert_eq!(config["generation"], 2, "{config}");
    assert_eq!(
        config["spec"]["pools"][0]["scheduling"]["weights"]["queue"],
        7.0
    );
    assert_eq!(config["spec"]["pools"][1]["name"], "q");

    // The new pool serves, and the decision headers name it.
    let headers = curl(&[
        "-D",
        "-",
        "-o",
        "/dev/null",
        "-H",
        "content-type: application/json",
        "-d",
        &chat("model-b", false),
        &url,
    ]);
    assert!(headers.starts_with("HTTP/1.1 200"), "{headers}");
    assert!(
        headers.to_ascii_lowercase().contains("x-infergate-pool: q"),
        "{headers}"
    );

    let streamed = stream.join().unwrap();
    assert!(streamed.trim_end().ends_with("data: [DONE]"), "{streamed}");
    assert!(!streamed.contains("\"error\""), "{streamed}");
    server
        .wait_for("generation 2 accepted", DEADLINE, |s| {
            status(s).is_some_and(|st| {
                st.observed_generation == Some(2)
                    && st.condition(ACCEPTED).is_some_and(|c| c.status == "True")
                    && st.pools.len() == 2
            })
        })
        .await;

    // An invalid change: refused with every problem, the old config serves.
    server.put(
        &Resource::GATEWAY_CONFIGS,
        NS,
        object(&admin, |o| {
            o["spec"]["pools"][0]["models"] = json!([]);
            o["spec"]["pools"][0]["weight"] = json!(3);
        }),
    );
    let line = served.wait_for("\"trigger\":\"the object changed\"");
    assert!(line.contains("reload refused"), "{line}");
    server
        .wait_for("generation 3 refused", DEADLINE, |s| {
            status(s).is_some_and(|st| {
                st.observed_generation == Some(3)
                    && st.condition(ACCEPTED).is_some_and(|c| {
                        c.status == "False"
                            && c.message.contains("spec.pools[0].weight")
                            && c.message.contains("spec.pools[0].models")
                    })
            })
        })
        .await;
    let config = debug_config(&admin);
    assert_eq!(
        config["generation"],
        1 + 1,
        "the running config stays: {config}"
    );
    let answer = curl(&[
        "-H",
        "content-type: application/json",
        "-d",
        &chat("model-a", false),
        &url,
    ]);
    assert!(answer.contains("chat.completion"), "{answer}");
}
