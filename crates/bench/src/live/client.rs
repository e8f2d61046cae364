//! The load generator: open-loop arrivals, one streaming chat request each,
//! measured from the client's side of the socket.
//!
//! Each request is sent at its planned instant whether or not earlier ones
//! have finished (open loop), and its latencies are measured from that
//! planned instant, so a late sender cannot hide queueing. TTFT ends at the
//! first SSE data event; the last token is the last data event before the
//! usage chunk; token and cache counts come from the final `usage` chunk.
//! A request marked with a band carries it as `x-infergate-priority`; the
//! gateway's `x-infergate-queue-wait-ms` and `x-infergate-dropped-reason`
//! are recorded with its outcome.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use config::Priority;
use futures_util::StreamExt;
use serde::Deserialize;
use tokio::time::Instant;

use crate::stats::{Outcome, Refusal};

/// One request to send: when (simulated seconds from the start) and what.
#[derive(Debug, Clone)]
pub struct Planned {
    pub at: f64,
    pub body: Bytes,
    /// Sent as `x-infergate-priority`.
    pub band: Option<Priority>,
}

/// Sends requests and measures them.
#[derive(Debug, Clone)]
pub struct LoadGenerator {
    client: reqwest::Client,
    /// Request `i` of a run goes to `urls[i % len]`.
    urls: Arc<[Arc<str>]>,
    /// Engine seconds per wall second.
    time_scale: f64,
    /// Simulated seconds a client waits for a complete answer.
    timeout: f64,
}

impl LoadGenerator {
    /// `url` is the chat-completions endpoint.
    pub fn new(url: &str, time_scale: f64, timeout: f64) -> anyhow::Result<Self> {
        Self::split(&[url.to_owned()], time_scale, timeout)
    }

    /// Requests split round-robin between the chat-completions endpoints
    /// `urls` (several gateway replicas behind a Service).
    pub fn split(urls: &[String], time_scale: f64, timeout: f64) -> anyhow::Result<Self> {
        anyhow::ensure!(!urls.is_empty(), "a load generator needs a URL");
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .http1_only()
            .pool_max_idle_per_host(usize::MAX)
            .build()?;
        Ok(LoadGenerator {
            client,
            urls: urls.iter().map(|u| Arc::from(u.as_str())).collect(),
            time_scale,
            timeout,
        })
    }

    fn wall(&self, simulated: f64) -> Duration {
        Duration::from_secs_f64(simulated / self.time_scale)
    }

    /// Send every request at its time; return the outcomes in plan order.
    pub async fn run(&self, plan: Vec<Planned>) -> Vec<Outcome> {
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(plan.len());
        for (i, request) in plan.into_iter().enumerate() {
            let due = start + self.wall(request.at);
            tokio::time::sleep_until(due).await;
            let this = self.clone();
            let url = Arc::clone(&self.urls[i % self.urls.len()]);
            tasks.push(tokio::spawn(async move {
                let outcome = this
                    .one(&url, request.at, due, request.body, request.band)
                    .await;
                outcome.in_band(request.band)
            }));
        }
        let mut outcomes = Vec::with_capacity(tasks.len());
        for task in tasks {
            outcomes.push(task.await.unwrap_or_else(|_| Outcome::failed(f64::NAN)));
        }
        outcomes
    }

    /// One request, sent at `due` (wall) = `arrival` (simulated).
    async fn one(
        &self,
        url: &str,
        arrival: f64,
        due: Instant,
        body: Bytes,
        band: Option<Priority>,
    ) -> Outcome {
        let mut progress = Progress::default();
        let deadline = due + self.wall(self.timeout);
        let exchange = self.exchange(url, body, band, &mut progress);
        let ended = tokio::time::timeout_at(deadline, exchange).await;
        let since = |t: Instant| t.duration_since(due).as_secs_f64() * self.time_scale;
        let ttft = progress.first_event.map(since);
        let queue_wait = progress.queue_wait_ms.map(|ms| ms / 1e3 * self.time_scale);
        let outcome = match ended {
            Err(_elapsed) => Outcome::timed_out(arrival, ttft),
            Ok(Ending::Rejected(refusal)) => Outcome::refused(arrival, refusal),
            Ok(Ending::Failed) => Outcome::failed(arrival),
            Ok(Ending::Done(usage)) => match (ttft, progress.last_token) {
                (Some(ttft), Some(last)) => Outcome::completed(
                    arrival,
                    ttft,
                    since(last),
                    usage.completion_tokens,
                    usage.prompt_tokens,
                    usage
                        .prompt_tokens_details
                        .map_or(0, |details| details.cached_tokens),
                ),
                _ => Outcome::failed(arrival),
            },
        };
        outcome.after_queue_wait(queue_wait)
    }

    async fn exchange(
        &self,
        url: &str,
        body: Bytes,
        band: Option<Priority>,
        progress: &mut Progress,
    ) -> Ending {
        let mut request = self
            .client
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(band) = band {
            request = request.header("x-infergate-priority", band.as_str());
        }
        let response = match request.body(body).send().await {
            Ok(r) => r,
            Err(_) => return Ending::Failed,
        };
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok());
        progress.queue_wait_ms = header("x-infergate-queue-wait-ms").and_then(|v| v.parse().ok());
        match response.status().as_u16() {
            200 => {}
            429 => {
                return Ending::Rejected(Refusal::from_reason(header(
                    "x-infergate-dropped-reason",
                )));
            }
            _ => return Ending::Failed,
        }
        let mut stream = response.bytes_stream();
        let mut buffer = BytesMut::new();
        let mut usage = None;
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else {
                return Ending::Failed;
            };
            let now = Instant::now();
            buffer.extend_from_slice(&chunk);
            while let Some(end) = find_event_end(&buffer) {
                let event = buffer.split_to(end + 2);
                match classify(&event) {
                    SseEvent::Done => {
                        return usage.map_or(Ending::Failed, Ending::Done);
                    }
                    SseEvent::Usage(u) => usage = Some(u),
                    SseEvent::Error => return Ending::Failed,
                    SseEvent::Token => {
                        progress.first_event.get_or_insert(now);
                        progress.last_token = Some(now);
                    }
                    SseEvent::Other => {}
                }
            }
        }
        // The stream ended without [DONE]: the replica or the gateway broke it.
        Ending::Failed
    }
}

#[derive(Debug, Default)]
struct Progress {
    first_event: Option<Instant>,
    last_token: Option<Instant>,
    /// The gateway's `x-infergate-queue-wait-ms` (wall time).
    queue_wait_ms: Option<f64>,
}

enum Ending {
    Done(Usage),
    Rejected(Refusal),
    Failed,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
struct Usage {
    prompt_tokens: u32,
    completion_tokens: u32,
    #[serde(default)]
    prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
struct PromptTokensDetails {
    cached_tokens: u32,
}

#[derive(Debug, PartialEq)]
enum SseEvent {
    /// A chunk of the answer (including the opening role chunk and the
    /// closing finish chunk, which arrive with the first and last token).
    Token,
    /// The `include_usage` chunk: no choices, final usage.
    Usage(Usage),
    Error,
    Done,
    /// Comments, keep-alives, anything unrecognised.
    Other,
}

/// End of the first complete event (`\n\n`) in `buffer`.
fn find_event_end(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|w| w == b"\n\n")
}

/// Reads one SSE event without parsing answer chunks (they are most of
/// the traffic); only the usage chunk is parsed.
fn classify(event: &[u8]) -> SseEvent {
    let Some(data) = event
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"data:"))
    else {
        return SseEvent::Other;
    };
    let data = data.trim_ascii();
    if data == b"[DONE]" {
        return SseEvent::Done;
    }
    if data.starts_with(b"{\"error\"") {
        return SseEvent::Error;
    }
    if contains(data, b"\"choices\":[]") {
        #[derive(Deserialize)]
        struct UsageChunk {
            usage: Option<Usage>,
        }
        return match serde_json::from_slice::<UsageChunk>(data) {
            Ok(UsageChunk { usage: Some(usage) }) => SseEvent::Usage(usage),
            _ => SseEvent::Other,
        };
    }
    SseEvent::Token
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_classified() {
        let token = br#"data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" the"}}]}"#;
        assert_eq!(classify(token), SseEvent::Token);
        let usage = br#"data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        assert_eq!(
            classify(usage),
            SseEvent::Usage(Usage {
                prompt_tokens: 12,
                completion_tokens: 8,
                prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: 4 }),
            })
        );
        assert_eq!(classify(b"data: [DONE]"), SseEvent::Done);
        assert_eq!(
            classify(br#"data: {"error": {"message": "boom"}}"#),
            SseEvent::Error
        );
        assert_eq!(classify(b": keep-alive"), SseEvent::Other);
    }

    #[test]
    fn event_boundaries() {
        assert_eq!(find_event_end(b"data: a\n\ndata: b"), Some(7));
        assert_eq!(find_event_end(b"data: a\n"), None);
    }
}
