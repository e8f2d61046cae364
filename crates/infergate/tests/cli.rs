//! The `infergate` binary as a user runs it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

fn infergate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infergate"))
}

fn write_config(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

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

#[test]
fn check_reports_unreadable_files() {
    let out = infergate()
        .args(["check", "--config", "/nonexistent.yaml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.yaml"));
}

#[test]
fn help_describes_every_subcommand() {
    let out = infergate().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for sub in ["serve", "check", "sim"] {
        assert!(text.contains(sub), "{text}");
    }
    let out = infergate().args(["serve", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--config"));
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
    let out = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "60",
            "-H",
            "content-type: application/json",
            "-d",
        ])
        .arg(body.to_string())
        .arg(format!("http://{addr}/v1/chat/completions"))
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let resp: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(resp["object"], "chat.completion", "{resp}");
    assert_eq!(resp["usage"]["completion_tokens"], 8, "{resp}");
}
