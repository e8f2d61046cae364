//! Capturing what the gateway logs, for tests that read its log lines.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use gateway::telemetry::{ACCESS_TARGET, LogFormat, log_layers};
use parking_lot::Mutex;
use serde_json::Value;
use tokio::sync::Notify;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;

const DEADLINE: Duration = Duration::from_secs(20);

/// A subscriber that stays registered for the life of the process and
/// wants nothing. While only one subscriber is registered, `tracing`
/// decides whether a call site is wanted by asking the subscriber of the
/// thread that first reaches it, and keeps the answer for every thread: a
/// gateway of another test, on a thread with no subscriber, would make the
/// call sites it reaches first silent for this test's subscriber too. With
/// two registered, every call site asks all of them.
static BYSTANDER: LazyLock<tracing::Dispatch> =
    LazyLock::new(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));

/// Everything the gateway logs, as written; wakes waiters on each write.
#[derive(Clone, Default)]
pub struct Logs {
    bytes: Arc<Mutex<Vec<u8>>>,
    written: Arc<Notify>,
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.bytes.lock().extend_from_slice(buf);
        self.written.notify_waiters();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    /// Install the gateway's own log layers (text logs, JSON access log)
    /// for this thread.
    pub fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        Self::capture_with("info")
    }

    pub fn capture_with(filter: &str) -> (Self, tracing::subscriber::DefaultGuard) {
        LazyLock::force(&BYSTANDER);
        let logs = Logs::default();
        let subscriber = tracing_subscriber::registry().with(log_layers(
            LogFormat::Text,
            Some(LogFormat::Json),
            filter,
            false,
            logs.clone(),
        ));
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Wait until some line contains `needle`.
    pub async fn wait_for_text(&self, needle: &str) {
        loop {
            let written = self.written.notified();
            if self.text().contains(needle) {
                return;
            }
            written.await;
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes.lock()).into_owned()
    }

    pub fn access(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.bytes.lock())
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"] == ACCESS_TARGET)
            .collect()
    }

    /// Wait for `n` access-log lines: a request is logged when its
    /// response body is dropped, just after the client saw its end.
    pub async fn wait_for_access(&self, n: usize) -> Vec<Value> {
        tokio::time::timeout(DEADLINE, async {
            loop {
                let written = self.written.notified();
                let lines = self.access();
                if lines.len() >= n {
                    return lines;
                }
                written.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("expected {n} access-log lines, got {:?}", self.access()))
    }
}
