//! An in-process Kubernetes API server double for tests: real kube-rs
//! clients, watchers and reflectors run against it unchanged.
//!
//! It serves namespaced list, watch, get, create, replace, merge patch and
//! server-side apply (as kube-rs sends them) for pods, leases,
//! InferencePools, InferenceGatewayConfigs and the workloads a cold pool
//! wakes (Deployments, StatefulSets, LeaderWorkerSets), with the `/status`
//! subresource and the workloads' `/scale`, one monotonically increasing resourceVersion, generation
//! bumped on spec changes only, label selectors, bookmarks and `410
//! Expired` for a watch that resumes from before a compaction. Knobs let a
//! test compact history, cut every open watch, make watches go silent,
//! take the server down and count requests per path.

mod selector;
mod server;
mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::AbortHandle;

pub use server::Verb;
pub use store::{Refusal, Resource};

use server::Shared;
use store::{Part, Store};

/// How often open watches that allow bookmarks get one. A real server
/// sends them about once a minute; tests want them sooner.
const BOOKMARK_INTERVAL: Duration = Duration::from_millis(500);

/// The running double. Dropping it stops the server.
pub struct ApiServer {
    shared: Arc<Shared>,
    address: std::net::SocketAddr,
    down: Arc<AtomicBool>,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    accept: AbortHandle,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.accept.abort();
        for connection in self.connections.lock().drain(..) {
            connection.abort();
        }
    }
}

impl ApiServer {
    /// Start on 127.0.0.1 at a free port.
    pub async fn start() -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the API server double");
        let address = listener.local_addr().expect("bound address");
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            resources: Resource::ALL.to_vec(),
            requests: Mutex::default(),
            cut: watch::channel(0).0,
            silenced: watch::channel(0).0,
            silent: AtomicBool::new(false),
            bookmark_interval: Mutex::new(BOOKMARK_INTERVAL),
            open_watches: Mutex::new(0),
        });
        let down = Arc::new(AtomicBool::new(false));
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let accept = tokio::spawn({
            let shared = shared.clone();
            let down = down.clone();
            let connections = connections.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    if down.load(Ordering::SeqCst) {
                        // Unreachable: the connection is dropped unanswered.
                        drop(stream);
                        continue;
                    }
                    let shared = shared.clone();
                    let task = tokio::spawn(async move {
                        let service = hyper::service::service_fn(move |request| {
                            server::handle(shared.clone(), request)
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                    let mut open = connections.lock();
                    open.retain(|c| !c.is_finished());
                    open.push(task.abort_handle());
                }
            }
        })
        .abort_handle();
        ApiServer {
            shared,
            address,
            down,
            connections,
            accept,
        }
    }

    pub fn url(&self) -> http::Uri {
        format!("http://{}", self.address)
            .parse()
            .expect("a socket address makes a URI")
    }

    /// A kube-rs client for this server, default namespace `default`.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(kube::Config::new(self.url()))
            .expect("a client for a plain HTTP URL")
    }

    /// Create the object, or replace it (status included) when it exists,
    /// as a controller writing directly would. Returns it as stored.
    pub fn put(&self, resource: &Resource, namespace: &str, object: Value) -> Value {
        let mut store = self.shared.store.lock();
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .expect("the object has metadata.name")
            .to_owned();
        let result = if store.get(resource, namespace, &name).is_some() {
            let mut object = object;
            if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("resourceVersion");
            }
            let status = object.get("status").cloned();
            let main = store.replace(resource, namespace, &name, object.clone(), Part::Main);
            match (main, status, resource.status_subresource) {
                (Ok(_), Some(_), true) => {
                    store.replace(resource, namespace, &name, object, Part::Status)
                }
                (main, _, _) => main,
            }
        } else {
            let status = object.get("status").cloned();
            let created = store.create(resource, namespace, object.clone());
            match (created, status, resource.status_subresource) {
                // Created objects keep the status they were given: tests set
                // pod readiness this way.
                (Ok(_), Some(_), _) => {
                    store.replace(resource, namespace, &name, object, Part::Status)
                }
                (created, _, _) => created,
            }
        };
        result.expect("the double accepts the test's object")
    }

    /// The stored object, if any.
    pub fn get(&self, resource: &Resource, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store
            .lock()
            .get(resource, namespace, name)
            .cloned()
    }

    /// Delete the object; `None` when there was none.
    pub fn delete(&self, resource: &Resource, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store
            .lock()
            .delete(resource, namespace, name)
            .ok()
    }

    /// Mark the object terminating (`metadata.deletionTimestamp` set), as
    /// a graceful pod deletion does before the pod goes away.
    pub fn mark_terminating(&self, resource: &Resource, namespace: &str, name: &str) {
        self.shared
            .store
            .lock()
            .set_terminating(resource, namespace, name)
            .expect("the object exists");
    }

    /// The last resourceVersion handed out.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.lock().revision
    }

    /// Forget history: a watch resuming from any version up to now gets
    /// `410 Expired`.
    pub fn compact(&self) {
        self.shared.store.lock().compact();
    }

    /// End every open watch (the connection stays usable).
    pub fn cut_watches(&self) {
        self.shared.cut.send_modify(|n| *n += 1);
    }

    /// Make every open watch go silent for good (open, sending nothing)
    /// while `silent` is set; watches opened after it is cleared work.
    pub fn set_silent(&self, silent: bool) {
        self.shared.silent.store(silent, Ordering::SeqCst);
        if silent {
            self.shared.silenced.send_modify(|n| *n += 1);
        }
    }

    /// Take the server down (every connection dropped, new ones dropped
    /// unanswered) or bring it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            self.cut_watches();
            for connection in self.connections.lock().drain(..) {
                connection.abort();
            }
        }
    }

    pub fn set_bookmark_interval(&self, interval: Duration) {
        *self.shared.bookmark_interval.lock() = interval;
    }

    /// Requests of one verb made on one path (no query), e.g. the lists
    /// of `/api/v1/namespaces/ml/pods`.
    pub fn requests(&self, verb: Verb, path: &str) -> usize {
        self.shared
            .requests
            .lock()
            .get(&(verb, path.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Watches open now.
    pub fn open_watches(&self) -> usize {
        *self.shared.open_watches.lock()
    }

    /// Wait (up to `deadline`) until `condition` holds; panics after it.
    pub async fn wait_for(
        &self,
        what: &str,
        deadline: Duration,
        mut condition: impl FnMut(&ApiServer) -> bool,
    ) {
        let end = tokio::time::Instant::now() + deadline;
        while !condition(self) {
            assert!(
                tokio::time::Instant::now() < end,
                "timed out waiting for {what}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A pod for tests: `Ready` or not, with a pod IP and labels.
pub fn pod(name: &str, ip: Option<&str>, labels: &[(&str, &str)], ready: bool) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    let mut status = serde_json::json!({
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
    });
    if let Some(ip) = ip {
        status["podIP"] = Value::from(ip);
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "engine", "image": "engine", "ports": [{"name": "http", "containerPort": 8000}]}]},
        "status": status,
    })
}
