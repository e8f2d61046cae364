//! Which pods are replicas, and at which addresses.

use std::net::{IpAddr, SocketAddr};

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
}

/// Whether the pod may take requests: Ready, not terminating, with an IP.
pub fn is_serving(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(status) = &pod.status else {
        return false;
    };
    let has_ip = status.pod_ip.as_deref().is_some_and(|ip| !ip.is_empty());
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    has_ip && ready
}

/// The replicas of every serving pod, sorted, each address once. A pod
/// without the named port is skipped (it runs something else).
pub fn replicas<'a>(pods: impl IntoIterator<Item = &'a Pod>, ports: &Ports) -> Vec<Replica> {
    let mut out: Vec<Replica> = Vec::new();
    for pod in pods.into_iter().filter(|p| is_serving(p)) {
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
            });
        }
    }
    out.sort();
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
        assert_eq!(named[0].addr, "10.0.0.1:8000");
        assert!(replicas(&all, &Ports::Named("grpc".into())).is_empty());
    }
}
