//! The process's limit on open file descriptors: `infergate serve` raises
//! its soft limit to the hard one, and out of descriptors the gateway
//! pauses accepting instead of retrying in a busy loop, and accepts again
//! once some are free.
//!
//! A test binary of its own: these tests change the whole process's limit,
//! and one takes every descriptor the process may open, which would fail
//! any other test running beside it. The two take turns ([`TURN`]).

mod support;

use std::time::{Duration, Instant};

use gateway::Gateway;
use support::logs::Logs;
use support::{Behaviour, FakeReplica, HEALTHZ, config, healthz_answered};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Held for the whole of each test here: each changes the limit the other
/// reads or needs.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[test]
fn the_soft_limit_is_raised_to_the_hard_one() {
    let _turn = TURN.blocking_lock();
    let hard = DescriptorLimit::hard();
    let _restore = DescriptorLimit::lower_to(hard.min(open_descriptors() + 4096) - 1);
    assert!(DescriptorLimit::soft() < hard);
    assert_eq!(gateway::raise_descriptor_limit().unwrap(), hard);
    assert_eq!(DescriptorLimit::soft(), hard);
}

#[tokio::test]
async fn out_of_descriptors_accepting_pauses_and_then_resumes() {
    let _turn = TURN.lock().await;
    let (logs, _guard) = Logs::capture();
    let replica = FakeReplica::start("a", Behaviour::Echo).await;
    let pools = format!(
        "    - {{name: p, engine: none, models: [m], endpoints: [\"{}\"]}}\n",
        replica.addr
    );
    let gw = Gateway::start(&config("", &pools)).await.unwrap();

    // Take every descriptor but one, which the client's socket takes.
    let limit = DescriptorLimit::lower_to(open_descriptors() + 32);
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) => break,
            Err(e) => panic!("{e}"),
        }
    }
    held.pop();
    let mut conn = TcpStream::connect(gw.addr()).await.unwrap();
    conn.write_all(HEALTHZ).await.unwrap();

    // The kernel completed the connection; the gateway cannot accept it.
    tokio::time::timeout(Duration::from_secs(10), logs.wait_for_text("accept failed"))
        .await
        .expect("a failed accept is logged");
    let failing_since = Instant::now();
    drop(held);
    // Accepted and answered once descriptors are free.
    healthz_answered(&mut conn).await;
    let failing_for = failing_since.elapsed();
    drop(limit);

    // One try per pause, not one per turn of a loop.
    let failures = logs.text().matches("accept failed").count() as u128;
    let pauses = failing_for.as_millis() / 100;
    assert!(
        failures <= pauses + 2,
        "{failures} failed accepts in {failing_for:?}"
    );
}

/// The soft limit lowered for a test's span, restored when dropped.
pub struct DescriptorLimit(libc::rlimit);

impl DescriptorLimit {
    pub fn lower_to(soft: u64) -> Self {
        let old = Self::read();
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: old.rlim_max,
        };
        // SAFETY: a plain call on a valid rlimit value.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) }, 0);
        Self(old)
    }

    pub fn soft() -> u64 {
        Self::read().rlim_cur
    }

    pub fn hard() -> u64 {
        Self::read().rlim_max
    }

    fn read() -> libc::rlimit {
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a plain call on a valid rlimit value.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut now) }, 0);
        now
    }
}

impl Drop for DescriptorLimit {
    fn drop(&mut self) {
        // SAFETY: restores the value read before.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &self.0) };
    }
}

/// Descriptors the process has open.
pub fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}
