//! Live runs that follow the simulated engines' own KV events: every
//! replica publishes them over ZMQ on vLLM's wire format, the gateway (or
//! two independent gateways behind the clients' round-robin split)
//! subscribes to each, and scores prefixes by them rather than by its
//! guess.

use std::time::Duration;

use bench::live::{self, GatewayLauncher, LiveOptions, LiveRun};
use bench::routers::RouterUnderTest;
use bench::scenario::{Scenario, Size};
use bench::stats::Status;
use bench::workload::Workload;

/// Conversations on four replicas, a few dozen requests: enough for every
/// replica to store blocks and for later turns to find earlier ones.
async fn run(router: &str) -> LiveRun {
    let scenario = Scenario::named("multi-turn", Size::Quick).unwrap();
    let workload = Workload::new(scenario.workload.clone(), 11);
    let plans: Vec<_> = workload.stream(2.0, 20.0).collect();
    let requests = live::planned(&workload, &plans);
    let options = LiveOptions {
        // A test binary has no `infergate serve` to start; the gateway
        // library is the same code.
        gateway: GatewayLauncher::InProcess,
        time_scale: 10.0,
        // Generous: a busy machine delays the run instead of failing it.
        client_timeout: 600.0,
        ready_timeout: Duration::from_secs(60),
        seed: 11,
        scheduling: None,
    };
    let router: RouterUnderTest = router.parse().unwrap();
    let run = live::run(&scenario.fleet, &router, requests, &options)
        .await
        .unwrap();
    assert!(run.outcomes.len() >= 20, "{} requests", run.outcomes.len());
    let completed = run
        .outcomes
        .iter()
        .filter(|o| o.status == Status::Completed)
        .count() as u64;
    assert_eq!(
        completed,
        run.outcomes.len() as u64,
        "{router}: all answered"
    );
    assert_eq!(
        run.gateways.iter().map(|g| g.completed).sum::<u64>(),
        completed,
        "{router}: every answer came through one of its gateways"
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_runs_follow_the_engines_kv_events_with_one_or_two_gateways() {
    // One gateway: every replica's stream in step at the end, blocks
    // indexed, and picks scored by the events.
    let one = run("infergate:scored-events").await;
    assert_eq!(one.gateways.len(), 1);
    let view = &one.gateways[0];
    assert_eq!(view.prefix_sources, ["events"; 4], "{view:?}");
    assert!(view.indexed_blocks > 0, "{view:?}");
    assert!(view.picks_by_source.get("events") > Some(&0), "{view:?}");

    // Two gateways behind the split: each served half the requests and
    // followed the same four streams itself.
    let two = run("infergate:scored-events@2").await;
    assert_eq!(two.gateways.len(), 2);
    let half = two.outcomes.len() as u64 / 2;
    for view in &two.gateways {
        assert!(view.completed >= half, "{view:?}");
        assert_eq!(view.prefix_sources, ["events"; 4], "{view:?}");
        assert!(view.indexed_blocks > 0, "{view:?}");
        assert!(view.picks_by_source.get("events") > Some(&0), "{view:?}");
    }

    // The approximate index, for contrast: no streams, every pick guessed.
    let guessed = run("infergate:scored@2").await;
    for view in &guessed.gateways {
        assert_eq!(view.prefix_sources, ["approximate"; 4], "{view:?}");
        assert_eq!(view.indexed_blocks, 0, "{view:?}");
        assert_eq!(
            view.picks_by_source.get("events").copied(),
            Some(0),
            "{view:?}"
        );
        assert!(
            view.picks_by_source.get("approximate") > Some(&0),
            "{view:?}"
        );
    }
}
