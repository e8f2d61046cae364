//! The quick global-failover benchmark end to end: three member gateways
//! behind a global router, one killed and restarted under streaming load.
//! Asserts what the global tier promises, with margins wide enough for a
//! busy machine; not how fast anything is.

use std::time::Duration;

use bench::failover::{self, FailoverOptions, analysis};
use bench::scenario::Size;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_global_failover_loses_nothing_and_the_member_comes_back() {
    let options = FailoverOptions::new(Size::Quick, 3);
    let report = failover::run(&options).await.unwrap();
    println!("{}", report.markdown());
    let (t, m) = (&report.timeline, &report.measured);

    assert!(m.requests > 100, "too little traffic: {}", m.requests);
    assert_eq!(m.failed, 0, "requests lost: {:?}", m.errors);
    assert_eq!(
        m.phases.iter().map(|p| p.requests).sum::<usize>(),
        m.requests,
        "the phases partition the requests"
    );
    assert!(m.phases.iter().all(|p| p.ttft_p50_ms.is_some()));

    // Out of rotation within unhealthyAfter (and a margin for the
    // router's 100 ms health tick and the sampling), then nothing until
    // the restart.
    let limit = options.unhealthy_after + analysis::OUT_OF_ROTATION_MARGIN;
    assert!(t.killed_at + limit < t.restarted_at);
    let failover = m.failover_ms.expect("the router was sampled");
    assert!(
        failover <= limit.as_secs_f64() * 1e3,
        "failover took {failover} ms"
    );
    assert!(m.attempts_after_kill > 0.0, "the kill went unnoticed");
    assert_eq!(m.attempts_while_out, 0.0, "requests sent to a dead member");
    assert_eq!(m.victim_share_down, Some(0.0), "answers from a dead member");

    // Back: a fair share again before the run ends, and not all at once.
    let recovery = m
        .recovery_ms
        .expect("the killed member never got its share back");
    assert!(
        recovery <= (options.ramp_up + Duration::from_secs(3)).as_secs_f64() * 1e3,
        "recovery took {recovery} ms"
    );
    let (early, end) = (
        m.victim_share_first_back.unwrap(),
        m.victim_share_end.unwrap(),
    );
    assert!(early < end && early < 0.25, "no ramp: {early} then {end}");
    let before = m.victim_share_before.unwrap();
    assert!(
        (0.2..0.47).contains(&before),
        "uneven before the kill: {before}"
    );

    let dir = tempfile::tempdir().unwrap();
    report.write(dir.path(), failover::NAME).unwrap();
    for ext in ["json", "md", "svg"] {
        let path = dir.path().join(format!("{}.{ext}", failover::NAME));
        assert!(std::fs::metadata(&path).unwrap().len() > 0, "{ext}");
    }
}
