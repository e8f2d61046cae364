//! A real Redis for the tests that share limits through one: the
//! distribution's `redis-server`, started on a free port with nothing
//! persisted, and killed when the test is done with it.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RedisServer {
    pub url: String,
    child: Child,
}

impl RedisServer {
    pub async fn start() -> Self {
        let binary = ["redis-server", "/usr/bin/redis-server", "/usr/sbin/redis-server"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok())
            .expect("redis-server is not installed: apt-get install redis-server (scripts/test installs it)");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
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
