//! Which pods are replicas, and at which addresses.
//!
//! A pod's state is read as Kubernetes' EndpointSlice controller reads it
//! into an endpoint's conditions ([`Conditions`]): `serving` is the pod's
//! Ready condition, `terminating` is a deletion under way (its
//! `metadata.deletionTimestamp` is set), and `ready` is serving and not
//! terminating. A ready pod is a replica; a terminating one that had an
//! address is reported as leaving, with the time its grace period ends
//! (the deletion timestamp: the kubelet kills its containers then), so the
//! gateway drains it and moves what it still runs before that time; any
//! other pod is not a replica (a replica that becomes not ready leaves the
//! pool, and drains too).

use std::net::{IpAddr, SocketAddr};
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;

/// Where a pool's replicas listen on each pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ports {
    /// These port numbers (an InferencePool's `targetPorts`, or one).
    Numbers(Vec<u16>),
    /// The container port of this name.
    Named(String),
}

/// One replica found in the cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Replica {
    /// `podIP:port` (`[podIP]:port` for IPv6).
    pub addr: String,
    /// The pod's `infergate.dev/engine` label, when it has one.
    pub engine: Option<String>,
    /// Set while the pod terminates: when its grace period ends. Such a
    /// replica is leaving: it takes no new request.
    pub terminating: Option<SystemTime>,
}

/// A pod's conditions as an EndpointSlice endpoint's (`discovery.k8s.io/v1`
/// `EndpointConditions`), for a pod with an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditions {
    /// Serving and not terminating: may take new requests.
    pub ready: bool,
    /// The pod's Ready condition, whether it terminates or not.
    pub serving: bool,
    /// A deletion is under way.
    pub terminating: bool,
}

/// The pod's conditions, `None` while it has no IP address.
pub fn conditions(pod: &Pod) -> Option<Conditions> {
    let status = pod.status.as_ref()?;
    status.pod_ip.as_deref().filter(|ip| !ip.is_empty())?;
    let serving = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let terminating = pod.metadata.deletion_timestamp.is_some();
    Some(Conditions {
        ready: serving && !terminating,
        serving,
        terminating,
    })
}

/// Whether the pod may take requests: Ready, not terminating, with an IP.
pub fn is_serving(pod: &Pod) -> bool {
    conditions(pod).is_some_and(|c| c.ready)
}

/// When a terminating pod's grace period ends: its deletion timestamp.
fn killed_at(pod: &Pod) -> Option<SystemTime> {
    let at = pod.metadata.deletion_timestamp.as_ref()?;
    Some(SystemTime::from(at.0))
}

/// The replicas of every ready pod, and of every terminating one (marked
/// so), sorted, each address once. A pod without the named port is
/// skipped (it runs something else).
pub fn replicas<'a>(pods: impl IntoIterator<Item = &'a Pod>, ports: &Ports) -> Vec<Replica> {
    let mut out: Vec<Replica> = Vec::new();
    for pod in pods {
        let terminating = match conditions(pod) {
            Some(c) if c.ready => None,
            // Serving or not: a server that fails its readiness while it
            // finishes its requests is the usual graceful shutdown, so its
            // requests are left to finish rather than moved at once.
            Some(c) if c.terminating => killed_at(pod),
            _ => continue,
        };
        let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref()) else {
            continue;
        };
        let engine = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(config::defaults::ENGINE_LABEL))
            .cloned();
        for port in pod_ports(pod, ports) {
            out.push(Replica {
                addr: address(ip, port),
                engine: engine.clone(),
                terminating,
            });
        }
    }
    // A ready pod's replica before a terminating one's at the same
    // address (a new pod given the old one's IP): the one kept.
    out.sort_by(|a, b| (&a.addr, a.terminating.is_some()).cmp(&(&b.addr, b.terminating.is_some())));
    out.dedup_by(|a, b| a.addr == b.addr);
    out
}

fn pod_ports(pod: &Pod, ports: &Ports) -> Vec<u16> {
    match ports {
        Ports::Numbers(numbers) => numbers.clone(),
        Ports::Named(name) => pod
            .spec
            .iter()
            .flat_map(|s| &s.containers)
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.name.as_deref() == Some(name.as_str()))
            .filter_map(|p| u16::try_from(p.container_port).ok())
            .take(1)
            .collect(),
    }
}

fn address(ip: &str, port: u16) -> String {
    match ip.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{ip}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn base(name: &str, ip: &str, ready: &str) -> serde_json::Value {
        serde_json::json!({
            "metadata": {"name": name, "labels": {"app": "vllm"}},
            "spec": {"containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 8000}]}]},
            "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": ready}]},
        })
    }

    #[test]
    fn conditions_are_an_endpoint_slices() {
        let ready = pod(base("a", "10.0.0.1", "True"));
        let c = conditions(&ready).unwrap();
        assert_eq!((c.ready, c.serving, c.terminating), (true, true, false));
        let mut terminating = base("b", "10.0.0.2", "True");
        terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z".into();
        let c = conditions(&pod(terminating.clone())).unwrap();
        assert_eq!((c.ready, c.serving, c.terminating), (false, true, true));
        terminating["status"]["conditions"][0]["status"] = "False".into();
        let c = conditions(&pod(terminating)).unwrap();
        assert_eq!((c.ready, c.serving, c.terminating), (false, false, true));
        let unready = pod(base("c", "10.0.0.3", "False"));
        let c = conditions(&unready).unwrap();
        assert_eq!((c.ready, c.serving, c.terminating), (false, false, false));
        let mut no_ip = base("d", "", "True");
        no_ip["status"].as_object_mut().unwrap().remove("podIP");
        assert_eq!(conditions(&pod(no_ip)), None);
    }

    #[test]
    fn a_terminating_pod_is_a_leaving_replica_until_its_grace_period_ends() {
        let mut leaving = base("b", "10.0.0.2", "True");
        leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z".into();
        let all = [pod(base("a", "10.0.0.1", "True")), pod(leaving)];
        let found = replicas(&all, &Ports::Numbers(vec![8000]));
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].terminating, None);
        assert_eq!(found[1].addr, "10.0.0.2:8000");
        let end = found[1].terminating.unwrap();
        // 2026-01-01T00:00:30Z.
        let expected = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_767_225_630);
        assert_eq!(end, expected);
    }

    #[test]
    fn a_ready_pod_wins_an_address_over_a_terminating_one() {
        let mut old = base("old", "10.0.0.1", "True");
        old["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z".into();
        let all = [pod(old), pod(base("new", "10.0.0.1", "True"))];
        let found = replicas(&all, &Ports::Numbers(vec![8000]));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].terminating, None);
    }

    #[test]
    fn only_ready_live_pods_with_an_ip_are_replicas() {
        let ready = pod(base("a", "10.0.0.1", "True"));
        let unready = pod(base("b", "10.0.0.2", "False"));
        let mut terminating = base("c", "10.0.0.3", "True");
        terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        let terminating = pod(terminating);
        let mut no_ip = base("d", "", "True");
        no_ip["status"].as_object_mut().unwrap().remove("podIP");
        let no_ip = pod(no_ip);
        let mut v6 = base("e", "fd00::1", "True");
        v6["metadata"]["labels"]["infergate.dev/engine"] = "sglang".into();
        let v6 = pod(v6);

        let all = [ready, unready, terminating, no_ip, v6];
        let found = replicas(&all, &Ports::Numbers(vec![8000, 8001]));
        let found: Vec<Replica> = found
            .into_iter()
            .filter(|r| r.terminating.is_none())
            .collect();
        let addrs: Vec<_> = found.iter().map(|r| r.addr.as_str()).collect();
        assert_eq!(
            addrs,
            [
                "10.0.0.1:8000",
                "10.0.0.1:8001",
                "[fd00::1]:8000",
                "[fd00::1]:8001"
            ]
        );
        assert_eq!(found[2].engine.as_deref(), Some("sglang"));
        assert_eq!(found[0].engine, None);

        let named = replicas(&all, &Ports::Named("http".into()));
        assert_eq!(named.len(), 3, "10.0.0.1, 10.0.0.3 terminating, fd00::1");
        assert_eq!(named[0].addr, "10.0.0.1:8000");
        assert!(replicas(&all, &Ports::Named("grpc".into())).is_empty());
    }
}
