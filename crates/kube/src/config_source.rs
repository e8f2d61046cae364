//! The config from an `InferenceGatewayConfig` object: each new version
//! of its spec, as a document the config crate reads exactly as it reads a
//! file, so a cluster object and a file are checked the same way.
//!
//! The object is watched as untyped JSON, not as the typed resource: a
//! spec that does not deserialize must still reach the config reader,
//! which reports every problem, instead of stopping the watch.

use std::pin::Pin;

use futures_util::{Stream, StreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::{Value, json};

use crate::crd::GatewayConfigObject;

/// One version of the object's spec.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigObject {
    /// `metadata.generation`: which version of the spec this is.
    pub generation: Option<i64>,
    /// The object as a config document (`apiVersion`, `kind`,
    /// `metadata.name`/`namespace`, `spec`), in YAML.
    pub document: String,
}

/// The versions of one object's spec, as they are written.
pub struct ConfigWatch {
    name: String,
    objects: Pin<Box<dyn Stream<Item = Result<DynamicObject, watcher::Error>> + Send>>,
    /// The spec last handed out: a status write or a metadata change
    /// changes the object, not the config.
    last_spec: Option<Value>,
}

impl ConfigWatch {
    /// Watch `namespace/name`. The watch lists and resumes as kube-rs's
    /// watcher does, with its backoff after errors.
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> ConfigWatch {
        let resource = ApiResource::erase::<GatewayConfigObject>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &resource);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let objects = watcher(api, config).default_backoff().applied_objects();
        ConfigWatch {
            name: name.to_owned(),
            objects: Box::pin(objects),
            last_spec: None,
        }
    }

    /// The next version of the spec (the first: the object as it is now,
    /// once it exists). Waits through API errors, which are logged.
    pub async fn next(&mut self) -> Option<ConfigObject> {
        loop {
            let object = match self.objects.next().await? {
                Ok(object) => object,
                Err(e) => {
                    tracing::warn!(object = %self.name, error = %e, "cannot watch the config object; retrying");
                    continue;
                }
            };
            if object.metadata.name.as_deref() != Some(&*self.name) {
                continue;
            }
            let spec = object.data.get("spec").cloned().unwrap_or(Value::Null);
            if self.last_spec.as_ref() == Some(&spec) {
                continue;
            }
            self.last_spec = Some(spec);
            return Some(document(&object));
        }
    }
}

/// The object as the config reader takes it: what a user wrote, without
/// what the server adds (the reader would accept it, but problems are
/// easier to read without it).
fn document(object: &DynamicObject) -> ConfigObject {
    let mut metadata = serde_json::Map::new();
    for (field, value) in [
        ("name", object.metadata.name.clone()),
        ("namespace", object.metadata.namespace.clone()),
    ] {
        if let Some(value) = value {
            metadata.insert(field.to_owned(), Value::from(value));
        }
    }
    let types = object.types.clone().unwrap_or_default();
    let doc = json!({
        "apiVersion": types.api_version,
        "kind": types.kind,
        "metadata": metadata,
        "spec": object.data.get("spec").cloned().unwrap_or(Value::Null),
    });
    ConfigObject {
        generation: object.metadata.generation,
        document: serde_yaml_ng::to_string(&doc).expect("JSON values serialize to YAML"),
    }
}
