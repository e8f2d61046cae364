//! The `InferenceGatewayConfig` custom resource: its definition, generated
//! from the config's own types, so the API server checks an object against
//! the same fields `infergate check` reads.
//!
//! `deploy/kubernetes/crd.yaml` is [`manifest`]'s output; a test fails when
//! it is out of date.

use kube::CustomResource;
use kube::core::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::status::ConfigStatus;

/// The API group of the config's custom resource.
pub const GROUP: &str = "infergate.dev";
/// The served and stored version (the config's `apiVersion` is
/// `GROUP/VERSION`).
pub const VERSION: &str = "v1alpha1";
/// The resource's plural name, in URLs and RBAC rules.
pub const PLURAL: &str = "inferencegatewayconfigs";

/// The spec of an `InferenceGatewayConfig` object: the config file's
/// `spec`, field for field (docs/config.md).
#[derive(CustomResource, Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "infergate.dev",
    version = "v1alpha1",
    kind = "InferenceGatewayConfig",
    plural = "inferencegatewayconfigs",
    shortname = "igc",
    namespaced,
    root = "GatewayConfigObject",
    status = "ConfigStatus",
    doc = "The configuration of an infergate gateway: listeners, pools of model-server replicas, routing, limits and security. Every gateway replica started with `infergate serve --kubernetes --name NAME` reads the object of that name and applies each change live.",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status","description":"Whether the gateways accepted the current spec"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status","description":"Whether the gateway can serve"}"#,
    printcolumn = r#"{"name":"Observed","type":"integer","jsonPath":".status.observedGeneration","priority":1,"description":"The generation of the spec the status describes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(transparent)]
pub struct GatewaySpec(pub config::Spec);

/// The `CustomResourceDefinition`, as the API server takes it.
pub fn definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    GatewayConfigObject::crd()
}

/// The definition as YAML, headed by how it is made: what `infergate crd`
/// prints and `deploy/kubernetes/crd.yaml` holds.
pub fn manifest() -> String {
    let yaml = serde_yaml_ng::to_string(&definition())
        .expect("a CustomResourceDefinition serializes to YAML");
    format!(
        "# Generated from the config's Rust types by `{REGENERATE}`.\n# Do not edit: change the types (crates/config/src/schema.rs) and run it again.\n{yaml}"
    )
}

/// The command that writes `deploy/kubernetes/crd.yaml` again.
pub const REGENERATE: &str = "cargo run -p infergate -- crd > deploy/kubernetes/crd.yaml";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn the_checked_in_definition_is_current() {
        let checked_in = include_str!("../../../deploy/kubernetes/crd.yaml");
        // INFERGATE_BLESS=1 writes it instead (when the binary is not built).
        if std::env::var_os("INFERGATE_BLESS").is_some() {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../deploy/kubernetes/crd.yaml"
            );
            std::fs::write(path, manifest()).unwrap();
            return;
        }
        assert!(
            checked_in == manifest(),
            "deploy/kubernetes/crd.yaml is out of date with the config's types; regenerate it with\n    {REGENERATE}"
        );
    }

    fn schema() -> Value {
        let crd = serde_json::to_value(definition()).unwrap();
        let versions = crd["spec"]["versions"].as_array().unwrap();
        assert_eq!(versions.len(), 1);
        versions[0]["schema"]["openAPIV3Schema"].clone()
    }

    /// The rules a Kubernetes API server applies to a CRD's schema (a
    /// "structural schema"): every node has a type unless it says it
    /// holds anything, no references, no combinators carrying types, no
    /// `additionalProperties` beside `properties` or as a boolean, no
    /// `uniqueItems`, map-lists keyed on required fields.
    fn check_structural(node: &Value, path: &str, problems: &mut Vec<String>) {
        let Some(object) = node.as_object() else {
            problems.push(format!("{path}: not a schema object"));
            return;
        };
        let open = object.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
            || object.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
        if !open
            && object
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
        {
            problems.push(format!("{path}: no type"));
        }
        for forbidden in [
            "$ref",
            "$schema",
            "$defs",
            "definitions",
            "allOf",
            "anyOf",
            "oneOf",
            "not",
        ] {
            if object.contains_key(forbidden) {
                problems.push(format!("{path}: has {forbidden}"));
            }
        }
        if object.get("uniqueItems") == Some(&Value::Bool(true)) {
            problems.push(format!("{path}: uniqueItems"));
        }
        match object.get("additionalProperties") {
            Some(Value::Bool(_)) => problems.push(format!("{path}: boolean additionalProperties")),
            Some(_) if object.contains_key("properties") => {
                problems.push(format!("{path}: additionalProperties beside properties"))
            }
            Some(inner) => check_structural(inner, &format!("{path}.*"), problems),
            None => {}
        }
        if let Some(properties) = object.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                check_structural(property, &format!("{path}.{name}"), problems);
            }
        }
        if let Some(items) = object.get("items") {
            check_structural(items, &format!("{path}[]"), problems);
            if object.get("x-kubernetes-list-type") == Some(&Value::from("map")) {
                let required = items["required"].as_array().cloned().unwrap_or_default();
                for key in object["x-kubernetes-list-map-keys"].as_array().unwrap() {
                    if !required.contains(key) {
                        problems.push(format!("{path}: list map key {key} is not required"));
                    }
                }
            }
        }
    }

    #[test]
    fn the_schema_is_structural() {
        let mut problems = Vec::new();
        check_structural(&schema(), "", &mut problems);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn the_definition_has_what_kubectl_shows() {
        let crd = definition();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("inferencegatewayconfigs.infergate.dev")
        );
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.names.plural, PLURAL);
        assert_eq!(crd.spec.names.kind, config::defaults::KIND);
        assert_eq!(
            config::defaults::API_VERSION,
            format!("{GROUP}/{VERSION}"),
            "the file's apiVersion is the resource's"
        );
        assert!(
            crd.spec
                .names
                .short_names
                .unwrap()
                .contains(&"igc".to_owned())
        );
        let version = &crd.spec.versions[0];
        assert!(version.subresources.as_ref().unwrap().status.is_some());
        let columns: Vec<&str> = version
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns, ["Accepted", "Ready", "Observed", "Age"]);
    }

    /// Doc comments become descriptions, down to the pools' fields, and the
    /// enums read from other crates keep their names.
    #[test]
    fn the_schema_describes_the_fields() {
        let schema = schema();
        let spec = &schema["properties"]["spec"];
        let pool = &spec["properties"]["pools"]["items"]["properties"];
        assert!(
            pool["models"]["description"]
                .as_str()
                .unwrap()
                .contains("Model names clients may put in `model`")
        );
        assert_eq!(pool["engine"]["enum"][0], "vllm");
        // Pools may be left out when `global` has members (checked by the
        // config, which can say why).
        assert!(
            !spec["required"]
                .as_array()
                .is_some_and(|r| r.contains(&Value::from("pools")))
        );
        let member = &spec["properties"]["global"]["properties"]["members"]["items"]["properties"];
        assert_eq!(member["tier"]["enum"][1], "fallback");
        let failover = &spec["properties"]["global"]["properties"]["failover"]["properties"];
        assert_eq!(failover["unhealthyAfter"]["type"], "string");
        let status = &schema["properties"]["status"]["properties"];
        assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
        assert_eq!(
            status["pools"]["items"]["properties"]["readyEndpoints"]["type"],
            "integer"
        );
    }
}
