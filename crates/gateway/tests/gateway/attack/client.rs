//! The attacker's side: a gateway started in front of recording replicas
//! ([`Lab`]), and raw TCP clients that write exact bytes and read the
//! gateway's exact answer ([`RawConn`]). Every wait is bounded.

use std::net::SocketAddr;
use std::time::Duration;

use gateway::Gateway;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

use super::replica::{RecordingReplica, Script, Seen};
use super::wire::{self, Fields, Parsed, Response};
use crate::support::{self, CHAT};

/// How long any one answer may take before the case fails.
pub const WAIT: Duration = Duration::from_secs(5);

/// A gateway in front of recording replicas: one pool `p` serving model
/// `m`, round-robin over the replicas, no metrics (reachability only).
pub struct Lab {
    pub gw: Gateway,
    pub replicas: Vec<RecordingReplica>,
}

impl Lab {
    /// `spec` adds lines to `spec:` (indented two spaces, each ending in a
    /// newline); `pool` adds fields to the pool's flow mapping (each
    /// starting with `, `).
    pub async fn start(spec: &str, pool: &str, scripts: Vec<Script>) -> Self {
        let mut replicas = Vec::new();
        for script in scripts {
            replicas.push(RecordingReplica::start(script).await);
        }
        let endpoints: Vec<String> = replicas.iter().map(|r| r.addr.to_string()).collect();
        let gw = start_gateway(spec, &endpoints, pool).await;
        Self { gw, replicas }
    }

    pub fn addr(&self) -> SocketAddr {
        self.gw.addr()
    }

    /// A well-formed request on a fresh connection, answered 200 once the
    /// replica has it. Whatever an earlier exchange made the gateway send
    /// upstream has been sent by the time this is answered: a barrier
    /// awaited, not slept.
    pub async fn sentinel(&self) -> Result<(), String> {
        let answers = exchange(self.addr(), &post(CHAT, "", SENTINEL), 1)
            .await
            .map_err(|e| format!("sentinel request after the case: {e}"))?;
        match answers.responses[0].status {
            200 => Ok(()),
            s => Err(format!(
                "sentinel request after the case got {s}: {}",
                answers.responses[0].summary()
            )),
        }
    }

    /// What the replicas received, the sentinel taken out; an error if any
    /// replica received bytes that are not whole, valid requests.
    pub fn upstream(&self) -> Result<Vec<Seen>, String> {
        let mut all = Vec::new();
        for (i, r) in self.replicas.iter().enumerate() {
            let problems = r.problems();
            if !problems.is_empty() {
                return Err(format!("replica {i} received garbage: {problems:?}"));
            }
            all.extend(r.seen());
        }
        let sentinels = all.iter().filter(|s| s.request.body == SENTINEL.as_bytes());
        match sentinels.count() {
            0 => {}
            1 => all.retain(|s| s.request.body != SENTINEL.as_bytes()),
            n => {
                return Err(format!(
                    "the sentinel request reached the replicas {n} times"
                ));
            }
        }
        Ok(all)
    }
}

const SENTINEL: &str = r#"{"model":"m","sentinel":true}"#;

/// A gateway over `endpoints`, its config read from YAML and validated.
pub async fn start_gateway(spec: &str, endpoints: &[String], pool: &str) -> Gateway {
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let pools = support::plain_pool(&endpoints, pool);
    let config = config::validated(support::config(spec, &pools))
        .unwrap_or_else(|e| panic!("test config refused: {e}\n{spec}{pools}"));
    Gateway::start(&config).await.expect("gateway starts")
}

/// A `POST` of `body` to `path` on HTTP/1.1, with `extra` header lines
/// (each ending in CRLF) and `Connection: close`.
pub fn post(path: &str, extra: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n{extra}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The gateway's answers to one write of raw bytes.
pub struct Exchanged {
    pub responses: Vec<Response>,
    /// Interim (1xx) statuses seen before them.
    pub informational: Vec<u16>,
}

/// Write `bytes` on a fresh connection (in the background, so a gateway
/// that stops reading cannot block the test) and read `expected` answers.
/// Then half-close, and read until the gateway closes: any answer beyond
/// `expected` is an error, as is a connection closed early or an answer
/// that is not valid HTTP/1.1.
pub async fn exchange(
    addr: SocketAddr,
    bytes: &[u8],
    expected: usize,
) -> Result<Exchanged, String> {
    let mut conn = RawConn::open(addr).await?;
    let writer = conn.send_in_background(bytes.to_vec());
    let mut responses = Vec::new();
    while responses.len() < expected {
        match conn.answer().await {
            Ok(r) => responses.push(r),
            Err(e) => {
                writer.abort();
                let got: Vec<String> = responses.iter().map(Response::summary).collect();
                return Err(format!(
                    "answer {} of {expected}: {e} (answers before it: {got:?})",
                    responses.len() + 1
                ));
            }
        }
    }
    // Dropping the write half (or the writer task holding it) half-closes.
    writer.abort();
    let _ = writer.await;
    let rest = conn.rest().await?;
    if !rest.is_empty() {
        let extra = match wire::response(&rest, true) {
            Parsed::Complete(r, _) => format!("another answer: {}", r.summary()),
            _ => wire::preview(&rest, 200),
        };
        return Err(format!(
            "after the {expected} expected answer(s) the gateway sent more: {extra}"
        ));
    }
    Ok(Exchanged {
        responses,
        informational: conn.informational,
    })
}

/// One raw client connection.
pub struct RawConn {
    read: OwnedReadHalf,
    write: Option<OwnedWriteHalf>,
    buf: Vec<u8>,
    eof: bool,
    /// Interim (1xx) statuses read so far.
    pub informational: Vec<u16>,
}

impl RawConn {
    pub async fn open(addr: SocketAddr) -> Result<Self, String> {
        let stream = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .map_err(|_| "connecting took over 5 s".to_owned())?
            .map_err(|e| format!("connecting: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        Ok(Self {
            read,
            write: Some(write),
            buf: Vec::new(),
            eof: false,
            informational: Vec::new(),
        })
    }

    /// Write all of `bytes` now.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        let write = self.write.as_mut().ok_or("the write side is closed")?;
        tokio::time::timeout(WAIT, write.write_all(bytes))
            .await
            .map_err(|_| "writing took over 5 s".to_owned())?
            .map_err(|e| format!("writing: {e}"))
    }

    /// Write `bytes` from a task of its own, which owns the write side:
    /// aborting (or finishing) it half-closes the connection.
    pub fn send_in_background(&mut self, bytes: Vec<u8>) -> tokio::task::JoinHandle<()> {
        let mut write = self.write.take().expect("the write side is open");
        tokio::spawn(async move {
            let _ = write.write_all(&bytes).await;
            // Hold the write side open until aborted.
            std::future::pending::<()>().await;
            drop(write);
        })
    }

    /// The next final answer; interim (1xx) ones are noted and skipped.
    pub async fn answer(&mut self) -> Result<Response, String> {
        tokio::time::timeout(WAIT, self.next_answer())
            .await
            .unwrap_or_else(|_| {
                Err(format!(
                    "no whole answer within 5 s; got {}",
                    wire::preview(&self.buf, 300)
                ))
            })
    }

    async fn next_answer(&mut self) -> Result<Response, String> {
        loop {
            match wire::response(&self.buf, self.eof) {
                Parsed::Complete(r, n) => {
                    self.buf.drain(..n);
                    if (100..200).contains(&r.status) {
                        self.informational.push(r.status);
                        continue;
                    }
                    return Ok(r);
                }
                Parsed::Invalid(e) => return Err(format!("not a valid answer: {e}")),
                Parsed::Partial if self.eof && self.buf.is_empty() => {
                    return Err("the gateway closed the connection without an answer".into());
                }
                Parsed::Partial if self.eof => {
                    return Err(format!(
                        "the gateway closed the connection mid-answer: {}",
                        wire::preview(&self.buf, 300)
                    ));
                }
                Parsed::Partial => self.fill().await,
            }
        }
    }

    /// Read until `needle` has arrived (it stays in the buffer).
    pub async fn read_until(&mut self, needle: &[u8]) -> Result<(), String> {
        let wait = async {
            while !self.buf.windows(needle.len()).any(|w| w == needle) {
                if self.eof {
                    return Err(format!(
                        "closed before {} arrived; got {}",
                        wire::preview(needle, 80),
                        wire::preview(&self.buf, 300)
                    ));
                }
                self.fill().await;
            }
            Ok(())
        };
        match tokio::time::timeout(WAIT, wait).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "{} did not arrive within 5 s; got {}",
                wire::preview(needle, 80),
                wire::preview(&self.buf, 300)
            )),
        }
    }

    /// Everything until the gateway closes the connection (a reset counts
    /// as closing), bounded by `wait`.
    pub async fn rest_within(&mut self, wait: Duration) -> Result<Vec<u8>, String> {
        let read = async {
            while !self.eof {
                self.fill().await;
            }
        };
        tokio::time::timeout(wait, read).await.map_err(|_| {
            format!(
                "the gateway kept the connection open for over {wait:?}; got {}",
                wire::preview(&self.buf, 300)
            )
        })?;
        Ok(std::mem::take(&mut self.buf))
    }

    pub async fn rest(&mut self) -> Result<Vec<u8>, String> {
        self.rest_within(WAIT).await
    }

    async fn fill(&mut self) {
        let mut chunk = [0u8; 64 * 1024];
        match self.read.read(&mut chunk).await {
            Ok(0) | Err(_) => self.eof = true,
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The error in `r`'s body has the OpenAI shape
/// `{"error": {"message", "type", "param", "code"}}`.
pub fn openai_error(r: &Response) -> Result<(), String> {
    let body: serde_json::Value = serde_json::from_slice(&r.body).map_err(|e| {
        format!(
            "the {} answer's body is not JSON ({e}): {}",
            r.status,
            r.summary()
        )
    })?;
    check_error_object(&body).map_err(|e| format!("the {} answer: {e}", r.status))?;
    if !r
        .value("content-type")
        .is_some_and(|t| t.starts_with("application/json"))
    {
        return Err(format!(
            "the {} answer's content-type is {:?}",
            r.status,
            r.values("content-type")
        ));
    }
    Ok(())
}

/// `{"error": {"message": string, "type": string, "param", "code"}}`.
pub fn check_error_object(body: &serde_json::Value) -> Result<(), String> {
    let error = body
        .get("error")
        .and_then(|e| e.as_object())
        .ok_or_else(|| format!("no error object in {body}"))?;
    for field in ["message", "type", "param", "code"] {
        if !error.contains_key(field) {
            return Err(format!("no error.{field} in {body}"));
        }
    }
    if !error["message"].is_string() || !error["type"].is_string() {
        return Err(format!(
            "error.message and error.type must be strings: {body}"
        ));
    }
    Ok(())
}
