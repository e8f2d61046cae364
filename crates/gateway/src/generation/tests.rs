use super::*;

fn spec(pools: &str) -> config::Spec {
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners:\n    - {{name: public, address: \"127.0.0.1:0\"}}\n  pools:\n{pools}"
    );
    config::validated(config::from_yaml(&yaml).unwrap())
        .unwrap()
        .spec
}

fn pool(name: &str, protocol: &str, addrs: &[&str]) -> String {
    format!(
        "    - {{name: {name}, engine: none, protocol: {protocol}, models: [{name}-m], endpoints: [{}]}}\n",
        addrs.join(", ")
    )
}

fn endpoints(generation: &Generation, pool: &str) -> Vec<Arc<picker::Endpoint>> {
    generation
        .pool(pool)
        .unwrap()
        .runtime()
        .picker()
        .endpoints()
        .to_vec()
}

#[tokio::test]
async fn a_replica_that_stays_keeps_its_endpoint_and_a_newcomer_gets_a_new_id() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(2);
    let first = runtimes
        .build(
            &spec(&pool("p", "http1", &["127.0.0.1:1", "127.0.0.1:2"])),
            &metrics,
        )
        .unwrap();
    let before = endpoints(&first, "p");
    let held = before[1].acquire(10);

    let second = runtimes
        .build(
            &spec(&pool("p", "http1", &["127.0.0.1:2", "127.0.0.1:3"])),
            &metrics,
        )
        .unwrap();
    let after = endpoints(&second, "p");
    assert!(Arc::ptr_eq(&before[1], &after[0]), "127.0.0.1:2 stays");
    assert_eq!(after[0].load.requests(), 1, "its load carries over");
    assert_eq!(&*after[1].addr, "127.0.0.1:3");
    assert!(
        before.iter().all(|e| e.index != after[1].index),
        "ids are never reused"
    );
    assert!(Arc::ptr_eq(
        first.pool("p").unwrap().runtime().picker(),
        second.pool("p").unwrap().runtime().picker()
    ));
    drop(held);
    assert_eq!(after[0].load.requests(), 0);
}

#[tokio::test]
async fn a_pool_starts_afresh_when_its_protocol_changes_and_leaves_when_removed() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let first = runtimes
        .build(
            &spec(&(pool("p", "http1", &["127.0.0.1:1"]) + &pool("q", "http1", &["127.0.0.1:2"]))),
            &metrics,
        )
        .unwrap();
    let second = runtimes
        .build(&spec(&pool("p", "h2c", &["127.0.0.1:1"])), &metrics)
        .unwrap();
    assert!(!Arc::ptr_eq(
        first.pool("p").unwrap().runtime().picker(),
        second.pool("p").unwrap().runtime().picker()
    ));
    assert!(second.pool("q").is_none());
    assert!(second.routes.resolve("q-m").is_err());
    assert!(second.routes.resolve("p-m").is_ok());
    // The old generation still serves its requests with the old pool.
    assert!(first.routes.resolve("q-m").is_ok());
    let exported = metrics.encode();
    assert!(
        exported.contains("infergate_pool_endpoints{pool=\"p\"} 1"),
        "{exported}"
    );
    assert!(
        !exported.contains("infergate_pool_endpoints{pool=\"q\"}"),
        "a removed pool's live gauges are no longer exported"
    );
}

fn draining_pool(addrs: &[&str], deadline: &str) -> String {
    format!(
        "    - {{name: p, engine: none, models: [p-m], endpoints: [{}], drain: {{deadline: {deadline}}}}}\n",
        addrs.join(", ")
    )
}

/// Let the drain tasks run until `done` holds (they are woken by
/// releases and timers, not by this loop).
async fn settle(done: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the drain tasks never got there");
}

#[tokio::test]
async fn a_removed_replica_drains_until_its_last_request_ends_then_is_forgotten() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let first = runtimes
        .build(
            &spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "1h")),
            &metrics,
        )
        .unwrap();
    let leaver = Arc::clone(&endpoints(&first, "p")[1]);
    let held = leaver.acquire(10);
    let idle = Arc::clone(&endpoints(&first, "p")[0]);

    let second = runtimes
        .build(&spec(&draining_pool(&["127.0.0.1:1"], "1h")), &metrics)
        .unwrap();
    let runtime = second.pool("p").unwrap().runtime();
    assert!(leaver.draining() && !leaver.evacuating());
    assert!(!idle.draining());
    let draining = runtime.draining();
    assert_eq!(draining.len(), 1);
    assert_eq!(&*draining[0].addr, "127.0.0.1:2");
    assert_eq!(draining[0].why, super::drain::Why::Removed);
    assert!(!draining[0].member);
    assert_eq!(draining[0].inflight, 1);
    assert_eq!(runtime.draining_counts(), (1, 0));
    assert!(runtime.replica("127.0.0.1:2").is_some(), "still found");

    drop(held);
    settle(|| runtime.draining().is_empty()).await;
    assert!(runtime.replica("127.0.0.1:2").is_none(), "forgotten");
    assert_eq!(runtime.draining_counts(), (0, 0));
}

#[tokio::test]
async fn a_removed_replica_with_nothing_in_flight_is_forgotten_at_once() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    runtimes
        .build(
            &spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "1h")),
            &metrics,
        )
        .unwrap();
    let second = runtimes
        .build(&spec(&draining_pool(&["127.0.0.1:1"], "1h")), &metrics)
        .unwrap();
    assert!(second.pool("p").unwrap().runtime().draining().is_empty());
}

#[tokio::test(start_paused = true)]
async fn at_the_deadline_a_leaving_replica_is_evacuated_and_forgotten_when_idle() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let first = runtimes
        .build(
            &spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "5s")),
            &metrics,
        )
        .unwrap();
    let leaver = Arc::clone(&endpoints(&first, "p")[1]);
    let held = leaver.acquire(10);
    let second = runtimes
        .build(&spec(&draining_pool(&["127.0.0.1:1"], "5s")), &metrics)
        .unwrap();
    let runtime = second.pool("p").unwrap().runtime();
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(!leaver.evacuating(), "before the deadline");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(leaver.evacuating(), "at the deadline");
    assert_eq!(runtime.draining()[0].evacuate_in, None);
    assert_eq!(runtime.draining_counts(), (1, 1));
    drop(held);
    settle(|| runtime.draining().is_empty()).await;
}

#[tokio::test]
async fn a_leaving_replica_that_comes_back_is_the_same_endpoint_serving_again() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let both = spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "1h"));
    let first = runtimes.build(&both, &metrics).unwrap();
    let leaver = Arc::clone(&endpoints(&first, "p")[1]);
    let held = leaver.acquire(10);
    runtimes
        .build(&spec(&draining_pool(&["127.0.0.1:1"], "1h")), &metrics)
        .unwrap();
    assert!(leaver.draining());

    let third = runtimes.build(&both, &metrics).unwrap();
    let back = &endpoints(&third, "p")[1];
    assert!(Arc::ptr_eq(back, &leaver), "its id and load carry over");
    assert!(!back.draining());
    assert_eq!(back.load.requests(), 1);
    let runtime = third.pool("p").unwrap().runtime();
    assert!(runtime.draining().is_empty(), "its drain is cancelled");
    drop(held);
    // Nothing forgets it when its request ends.
    tokio::task::yield_now().await;
    assert!(runtime.replica("127.0.0.1:2").unwrap().member);
}

#[tokio::test(start_paused = true)]
async fn a_terminating_replica_is_evacuated_before_its_pod_is_killed() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let first = runtimes
        .build(
            &spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "1h")),
            &metrics,
        )
        .unwrap();
    let runtime = first.pool("p").unwrap().runtime();
    let leaver = Arc::clone(&endpoints(&first, "p")[1]);
    let _held = leaver.acquire(10);
    // Killed in 10 s: evacuated KILL_MARGIN before, long before the
    // pool's hour.
    let kill = std::time::SystemTime::now() + std::time::Duration::from_secs(10);
    let terminating = pool::Terminating::from([("127.0.0.1:2".to_owned(), kill)]);
    runtime.set_replicas(
        &["127.0.0.1:1".to_owned()],
        &terminating,
        HashMap::new(),
        &metrics,
    );
    let draining = runtime.draining();
    assert_eq!(draining[0].why, super::drain::Why::Terminating);
    let evacuate_in = draining[0].evacuate_in.unwrap();
    assert!(
        evacuate_in <= std::time::Duration::from_secs(10) - pool::KILL_MARGIN,
        "{evacuate_in:?}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(7)).await;
    assert!(!leaver.evacuating());
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(leaver.evacuating());
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_left_is_evacuated_sooner_when_its_pod_starts_terminating() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let first = runtimes
        .build(
            &spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "1h")),
            &metrics,
        )
        .unwrap();
    let runtime = first.pool("p").unwrap().runtime();
    let leaver = Arc::clone(&endpoints(&first, "p")[1]);
    let _held = leaver.acquire(10);
    let one = ["127.0.0.1:1".to_owned()];
    // Not ready first (it leaves for the pool's hour)...
    runtime.set_replicas(&one, &pool::Terminating::new(), HashMap::new(), &metrics);
    assert!(runtime.draining()[0].evacuate_in.unwrap() > std::time::Duration::from_secs(3000));
    // ...then terminating, killed in 5 s.
    let kill = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
    let terminating = pool::Terminating::from([("127.0.0.1:2".to_owned(), kill)]);
    runtime.set_replicas(&one, &terminating, HashMap::new(), &metrics);
    assert_eq!(runtime.draining()[0].why, super::drain::Why::Terminating);
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    assert!(leaver.evacuating());
}

#[tokio::test]
async fn a_drain_by_hand_holds_until_undone_even_across_leaving_and_coming_back() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let both = spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "1h"));
    let first = runtimes.build(&both, &metrics).unwrap();
    let runtime = first.pool("p").unwrap().runtime();
    let replica = Arc::clone(&endpoints(&first, "p")[1]);

    let state = runtime.drain("127.0.0.1:2", false).unwrap();
    assert!(state.member && state.draining && !state.evacuating);
    assert_eq!(state.drain.unwrap().why, super::drain::Why::ByHand);
    assert!(replica.draining());
    assert_eq!(runtime.draining_counts(), (1, 0));
    assert!(runtime.drain("127.0.0.1:9", false).is_none(), "unknown");

    // Evacuate: its streams move now.
    let state = runtime.drain("127.0.0.1:2", true).unwrap();
    assert!(state.evacuating);
    assert_eq!(runtime.draining_counts(), (1, 1));

    // It leaves (idle: forgotten at once) and comes back: still drained.
    runtimes
        .build(&spec(&draining_pool(&["127.0.0.1:1"], "1h")), &metrics)
        .unwrap();
    let third = runtimes.build(&both, &metrics).unwrap();
    let back = Arc::clone(&endpoints(&third, "p")[1]);
    assert!(back.draining(), "drained by hand until undone");

    let state = runtime.undrain("127.0.0.1:2").unwrap();
    assert!(!state.draining && !state.evacuating && state.drain.is_none());
    assert!(!back.draining());
    assert!(runtime.draining().is_empty());
}

#[tokio::test]
async fn undoing_a_drain_by_hand_does_not_bring_back_a_replica_that_left() {
    let metrics = Metrics::new();
    let mut runtimes = Runtimes::new(1);
    let first = runtimes
        .build(
            &spec(&draining_pool(&["127.0.0.1:1", "127.0.0.1:2"], "1h")),
            &metrics,
        )
        .unwrap();
    let runtime = first.pool("p").unwrap().runtime();
    let leaver = Arc::clone(&endpoints(&first, "p")[1]);
    let _held = leaver.acquire(10);
    runtimes
        .build(&spec(&draining_pool(&["127.0.0.1:1"], "1h")), &metrics)
        .unwrap();
    // A replica still leaving can be evacuated by hand...
    let state = runtime.drain("127.0.0.1:2", true).unwrap();
    assert!(!state.member && state.evacuating);
    // ...and undoing that leaves it leaving.
    let state = runtime.undrain("127.0.0.1:2").unwrap();
    assert!(!state.member && state.draining);
}
