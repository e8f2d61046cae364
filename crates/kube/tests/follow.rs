//! Following a pool's pods and InferencePool through the API server
//! double: what the watches do on a cut, a compaction, a silent watch and
//! an InferencePool whose selector changes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use infergate_kube::testing::{ApiServer, Resource, Verb, pod};
use infergate_kube::{Replica, Sink};
use parking_lot::Mutex;
use serde_json::json;

const NS: &str = "ml";
const PODS: &str = "/api/v1/namespaces/ml/pods";
const WAIT: Duration = Duration::from_secs(15);

/// Remembers what discovery reported.
#[derive(Default)]
struct Recorder {
    replicas: Mutex<HashMap<String, Vec<Replica>>>,
    up: Mutex<Option<bool>>,
    errors: Mutex<usize>,
}

impl Sink for Recorder {
    fn replicas(&self, pool: &str, replicas: Vec<Replica>) {
        self.replicas.lock().insert(pool.to_owned(), replicas);
    }
    fn reachable(&self, _: &str, up: bool) {
        *self.up.lock() = Some(up);
    }
    fn error(&self, _: &str) {
        *self.errors.lock() += 1;
    }
}

impl Recorder {
    /// The replicas reported ready (terminating ones are leaving).
    fn addrs(&self) -> Option<Vec<String>> {
        self.replicas.lock().get("p").map(|r| {
            r.iter()
                .filter(|r| r.terminating.is_none())
                .map(|r| r.addr.clone())
                .collect()
        })
    }

    fn terminating(&self) -> Vec<String> {
        self.replicas
            .lock()
            .get("p")
            .map(|r| {
                r.iter()
                    .filter(|r| r.terminating.is_some())
                    .map(|r| r.addr.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn wait_addrs(&self, want: &[&str]) {
        let end = tokio::time::Instant::now() + WAIT;
        while self
            .addrs()
            .as_deref()
            .map(|a| a.iter().map(String::as_str).collect::<Vec<_>>())
            != Some(want.to_vec())
        {
            assert!(
                tokio::time::Instant::now() < end,
                "replicas are {:?}, want {want:?}",
                self.addrs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn selector(relist: Duration) -> config::EndpointSelector {
    config::EndpointSelector {
        namespace: NS.into(),
        match_labels: BTreeMap::from([("app".to_owned(), "vllm".to_owned())]),
        port: Some(8000),
        port_name: None,
        relist_interval: Some(relist),
    }
}

fn vllm_pod(name: &str, ip: &str) -> serde_json::Value {
    pod(name, Some(ip), &[("app", "vllm")], true)
}

async fn follow_selector(
    server: &ApiServer,
    relist: Duration,
) -> (Arc<Recorder>, infergate_kube::Task) {
    let recorder = Arc::new(Recorder::default());
    let selector = selector(relist);
    let task = infergate_kube::follow(
        server.client(),
        "p",
        config::Discovery::Selector(&selector),
        recorder.clone(),
    );
    (recorder, task)
}

#[tokio::test]
async fn nothing_is_reported_before_the_first_list_then_every_change_is() {
    let server = ApiServer::start().await;
    server.set_down(true);
    server.put(&Resource::PODS, NS, vllm_pod("a", "10.0.0.1"));
    let (recorder, _task) = follow_selector(&server, Duration::from_secs(3600)).await;
    let end = tokio::time::Instant::now() + WAIT;
    while *recorder.errors.lock() == 0 {
        assert!(
            tokio::time::Instant::now() < end,
            "no error reported while down"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        recorder.addrs(),
        None,
        "no replicas before a list succeeded"
    );
    assert_eq!(*recorder.up.lock(), Some(false));

    server.set_down(false);
    recorder.wait_addrs(&["10.0.0.1:8000"]).await;
    assert_eq!(*recorder.up.lock(), Some(true));

    // Unready, terminating and label-changed pods leave; a Ready one joins.
    server.put(&Resource::PODS, NS, vllm_pod("b", "10.0.0.2"));
    server.put(&Resource::PODS, NS, vllm_pod("c", "10.0.0.3"));
    recorder
        .wait_addrs(&["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"])
        .await;
    server.put(
        &Resource::PODS,
        NS,
        pod("a", Some("10.0.0.1"), &[("app", "vllm")], false),
    );
    recorder
        .wait_addrs(&["10.0.0.2:8000", "10.0.0.3:8000"])
        .await;
    server.mark_terminating(&Resource::PODS, NS, "b");
    recorder.wait_addrs(&["10.0.0.3:8000"]).await;
    // Terminating is leaving, reported with the end of its grace period.
    assert_eq!(recorder.terminating(), ["10.0.0.2:8000"]);
    let end = recorder.replicas.lock()["p"]
        .iter()
        .find_map(|r| r.terminating)
        .unwrap();
    let left = end.duration_since(std::time::SystemTime::now()).unwrap();
    assert!(left > Duration::from_secs(20), "{left:?}");
    server.put(
        &Resource::PODS,
        NS,
        pod("c", Some("10.0.0.3"), &[("app", "other")], true),
    );
    recorder.wait_addrs(&[]).await;
}

#[tokio::test]
async fn a_cut_watch_resumes_without_a_relist() {
    let server = ApiServer::start().await;
    server.put(&Resource::PODS, NS, vllm_pod("a", "10.0.0.1"));
    let (recorder, _task) = follow_selector(&server, Duration::from_secs(3600)).await;
    recorder.wait_addrs(&["10.0.0.1:8000"]).await;
    server
        .wait_for("a watch", WAIT, |s| s.open_watches() == 1)
        .await;

    server.cut_watches();
    server.put(&Resource::PODS, NS, vllm_pod("b", "10.0.0.2"));
    recorder
        .wait_addrs(&["10.0.0.1:8000", "10.0.0.2:8000"])
        .await;
    assert_eq!(server.requests(Verb::List, PODS), 1);
    assert!(server.requests(Verb::Watch, PODS) >= 2);
}

#[tokio::test]
async fn a_compaction_makes_the_resumed_watch_410_and_the_pool_relists() {
    let server = ApiServer::start().await;
    server.put(&Resource::PODS, NS, vllm_pod("a", "10.0.0.1"));
    let (recorder, _task) = follow_selector(&server, Duration::from_secs(3600)).await;
    recorder.wait_addrs(&["10.0.0.1:8000"]).await;
    server
        .wait_for("a watch", WAIT, |s| s.open_watches() == 1)
        .await;

    server.set_silent(true);
    server.delete(&Resource::PODS, NS, "a");
    server.put(&Resource::PODS, NS, vllm_pod("b", "10.0.0.2"));
    server.compact();
    server.cut_watches();
    server.set_silent(false);

    recorder.wait_addrs(&["10.0.0.2:8000"]).await;
    assert_eq!(server.requests(Verb::List, PODS), 2, "one relist after 410");
}

#[tokio::test]
async fn a_silent_watch_is_caught_by_the_periodic_relist() {
    let server = ApiServer::start().await;
    server.put(&Resource::PODS, NS, vllm_pod("a", "10.0.0.1"));
    let relist = Duration::from_millis(500);
    let (recorder, _task) = follow_selector(&server, relist).await;
    recorder.wait_addrs(&["10.0.0.1:8000"]).await;
    server
        .wait_for("a watch", WAIT, |s| s.open_watches() >= 1)
        .await;

    // Every watch stays open and says nothing from now on: only a list can
    // show the new pod.
    server.set_silent(true);
    let lists_before = server.requests(Verb::List, PODS);
    server.put(&Resource::PODS, NS, vllm_pod("b", "10.0.0.2"));
    recorder
        .wait_addrs(&["10.0.0.1:8000", "10.0.0.2:8000"])
        .await;
    assert!(server.requests(Verb::List, PODS) > lists_before);
    server.set_silent(false);
}

#[tokio::test]
async fn an_inference_pool_is_followed_and_its_selector_retargets_the_pods() {
    let server = ApiServer::start().await;
    server.put(
        &Resource::PODS,
        NS,
        pod("a1", Some("10.0.1.1"), &[("app", "a")], true),
    );
    server.put(
        &Resource::PODS,
        NS,
        pod("b1", Some("10.0.2.1"), &[("app", "b")], true),
    );
    let pool = |app: &str, ports: &[u16]| {
        json!({
            "apiVersion": "inference.networking.k8s.io/v1",
            "kind": "InferencePool",
            "metadata": {"name": "llama"},
            "spec": {
                "selector": {"matchLabels": {"app": app}},
                "targetPorts": ports.iter().map(|p| json!({"number": p})).collect::<Vec<_>>(),
                "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
            },
        })
    };
    let recorder = Arc::new(Recorder::default());
    let reference = config::InferencePoolRef {
        name: "llama".into(),
        namespace: NS.into(),
        relist_interval: None,
    };
    let _task = infergate_kube::follow(
        server.client(),
        "p",
        config::Discovery::InferencePool(&reference),
        recorder.clone(),
    );
    // No InferencePool yet: no replicas, reported as such.
    recorder.wait_addrs(&[]).await;

    server.put(&Resource::INFERENCE_POOLS, NS, pool("a", &[8000]));
    recorder.wait_addrs(&["10.0.1.1:8000"]).await;

    server.put(&Resource::INFERENCE_POOLS, NS, pool("b", &[8000, 8001]));
    recorder
        .wait_addrs(&["10.0.2.1:8000", "10.0.2.1:8001"])
        .await;

    // The re-targeted watch follows pods of the new selector only.
    server.put(
        &Resource::PODS,
        NS,
        pod("b2", Some("10.0.2.2"), &[("app", "b")], true),
    );
    server.put(
        &Resource::PODS,
        NS,
        pod("a2", Some("10.0.1.2"), &[("app", "a")], true),
    );
    recorder
        .wait_addrs(&[
            "10.0.2.1:8000",
            "10.0.2.1:8001",
            "10.0.2.2:8000",
            "10.0.2.2:8001",
        ])
        .await;

    server.delete(&Resource::INFERENCE_POOLS, NS, "llama");
    recorder.wait_addrs(&[]).await;
}
