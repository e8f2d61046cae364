//! `infergate serve` as a child process, for the tests that run the
//! binary as a user does.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

pub fn infergate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infergate"))
}

pub fn write_config(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

/// A running `infergate serve --config FILE`, its log lines on a channel.
pub struct Served {
    pub child: std::process::Child,
    logs: std::sync::mpsc::Receiver<String>,
    pub addr: String,
}

impl Served {
    pub fn start(config: &std::path::Path) -> Self {
        let mut child = infergate()
            .args(["serve", "--log-format", "json", "--config"])
            .arg(config)
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
        let mut served = Self {
            child,
            logs,
            addr: String::new(),
        };
        let line = served.wait_for("\"listening\"");
        let log: serde_json::Value = serde_json::from_str(&line).unwrap();
        served.addr = log["fields"]["addr"]
            .as_str()
            .or(log["addr"].as_str())
            .unwrap_or_else(|| panic!("no addr in {line}"))
            .to_owned();
        served
    }

    /// The next log line containing `needle` (within 60 s).
    pub fn wait_for(&self, needle: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.logs.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(e) => panic!("no log line with {needle}: {e}"),
            }
        }
    }

    /// The admin listener's address, from its log line (which follows
    /// the public listeners').
    pub fn admin_addr(&self) -> String {
        let line = self.wait_for("admin listening");
        let log: serde_json::Value = serde_json::from_str(&line).unwrap();
        log["fields"]["addr"]
            .as_str()
            .or(log["addr"].as_str())
            .unwrap_or_else(|| panic!("no addr in {line}"))
            .to_owned()
    }

    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{name}");
    }

    pub fn models(&self) -> Vec<String> {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10"])
            .arg(format!("http://{}/v1/models", self.addr))
            .output()
            .unwrap();
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
