//! Label and field selectors as the API server reads them from a query.

use std::collections::BTreeMap;

use serde_json::Value;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` or `fieldSelector`: every requirement holds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parse `a=b,c==d,e!=f,g,!h`. Set-based forms (`in`, `notin`) are
    /// refused: the gateway never sends them.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut requirements = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let requirement = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::NotExists(k.trim().into())
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!("unsupported selector requirement {part:?}"));
            } else {
                Requirement::Exists(part.into())
            };
            requirements.push(requirement);
        }
        Ok(Selector(requirements))
    }

    pub fn matches(&self, values: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => values.get(k) == Some(v),
            Requirement::NotEquals(k, v) => values.get(k) != Some(v),
            Requirement::Exists(k) => values.contains_key(k),
            Requirement::NotExists(k) => !values.contains_key(k),
        })
    }
}

/// An object's labels.
pub fn labels(object: &Value) -> BTreeMap<String, String> {
    object
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

/// The fields every kind can be selected by.
pub fn fields(object: &Value) -> BTreeMap<String, String> {
    let mut fields = BTreeMap::new();
    for (field, pointer) in [
        ("metadata.name", "/metadata/name"),
        ("metadata.namespace", "/metadata/namespace"),
    ] {
        if let Some(v) = object.pointer(pointer).and_then(Value::as_str) {
            fields.insert(field.to_owned(), v.to_owned());
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn equality_inequality_and_existence() {
        let s = Selector::parse("app=vllm,tier==gpu,zone!=b,ready,!draining").unwrap();
        assert!(s.matches(&map(&[("app", "vllm"), ("tier", "gpu"), ("ready", "")])));
        assert!(!s.matches(&map(&[("app", "vllm"), ("tier", "gpu")])));
        assert!(!s.matches(&map(&[
            ("app", "vllm"),
            ("tier", "gpu"),
            ("ready", ""),
            ("zone", "b")
        ])));
        assert!(!s.matches(&map(&[("app", "sglang"), ("tier", "gpu"), ("ready", "")])));
        assert!(Selector::parse("").unwrap().matches(&map(&[])));
        assert!(Selector::parse("app in (a,b)").is_err());
    }
}
