//! The watches behind a pool: its pods by label, or an InferencePool and
//! then the pods its selector picks. Built on kube-runtime's watcher (it
//! resumes from the last resourceVersion after a disconnect and lists
//! again after `410 Gone`) and reflector store, plus a full relist every
//! `relistInterval` in case a watch stops delivering without closing.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector};
use serde_json::Value;

use crate::replicas::{Ports, replicas};
use crate::sink::{Sink, Task};

type EventStream<K> = Pin<Box<dyn Stream<Item = Result<Event<K>, watcher::Error>> + Send>>;

/// After a failed list or watch, a full list comes at the latest this
/// long after: a watch that resumes quietly (nothing changed) yields no
/// event, and only a list says the API server answers again.
const RELIST_AFTER_ERROR: Duration = Duration::from_secs(5);

/// A watcher that is dropped and started afresh (a full list) every
/// `relist` interval, and soon after an error.
struct Relisting<K: kube::Resource + Clone + 'static> {
    api: Api<K>,
    config: watcher::Config,
    relist: Duration,
    stream: EventStream<K>,
    next_relist: tokio::time::Instant,
}

impl<K> Relisting<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    fn new(api: Api<K>, config: watcher::Config, relist: Duration) -> Self {
        let stream = Self::start(&api, &config);
        Self {
            api,
            config,
            relist,
            stream,
            next_relist: tokio::time::Instant::now() + relist,
        }
    }

    fn start(api: &Api<K>, config: &watcher::Config) -> EventStream<K> {
        watcher::watcher(api.clone(), config.clone())
            .default_backoff()
            .boxed()
    }

    async fn next(&mut self) -> Result<Event<K>, watcher::Error> {
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(self.next_relist) => {
                    tracing::debug!(relist = ?self.relist, "periodic full relist");
                    self.stream = Self::start(&self.api, &self.config);
                    self.next_relist = tokio::time::Instant::now() + self.relist;
                }
                event = self.stream.next() => match event {
                    Some(Err(e)) => {
                        let soon = tokio::time::Instant::now() + RELIST_AFTER_ERROR;
                        self.next_relist = self.next_relist.min(soon);
                        return Err(e);
                    }
                    Some(event) => return event,
                    // The backoff-wrapped watcher never ends; if it does,
                    // start again.
                    None => self.stream = Self::start(&self.api, &self.config),
                },
            }
        }
    }
}

/// Whether the watches of a pool reach the API server, reported on change.
struct Health {
    pool: Arc<str>,
    sink: Arc<dyn Sink>,
    up: Option<bool>,
}

impl Health {
    fn ok(&mut self) {
        if self.up != Some(true) {
            if self.up == Some(false) {
                tracing::info!(pool = %self.pool, "Kubernetes API reachable again");
            }
            self.up = Some(true);
            self.sink.reachable(&self.pool, true);
        }
    }

    fn failed(&mut self, what: &str, error: &watcher::Error) {
        if let watcher::Error::WatchError(status) = error
            && status.code == 410
        {
            // History was compacted past the watch's version: the watcher
            // lists again, as it should. Not an outage.
            tracing::info!(pool = %self.pool, "watch expired (410 Gone); listing again");
            return;
        }
        tracing::warn!(
            pool = %self.pool,
            error = %error,
            "cannot {what}; the pool keeps its last known replicas"
        );
        self.sink.error(&self.pool);
        if self.up != Some(false) {
            self.up = Some(false);
            self.sink.reachable(&self.pool, false);
        }
    }
}

/// Follow the pods `labels` selects in `namespace` until dropped: after the
/// first full list, and on every change, the sink gets the replicas.
pub async fn pods(
    client: Client,
    pool: Arc<str>,
    namespace: String,
    labels: BTreeMap<String, String>,
    ports: Ports,
    relist: Duration,
    sink: Arc<dyn Sink>,
) {
    let selector = labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let mut watch = Relisting::new(api, watcher::Config::default().labels(&selector), relist);
    let (store, mut writer) = reflector::store();
    let mut health = Health {
        pool: pool.clone(),
        sink: sink.clone(),
        up: None,
    };
    let mut listed = false;
    let mut last = None;
    loop {
        match watch.next().await {
            Ok(event) => {
                health.ok();
                writer.apply_watcher_event(&event);
                match event {
                    Event::InitDone => listed = true,
                    Event::Init | Event::InitApply(_) => continue,
                    Event::Apply(_) | Event::Delete(_) => {}
                }
                if !listed {
                    continue;
                }
                let found = replicas(store.state().iter().map(|p| &**p), &ports);
                if last.as_ref() != Some(&found) {
                    let listed = |terminating: bool| {
                        found
                            .iter()
                            .filter(|r| r.terminating.is_some() == terminating)
                            .map(|r| r.addr.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    tracing::info!(
                        pool = %pool,
                        replicas = %listed(false),
                        terminating = %listed(true),
                        "replicas discovered"
                    );
                    sink.replicas(&pool, found.clone());
                    last = Some(found);
                }
            }
            Err(e) => health.failed(
                &format!("watch the pods selected by {selector:?} in {namespace:?}"),
                &e,
            ),
        }
    }
}

/// An InferencePool's target: the pods its selector picks, at its ports.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    labels: BTreeMap<String, String>,
    ports: Vec<u16>,
}

/// Read `spec.selector.matchLabels` and `spec.targetPorts[].number`.
fn target(pool: &DynamicObject) -> Result<Target, String> {
    let spec = pool.data.get("spec").ok_or("it has no spec")?;
    let labels: BTreeMap<String, String> = spec
        .pointer("/selector/matchLabels")
        .and_then(Value::as_object)
        .ok_or("it has no spec.selector.matchLabels")?
        .iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect();
    if labels.is_empty() {
        return Err("its spec.selector.matchLabels is empty".into());
    }
    let ports: Vec<u16> = spec
        .get("targetPorts")
        .and_then(Value::as_array)
        .ok_or("it has no spec.targetPorts")?
        .iter()
        .filter_map(|p| p.get("number")?.as_u64()?.try_into().ok())
        .collect();
    if ports.is_empty() {
        return Err("its spec.targetPorts has no port number".into());
    }
    Ok(Target { labels, ports })
}

pub fn inference_pool_resource() -> ApiResource {
    ApiResource {
        group: "inference.networking.k8s.io".into(),
        version: "v1".into(),
        api_version: "inference.networking.k8s.io/v1".into(),
        kind: "InferencePool".into(),
        plural: "inferencepools".into(),
    }
}

/// Follow an InferencePool, and the pods its selector picks: a change of
/// its selector or ports re-targets the pod watch.
pub async fn inference_pool(
    client: Client,
    pool: Arc<str>,
    namespace: String,
    name: String,
    relist: Duration,
    sink: Arc<dyn Sink>,
) {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &inference_pool_resource());
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut watch = Relisting::new(api, config, relist);
    let mut health = Health {
        pool: pool.clone(),
        sink: sink.clone(),
        up: None,
    };
    let mut current: Option<Target> = None;
    let mut following: Option<Task> = None;
    let mut seen_in_list = false;
    // Whether the sink has heard anything yet: "no InferencePool" after
    // the first list is news too (the pool is listed, and empty).
    let mut reported = false;
    loop {
        let event = match watch.next().await {
            Ok(event) => event,
            Err(e) => {
                health.failed(&format!("watch InferencePool {namespace}/{name}"), &e);
                continue;
            }
        };
        health.ok();
        let object = match event {
            Event::Init => {
                seen_in_list = false;
                continue;
            }
            Event::InitApply(object) => {
                seen_in_list = true;
                Some(object)
            }
            Event::Apply(object) => Some(object),
            Event::InitDone if seen_in_list => continue,
            Event::InitDone | Event::Delete(_) => None,
        };
        let wanted = match object.as_ref().map(target) {
            Some(Ok(t)) => Some(t),
            Some(Err(why)) => {
                tracing::warn!(pool = %pool, inference_pool = %format!("{namespace}/{name}"), "InferencePool not usable: {why}");
                sink.error(&pool);
                None
            }
            None => {
                tracing::warn!(pool = %pool, inference_pool = %format!("{namespace}/{name}"), "InferencePool not found; the pool has no replicas");
                None
            }
        };
        if reported && wanted == current && (following.is_some() || wanted.is_none()) {
            continue;
        }
        reported = true;
        match &wanted {
            Some(t) => {
                tracing::info!(pool = %pool, selector = ?t.labels, ports = ?t.ports, "following InferencePool {namespace}/{name}");
                following = Some(Task::spawn(pods(
                    client.clone(),
                    pool.clone(),
                    namespace.clone(),
                    t.labels.clone(),
                    Ports::Numbers(t.ports.clone()),
                    relist,
                    sink.clone(),
                )));
            }
            None => {
                following = None;
                sink.replicas(&pool, Vec::new());
            }
        }
        current = wanted;
    }
}
