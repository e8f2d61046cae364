//! The gateway's side of replica discovery: where a watcher of the
//! cluster (the `infergate-kube` crate) reports a pool's replicas, and
//! whether it reaches the API server. Replicas change through the same
//! reconcile as a config reload (a leaver finishes its requests, a
//! newcomer is picked once scraped), without rebuilding anything else.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::generation::{Discovered, Runtimes};
use crate::state::State;

/// A handle on a running gateway's discovered pools; cheap to clone.
#[derive(Clone)]
pub struct Discovery {
    pub(crate) runtimes: Arc<Mutex<Runtimes>>,
    pub(crate) state: Arc<State>,
}

impl Discovery {
    /// `pool`'s replicas are now `replicas` (address, and its metrics
    /// dialect when not the pool's `engine`).
    pub fn set_replicas(&self, pool: &str, replicas: Vec<(String, Option<signals::Dialect>)>) {
        let mut engines = HashMap::new();
        let mut addrs = Vec::with_capacity(replicas.len());
        for (addr, dialect) in replicas {
            if let Some(dialect) = dialect {
                engines.insert(addr.clone(), dialect);
            }
            addrs.push(addr);
        }
        self.runtimes.lock().set_discovered(
            pool,
            Discovered { addrs, engines },
            &self.state.metrics,
        );
    }

    /// Whether `pool`'s discovery reaches the API server
    /// (`infergate_discovery_up`).
    pub fn set_up(&self, pool: &str, up: bool) {
        self.state.metrics.set_discovery_up(pool, up);
    }

    /// One failed list or watch (`infergate_discovery_errors_total`).
    pub fn count_error(&self, pool: &str) {
        self.state.metrics.count_discovery_error(pool);
    }
}
