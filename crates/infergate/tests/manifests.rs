//! `deploy/kubernetes/`: every document parses into its Kubernetes type
//! with nothing left over, the example config validates, the RBAC rules
//! grant exactly the calls the code makes, and the probes point at the
//! admin listener's real paths and port.

#[path = "support/yaml.rs"]
mod yaml;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Container, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde_json::Value;
use yaml::yaml_documents;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every document of every file the kustomization lists, as JSON values.
struct Manifests {
    documents: Vec<(String, Value)>,
}

impl Manifests {
    fn load() -> Self {
        let kustomization: Value = yaml_documents(&deploy_dir().join("kustomization.yaml"))
            .pop()
            .unwrap();
        let files: Vec<String> = kustomization["resources"]
            .as_array()
            .expect("kustomization.yaml lists resources")
            .iter()
            .map(|f| f.as_str().unwrap().to_owned())
            .collect();
        // Every manifest in the folder is part of the install.
        let on_disk: BTreeSet<String> = std::fs::read_dir(deploy_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
            .collect();
        assert_eq!(
            on_disk,
            files.iter().cloned().collect::<BTreeSet<_>>(),
            "kustomization.yaml must list every manifest of deploy/kubernetes"
        );
        let documents = files
            .iter()
            .flat_map(|f| {
                yaml_documents(&deploy_dir().join(f))
                    .into_iter()
                    .map(move |d| (f.clone(), d))
            })
            .collect();
        Manifests { documents }
    }

    /// The documents of one kind, each parsed into its type. A field the
    /// type does not know (a typo, a wrong indentation) fails the test:
    /// the parsed value must give back the document exactly.
    fn all<T: DeserializeOwned + serde::Serialize>(&self, kind: &str) -> Vec<T> {
        self.documents
            .iter()
            .filter(|(_, d)| d["kind"] == kind)
            .map(|(file, d)| {
                let typed: T = serde_json::from_value(d.clone())
                    .unwrap_or_else(|e| panic!("{file}: a {kind} that does not parse: {e}"));
                let back = serde_json::to_value(&typed).unwrap();
                assert_eq!(
                    &back, d,
                    "{file}: the {kind} has fields its type does not know"
                );
                typed
            })
            .collect()
    }

    fn one<T: DeserializeOwned + serde::Serialize>(&self, kind: &str) -> T {
        let mut all = self.all::<T>(kind);
        assert_eq!(all.len(), 1, "expected one {kind}");
        all.pop().unwrap()
    }

    /// The example `InferenceGatewayConfig`, as text.
    fn config_text(&self) -> String {
        std::fs::read_to_string(deploy_dir().join("config.yaml")).unwrap()
    }
}

#[test]
fn every_document_parses_into_its_type() {
    let m = Manifests::load();
    let known = [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "InferenceGatewayConfig",
    ];
    for (file, d) in &m.documents {
        assert!(
            known.contains(&d["kind"].as_str().unwrap_or_default()),
            "{file}: a document of kind {} the test does not check",
            d["kind"]
        );
    }
    m.one::<Namespace>("Namespace");
    m.one::<CustomResourceDefinition>("CustomResourceDefinition");
    m.one::<ServiceAccount>("ServiceAccount");
    m.one::<Role>("Role");
    m.one::<RoleBinding>("RoleBinding");
    m.one::<ClusterRole>("ClusterRole");
    m.one::<ClusterRoleBinding>("ClusterRoleBinding");
    m.one::<Deployment>("Deployment");
    m.one::<PodDisruptionBudget>("PodDisruptionBudget");
    m.one::<Service>("Service");
}

#[test]
fn the_example_config_is_valid_and_the_crd_serves_it() {
    let m = Manifests::load();
    let config = config::from_yaml(&m.config_text())
        .unwrap_or_else(|e| panic!("deploy/kubernetes/config.yaml is refused:\n{e}"));
    let crd = m.one::<CustomResourceDefinition>("CustomResourceDefinition");
    let (group, version) = config.api_version.split_once('/').unwrap();
    assert_eq!(crd.spec.group, group);
    assert_eq!(crd.spec.names.kind, config.kind);
    assert!(
        crd.spec
            .versions
            .iter()
            .any(|v| v.name == version && v.served)
    );
    assert_eq!(crd.spec.scope, "Namespaced");
}

/// (API group, resource, verb) for every verb a rule grants.
fn grants(rules: &[PolicyRule]) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules {
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "rules are by resource"
        );
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    assert_ne!(verb, "*", "no wildcard verbs");
                    out.insert((group.clone(), resource.clone(), verb.clone()));
                }
            }
        }
    }
    out
}

/// Each (group, resource, verb) of a list of API calls.
fn calls(access: &[infergate_kube::access::Access]) -> BTreeSet<(String, String, String)> {
    access
        .iter()
        .flat_map(|a| {
            a.verbs
                .iter()
                .map(|v| (a.group.to_owned(), a.resource.to_owned(), (*v).to_owned()))
        })
        .collect()
}

#[test]
fn rbac_grants_exactly_the_calls_the_code_makes() {
    let m = Manifests::load();
    let role = m.one::<Role>("Role");
    let cluster_role = m.one::<ClusterRole>("ClusterRole");
    let mut granted = grants(role.rules.as_deref().unwrap_or_default());
    granted.extend(grants(cluster_role.rules.as_deref().unwrap_or_default()));
    let called = calls(infergate_kube::access::API_ACCESS);
    assert_eq!(
        granted, called,
        "rbac.yaml and infergate_kube::access::API_ACCESS disagree"
    );

    // The bindings give those roles to the account the pods run as.
    let account = m.one::<ServiceAccount>("ServiceAccount");
    let account_name = account.metadata.name.clone().unwrap();
    let deployment = m.one::<Deployment>("Deployment");
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(&*account_name));
    let binding = m.one::<RoleBinding>("RoleBinding");
    assert_eq!(binding.role_ref.kind, "Role");
    assert_eq!(Some(binding.role_ref.name), role.metadata.name);
    let cluster_binding = m.one::<ClusterRoleBinding>("ClusterRoleBinding");
    assert_eq!(cluster_binding.role_ref.kind, "ClusterRole");
    assert_eq!(
        Some(cluster_binding.role_ref.name),
        cluster_role.metadata.name
    );
    for subjects in [binding.subjects, cluster_binding.subjects] {
        let subjects = subjects.unwrap();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "ServiceAccount");
        assert_eq!(subjects[0].name, account_name);
        assert_eq!(subjects[0].namespace, account.metadata.namespace);
    }
}

fn gateway_container(deployment: &Deployment) -> Container {
    let pod = deployment.spec.clone().unwrap().template.spec.unwrap();
    assert_eq!(pod.containers.len(), 1);
    pod.containers[0].clone()
}

/// The container port a probe's named or numbered port refers to.
fn container_port(container: &Container, port: &IntOrString) -> i32 {
    match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    }
}

fn address_port(address: &str) -> i32 {
    address.rsplit_once(':').unwrap().1.parse().unwrap()
}

/// Probes go to the admin listener the example config opens, at paths
/// that a running gateway's admin listener answers.
#[tokio::test]
async fn probes_point_at_the_admin_listener() {
    let m = Manifests::load();
    let config = config::from_yaml(&m.config_text()).unwrap();
    let admin_port = address_port(&config.spec.admin.as_ref().unwrap().address);
    let deployment = m.one::<Deployment>("Deployment");
    let container = gateway_container(&deployment);
    let readiness = container.readiness_probe.clone().unwrap().http_get.unwrap();
    let liveness = container.liveness_probe.clone().unwrap().http_get.unwrap();
    assert_eq!(readiness.path.as_deref(), Some("/readyz"));
    assert_eq!(liveness.path.as_deref(), Some("/healthz"));
    for probe in [&readiness, &liveness] {
        assert_eq!(container_port(&container, &probe.port), admin_port);
    }

    // A gateway with an admin listener answers those paths (not 404):
    // /healthz with 200, /readyz with 200 or 503 as its pools are.
    let gateway_config = config::from_yaml(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{name: public, address: \"127.0.0.1:0\"}]\n  admin: {address: \"127.0.0.1:0\"}\n  pools: [{name: p, models: [m], endpoints: [\"127.0.0.1:1\"]}]\n",
    )
    .unwrap();
    let gateway = gateway::Gateway::start(&gateway_config).await.unwrap();
    let admin = gateway.admin_addr().unwrap();
    let live = get(admin, liveness.path.as_deref().unwrap()).await;
    assert!(live.starts_with("HTTP/1.1 200"), "{live}");
    let ready = get(admin, readiness.path.as_deref().unwrap()).await;
    assert!(
        ready.starts_with("HTTP/1.1 200") || ready.starts_with("HTTP/1.1 503"),
        "{ready}"
    );
    assert!(ready.contains("ready"), "{ready}");
    gateway.shutdown().await;
}

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

/// What a rolling update and a node drain need: more than one replica,
/// spread, a disruption budget, and a grace period longer than the
/// preStop pause plus the config's drain timeout.
#[test]
fn the_deployment_survives_rollouts_and_drains() {
    let m = Manifests::load();
    let config = config::from_yaml(&m.config_text()).unwrap();
    let deployment = m.one::<Deployment>("Deployment");
    let spec = deployment.spec.clone().unwrap();
    assert!(spec.replicas.unwrap_or(1) >= 2);
    let pod_labels = spec.template.metadata.clone().unwrap().labels.unwrap();
    let selected = spec.selector.match_labels.clone().unwrap();
    assert!(selected.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    let pod = spec.template.spec.clone().unwrap();
    let anti = pod.affinity.unwrap().pod_anti_affinity.unwrap();
    let terms = anti
        .preferred_during_scheduling_ignored_during_execution
        .unwrap();
    assert_eq!(
        terms[0]
            .pod_affinity_term
            .label_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref(),
        Some(&selected)
    );

    let container = gateway_container(&deployment);
    let pre_stop = container.lifecycle.clone().unwrap().pre_stop.unwrap();
    let command = pre_stop.exec.unwrap().command.unwrap();
    assert_eq!(command[0], "sleep");
    let pause: i64 = command[1].parse().unwrap();
    let drain = config.spec.shutdown.drain_timeout().as_secs() as i64;
    let grace = pod.termination_grace_period_seconds.unwrap();
    assert!(
        grace > pause + drain,
        "terminationGracePeriodSeconds {grace} must exceed preStop {pause} s + drainTimeout {drain} s"
    );

    let pdb = m.one::<PodDisruptionBudget>("PodDisruptionBudget");
    let pdb_spec = pdb.spec.unwrap();
    assert_eq!(
        pdb_spec.selector.unwrap().match_labels.as_ref(),
        Some(&selected)
    );
    assert_eq!(pdb_spec.min_available, Some(IntOrString::Int(1)));

    // The pods read the example object.
    let args = container.args.clone().unwrap();
    assert!(args.contains(&"--kubernetes".to_owned()));
    let name = config.metadata.name.clone();
    assert!(args.contains(&format!("--name={name}")), "{args:?}");

    // The Service reaches the pods on ports they open.
    let service = m.one::<Service>("Service");
    let service_spec = service.spec.unwrap();
    assert!(
        service_spec
            .selector
            .unwrap()
            .iter()
            .all(|(k, v)| pod_labels.get(k) == Some(v))
    );
    let public_port = address_port(&config.spec.listeners[0].address);
    let ports = service_spec.ports.unwrap();
    let http = ports
        .iter()
        .find(|p| p.name.as_deref() == Some("http"))
        .unwrap();
    assert_eq!(
        container_port(&container, http.target_port.as_ref().unwrap()),
        public_port
    );
}

/// Non-root, read-only root filesystem, no capabilities, resource
/// requests; the same user as the image's.
#[test]
fn the_gateway_runs_locked_down() {
    let m = Manifests::load();
    let deployment = m.one::<Deployment>("Deployment");
    let pod = deployment.spec.clone().unwrap().template.spec.unwrap();
    let pod_security = pod.security_context.unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    let container = gateway_container(&deployment);
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(
        security.capabilities.unwrap().drop,
        Some(vec!["ALL".to_owned()])
    );
    let requests = container.resources.clone().unwrap().requests.unwrap();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));

    let dockerfile =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Dockerfile"))
            .unwrap();
    let image_user: i64 = dockerfile
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("the Dockerfile sets a USER")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(pod_security.run_as_user, Some(image_user));
}

/// `infergate check` takes a custom resource manifest as it takes a file:
/// the example, and an object as read back from a cluster (server-set
/// metadata and a status), and it refuses an invalid one with its problems.
#[test]
fn check_validates_custom_resource_manifests() {
    let check = |path: &Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["check", "--config"])
            .arg(path)
            .output()
            .unwrap()
    };
    let out = check(&deploy_dir().join("config.yaml"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let read_back = "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nmetadata:\n  name: gw\n  namespace: infergate\n  uid: 0d9e4ae4-8f5c-4d0e-9c8e-1b2f3a4b5c6d\n  resourceVersion: \"4711\"\n  generation: 3\n  creationTimestamp: \"2026-01-01T00:00:00Z\"\n  managedFields: [{manager: kubectl, operation: Apply}]\nspec:\n  listeners: [{name: public, address: \"127.0.0.1:8080\"}]\n  pools: [{name: p, models: [m], endpoints: [\"127.0.0.1:9001\"]}]\nstatus:\n  observedGeneration: 3\n  conditions: [{type: Accepted, status: \"True\", reason: Accepted, message: \"\", lastTransitionTime: \"2026-01-01T00:00:00Z\"}]\n";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("object.yaml");
    std::fs::write(&file, read_back).unwrap();
    let out = check(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    std::fs::write(&file, read_back.replace("models: [m]", "models: []")).unwrap();
    let out = check(&file);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("spec.pools[0].models"), "{stderr}");
}

/// The example Role that lets the gateway wake a cold pool's workload
/// grants only calls the scaler makes, each on named objects.
#[test]
fn wake_rbac_grants_only_the_scale_calls_on_named_workloads() {
    let path = deploy_dir().join("autoscaling/wake-rbac.yaml");
    let documents = yaml_documents(&path);
    let role: Role = documents
        .iter()
        .find(|d| d["kind"] == "Role")
        .map(|d| serde_json::from_value(d.clone()).unwrap())
        .expect("a Role");
    let binding: RoleBinding = documents
        .iter()
        .find(|d| d["kind"] == "RoleBinding")
        .map(|d| serde_json::from_value(d.clone()).unwrap())
        .expect("a RoleBinding");
    assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
    assert_eq!(role.metadata.namespace, binding.metadata.namespace);
    let allowed = calls(infergate_kube::access::WAKE_ACCESS);
    let rules = role.rules.unwrap();
    assert!(!rules.is_empty());
    for rule in &rules {
        let names = rule.resource_names.as_deref().unwrap_or_default();
        assert!(!names.is_empty(), "each rule names its workloads: {rule:?}");
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                for verb in &rule.verbs {
                    let call = (group.clone(), resource.clone(), verb.clone());
                    assert!(
                        allowed.contains(&call),
                        "{call:?} is not a call the gateway makes"
                    );
                }
            }
        }
    }
    // The account bound is the gateway's own.
    let account = Manifests::load().one::<ServiceAccount>("ServiceAccount");
    let subjects = binding.subjects.unwrap();
    assert_eq!(subjects[0].name, account.metadata.name.unwrap());
}
