//! `deploy/kubernetes/endpoint-picker/`: infergate as a Gateway's endpoint
//! picker. Every document parses into its type with nothing left over,
//! the config validates, and the pieces point at each other: the
//! InferencePool's endpointPickerRef at the Service, the Service at the
//! picker's gRPC port (as h2c), the probes at the gRPC health services,
//! the config's pool at the InferencePool, the HTTPRoute at the pool.

#[path = "support/yaml.rs"]
mod yaml;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::Value;
use yaml::yaml_documents;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes/endpoint-picker")
}

/// Every document of every file the kustomization lists.
fn documents() -> Vec<(String, Value)> {
    let kustomization = yaml_documents(&dir().join("kustomization.yaml"))
        .pop()
        .unwrap();
    let files: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
        .collect();
    assert_eq!(on_disk, files, "kustomization.yaml lists every manifest");
    files
        .iter()
        .flat_map(|f| {
            yaml_documents(&dir().join(f))
                .into_iter()
                .map(move |d| (f.clone(), d))
        })
        .collect()
}

/// The one document of `kind`, parsed into `T` and given back whole.
fn one<T: DeserializeOwned + serde::Serialize>(docs: &[(String, Value)], kind: &str) -> T {
    let found: Vec<&(String, Value)> = docs.iter().filter(|(_, d)| d["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind}");
    let (file, d) = found[0];
    let typed: T = serde_json::from_value(d.clone())
        .unwrap_or_else(|e| panic!("{file}: a {kind} that does not parse: {e}"));
    assert_eq!(
        &serde_json::to_value(&typed).unwrap(),
        d,
        "{file}: the {kind} has fields its type does not know"
    );
    typed
}

fn raw<'d>(docs: &'d [(String, Value)], kind: &str) -> &'d Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(_, d)| d)
        .collect();
    assert_eq!(found.len(), 1, "one {kind}");
    found[0]
}

fn container(deployment: &Deployment) -> Container {
    let pod = deployment.spec.clone().unwrap().template.spec.unwrap();
    assert_eq!(pod.containers.len(), 1);
    pod.containers[0].clone()
}

fn named_port(container: &Container, name: &str) -> i32 {
    container
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no container port named {name}"))
        .container_port
}

#[test]
fn the_endpoint_picker_manifests_fit_together() {
    let docs = documents();
    let known = [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "Service",
        "InferencePool",
        "HTTPRoute",
    ];
    for (file, d) in &docs {
        let kind = d["kind"].as_str().unwrap_or_default();
        assert!(known.contains(&kind), "{file}: {kind} is not checked");
    }
    one::<ServiceAccount>(&docs, "ServiceAccount");
    one::<RoleBinding>(&docs, "RoleBinding");

    // The config validates and opens the endpoint picker.
    let config_map = one::<ConfigMap>(&docs, "ConfigMap");
    let text = &config_map.data.unwrap()["config.yaml"];
    let config = config::from_yaml(text).unwrap_or_else(|e| panic!("the picker's config: {e}"));
    let picker = config
        .spec
        .endpoint_picker
        .as_ref()
        .expect("endpointPicker");
    let grpc_port: i32 = picker
        .address()
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();

    // The Deployment serves it on its `grpc` port, probed by gRPC health.
    let deployment = one::<Deployment>(&docs, "Deployment");
    let c = container(&deployment);
    assert_eq!(named_port(&c, "grpc"), grpc_port);
    let readiness = c.readiness_probe.clone().unwrap().grpc.unwrap();
    let liveness = c.liveness_probe.clone().unwrap().grpc.unwrap();
    assert_eq!(
        (readiness.port, readiness.service.as_deref()),
        (grpc_port, Some("readiness"))
    );
    assert_eq!(
        (liveness.port, liveness.service.as_deref()),
        (grpc_port, Some("liveness"))
    );
    assert!(
        deployment.spec.unwrap().replicas.unwrap() >= 2,
        "active-active"
    );

    // The Service's gRPC port reaches it, as h2c.
    let service = one::<Service>(&docs, "Service");
    let service_name = service.metadata.name.clone().unwrap();
    let ports = service.spec.unwrap().ports.unwrap();
    let grpc = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("grpc"))
        .unwrap();
    assert_eq!(grpc.target_port, Some(IntOrString::String("grpc".into())));
    assert_eq!(grpc.app_protocol.as_deref(), Some("kubernetes.io/h2c"));

    // The InferencePool names that Service and port as its picker.
    let pool = raw(&docs, "InferencePool");
    assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
    let picker_ref = &pool["spec"]["endpointPickerRef"];
    assert_eq!(picker_ref["name"], service_name.as_str());
    assert_eq!(picker_ref["port"]["number"], grpc.port);
    assert!(["FailOpen", "FailClose"].contains(&picker_ref["failureMode"].as_str().unwrap()));
    assert!(pool["spec"]["selector"]["matchLabels"].is_object());
    assert!(pool["spec"]["targetPorts"][0]["number"].is_number());

    // The config's pool follows that InferencePool.
    let pool_name = pool["metadata"]["name"].as_str().unwrap();
    let pool_namespace = pool["metadata"]["namespace"].as_str().unwrap();
    let followed = config.spec.pools[0]
        .inference_pool
        .as_ref()
        .expect("inferencePool");
    assert_eq!(followed.name, pool_name);
    assert_eq!(followed.namespace, pool_namespace);

    // The route sends to the pool.
    let route = raw(&docs, "HTTPRoute");
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["group"], "inference.networking.k8s.io");
    assert_eq!(backend["kind"], "InferencePool");
    assert_eq!(backend["name"], pool_name);

    // The Role grants reading what discovery reads, nothing more.
    let role = one::<Role>(&docs, "Role");
    let mut granted = BTreeSet::new();
    for rule in role.rules.unwrap() {
        for group in rule.api_groups.unwrap() {
            for resource in rule.resources.clone().unwrap() {
                for verb in &rule.verbs {
                    granted.insert(format!("{group}/{resource}:{verb}"));
                }
            }
        }
    }
    let want: BTreeSet<String> = ["/pods", "inference.networking.k8s.io/inferencepools"]
        .iter()
        .flat_map(|r| ["get", "list", "watch"].map(|v| format!("{r}:{v}")))
        .collect();
    assert_eq!(granted, want);
}
