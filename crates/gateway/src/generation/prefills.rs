//! A disaggregated pool's prefill replicas and the prefill work this
//! gateway has on each (see `outbound::disaggregated`, which sends the
//! legs). A leaf: the pool holds it, the request path reads it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use config::KvProtocol;

/// A disaggregated pool's prefill replicas and settings.
pub struct Prefills {
    protocol: KvProtocol,
    min_uncached_tokens: u64,
    timeout: Duration,
    bootstrap_port: u16,
    replicas: Vec<PrefillReplica>,
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
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn outstanding_tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }
}

impl Prefills {
    pub fn new(spec: &config::Disaggregation) -> Self {
        let replicas = spec
            .prefill
            .endpoints
            .iter()
            .map(|addr| PrefillReplica {
                addr: Arc::from(addr.as_str()),
                host: host_of(addr),
                in_flight: AtomicU64::new(0),
                tokens: AtomicU64::new(0),
            })
            .collect();
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

    pub fn replicas(&self) -> &[PrefillReplica] {
        &self.replicas
    }

    /// The prefill replica with the least prompt work outstanding, then
    /// the fewest legs, not in `tried`.
    pub(crate) fn pick(&self, tried: &[usize]) -> Option<usize> {
        (0..self.replicas.len())
            .filter(|i| !tried.contains(i))
            .min_by_key(|&i| {
                let r = &self.replicas[i];
                (r.outstanding_tokens(), r.in_flight())
            })
    }

    /// Counts a leg of `tokens` on replica `index` until the guard drops.
    pub(crate) fn load(self: &Arc<Self>, index: usize, tokens: u64) -> PrefillLoad {
        let replica = &self.replicas[index];
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        replica.tokens.fetch_add(tokens, Ordering::Relaxed);
        PrefillLoad {
            prefills: Arc::clone(self),
            index,
            tokens,
        }
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
    prefills: Arc<Prefills>,
    index: usize,
    tokens: u64,
}

impl Drop for PrefillLoad {
    fn drop(&mut self) {
        let replica = &self.prefills.replicas[self.index];
        replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        replica.tokens.fetch_sub(self.tokens, Ordering::Relaxed);
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
        let prefills = Arc::new(Prefills::new(&spec));
        let busy = prefills.load(0, 4000);
        let light = prefills.load(1, 600);
        assert_eq!(prefills.pick(&[]), Some(2));
        assert_eq!(prefills.pick(&[2]), Some(1));
        drop(busy);
        assert_eq!(prefills.pick(&[2]), Some(0));
        drop(light);
        assert_eq!(prefills.replicas()[1].outstanding_tokens(), 0);
        assert_eq!(prefills.pick(&[0, 1, 2]), None);
    }
}
