//! The API server double against real kube-rs clients and reflectors.

use std::time::Duration;

use futures_util::StreamExt;
use infergate_kube::testing::{ApiServer, Resource, Verb, pod};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

const NS: &str = "ml";
const PODS: &str = "/api/v1/namespaces/ml/pods";
const WAIT: Duration = Duration::from_secs(10);

fn rv(object: &serde_json::Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn list_selects_by_label_with_real_resource_versions() {
    let server = ApiServer::start().await;
    let a = server.put(
        &Resource::PODS,
        NS,
        pod("a", Some("10.0.0.1"), &[("app", "vllm")], true),
    );
    let b = server.put(
        &Resource::PODS,
        NS,
        pod("b", Some("10.0.0.2"), &[("app", "vllm")], true),
    );
    server.put(
        &Resource::PODS,
        NS,
        pod("c", Some("10.0.0.3"), &[("app", "other")], true),
    );
    server.put(
        &Resource::PODS,
        "elsewhere",
        pod("d", None, &[("app", "vllm")], true),
    );
    assert!(rv(&b) > rv(&a));

    let api: Api<Pod> = Api::namespaced(server.client(), NS);
    let list = api
        .list(&ListParams::default().labels("app=vllm"))
        .await
        .unwrap();
    let names: Vec<_> = list
        .items
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert_eq!(list_rv, server.resource_version());
    assert_eq!(
        list.items[0].status.as_ref().unwrap().pod_ip.as_deref(),
        Some("10.0.0.1")
    );
    assert_eq!(server.requests(Verb::List, PODS), 1);

    let missing = api.get("nope").await.unwrap_err();
    assert!(
        matches!(missing, kube::Error::Api(ref s) if s.code == 404),
        "{missing:?}"
    );
}

/// A reflector over the pods labelled app=vllm, driven in the background.
fn reflect(server: &ApiServer) -> reflector::Store<Pod> {
    let api: Api<Pod> = Api::namespaced(server.client(), NS);
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default().labels("app=vllm")),
    );
    tokio::spawn(stream.default_backoff().for_each(|_| async {}));
    reader
}

fn names(store: &reflector::Store<Pod>) -> Vec<String> {
    let mut names: Vec<_> = store
        .state()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    names
}

async fn wait_names(store: &reflector::Store<Pod>, want: &[&str]) {
    let end = tokio::time::Instant::now() + WAIT;
    while names(store) != want {
        assert!(
            tokio::time::Instant::now() < end,
            "store has {:?}, want {want:?}",
            names(store)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_cut_watch_resumes_from_its_resource_version_without_a_relist() {
    let server = ApiServer::start().await;
    server.put(
        &Resource::PODS,
        NS,
        pod("a", Some("10.0.0.1"), &[("app", "vllm")], true),
    );
    let store = reflect(&server);
    store.wait_until_ready().await.unwrap();
    wait_names(&store, &["a"]).await;
    server
        .wait_for("a watch", WAIT, |s| s.open_watches() == 1)
        .await;

    server.cut_watches();
    server.put(
        &Resource::PODS,
        NS,
        pod("b", Some("10.0.0.2"), &[("app", "vllm")], true),
    );
    wait_names(&store, &["a", "b"]).await;
    assert_eq!(
        server.requests(Verb::List, PODS),
        1,
        "resumed without listing again"
    );
    assert!(server.requests(Verb::Watch, PODS) >= 2);

    // A label change out of the selection reaches the watch as DELETED.
    server.put(
        &Resource::PODS,
        NS,
        pod("a", Some("10.0.0.1"), &[("app", "retired")], true),
    );
    wait_names(&store, &["b"]).await;
}

#[tokio::test]
async fn a_watch_from_before_a_compaction_gets_410_and_the_reflector_relists() {
    let server = ApiServer::start().await;
    server.put(
        &Resource::PODS,
        NS,
        pod("a", Some("10.0.0.1"), &[("app", "vllm")], true),
    );
    let store = reflect(&server);
    store.wait_until_ready().await.unwrap();
    server
        .wait_for("a watch", WAIT, |s| s.open_watches() == 1)
        .await;

    // The open watch misses a change, history is compacted, the watch
    // drops: resuming from its version must fail with 410.
    server.set_silent(true);
    server.put(
        &Resource::PODS,
        NS,
        pod("b", Some("10.0.0.2"), &[("app", "vllm")], true),
    );
    server.compact();
    server.cut_watches();
    server.set_silent(false);

    wait_names(&store, &["a", "b"]).await;
    assert_eq!(
        server.requests(Verb::List, PODS),
        2,
        "relisted once after 410"
    );

    // Straight from the API: the 410 is a watch ERROR event with Status.
    let api: Api<Pod> = Api::namespaced(server.client(), NS);
    let mut events = api
        .watch(&WatchParams::default(), "1")
        .await
        .unwrap()
        .boxed();
    match events.next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!(e.code, 410);
            assert_eq!(e.reason, "Expired");
        }
        other => panic!("expected a 410, got {other:?}"),
    }
}

#[tokio::test]
async fn watches_send_bookmarks_at_the_version_they_have_seen() {
    let server = ApiServer::start().await;
    server.set_bookmark_interval(Duration::from_millis(50));
    server.put(
        &Resource::PODS,
        NS,
        pod("a", Some("10.0.0.1"), &[("app", "vllm")], true),
    );
    let api: Api<Pod> = Api::namespaced(server.client(), NS);
    let from = server.resource_version().to_string();
    let mut events = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    // A change to another kind moves the version a bookmark carries.
    server.put(
        &Resource::LEASES,
        NS,
        json!({"metadata": {"name": "l"}, "spec": {}}),
    );
    let want = server.resource_version().to_string();
    loop {
        match tokio::time::timeout(WAIT, events.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Bookmark(b) if b.metadata.resource_version == want => break,
            WatchEvent::Bookmark(_) => continue,
            other => panic!("expected only bookmarks, got {other:?}"),
        }
    }
}

fn configs(server: &ApiServer) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "infergate.dev".into(),
        version: "v1alpha1".into(),
        api_version: "infergate.dev/v1alpha1".into(),
        kind: "InferenceGatewayConfig".into(),
        plural: "inferencegatewayconfigs".into(),
    };
    Api::namespaced_with(server.client(), NS, &resource)
}

#[tokio::test]
async fn status_is_a_subresource_and_generation_follows_the_spec() {
    let server = ApiServer::start().await;
    let api = configs(&server);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "infergate.dev/v1alpha1",
        "kind": "InferenceGatewayConfig",
        "metadata": {"name": "gw"},
        "spec": {"pools": []},
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &object).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));

    let status = json!({"status": {"observedGeneration": 1, "conditions": [{"type": "Accepted", "status": "True"}]}});
    let patched = api
        .patch_status("gw", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    assert_eq!(
        patched.metadata.generation,
        Some(1),
        "status writes keep the generation"
    );
    assert_eq!(patched.data["status"]["conditions"][0]["type"], "Accepted");
    assert!(
        patched
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > created
                .metadata
                .resource_version
                .as_deref()
                .unwrap()
                .parse::<u64>()
                .unwrap()
    );

    // Server-side apply of a new spec: generation moves, status stays.
    let apply = json!({
        "apiVersion": "infergate.dev/v1alpha1",
        "kind": "InferenceGatewayConfig",
        "metadata": {"name": "gw"},
        "spec": {"pools": [{"name": "p"}]},
        "status": {"conditions": []},
    });
    let applied = api
        .patch(
            "gw",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&apply),
        )
        .await
        .unwrap();
    assert_eq!(applied.metadata.generation, Some(2));
    assert_eq!(applied.data["status"]["conditions"][0]["type"], "Accepted");

    // Replace with a stale resourceVersion is a conflict.
    let mut stale = created.clone();
    stale.data["spec"] = json!({"pools": [{"name": "q"}]});
    let conflict = api
        .replace("gw", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    assert!(
        matches!(conflict, kube::Error::Api(ref s) if s.code == 409),
        "{conflict:?}"
    );

    // Apply creates what does not exist yet, under the URL's name.
    let mismatch = api
        .patch("other", &PatchParams::apply("test"), &Patch::Apply(&apply))
        .await
        .unwrap_err();
    assert!(
        matches!(mismatch, kube::Error::Api(ref s) if s.code == 400),
        "{mismatch:?}"
    );
    let mut other = apply.clone();
    other["metadata"]["name"] = json!("other");
    let fresh = api
        .patch("other", &PatchParams::apply("test"), &Patch::Apply(&other))
        .await
        .unwrap();
    assert_eq!(fresh.metadata.generation, Some(1));
}
