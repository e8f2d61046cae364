//! The `infergate` binary as a user runs it.

#[path = "support/served.rs"]
mod served;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use served::{Served, infergate, write_config};

#[test]
fn check_accepts_a_valid_config() {
    let out = infergate()
        .args(["check", "--config"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/static.yaml"
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid"));
}

#[test]
fn check_lists_every_problem_and_fails() {
    let cfg = write_config(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{name: public, address: \"127.0.0.1:8080\"}]\n  pools:\n    - {name: a, models: [m1], endpoints: [\"127.0.0.1:1\"]}\n    - {name: b, models: [m1], endpoints: [\"not a host\"]}\n",
    );
    let out = infergate()
        .args(["check", "--config"])
        .arg(cfg.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(r#"spec.pools[1].endpoints[0]: "not a host" is not host:port"#),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            r#"spec.pools[1].models[0]: "m1" is already served by spec.pools[0].models[0]"#
        ),
        "{stderr}"
    );
}

/// Runs `check` on `yaml`: its exit code and what it printed on stderr.
fn check(yaml: &str) -> (Option<i32>, String) {
    let cfg = write_config(yaml);
    let out = infergate()
        .args(["check", "--config"])
        .arg(cfg.path())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// serde stops at the first unknown field; `check` goes on.
#[test]
fn check_reports_every_typo_in_one_run() {
    let (code, stderr) = check(concat!(
        "apiVersion: infergate.dev/v1alpha1\n",
        "kind: InferenceGatewayConfig\n",
        "spec:\n",
        "  listeners: [{name: public, address: \"127.0.0.1:0\"}]\n",
        "  limits: {maxBodyByte: 1024}\n",
        "  pools:\n",
        "    - {name: a, models: [m1], endpoints: [\"127.0.0.1:1\"]}\n",
        "    - {name: b, models: [m2], endpoints: [\"127.0.0.1:2\"], scheduling: {polcy: scored}}\n",
    ));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(": invalid, 2 problems:"), "{stderr}");
    for expected in [
        "spec.limits.maxBodyByte: unknown field `maxBodyByte`",
        "spec.pools[1].scheduling.polcy: unknown field `polcy`",
    ] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(expected))
            .unwrap_or_else(|| panic!("no {expected:?} in\n{stderr}"));
        assert!(line.contains("did you mean"), "{line}");
    }
}

/// Pools `serve` cannot start are refused by `check`, every one, each at
/// the field to change and in the config's terms.
#[test]
fn check_refuses_simulated_pools_the_simulator_would_refuse() {
    let (code, stderr) = check(concat!(
        "apiVersion: infergate.dev/v1alpha1\n",
        "kind: InferenceGatewayConfig\n",
        "spec:\n",
        "  listeners: [{name: public, address: \"127.0.0.1:0\"}]\n",
        "  pools:\n",
        "    - {name: a, models: [m1], simulated: {replicas: 1, hardware: [h100], model: gpt-5}}\n",
        "    - {name: b, models: [m2], simulated: {replicas: 1, hardware: [b200], model: llama-3.1-8b}}\n",
        "    - {name: c, models: [m3], simulated: {replicas: 1, hardware: [h100], model: llama-3.1-8b, tensorParallel: 3}}\n",
        "    - {name: d, models: [m4], adapters: [d-lora], simulated: {replicas: 1, hardware: [h100], model: llama-3.1-8b, maxLoras: 0}}\n",
        "    - {name: e, models: [m5], adapters: [e-lora], simulated: {replicas: 1, hardware: [l4], model: llama-3.1-8b, maxLoras: 2}}\n",
    ));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains(": invalid, 5 problems:"), "{stderr}");
    let known_gpus = sim::engine::hardware_names().join(", ");
    for expected in [
        r#"spec.pools[0].simulated.model: "gpt-5" is not a model the simulator knows; known: llama-3.1-8b"#.to_owned(),
        format!(r#"spec.pools[1].simulated.hardware[0]: "b200" is not a known GPU; known: {known_gpus}"#),
        "spec.pools[2].simulated.tensorParallel: 3 GPUs per replica do not suit llama-3.1-8b".to_owned(),
        "spec.pools[3].simulated.maxLoras: 0 turns LoRA off, but the pool serves adapters (d-lora)".to_owned(),
        "spec.pools[4].simulated.maxLoras: 2 LoRA slots per replica leave llama-3.1-8b on l4".to_owned(),
    ] {
        assert!(
            stderr.lines().any(|l| l.starts_with(&expected)),
            "no {expected:?} in\n{stderr}"
        );
    }
    // Advice in the config's terms, not the engine's.
    for engine_setting in [
        "max_model_len",
        "gpu_memory_utilization",
        "tensor_parallel",
        "max_loras",
    ] {
        assert!(
            !stderr.contains(engine_setting),
            "{engine_setting} in\n{stderr}"
        );
    }
}

#[test]
fn check_reports_unreadable_files() {
    let out = infergate()
        .args(["check", "--config", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.yaml"));
}

/// Certificate, key and CA files are read by `check` as `serve` reads
/// them, and refused by both in the same words.
#[test]
fn check_and_serve_refuse_unusable_tls_files() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("tls.key");
    std::fs::write(&key, "not a key").unwrap();
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners:\n    - name: public\n      address: \"127.0.0.1:0\"\n      tls: {{certFile: /nonexistent/tls.crt, keyFile: {key}}}\n  pools:\n    - {{name: a, models: [m], endpoints: [\"https://127.0.0.1:1\"], tls: {{caFile: /nonexistent/ca.crt}}}}\n",
        key = key.display()
    );
    let (code, stderr) = check(&yaml);
    assert_eq!(code, Some(1), "{stderr}");
    let expected = [
        "spec.listeners[0].tls.certFile: cannot read \"/nonexistent/tls.crt\": No such file or directory",
        &format!(
            "spec.listeners[0].tls.keyFile: {:?} holds no PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)",
            key.display().to_string()
        ),
        "spec.pools[0].tls.caFile: cannot read \"/nonexistent/ca.crt\": No such file or directory",
    ];
    for line in expected {
        assert!(stderr.contains(line), "{line:?} missing from:\n{stderr}");
    }
    assert!(stderr.contains("invalid, 3 problems"), "{stderr}");

    let cfg = write_config(&yaml);
    let out = infergate()
        .args(["serve", "--config"])
        .arg(cfg.path())
        .output()
        .unwrap();
    let served = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{served}");
    for line in expected {
        assert!(served.contains(line), "{line:?} missing from:\n{served}");
    }
}

#[test]
fn help_describes_every_subcommand() {
    let out = infergate().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["serve", "check", "keys", "drain", "sim"] {
        assert!(text.contains(sub), "{text}");
    }
    let out = infergate().args(["serve", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--config"));
}

#[test]
fn check_help_describes_its_config_option() {
    let out = infergate().args(["check", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let option = text
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("-c, --config <FILE>"))
        .unwrap_or_else(|| panic!("no --config option in\n{text}"));
    assert!(
        option
            .trim_start()
            .starts_with("The InferenceGatewayConfig YAML document"),
        "{text}"
    );
}

/// The README's way to try examples/static.yaml without servers: its
/// `infergate sim` lines start a replica at every endpoint of the example,
/// serving the pool's model, adapters and metrics dialect, and the
/// example's ports are not the demo's, so both run at once.
#[test]
fn the_readme_sim_lines_stand_in_for_every_endpoint_of_the_static_example() {
    #[derive(clap::Parser)]
    #[command(name = "infergate")]
    enum Cli {
        Sim(sim::cli::SimArgs),
    }

    let readme = include_str!("../../../README.md");
    assert!(readme.contains("\ninfergate serve --config examples/static.yaml\n"));
    let fleets: Vec<sim::FleetSpec> = readme
        .lines()
        .filter(|line| line.starts_with("infergate sim "))
        .map(|line| {
            let words = line.trim_end_matches('&').split_whitespace();
            match <Cli as clap::Parser>::try_parse_from(words) {
                Ok(Cli::Sim(args)) => args.fleet_spec(),
                Err(e) => panic!("{line}: {e}"),
            }
        })
        .collect();
    assert!(!fleets.is_empty(), "no `infergate sim` line in the README");

    let example = config::from_yaml(include_str!("../../../examples/static.yaml")).unwrap();
    for pool in &example.spec.pools {
        for endpoint in &pool.endpoints {
            let fleet = fleets
                .iter()
                .find(|fleet| {
                    (0..fleet.replicas).any(|i| {
                        let port = usize::from(fleet.base_port.unwrap_or(0)) + i;
                        format!("{}:{port}", fleet.host) == *endpoint
                    })
                })
                .unwrap_or_else(|| panic!("no README sim line serves {endpoint}"));
            let served = fleet
                .served_model_name
                .clone()
                .unwrap_or_else(|| sim::engine::model(&fleet.model).unwrap().hf_id.to_owned());
            assert_eq!(served, pool.base_model(), "{endpoint}");
            for adapter in &pool.adapters {
                assert!(fleet.adapters.contains(adapter), "{endpoint}: {adapter}");
            }
            assert_eq!(fleet.dialect, pool.engine, "{endpoint}");
            fleet.validate().unwrap();
        }
    }

    let ports = |c: &config::InferenceGatewayConfig| -> Vec<String> {
        c.spec
            .listeners
            .iter()
            .map(|l| l.address.clone())
            .chain(c.spec.admin.iter().map(|a| a.address.clone()))
            .map(|a| a.rsplit_once(':').unwrap().1.to_owned())
            .collect()
    };
    let demo = config::from_yaml(include_str!("../../../examples/demo.yaml")).unwrap();
    for port in ports(&example) {
        assert!(
            !ports(&demo).contains(&port),
            "the demo uses port {port} too"
        );
    }
}

/// The README's first command: `infergate serve` with no config starts the
/// demo; the curl line it prints works.
#[test]
fn quickstart_demo_serves_a_completion() {
    // The demo's fixed ports (8080, 9464) may be taken; use free ones.
    let mut child = infergate()
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut addr = None;
    let mut curl = None;
    for line in stdout.lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("infergate demo: a gateway on http://") {
            addr = rest.split_whitespace().next().map(str::to_owned);
        }
        if line.starts_with("Press Ctrl-C") {
            break;
        }
        if line.trim_start().starts_with("curl ") {
            curl = Some(line);
        }
    }
    let addr = addr.expect("the demo printed its address");
    assert!(curl.is_some(), "the demo printed a curl line");
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [{"role": "user", "content": "Hello!"}],
        "max_tokens": 8,
    });
    let resp = chat(&addr, &body.to_string());
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(resp["object"], "chat.completion", "{resp}");
    assert_eq!(resp["usage"]["completion_tokens"], 8, "{resp}");
}

/// A chat completion through the gateway at `addr` with curl, as a user
/// would send it: the JSON answer.
fn chat(addr: &str, body: &str) -> serde_json::Value {
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "60",
            "-H",
            "content-type: application/json",
            "-d",
            body,
        ])
        .arg(format!("http://{addr}/v1/chat/completions"))
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn simulated_config(model: &str, time_scale: f64) -> String {
    format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]\n  pools:\n    - {{name: p, models: [{model}], simulated: {{replicas: 1, hardware: [a10g], model: llama-3.1-8b, timeScale: {time_scale}}}}}\n"
    )
}

#[test]
fn sighup_reloads_the_config_file_and_a_bad_file_changes_nothing() {
    let file = write_config(&simulated_config("model-a", 0.01));
    let served = Served::start(file.path());
    assert_eq!(served.models(), ["model-a"]);

    // (The file is watched too: whichever notices first reloads it, and
    // the signal's own reload is the one waited for.)
    std::fs::write(file.path(), simulated_config("model-b", 0.01)).unwrap();
    served.signal("HUP");
    let line = served.wait_for("\"trigger\":\"SIGHUP\"");
    assert!(line.contains("config reloaded"), "{line}");
    assert_eq!(served.models(), ["model-b"]);

    std::fs::write(file.path(), "spec: [not, a, config]").unwrap();
    served.signal("HUP");
    let line = served.wait_for("\"trigger\":\"SIGHUP\"");
    assert!(line.contains("reload refused"), "{line}");
    assert_eq!(served.models(), ["model-b"], "the running config stays");
}

/// Write `path` whole at once (as Kubernetes and editors do), so a watcher
/// never reads it half written.
fn replace_file(path: &std::path::Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// The config file is watched: a change is put in force without a signal,
/// `/debug/config` shows which generation runs and from where, and
/// `infergate_config_reloads_total` counts what happened.
#[test]
fn a_changed_config_file_is_reloaded_without_a_signal() {
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let with_admin = |model: &str| {
        simulated_config(model, 0.01).replace(
            "  pools:",
            &format!("  admin: {{address: \"{admin}\"}}\n  pools:"),
        )
    };
    let file = write_config(&with_admin("model-a"));
    let served = Served::start(file.path());
    replace_file(file.path(), &with_admin("model-b"));
    let line = served.wait_for("\"trigger\":\"the file changed\"");
    assert!(line.contains("config reloaded"), "{line}");
    assert_eq!(served.models(), ["model-b"]);

    let get = |path: &str| {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10"])
            .arg(format!("http://{admin}{path}"))
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let config: serde_json::Value = serde_json::from_str(&get("/debug/config")).unwrap();
    assert_eq!(config["generation"], 2, "{config}");
    assert_eq!(
        config["source"],
        format!("file {}", file.path().display()),
        "{config}"
    );
    assert_eq!(
        config["spec"]["pools"][0]["models"][0], "model-b",
        "{config}"
    );

    replace_file(file.path(), "spec: [not, a, config]");
    let line = served.wait_for("\"trigger\":\"the file changed\"");
    assert!(line.contains("reload refused"), "{line}");
    let metrics = get("/metrics");
    assert!(
        metrics.contains("infergate_config_reloads_total{result=\"applied\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("infergate_config_reloads_total{result=\"refused\"} 1"),
        "{metrics}"
    );
    assert_eq!(served.models(), ["model-b"], "the running config stays");
}

/// The status of `GET /v1/models` with these extra curl arguments, and
/// its body.
fn models_with(served: &Served, args: &[&str]) -> (String, serde_json::Value) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(format!("http://{}/v1/models", served.addr))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, status) = text.rsplit_once('\n').unwrap();
    (status.to_owned(), serde_json::from_str(body).unwrap())
}

#[test]
fn keys_new_prints_a_key_once_and_the_line_that_makes_it_work() {
    let out = infergate()
        .args(["keys", "new", "--tenant", "team-a", "--name", "ci"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "the key, then the line: {stdout}");
    let (key, line) = (lines[0], lines[1]);
    assert!(key.starts_with("ig-") && key.len() == 46, "{key}");
    assert!(
        !line.contains(key),
        "the key itself is never configured: {line}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("shown once"));
    let again = infergate()
        .args(["keys", "new", "--tenant", "team-a"])
        .output()
        .unwrap();
    assert_ne!(
        String::from_utf8_lossy(&again.stdout).lines().next(),
        Some(key)
    );

    // The line pasted into a config, as the help says.
    let config = simulated_config("m", 0.01).replace(
        "  pools:\n",
        &format!("  auth:\n    apiKeys:\n      keys:\n        {line}\n  pools:\n"),
    );
    let file = write_config(&config);
    let served = Served::start(file.path());
    let bearer = format!("authorization: Bearer {key}");
    let (status, list) = models_with(&served, &["-H", &bearer]);
    assert_eq!(status, "200");
    assert_eq!(list["data"][0]["id"], "m");
    let (status, error) = models_with(&served, &[]);
    assert_eq!(status, "401");
    assert_eq!(error["error"]["code"], "invalid_api_key");
    let (status, _) = models_with(&served, &["-H", "authorization: Bearer ig-not-the-key"]);
    assert_eq!(status, "401");

    let refused = infergate()
        .args(["keys", "new", "--tenant", ""])
        .output()
        .unwrap();
    assert!(!refused.status.success());
}

#[test]
fn a_second_stop_signal_during_the_drain_stops_at_once() {
    // Real time: the request below takes minutes, so the drain would wait.
    let file = write_config(&simulated_config("m", 1.0));
    let mut served = Served::start(file.path());
    let mut request = Command::new("curl")
        .args(["-s", "-N", "--max-time", "120", "-H", "content-type: application/json", "-d"])
        .arg(r#"{"model": "m", "stream": true, "max_tokens": 4000, "messages": [{"role": "user", "content": "hi"}]}"#)
        .arg(format!("http://{}/v1/chat/completions", served.addr))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The stream has started once its first event arrives.
    // Kept open to the end: a closed pipe would end the request, and the
    // drain with it.
    let mut stream = BufReader::new(request.stdout.take().unwrap());
    let mut first = String::new();
    stream.read_line(&mut first).unwrap();
    assert!(first.starts_with("data: "), "{first}");

    served.signal("TERM");
    served.wait_for("shutting down");
    served.signal("TERM");
    served.wait_for("second signal");
    let status = served.child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "a cut drain is a failure");
    let _ = request.kill();
    let _ = request.wait();
    drop(stream);
}

/// Secure by default: a listener others can reach needs `spec.auth`, and
/// the refusal names both ways out. `check` says the same as `serve`.
#[test]
fn an_exposed_listener_without_auth_is_refused() {
    let exposed = concat!(
        "apiVersion: infergate.dev/v1alpha1\n",
        "kind: InferenceGatewayConfig\n",
        "spec:\n",
        "  listeners: [{name: public, address: \"0.0.0.0:0\"}]\n",
        "  pools: [{name: p, engine: none, models: [m], endpoints: [\"127.0.0.1:9\"]}]\n",
    );
    let (code, stderr) = check(exposed);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("spec.listeners[0].address")
            && stderr.contains("configure spec.auth")
            && stderr.contains("auth: {mode: none}"),
        "{stderr}"
    );
    let cfg = write_config(exposed);
    let out = infergate()
        .args(["serve", "--config"])
        .arg(cfg.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("configure spec.auth"), "{stderr}");

    // Saying so on purpose is accepted, and so is a loopback listener.
    let on_purpose = exposed.replace("  pools:", "  auth: {mode: none}\n  pools:");
    let (code, stderr) = check(&on_purpose);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, stderr) = check(&exposed.replace("0.0.0.0:0", "127.0.0.1:0"));
    assert_eq!(code, Some(0), "{stderr}");
}

const DISCOVERED: &str = "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{name: public, address: \"127.0.0.1:0\"}]\n  pools:\n    - {name: a, models: [m1], endpointSelector: {namespace: ml, matchLabels: {app: vllm}, port: 8000}}\n";

#[test]
fn check_validates_discovered_pools_without_a_cluster() {
    let cfg = write_config(DISCOVERED);
    let out = infergate()
        .args(["check", "--config"])
        .arg(cfg.path())
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn serve_without_a_kubernetes_api_says_so() {
    let cfg = write_config(DISCOVERED);
    let home = tempfile::tempdir().unwrap();
    let out = infergate()
        .args(["serve", "--config"])
        .arg(cfg.path())
        .env("KUBECONFIG", home.path().join("missing"))
        .env("HOME", home.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no Kubernetes API is configured"),
        "{stderr}"
    );
}

/// A simulated pool that starts at zero: its first request wakes its
/// replica (the fleet's wake endpoint as the pool's wake webhook), waits
/// for it to load rather than getting a 503, and is answered once the
/// replica listens.
#[test]
fn a_simulated_pool_at_zero_is_woken_by_its_first_request() {
    let file = write_config(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{name: public, address: \"127.0.0.1:0\"}]\n  pools:\n    - {name: p, models: [m], simulated: {replicas: 1, hardware: [h100], model: llama-3.1-8b, timeScale: 20, loadTime: 40s, startAtZero: true}}\n",
    );
    let served = Served::start(file.path());
    let started = std::time::Instant::now();
    let resp = chat(
        &served.addr,
        r#"{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}"#,
    );
    assert_eq!(resp["object"], "chat.completion", "{resp}");
    // Woken by the request, then 40 s of simulated load at 20×: 2 s.
    served.wait_for("replica woken");
    served.wait_for("replica loaded its model");
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(1500),
        "answered after {:?}",
        started.elapsed()
    );
}
