//! Reading the manifests of deploy/: every document of a YAML file.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

/// Every document of the YAML file at `path`, as JSON values; empty
/// documents left out.
pub fn yaml_documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| {
            let value = serde_yaml_ng::Value::deserialize(d)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            serde_json::to_value(value).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}
