//! The double's object store: one resourceVersion counter for every kind
//! (as etcd has), the objects by kind/namespace/name, and the change feed
//! open watches follow.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use tokio::sync::broadcast;

/// A kind of object the double serves, addressed as kube-rs addresses it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Resource {
    /// Empty for the core group (`/api/v1/...`).
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    /// Writes to the object leave `status` alone; `/status` writes change
    /// only `status`.
    pub status_subresource: bool,
    /// `/scale` reads and writes `spec.replicas` as an `autoscaling/v1`
    /// Scale.
    pub scale_subresource: bool,
}

impl Resource {
    pub const PODS: Resource = Resource {
        group: "",
        version: "v1",
        plural: "pods",
        kind: "Pod",
        status_subresource: true,
        scale_subresource: false,
    };
    pub const LEASES: Resource = Resource {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        status_subresource: false,
        scale_subresource: false,
    };
    pub const INFERENCE_POOLS: Resource = Resource {
        group: "inference.networking.k8s.io",
        version: "v1",
        plural: "inferencepools",
        kind: "InferencePool",
        status_subresource: true,
        scale_subresource: false,
    };
    pub const GATEWAY_CONFIGS: Resource = Resource {
        group: "infergate.dev",
        version: "v1alpha1",
        plural: "inferencegatewayconfigs",
        kind: "InferenceGatewayConfig",
        status_subresource: true,
        scale_subresource: false,
    };
    pub const DEPLOYMENTS: Resource = Resource {
        group: "apps",
        version: "v1",
        plural: "deployments",
        kind: "Deployment",
        status_subresource: true,
        scale_subresource: true,
    };
    pub const STATEFULSETS: Resource = Resource {
        group: "apps",
        version: "v1",
        plural: "statefulsets",
        kind: "StatefulSet",
        status_subresource: true,
        scale_subresource: true,
    };
    pub const LEADER_WORKER_SETS: Resource = Resource {
        group: "leaderworkerset.x-k8s.io",
        version: "v1",
        plural: "leaderworkersets",
        kind: "LeaderWorkerSet",
        status_subresource: true,
        scale_subresource: true,
    };
    pub const ALL: [Resource; 7] = [
        Self::PODS,
        Self::LEASES,
        Self::INFERENCE_POOLS,
        Self::GATEWAY_CONFIGS,
        Self::DEPLOYMENTS,
        Self::STATEFULSETS,
        Self::LEADER_WORKER_SETS,
    ];

    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The collection path in a namespace, as the client requests it.
    pub fn collection_path(&self, namespace: &str) -> String {
        let root = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        format!("{root}/namespaces/{namespace}/{}", self.plural)
    }
}

/// What a watch event says happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as the change feed carries it to open watches.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    pub resource: Resource,
    pub namespace: String,
    pub kind: EventType,
    pub object: Value,
    /// The object before a modification, so a filtered watch can tell an
    /// object that left its selector (DELETED) from one that joined (ADDED).
    pub previous: Option<Value>,
}

/// Why a write was refused, as a Kubernetes `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            code,
            reason,
            message: message.into(),
        }
    }
    pub fn not_found(resource: &Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{}.{} {name:?} not found", resource.plural, resource.group),
        )
    }
    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        })
    }
}

type Key = (Resource, String, String);

/// Capacity of the change feed; a watch that falls this far behind is
/// ended with 410 Expired, as a real API server ends a slow watcher.
const FEED_CAPACITY: usize = 16_384;

pub struct Store {
    /// The last resourceVersion handed out.
    pub revision: u64,
    /// Changes at or below this were compacted away: a watch asking to
    /// resume from an older version gets 410 Expired.
    pub compacted: u64,
    objects: BTreeMap<Key, Value>,
    /// Changes since the last compaction, for watches that resume.
    history: Vec<Change>,
    pub feed: broadcast::Sender<Change>,
    uid_counter: u64,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            revision: 1,
            compacted: 0,
            objects: BTreeMap::new(),
            history: Vec::new(),
            feed: broadcast::channel(FEED_CAPACITY).0,
            uid_counter: 0,
        }
    }
}

/// Which part of an object a write may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The object itself (`status` kept when it is a subresource).
    Main,
    /// Only `status`.
    Status,
}

impl Store {
    pub fn get(&self, resource: &Resource, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(&(resource.clone(), namespace.to_owned(), name.to_owned()))
    }

    /// Objects of a kind in a namespace, in name order.
    pub fn list<'a>(
        &'a self,
        resource: &'a Resource,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Value> + 'a {
        self.objects
            .iter()
            .filter(move |((r, ns, _), _)| r == resource && ns == namespace)
            .map(|(_, v)| v)
    }

    /// Changes after `after` still in history, oldest first; `None` when
    /// `after` was compacted away.
    pub fn changes_since(&self, after: u64) -> Option<impl Iterator<Item = &Change>> {
        (after >= self.compacted).then(|| {
            self.history
                .iter()
                .filter(move |change| change.resource_version > after)
        })
    }

    /// Forget history: every resourceVersion up to now becomes too old to
    /// resume a watch from.
    pub fn compact(&mut self) {
        self.compacted = self.revision;
        self.history.clear();
    }

    pub fn create(
        &mut self,
        resource: &Resource,
        namespace: &str,
        mut object: Value,
    ) -> Result<Value, Refusal> {
        let name = object_name(&object)?;
        if self.get(resource, namespace, &name).is_some() {
            return Err(Refusal::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", resource.plural),
            ));
        }
        self.uid_counter += 1;
        let meta = metadata_mut(&mut object);
        meta.insert("namespace".into(), json!(namespace));
        meta.insert("uid".into(), json!(format!("uid-{}", self.uid_counter)));
        meta.insert("creationTimestamp".into(), json!("2026-01-01T00:00:00Z"));
        meta.insert("generation".into(), json!(1));
        meta.remove("deletionTimestamp");
        Ok(self.commit(resource, namespace, &name, object, EventType::Added))
    }

    /// Replace the object (or its status) with `object`. A
    /// `metadata.resourceVersion` in it must match the stored one (optimistic
    /// concurrency), as on a real server.
    pub fn replace(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        mut object: Value,
        part: Part,
    ) -> Result<Value, Refusal> {
        let Some(old) = self.get(resource, namespace, name).cloned() else {
            return Err(Refusal::not_found(resource, name));
        };
        if let Some(given) = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            && given != resource_version_of(&old)
        {
            return Err(Refusal::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: the object has been modified; please apply your changes to the latest version and try again",
                    resource.plural
                ),
            ));
        }
        if object_name(&object)? != name {
            return Err(Refusal::new(
                400,
                "BadRequest",
                "the name in the body does not match the URL",
            ));
        }
        // Server-set metadata is never taken from the client.
        for field in [
            "uid",
            "creationTimestamp",
            "generation",
            "namespace",
            "deletionTimestamp",
        ] {
            match old.pointer(&format!("/metadata/{field}")) {
                Some(v) => {
                    metadata_mut(&mut object).insert(field.into(), v.clone());
                }
                None => {
                    metadata_mut(&mut object).remove(field);
                }
            }
        }
        let object = match part {
            Part::Status => {
                let mut kept = old.clone();
                set_field(&mut kept, "status", object.get("status").cloned());
                kept
            }
            Part::Main => {
                if resource.status_subresource {
                    set_field(&mut object, "status", old.get("status").cloned());
                }
                if old.get("spec") != object.get("spec") {
                    let generation = old
                        .pointer("/metadata/generation")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    metadata_mut(&mut object).insert("generation".into(), json!(generation + 1));
                }
                object
            }
        };
        if object == old {
            // A no-op write changes nothing, not even the resourceVersion.
            return Ok(old);
        }
        Ok(self.commit(resource, namespace, name, object, EventType::Modified))
    }

    /// Set `metadata.deletionTimestamp` (a pod that is terminating) as a
    /// graceful deletion does: to the end of the pod's grace period, here
    /// Kubernetes' default of 30 s from now.
    pub fn set_terminating(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, Refusal> {
        let Some(mut object) = self.get(resource, namespace, name).cloned() else {
            return Err(Refusal::not_found(resource, name));
        };
        let end = k8s_openapi::jiff::Timestamp::now() + std::time::Duration::from_secs(30);
        metadata_mut(&mut object).insert(
            "deletionTimestamp".into(),
            json!(
                end.round(k8s_openapi::jiff::Unit::Second)
                    .unwrap()
                    .to_string()
            ),
        );
        Ok(self.commit(resource, namespace, name, object, EventType::Modified))
    }

    pub fn delete(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, Refusal> {
        let key = (resource.clone(), namespace.to_owned(), name.to_owned());
        let Some(mut object) = self.objects.remove(&key) else {
            return Err(Refusal::not_found(resource, name));
        };
        self.revision += 1;
        metadata_mut(&mut object)
            .insert("resourceVersion".into(), json!(self.revision.to_string()));
        self.record(
            resource,
            namespace,
            EventType::Deleted,
            object.clone(),
            None,
        );
        Ok(object)
    }

    /// The object's `/scale`: an `autoscaling/v1` Scale whose
    /// resourceVersion is the object's.
    pub fn scale(
        &self,
        resource: &Resource,
        namespace: &str,
        name: &str,
    ) -> Result<Value, Refusal> {
        let object = self
            .get(resource, namespace, name)
            .ok_or_else(|| Refusal::not_found(resource, name))?;
        let replicas = |pointer: &str| object.pointer(pointer).and_then(Value::as_i64).unwrap_or(0);
        Ok(json!({
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "resourceVersion": resource_version_of(object),
                "uid": object.pointer("/metadata/uid").cloned().unwrap_or(Value::Null),
            },
            "spec": {"replicas": replicas("/spec/replicas")},
            "status": {"replicas": replicas("/status/replicas")},
        }))
    }

    /// Write `/scale`: `spec.replicas` from `scale`, whose resourceVersion,
    /// when given, must be the object's (optimistic concurrency).
    pub fn set_scale(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        scale: &Value,
    ) -> Result<Value, Refusal> {
        let Some(mut object) = self.get(resource, namespace, name).cloned() else {
            return Err(Refusal::not_found(resource, name));
        };
        let replicas = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .filter(|n| *n >= 0)
            .ok_or_else(|| Refusal::new(422, "Invalid", "spec.replicas: Required value"))?;
        let spec = object
            .as_object_mut()
            .expect("stored objects are objects")
            .entry("spec")
            .or_insert_with(|| json!({}));
        spec["replicas"] = json!(replicas);
        if let Some(given) = scale
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
        {
            metadata_mut(&mut object).insert("resourceVersion".into(), json!(given));
        } else {
            metadata_mut(&mut object).remove("resourceVersion");
        }
        self.replace(resource, namespace, name, object, Part::Main)?;
        self.scale(resource, namespace, name)
    }

    fn commit(
        &mut self,
        resource: &Resource,
        namespace: &str,
        name: &str,
        mut object: Value,
        kind: EventType,
    ) -> Value {
        self.revision += 1;
        if let Some(map) = object.as_object_mut() {
            map.insert("apiVersion".into(), json!(resource.api_version()));
            map.insert("kind".into(), json!(resource.kind));
        }
        metadata_mut(&mut object)
            .insert("resourceVersion".into(), json!(self.revision.to_string()));
        let previous = self.objects.insert(
            (resource.clone(), namespace.to_owned(), name.to_owned()),
            object.clone(),
        );
        self.record(resource, namespace, kind, object.clone(), previous);
        object
    }

    fn record(
        &mut self,
        resource: &Resource,
        namespace: &str,
        kind: EventType,
        object: Value,
        previous: Option<Value>,
    ) {
        let change = Change {
            resource_version: self.revision,
            resource: resource.clone(),
            namespace: namespace.to_owned(),
            kind,
            object,
            previous,
        };
        self.history.push(change.clone());
        // No receiver is fine: nobody is watching.
        let _ = self.feed.send(change);
    }
}

pub fn resource_version_of(object: &Value) -> &str {
    object
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn object_name(object: &Value) -> Result<String, Refusal> {
    object
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Refusal::new(422, "Invalid", "metadata.name: Required value"))
}

fn metadata_mut(object: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    let map = object.as_object_mut().expect("made an object above");
    let meta = map.entry("metadata").or_insert_with(|| json!({}));
    if !meta.is_object() {
        *meta = json!({});
    }
    meta.as_object_mut().expect("made an object above")
}

fn set_field(object: &mut Value, field: &str, value: Option<Value>) {
    if let Some(map) = object.as_object_mut() {
        match value {
            Some(v) => {
                map.insert(field.into(), v);
            }
            None => {
                map.remove(field);
            }
        }
    }
}

/// JSON merge patch (RFC 7386): objects merge key by key, `null` removes,
/// anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(patch_map) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target_map = target.as_object_mut().expect("made an object above");
    for (key, value) in patch_map {
        if value.is_null() {
            target_map.remove(key);
        } else {
            merge_patch(target_map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut doc = json!({"a": "b", "c": {"d": "e", "f": "g"}});
        merge_patch(&mut doc, &json!({"a": "z", "c": {"f": null}}));
        assert_eq!(doc, json!({"a": "z", "c": {"d": "e"}}));
        merge_patch(&mut doc, &json!({"c": ["x"]}));
        assert_eq!(doc, json!({"a": "z", "c": ["x"]}));
    }

    #[test]
    fn generation_moves_with_spec_only_and_versions_only_forward() {
        let mut store = Store::default();
        let r = Resource::GATEWAY_CONFIGS;
        let created = store
            .create(
                &r,
                "ns",
                json!({"metadata": {"name": "gw"}, "spec": {"x": 1}}),
            )
            .unwrap();
        assert_eq!(created["metadata"]["generation"], 1);
        let rv1: u64 = resource_version_of(&created).parse().unwrap();

        let status_only = store
            .replace(
                &r,
                "ns",
                "gw",
                json!({"metadata": {"name": "gw"}, "spec": {"x": 1}, "status": {"ok": true}}),
                Part::Status,
            )
            .unwrap();
        assert_eq!(status_only["metadata"]["generation"], 1);
        assert_eq!(status_only["status"]["ok"], true);
        let rv2: u64 = resource_version_of(&status_only).parse().unwrap();
        assert!(rv2 > rv1);

        // A main write carries no status change through the subresource.
        let spec = store
            .replace(
                &r,
                "ns",
                "gw",
                json!({"metadata": {"name": "gw"}, "spec": {"x": 2}, "status": {"ok": false}}),
                Part::Main,
            )
            .unwrap();
        assert_eq!(spec["metadata"]["generation"], 2);
        assert_eq!(spec["status"]["ok"], true);

        let stale = store.replace(
            &r,
            "ns",
            "gw",
            json!({"metadata": {"name": "gw", "resourceVersion": rv1.to_string()}, "spec": {"x": 3}}),
            Part::Main,
        );
        assert_eq!(stale.unwrap_err().code, 409);
    }
}
