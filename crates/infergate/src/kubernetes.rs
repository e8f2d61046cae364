//! `serve --kubernetes`: the config from an `InferenceGatewayConfig`
//! object, each new version of it applied as a file reload is, and its
//! status written by whichever gateway replica holds the status Lease.

use config::defaults;
use infergate_kube::config_source::{ConfigObject, ConfigWatch};
use infergate_kube::lease::{Candidate, LeaseSettings};
use infergate_kube::status::PoolStatus;
use infergate_kube::status_writer::{StatusWriter, Verdict, View};

/// The object a gateway follows, and its part in writing the status.
pub struct Cluster {
    /// `namespace/name`, for logs and `/debug/config`.
    pub object: String,
    watch: ConfigWatch,
    candidate: Candidate,
    writer: StatusWriter,
}

impl Cluster {
    /// Connect with the usual client configuration (in a pod, its service
    /// account; elsewhere `KUBECONFIG` or `~/.kube/config`), and wait for
    /// the object's first version. `namespace` defaults to the client's
    /// (the pod's own), `name` to [`defaults::KUBERNETES_CONFIG_NAME`].
    pub async fn connect(
        namespace: Option<String>,
        name: Option<String>,
    ) -> anyhow::Result<(Cluster, ConfigObject)> {
        let client = kube::Client::try_default().await.map_err(|e| {
            anyhow::anyhow!("cannot reach the Kubernetes API (in a pod: its service account; elsewhere: KUBECONFIG): {e}")
        })?;
        let namespace = namespace.unwrap_or_else(|| client.default_namespace().to_owned());
        let name = name.unwrap_or_else(|| defaults::KUBERNETES_CONFIG_NAME.to_owned());
        let object = format!("{namespace}/{name}");
        tracing::info!(%object, "reading the config from InferenceGatewayConfig {object}");
        let mut watch = ConfigWatch::new(client.clone(), &namespace, &name);
        let first = watch
            .next()
            .await
            .ok_or_else(|| anyhow::anyhow!("the watch of {object} ended"))?;
        let candidate = Candidate::start(
            client.clone(),
            LeaseSettings {
                namespace: namespace.clone(),
                name: format!("{name}-status"),
                identity: identity(),
                duration: defaults::STATUS_LEASE_DURATION,
                renew_every: defaults::STATUS_LEASE_RENEW,
            },
        );
        let writer = StatusWriter::start(client, &namespace, &name, candidate.holding());
        Ok((
            Cluster {
                object,
                watch,
                candidate,
                writer,
            },
            first,
        ))
    }

    /// The next version of the object's spec; never, once the watch ends.
    pub async fn next(&mut self) -> ConfigObject {
        match self.watch.next().await {
            Some(object) => object,
            None => std::future::pending().await,
        }
    }

    /// The verdict on a version of the spec, for the status.
    pub fn report(&self, generation: Option<i64>, accepted: Result<(), String>) {
        self.writer.report(Verdict {
            generation,
            accepted,
        });
    }

    /// How the gateway is now, for the status.
    pub fn observe(&self, gateway: &gateway::Gateway) {
        let pools = gateway
            .ready_endpoints()
            .into_iter()
            .map(|(name, ready)| PoolStatus {
                name,
                ready_endpoints: u32::try_from(ready).unwrap_or(u32::MAX),
            })
            .collect();
        self.writer.observe(View {
            ready: gateway.readiness(),
            pools,
        });
    }

    /// On shutdown: stop writing status and give the Lease up, so another
    /// replica takes over at once.
    pub async fn stop(self) {
        drop(self.writer);
        self.candidate.release().await;
    }
}

/// This replica's name as the Lease's holder: the pod's name (`POD_NAME`,
/// from the downward API; a pod's hostname is its name too).
fn identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("infergate-{}", std::process::id()))
}
