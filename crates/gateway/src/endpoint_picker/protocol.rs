//! The protocol's names — its headers and dynamic metadata — and the
//! metadata read and written: the data plane's subset hint in, the chosen
//! endpoints out, the endpoint that served back.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};

use crate::flow::Candidates;

/// The header naming the chosen replica and its fallbacks, in order.
pub const DESTINATION: &str = "x-gateway-destination-endpoint";
/// The header carrying the fairness id (a tenant, or a client within it).
pub const FAIRNESS_ID: &str = "x-gateway-inference-fairness-id";
/// The header naming the request's objective (a band, or a model whose
/// objective the config sets).
pub const OBJECTIVE: &str = "x-gateway-inference-objective";
/// The header naming the model served when the picker rewrote it.
pub const MODEL_REWRITE: &str = "x-gateway-model-name-rewrite";

/// The namespace of the endpoints, out and back.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// The namespace of the data plane's subset hint.
pub const SUBSET_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The subset hint's key: the endpoints the picker must choose from.
pub const SUBSET_KEY: &str = "x-gateway-destination-endpoint-subset";
/// The key of the endpoint that served, in the response's metadata.
pub const SERVED_KEY: &str = "x-gateway-destination-endpoint-served";

fn field<'m>(metadata: Option<&'m Metadata>, namespace: &str, key: &str) -> Option<&'m Kind> {
    metadata?
        .filter_metadata
        .get(namespace)?
        .fields
        .get(key)?
        .kind
        .as_ref()
}

/// Each `ip:port` of a value: a list of strings, or one comma-separated
/// string.
fn addresses(kind: &Kind) -> Vec<String> {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned)
            .collect()
    };
    match kind {
        Kind::StringValue(s) => split(s),
        Kind::ListValue(list) => list
            .values
            .iter()
            .filter_map(|v| match &v.kind {
                Some(Kind::StringValue(s)) => Some(split(s)),
                _ => None,
            })
            .flatten()
            .collect(),
        _ => Vec::new(),
    }
}

/// The subset the data plane allows, when it sends one (an empty one
/// allows nothing).
pub fn subset_hint(metadata: Option<&Metadata>) -> Option<Candidates> {
    field(metadata, SUBSET_NAMESPACE, SUBSET_KEY).map(|kind| Candidates(addresses(kind)))
}

/// The endpoint that served the request, as the data plane reports it.
pub fn served(metadata: Option<&Metadata>) -> Option<String> {
    field(metadata, LB_NAMESPACE, SERVED_KEY)
        .map(addresses)
        .and_then(|a| a.into_iter().next())
}

fn string(s: &str) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// `envoy.lb` → `x-gateway-destination-endpoint` = `endpoints`.
pub fn destination(endpoints: &str) -> Struct {
    let lb = Struct {
        fields: HashMap::from([(DESTINATION.to_owned(), string(endpoints))]),
    };
    Struct {
        fields: HashMap::from([(
            LB_NAMESPACE.to_owned(),
            Value {
                kind: Some(Kind::StructValue(lb)),
            },
        )]),
    }
}
