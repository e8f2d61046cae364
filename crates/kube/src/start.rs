//! Starting a pool's watches, and the Kubernetes client they use.

use std::sync::Arc;

use crate::follow as watches;
use crate::replicas::Ports;
use crate::sink::{Sink, Task};

/// Start following the replicas of `pool` as `discovery` says. Needs a
/// Tokio runtime; stops when the returned task is dropped.
pub fn follow(
    client: kube::Client,
    pool: &str,
    discovery: config::Discovery<'_>,
    sink: Arc<dyn Sink>,
) -> Task {
    let name: Arc<str> = Arc::from(pool);
    let relist = discovery.relist_interval();
    match discovery {
        config::Discovery::Selector(s) => {
            let ports = match (&s.port_name, s.port) {
                (Some(name), _) => Ports::Named(name.clone()),
                (None, port) => Ports::Numbers(port.into_iter().collect()),
            };
            Task::spawn(watches::pods(
                client,
                name,
                s.namespace.clone(),
                s.match_labels.clone(),
                ports,
                relist,
                sink,
            ))
        }
        config::Discovery::InferencePool(r) => Task::spawn(watches::inference_pool(
            client,
            name,
            r.namespace.clone(),
            r.name.clone(),
            relist,
            sink,
        )),
    }
}

/// A client for the cluster the process runs in (its service account), or
/// else the current kubeconfig context; a clear error when neither exists.
pub async fn client() -> anyhow::Result<kube::Client> {
    kube::Client::try_default().await.map_err(|e| {
        anyhow::anyhow!(
            "a pool finds its replicas in Kubernetes (endpointSelector or inferencePool), \
             but no Kubernetes API is configured: run in a pod with a service account, or \
             set KUBECONFIG / ~/.kube/config ({e})"
        )
    })
}
