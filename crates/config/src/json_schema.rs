//! JSON schemas of the config's fields whose types the config does not
//! own or whose YAML form is not their Rust shape: durations written as
//! text, and the names of picker and signals enums. The custom resource
//! definition is generated from these (see the `kube` crate); each list of
//! names comes from the type itself, so the schema cannot drift from what
//! the config reads.

use picker::flow::Priority;
use picker::{Fallback, Policy};
use schemars::{Schema, SchemaGenerator, json_schema};
use signals::Dialect;

/// A duration as `humantime` reads it: `500ms`, `30s`, `5m`, `1h 30m`.
pub fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "description": "A duration such as 500ms, 30s, 5m or 1h 30m.",
    })
}

fn names(names: impl IntoIterator<Item = &'static str>) -> Schema {
    let names: Vec<&str> = names.into_iter().collect();
    json_schema!({ "type": "string", "enum": names })
}

/// A priority band: `critical`, `standard` or `sheddable`.
pub fn priority(_: &mut SchemaGenerator) -> Schema {
    names(Priority::ALL.map(Priority::as_str))
}

/// Model or adapter name → priority band.
pub fn priority_map(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "additionalProperties": priority(generator),
    })
}

pub fn policy(_: &mut SchemaGenerator) -> Schema {
    names(Policy::ALL.map(Policy::name))
}

pub fn dialect(_: &mut SchemaGenerator) -> Schema {
    names(Dialect::ALL.map(Dialect::as_str))
}

pub fn fallback(_: &mut SchemaGenerator) -> Schema {
    names(FALLBACKS.map(Fallback::name))
}

/// Every fallback. A new variant does not compile until it is listed here.
const FALLBACKS: [Fallback; 2] = [Fallback::LeastRequest, Fallback::Refuse];
const _: fn(Fallback) = |f| match f {
    Fallback::LeastRequest | Fallback::Refuse => (),
};

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name a schema offers is one the config reads.
    #[test]
    fn enum_names_are_read_back() {
        fn reads<T: serde::de::DeserializeOwned>(schema: Schema) {
            let names = schema.get("enum").and_then(|v| v.as_array()).unwrap();
            assert!(!names.is_empty());
            for name in names {
                serde_json::from_value::<T>(name.clone())
                    .unwrap_or_else(|e| panic!("{name} is not read: {e}"));
            }
        }
        let mut generator = SchemaGenerator::default();
        reads::<Priority>(priority(&mut generator));
        reads::<Policy>(policy(&mut generator));
        reads::<Dialect>(dialect(&mut generator));
        reads::<Fallback>(fallback(&mut generator));
    }
}
