//! The config object against the API server double: its versions are
//! followed, one replica at a time writes its status through the Lease,
//! and another takes over when the holder stops.

use std::time::Duration;

use infergate_kube::config_source::ConfigWatch;
use infergate_kube::lease::{Candidate, LeaseSettings};
use infergate_kube::status::{ACCEPTED, ConfigStatus, PoolStatus, READY};
use infergate_kube::status_writer::{StatusWriter, Verdict, View};
use infergate_kube::testing::{ApiServer, Resource};
use serde_json::{Value, json};

const NS: &str = "infergate";
const NAME: &str = "gw";
const DEADLINE: Duration = Duration::from_secs(20);

fn object(models: &[&str]) -> Value {
    json!({
        "apiVersion": "infergate.dev/v1alpha1",
        "kind": "InferenceGatewayConfig",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {
            "listeners": [{"name": "public", "address": "127.0.0.1:0"}],
            "pools": [{"name": "p", "models": models, "endpoints": ["127.0.0.1:1"]}],
        },
    })
}

fn status(server: &ApiServer) -> Option<ConfigStatus> {
    let object = server.get(&Resource::GATEWAY_CONFIGS, NS, NAME)?;
    serde_json::from_value(object.get("status")?.clone()).ok()
}

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: NS.into(),
        name: format!("{NAME}-status"),
        identity: identity.into(),
        duration: Duration::from_secs(2),
        renew_every: Duration::from_millis(100),
    }
}

fn view(ready_endpoints: u32) -> View {
    View {
        ready: Ok(()),
        pools: vec![PoolStatus {
            name: "p".into(),
            ready_endpoints,
        }],
    }
}

/// Each new spec comes through as a config document the config crate
/// reads; a status write (same spec) does not.
#[tokio::test]
async fn each_new_spec_is_seen_once() {
    let server = ApiServer::start().await;
    server.put(&Resource::GATEWAY_CONFIGS, NS, object(&["m1"]));
    let mut watch = ConfigWatch::new(server.client(), NS, NAME);
    let first = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .unwrap()
        .unwrap();
    let config = config::from_yaml(&first.document).unwrap();
    assert_eq!(config.spec.pools[0].models, ["m1"]);
    assert_eq!(config.metadata.name, NAME);
    assert_eq!(first.generation, Some(1));

    // A status write changes the object, not the spec: nothing new.
    let mut with_status = server.get(&Resource::GATEWAY_CONFIGS, NS, NAME).unwrap();
    with_status["status"] = json!({"observedGeneration": 1});
    server.put(&Resource::GATEWAY_CONFIGS, NS, with_status);
    server.put(&Resource::GATEWAY_CONFIGS, NS, object(&["m2"]));
    let second = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.generation, Some(2));
    let config = config::from_yaml(&second.document).unwrap();
    assert_eq!(config.spec.pools[0].models, ["m2"]);

    // An invalid spec reaches the reader, which names every problem.
    let mut invalid = object(&[]);
    invalid["spec"]["pools"][0]["weight"] = json!(3);
    server.put(&Resource::GATEWAY_CONFIGS, NS, invalid);
    let third = tokio::time::timeout(DEADLINE, watch.next())
        .await
        .unwrap()
        .unwrap();
    let problems = config::from_yaml(&third.document).unwrap_err().to_string();
    assert!(problems.contains("spec.pools[0].weight"), "{problems}");
    assert!(problems.contains("spec.pools[0].models"), "{problems}");
}

/// Two replicas: only the Lease holder writes status (each reports a
/// different view, so the status shows whose it is); when it stops and
/// releases the Lease, the other takes over and writes its own.
#[tokio::test]
async fn only_the_lease_holder_writes_status_and_another_takes_over() {
    let server = ApiServer::start().await;
    server.put(&Resource::GATEWAY_CONFIGS, NS, object(&["m1"]));
    let a = Candidate::start(server.client(), settings("gateway-a"));
    let mut a_holding = a.holding();
    // A first: it holds the Lease before B competes.
    tokio::time::timeout(DEADLINE, a_holding.wait_for(|held| *held))
        .await
        .unwrap()
        .unwrap();
    let b = Candidate::start(server.client(), settings("gateway-b"));
    let writer_a = StatusWriter::start(server.client(), NS, NAME, a.holding());
    let writer_b = StatusWriter::start(server.client(), NS, NAME, b.holding());
    for writer in [&writer_a, &writer_b] {
        writer.report(Verdict {
            generation: Some(1),
            accepted: Ok(()),
        });
    }
    writer_a.observe(view(1));
    writer_b.observe(view(2));

    server
        .wait_for("A's status", DEADLINE, |s| {
            status(s).is_some_and(|st| st.pools.first().is_some_and(|p| p.ready_endpoints == 1))
        })
        .await;
    let lease = server
        .get(&Resource::LEASES, NS, &format!("{NAME}-status"))
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "gateway-a");
    // B renews its view many times over while A holds the Lease: the
    // status stays A's.
    for _ in 0..5 {
        writer_b.observe(view(3));
        writer_b.observe(view(2));
        let b_holding = b.holding();
        assert!(!*b_holding.borrow());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let st = status(&server).unwrap();
        assert_eq!(st.pools[0].ready_endpoints, 1, "only the holder writes");
    }
    let st = status(&server).unwrap();
    assert_eq!(st.condition(ACCEPTED).unwrap().status, "True");
    assert_eq!(st.condition(READY).unwrap().status, "True");

    // A stops: it releases the Lease, B takes it and writes its view,
    // well before the Lease would have expired (2 s).
    drop(writer_a);
    a.release().await;
    let mut b_holding = b.holding();
    tokio::time::timeout(DEADLINE, b_holding.wait_for(|held| *held))
        .await
        .unwrap()
        .unwrap();
    server
        .wait_for("B's status", DEADLINE, |s| {
            status(s).is_some_and(|st| st.pools[0].ready_endpoints == 2)
        })
        .await;
    let lease = server
        .get(&Resource::LEASES, NS, &format!("{NAME}-status"))
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "gateway-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);
}

/// A holder that dies without releasing: the other waits for the Lease to
/// expire, then takes it.
#[tokio::test]
async fn an_expired_lease_is_taken_over() {
    let server = ApiServer::start().await;
    let a = Candidate::start(server.client(), settings("gateway-a"));
    let mut a_holding = a.holding();
    tokio::time::timeout(DEADLINE, a_holding.wait_for(|held| *held))
        .await
        .unwrap()
        .unwrap();
    let b = Candidate::start(server.client(), settings("gateway-b"));
    // Killed: no release.
    drop(a);
    let mut b_holding = b.holding();
    tokio::time::timeout(DEADLINE, b_holding.wait_for(|held| *held))
        .await
        .unwrap()
        .unwrap();
    let lease = server
        .get(&Resource::LEASES, NS, &format!("{NAME}-status"))
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "gateway-b");
}

/// A refused spec: `Accepted` is `False` with the problems, for the
/// generation that was refused.
#[tokio::test]
async fn a_refused_spec_is_in_the_status() {
    let server = ApiServer::start().await;
    server.put(&Resource::GATEWAY_CONFIGS, NS, object(&["m1"]));
    let a = Candidate::start(server.client(), settings("gateway-a"));
    let writer = StatusWriter::start(server.client(), NS, NAME, a.holding());
    writer.observe(view(1));
    writer.report(Verdict {
        generation: Some(2),
        accepted: Err("spec.pools[0].models: at least one model is required".into()),
    });
    server
        .wait_for("a refusal", DEADLINE, |s| {
            status(s).is_some_and(|st| {
                st.condition(ACCEPTED).is_some_and(|c| {
                    c.status == "False" && c.message.contains("spec.pools[0].models")
                })
            })
        })
        .await;
    assert_eq!(status(&server).unwrap().observed_generation, Some(2));
}
