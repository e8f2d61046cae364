//! The gateway as the place discovered replicas go, and the set of pool
//! watches that follows the config in force.

use std::collections::HashMap;
use std::sync::Arc;

use signals::Dialect;

use crate::replicas::Replica;
use crate::scale::WorkloadScaler;
use crate::sink::{Sink, Task};
use crate::start;

impl Sink for gateway::Discovery {
    fn replicas(&self, pool: &str, replicas: Vec<Replica>) {
        let replicas = replicas
            .into_iter()
            .map(|r| {
                let dialect = r.engine.as_deref().and_then(|label| {
                    let found = Dialect::ALL.into_iter().find(|d| d.as_str() == label);
                    if found.is_none() {
                        tracing::warn!(
                            pool,
                            replica = %r.addr,
                            "the pod's {} label {label:?} names no engine; the pool's engine is used",
                            config::defaults::ENGINE_LABEL
                        );
                    }
                    found
                });
                gateway::DiscoveredReplica {
                    addr: r.addr,
                    dialect,
                    terminating: r.terminating,
                }
            })
            .collect();
        self.set_replicas(pool, replicas);
    }

    fn reachable(&self, pool: &str, up: bool) {
        self.set_up(pool, up);
    }

    fn error(&self, pool: &str) {
        self.count_error(pool);
    }
}

/// What a pool's watch was started from: a pool whose discovery settings
/// are unchanged keeps its watch (and its replicas) across reloads.
#[derive(Debug, Clone, PartialEq)]
struct Key {
    selector: Option<config::EndpointSelector>,
    inference_pool: Option<config::InferencePoolRef>,
}

impl Key {
    fn of(discovery: config::Discovery<'_>) -> Self {
        match discovery {
            config::Discovery::Selector(s) => Key {
                selector: Some(s.clone()),
                inference_pool: None,
            },
            config::Discovery::InferencePool(r) => Key {
                selector: None,
                inference_pool: Some(r.clone()),
            },
        }
    }
}

/// What `pool` has watched, by the name its replicas are reported under:
/// its own replicas, and a disaggregated pool's prefill group.
fn watches(pool: &config::Pool) -> Vec<(String, config::Discovery<'_>)> {
    let own = pool.discovery().map(|d| (pool.name.clone(), d));
    let prefill = pool
        .disaggregation
        .as_ref()
        .and_then(|d| d.prefill_discovery())
        .map(|d| (config::prefill_group_name(&pool.name), d));
    own.into_iter().chain(prefill).collect()
}

/// The watches of every discovered pool of the config in force.
#[derive(Default)]
pub struct Discoveries {
    client: Option<kube::Client>,
    running: HashMap<String, (Key, Task)>,
    /// The gateway wakes cold pools' workloads with this client.
    scaler_set: bool,
}

impl Discoveries {
    /// Use this client instead of the in-cluster or kubeconfig one.
    pub fn with_client(client: kube::Client) -> Self {
        Self {
            client: Some(client),
            running: HashMap::new(),
            scaler_set: false,
        }
    }

    /// Make sure a Kubernetes client exists when `config` has discovered
    /// pools or pools woken by scaling a workload: the clear error when
    /// none can be made comes before anything is applied.
    pub async fn prepare(&mut self, config: &config::InferenceGatewayConfig) -> anyhow::Result<()> {
        let needed = config.spec.pools.iter().any(|p| {
            !watches(p).is_empty()
                || p.cold_start
                    .wake
                    .as_ref()
                    .is_some_and(|w| w.workload().is_some())
        });
        if needed && self.client.is_none() {
            self.client = Some(start::client().await?);
        }
        Ok(())
    }

    /// Start the watches of pools new to discovery, restart those whose
    /// settings changed, stop those that left. Call after the config is
    /// applied to `gateway` (and [`Discoveries::prepare`] before).
    pub fn sync(&mut self, config: &config::InferenceGatewayConfig, gateway: &gateway::Gateway) {
        if let Some(client) = &self.client
            && !self.scaler_set
        {
            gateway.set_scaler(Box::new(WorkloadScaler::new(client.clone())));
            self.scaler_set = true;
        }
        let sink: Arc<dyn Sink> = Arc::new(gateway.discovery());
        let mut running = HashMap::new();
        for (name, discovery) in config.spec.pools.iter().flat_map(watches) {
            let key = Key::of(discovery);
            let kept = self.running.remove(&name).filter(|(k, _)| *k == key);
            let entry = match (kept, &self.client) {
                (Some(kept), _) => kept,
                (None, Some(client)) => (
                    key,
                    start::follow(client.clone(), &name, discovery, Arc::clone(&sink)),
                ),
                (None, None) => {
                    tracing::error!(pool = %name, "no Kubernetes client: the pool's replicas cannot be discovered");
                    continue;
                }
            };
            running.insert(name, entry);
        }
        // Watches left in `self.running` stop as they drop here.
        self.running = running;
    }
}
