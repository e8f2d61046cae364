//! The status of an `InferenceGatewayConfig` object: which generation of
//! the spec the gateways last looked at, whether they accepted it (with
//! every problem when not), whether they can serve, and each pool's ready
//! replicas.
//!
//! [`ConfigStatus::next`] works out the status from what a gateway saw;
//! writing it is [`crate::status_writer`]'s job.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Condition type: the spec of `observedGeneration` was valid and is in
/// force (`True`), or was refused and an older spec still serves
/// (`False`, the problems in the message).
pub const ACCEPTED: &str = "Accepted";
/// Condition type: the gateway can serve some model (as `/readyz` says).
pub const READY: &str = "Ready";

/// The longest message the API server takes in a condition.
const MAX_MESSAGE: usize = 32 * 1024;

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigStatus {
    /// The `metadata.generation` of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted` and `Ready`, one of each.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The pools in force, each with its replicas ready to take requests.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pools: Vec<PoolStatus>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    pub name: String,
    /// Replicas that can take requests now: reachable, with fresh metrics
    /// when the pool scores on them.
    pub ready_endpoints: u32,
}

/// What a gateway saw, from which the status follows.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The object's `metadata.generation` last read.
    pub generation: Option<i64>,
    /// `Ok` when that spec is in force; otherwise every problem, one per
    /// line.
    pub accepted: Result<(), String>,
    /// `/readyz`'s answer: `Err` with the reason when not ready.
    pub ready: Result<(), String>,
    pub pools: Vec<PoolStatus>,
}

impl ConfigStatus {
    /// The status after `observed`, keeping each condition's
    /// `lastTransitionTime` unless its status changed (`now` otherwise).
    pub fn next(&self, observed: &Observed, now: Time) -> ConfigStatus {
        let accepted = match &observed.accepted {
            Ok(()) => (
                "True",
                "Accepted",
                "the spec is valid and in force".to_owned(),
            ),
            Err(problems) => (
                "False",
                "Invalid",
                format!("the spec was refused; the previous one still serves:\n{problems}"),
            ),
        };
        let ready = match &observed.ready {
            Ok(()) => (
                "True",
                "Ready",
                "a pool has a replica to send to".to_owned(),
            ),
            Err(why) => ("False", "NotReady", why.clone()),
        };
        let conditions = [(ACCEPTED, accepted), (READY, ready)]
            .into_iter()
            .map(|(kind, (status, reason, message))| {
                let before = self.conditions.iter().find(|c| c.type_ == kind);
                Condition {
                    type_: kind.to_owned(),
                    status: status.to_owned(),
                    reason: reason.to_owned(),
                    message: truncate(message),
                    observed_generation: observed.generation,
                    last_transition_time: match before {
                        Some(c) if c.status == status => c.last_transition_time.clone(),
                        _ => now.clone(),
                    },
                }
            })
            .collect();
        ConfigStatus {
            observed_generation: observed.generation,
            conditions,
            pools: observed.pools.clone(),
        }
    }

    /// The condition of a type, if set.
    pub fn condition(&self, kind: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == kind)
    }
}

/// A message within the API server's limit, cut at a character boundary.
fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - 3;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str("...");
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn observed(generation: i64, accepted: Result<(), String>) -> Observed {
        Observed {
            generation: Some(generation),
            accepted,
            ready: Ok(()),
            pools: vec![PoolStatus {
                name: "llama".into(),
                ready_endpoints: 2,
            }],
        }
    }

    #[test]
    fn a_refused_spec_says_why_and_keeps_ready_since() {
        let first = ConfigStatus::default().next(&observed(1, Ok(())), at(10));
        assert_eq!(first.observed_generation, Some(1));
        assert_eq!(first.condition(ACCEPTED).unwrap().status, "True");
        let refused = first.next(
            &observed(2, Err("spec.pools[0].models: at least one model".into())),
            at(20),
        );
        let accepted = refused.condition(ACCEPTED).unwrap();
        assert_eq!(accepted.status, "False");
        assert_eq!(accepted.reason, "Invalid");
        assert!(
            accepted
                .message
                .contains("spec.pools[0].models: at least one model")
        );
        assert_eq!(accepted.last_transition_time, at(20));
        assert_eq!(accepted.observed_generation, Some(2));
        // Ready did not change: its transition time stays.
        assert_eq!(
            refused.condition(READY).unwrap().last_transition_time,
            at(10)
        );
        assert_eq!(refused.pools[0].ready_endpoints, 2);
    }

    #[test]
    fn long_messages_fit_the_api_server() {
        let long = "é".repeat(MAX_MESSAGE);
        let status = ConfigStatus::default().next(&observed(1, Err(long)), at(0));
        let message = &status.condition(ACCEPTED).unwrap().message;
        assert!(message.len() <= MAX_MESSAGE);
        assert!(message.ends_with("..."));
    }
}
