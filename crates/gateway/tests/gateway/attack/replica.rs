//! A recording replica: a raw TCP listener that keeps every byte each
//! connection brought, parses the requests in them strictly
//! ([`super::wire`]), and answers each with raw bytes a per-test script
//! chooses, so a test can make the replica misbehave byte by byte.
//! `GET /metrics` is answered with an idle vLLM exposition and is not
//! counted as a request.

use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use super::wire::{self, Parsed};

/// What the replica does with a request it received in full.
pub enum Answer {
    /// Write these bytes; the connection stays open for more requests.
    Send(Vec<u8>),
    /// Write these bytes, then close the connection.
    SendAndClose(Vec<u8>),
    /// Write these bytes, wait until the test notifies, then close.
    SendThenCloseOn(Vec<u8>, Arc<Notify>),
    /// Close the connection without answering.
    Close,
}

/// A request as the replica saw it arrive.
#[derive(Debug, Clone)]
pub struct Seen {
    pub request: wire::Request,
    /// Which connection (in accept order) carried it.
    pub conn: usize,
    /// Its place on that connection: 0 for the first request.
    pub on_conn: usize,
    /// Its place among every request this replica received: 0 for the first.
    pub nth: usize,
}

/// Chooses the answer to each request.
pub type Script = Arc<dyn Fn(&Seen) -> Answer + Send + Sync>;

/// 200 with a small JSON body naming the request's arrival order, kept
/// alive: what a well-behaved replica answers.
pub fn ok(seen: &Seen) -> Answer {
    Answer::Send(ok_bytes(seen.nth))
}

pub fn ok_bytes(nth: usize) -> Vec<u8> {
    let body = format!(r#"{{"object":"ok","seen":{}}}"#, nth + 1);
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The same bytes to every request; the connection is closed after each
/// if `close`.
pub fn always(bytes: &[u8], close: bool) -> Script {
    let bytes = bytes.to_vec();
    Arc::new(move |_| {
        if close {
            Answer::SendAndClose(bytes.clone())
        } else {
            Answer::Send(bytes.clone())
        }
    })
}

pub struct RecordingReplica {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    script: Script,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Every byte each connection brought, in accept order.
    conns: Vec<Vec<u8>>,
    /// How much of each connection's bytes parsed as whole requests.
    parsed: Vec<usize>,
    /// Requests to each connection so far.
    on_conn: Vec<usize>,
    seen: Vec<Seen>,
    /// Bytes that were not a valid request, per connection.
    problems: Vec<String>,
}

impl RecordingReplica {
    pub async fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            script,
            state: Mutex::new(State::default()),
        });
        let accepting = Arc::clone(&shared);
        let task = tokio::spawn(async move {
            // Connections live in the accept task's set: aborting the task
            // closes them.
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let id = {
                    let mut state = accepting.state.lock();
                    state.conns.push(Vec::new());
                    state.parsed.push(0);
                    state.on_conn.push(0);
                    state.conns.len() - 1
                };
                while conns.try_join_next().is_some() {}
                conns.spawn(Arc::clone(&accepting).serve(stream, id));
            }
        });
        Self { addr, shared, task }
    }

    /// Every request received, in arrival order (scrapes not counted).
    pub fn seen(&self) -> Vec<Seen> {
        self.shared.state.lock().seen.clone()
    }

    /// Whatever was received that is not a whole, valid request: bytes
    /// that do not parse, or a request cut short. Checked once the test
    /// knows the gateway is done sending.
    pub fn problems(&self) -> Vec<String> {
        let state = self.shared.state.lock();
        let mut problems = state.problems.clone();
        for (i, (bytes, &parsed)) in state.conns.iter().zip(&state.parsed).enumerate() {
            if parsed < bytes.len() && !state.problems.iter().any(|p| p.starts_with(&conn(i))) {
                problems.push(format!(
                    "{}: {} bytes after the last whole request: {}",
                    conn(i),
                    bytes.len() - parsed,
                    wire::preview(&bytes[parsed..], 200)
                ));
            }
        }
        problems
    }
}

impl Drop for RecordingReplica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn conn(i: usize) -> String {
    format!("connection {i}")
}

impl Shared {
    async fn serve(self: Arc<Self>, mut stream: TcpStream, id: usize) {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            self.state.lock().conns[id].extend_from_slice(&chunk[..n]);
            // Every request now complete, in order.
            loop {
                let next = {
                    let mut state = self.state.lock();
                    let from = state.parsed[id];
                    match wire::request(&state.conns[id][from..]) {
                        Parsed::Complete(request, len) => {
                            state.parsed[id] += len;
                            if request.method == "GET" && request.target == "/metrics" {
                                Some(Answer::Send(metrics()))
                            } else {
                                let seen = Seen {
                                    request,
                                    conn: id,
                                    on_conn: state.on_conn[id],
                                    nth: state.seen.len(),
                                };
                                state.on_conn[id] += 1;
                                state.seen.push(seen.clone());
                                Some((self.script)(&seen))
                            }
                        }
                        Parsed::Partial => None,
                        Parsed::Invalid(e) => {
                            state.problems.push(format!("{}: {e}", conn(id)));
                            return;
                        }
                    }
                };
                let Some(answer) = next else { break };
                match answer {
                    Answer::Send(bytes) => {
                        if stream.write_all(&bytes).await.is_err() {
                            return;
                        }
                    }
                    Answer::SendAndClose(bytes) => {
                        let _ = stream.write_all(&bytes).await;
                        let _ = stream.shutdown().await;
                        return;
                    }
                    Answer::SendThenCloseOn(bytes, release) => {
                        let _ = stream.write_all(&bytes).await;
                        release.notified().await;
                        let _ = stream.shutdown().await;
                        return;
                    }
                    Answer::Close => return,
                }
            }
        }
    }
}

/// `/metrics` of an idle vLLM replica, for pools that scrape.
fn metrics() -> Vec<u8> {
    let body = "# TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 0\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0\n\
         # TYPE vllm:lora_requests_info gauge\n\
         vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\"} 1.7e9\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"10000\"} 1.0\n";
    format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
