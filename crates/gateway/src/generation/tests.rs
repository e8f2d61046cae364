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
