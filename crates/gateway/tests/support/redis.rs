//! A real Redis for the tests that share limits through one: the
//! distribution's `redis-server`, started on a free port with nothing
//! persisted, and killed when the test is done with it.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    pub url: String,
    child: Child,
}

/// How a TLS Redis is set up: its certificate and key files, and the CA
/// its clients' certificates must chain to when it asks for one.
pub struct TlsFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub client_ca: Option<&'a Path>,
}

fn binary() -> &'static str {
    [
        "redis-server",
        "/usr/bin/redis-server",
        "/usr/sbin/redis-server",
    ]
    .into_iter()
    .find(|b| Command::new(b).arg("--version").output().is_ok())
    .expect(
        "redis-server is not installed: apt-get install redis-server (scripts/test installs it)",
    )
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    pub async fn start() -> Self {
        let port = free_port();
        let child = Command::new(binary())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let addr = format!("127.0.0.1:{port}");
        super::poll_until(
            Duration::from_secs(20),
            "redis-server to answer PING",
            || {
                let addr = addr.clone();
                async move { ping(&addr).await }
            },
        )
        .await;
        Self {
            url: format!("redis://{addr}"),
            child,
        }
    }

    /// A Redis that speaks only TLS (`rediss://`), asking clients for a
    /// certificate when `files.client_ca` is given.
    pub async fn start_tls(files: TlsFiles<'_>) -> Self {
        let port = free_port();
        let mut command = Command::new(binary());
        command
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--tls-cert-file")
            .arg(files.cert)
            .arg("--tls-key-file")
            .arg(files.key);
        match files.client_ca {
            Some(ca) => command
                .arg("--tls-ca-cert-file")
                .arg(ca)
                .args(["--tls-auth-clients", "yes"]),
            None => command.args(["--tls-auth-clients", "no"]),
        };
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let addr = format!("127.0.0.1:{port}");
        super::poll_until(Duration::from_secs(20), "redis-server to listen", || {
            let addr = addr.clone();
            async move {
                tokio::net::TcpStream::connect(&addr)
                    .await
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        })
        .await;
        Self {
            url: format!("rediss://{addr}"),
            child,
        }
    }
}

/// One `PING`, in RESP, answered `+PONG`.
async fn ping(addr: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    conn.write_all(b"PING\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = [0u8; 7];
    conn.read_exact(&mut answer)
        .await
        .map_err(|e| e.to_string())?;
    if &answer == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&answer).into_owned())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
