//! A disaggregated pool's prefill replicas and the prefill work this
//! gateway has on each (see `outbound::disaggregated`, which sends the
//! legs). A leaf: the pool holds it, the request path reads it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use config::KvProtocol;

/// The prefill replicas of a pool, as they change (discovered ones come
/// and go): shared by the pool's runtime and each generation's [`Prefills`],
/// so the work counted on a replica outlives reloads.
pub type PrefillReplicas = Arc<ArcSwap<Vec<Arc<PrefillReplica>>>>;

/// A disaggregated pool's prefill replicas and settings.
pub struct Prefills {
    protocol: KvProtocol,
    min_uncached_tokens: u64,
    timeout: Duration,
    bootstrap_port: u16,
    replicas: PrefillReplicas,
}

/// One prefill replica and the work this gateway has on it.
pub struct PrefillReplica {
    pub addr: Arc<str>,
    /// Its host as a `bootstrap_host` (IPv6 in brackets).
    pub host: String,
    /// Prefill legs in flight.
    in_flight: AtomicU64,
    /// Their uncached prompt tokens: the prefill work outstanding.
    tokens: AtomicU64,
}

impl PrefillReplica {
    fn new(addr: &str) -> Self {
        Self {
            addr: Arc::from(addr),
            host: host_of(addr),
            in_flight: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn outstanding_tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// Counts a leg of `tokens` on this replica until the guard drops.
    pub(crate) fn load(self: &Arc<Self>, tokens: u64) -> PrefillLoad {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.tokens.fetch_add(tokens, Ordering::Relaxed);
        PrefillLoad {
            replica: Arc::clone(self),
            tokens,
        }
    }
}

/// Makes `replicas` the replicas at `addrs`, keeping those already there
/// (with the work counted on them).
pub fn set_prefill_addresses(replicas: &PrefillReplicas, addrs: &[String]) {
    let now = replicas.load();
    let next: Vec<Arc<PrefillReplica>> = addrs
        .iter()
        .map(|addr| {
            now.iter()
                .find(|r| *r.addr == **addr)
                .cloned()
                .unwrap_or_else(|| Arc::new(PrefillReplica::new(addr)))
        })
        .collect();
    replicas.store(Arc::new(next));
}

impl Prefills {
    /// The settings of `spec` over `replicas` (the pool runtime's).
    pub fn new(spec: &config::Disaggregation, replicas: PrefillReplicas) -> Self {
        Self {
            protocol: spec.protocol,
            min_uncached_tokens: u64::from(spec.min_uncached_tokens()),
            timeout: spec.prefill_timeout(),
            bootstrap_port: spec.bootstrap_port(),
            replicas,
        }
    }

    pub fn protocol(&self) -> KvProtocol {
        self.protocol
    }

    pub fn min_uncached_tokens(&self) -> u64 {
        self.min_uncached_tokens
    }

    /// Longest wait for a prefill leg.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// SGLang's bootstrap port of the prefill replicas.
    pub fn bootstrap_port(&self) -> u16 {
        self.bootstrap_port
    }

    /// The prefill replicas now.
    pub fn replicas(&self) -> Arc<Vec<Arc<PrefillReplica>>> {
        self.replicas.load_full()
    }

    /// The prefill replica with the least prompt work outstanding, then
    /// the fewest legs, not in `tried`.
    pub(crate) fn pick(&self, tried: &[Arc<str>]) -> Option<Arc<PrefillReplica>> {
        self.replicas
            .load()
            .iter()
            .filter(|r| !tried.contains(&r.addr))
            .min_by_key(|r| (r.outstanding_tokens(), r.in_flight()))
            .cloned()
    }
}

/// `host` of `host:port` as SGLang's `bootstrap_host`: an IPv6 address in
/// brackets, as the address gives it.
pub(crate) fn host_of(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some((host, _)) if host.contains(':') && !host.starts_with('[') => format!("[{host}]"),
        Some((host, _)) => host.to_owned(),
        None => addr.to_owned(),
    }
}

/// A prefill leg's share of its replica's load.
pub(crate) struct PrefillLoad {
    replica: Arc<PrefillReplica>,
    tokens: u64,
}

impl Drop for PrefillLoad {
    fn drop(&mut self) {
        self.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.replica
            .tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
    }
}

/// Aborts the SGLang prefill leg's task when the request ends (or its
/// decode goes on alone).
pub struct PrefillTask(tokio::task::AbortHandle);

impl PrefillTask {
    pub fn new(task: tokio::task::AbortHandle) -> Self {
        Self(task)
    }
}

impl std::fmt::Debug for PrefillTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrefillTask")
    }
}

impl Drop for PrefillTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bootstrap_hosts_put_ipv6_in_brackets() {
        assert_eq!(host_of("10.0.0.1:8000"), "10.0.0.1");
        assert_eq!(host_of("[fd00::1]:8000"), "[fd00::1]");
        assert_eq!(host_of("prefill-0.svc:8000"), "prefill-0.svc");
    }

    #[test]
    fn the_prefill_with_the_least_work_outstanding_is_picked() {
        let spec: config::Disaggregation = serde_json::from_value(json!({
            "protocol": "vllm", "prefill": {"endpoints": ["a:1", "b:1", "c:1"]}}))
        .unwrap();
        let replicas = PrefillReplicas::default();
        set_prefill_addresses(&replicas, &spec.prefill.endpoints);
        let prefills = Prefills::new(&spec, Arc::clone(&replicas));
        let all = prefills.replicas();
        let busy = all[0].load(4000);
        let light = all[1].load(600);
        let addr = |r: Option<Arc<PrefillReplica>>| r.map(|r| r.addr.to_string());
        assert_eq!(addr(prefills.pick(&[])), Some("c:1".into()));
        assert_eq!(addr(prefills.pick(&[Arc::from("c:1")])), Some("b:1".into()));
        drop(busy);
        assert_eq!(addr(prefills.pick(&[Arc::from("c:1")])), Some("a:1".into()));
        drop(light);
        assert_eq!(all[1].outstanding_tokens(), 0);
        assert_eq!(
            addr(prefills.pick(&[Arc::from("a:1"), Arc::from("b:1"), Arc::from("c:1")])),
            None
        );

        // A new list keeps the replicas still in it, with their work.
        let held = all[2].load(100);
        set_prefill_addresses(&replicas, &["c:1".to_owned(), "d:1".to_owned()]);
        let now = prefills.replicas();
        assert_eq!(now.len(), 2);
        assert_eq!(now[0].outstanding_tokens(), 100);
        drop(held);
        assert_eq!(now[0].outstanding_tokens(), 0);
    }
}
