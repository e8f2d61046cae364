//! Out of file descriptors, the gateway pauses accepting instead of
//! retrying in a busy loop, and accepts again once some are free. A test
//! binary of its own, with one test: it takes every descriptor the process
//! may open.

mod support;

use std::time::{Duration, Instant};

use gateway::Gateway;
use support::descriptors::{DescriptorLimit, open_descriptors};
use support::logs::Logs;
use support::{Behaviour, FakeReplica, HEALTHZ, config, healthz_answered};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

#[tokio::test]
async fn out_of_descriptors_accepting_pauses_and_then_resumes() {
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
