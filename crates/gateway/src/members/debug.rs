//! `/debug/members` on the admin listener: each member's health, its
//! share of this router's recent requests, the age of its last summary
//! and the signals its score is made of.

use std::time::Instant;

use global::Verdict;
use serde_json::{Value, json};

use super::roster::Members;

pub fn page(members: &Members) -> Value {
    let Some(roster) = members.roster() else {
        return json!({"members": []});
    };
    let now = Instant::now();
    let global = &roster.global;
    let list: Vec<Value> = roster
        .members
        .iter()
        .map(|m| {
            let snap = m.snapshot(now);
            let (state, share, reason) = match snap.verdict {
                Verdict::Healthy => ("healthy", 1.0, None),
                Verdict::Ramping { share } => ("ramping", share, None),
                Verdict::Unhealthy { reason } => ("unhealthy", 0.0, Some(reason.as_str())),
            };
            let models: Value = snap.summary.as_ref().map_or(Value::Null, |s| {
                json!(
                    s.models
                        .iter()
                        .map(|(name, l)| (
                            name.clone(),
                            json!({
                                "readyReplicas": l.ready_replicas,
                                "kvHeadroom": l.kv_headroom,
                                "queueDepth": l.queue_depth,
                                "inFlight": l.in_flight,
                                "saturated": l.saturated,
                                "errorRate": l.error_rate,
                                "throttleRate": l.throttle_rate,
                            })
                        ))
                        .collect::<serde_json::Map<_, _>>()
                )
            });
            json!({
                "name": m.name(),
                "url": m.spec.url,
                "kind": m.spec.kind.as_str(),
                "tier": m.spec.tier.as_str(),
                "region": m.spec.region(global),
                "residency": m.spec.residency,
                "state": state,
                "reason": reason,
                // The share of its traffic it may take: below 1 while ramping.
                "share": share,
                "lastSummaryAgeMs": snap.summary_age.map(|a| a.as_secs_f64() * 1e3),
                "generation": snap.summary.as_ref().map(|s| s.generation),
                "scoreParts": {
                    "inFlight": m.in_flight(),
                    "errorRate": snap.error_rate,
                    "distance": global.distance_to(m.spec.region(global)),
                    "rttMs": snap.rtt.map(|r| r.as_secs_f64() * 1e3),
                    "costPerMillionTokens": m.spec.cost_per_million_tokens,
                    "models": models,
                },
            })
        })
        .collect();
    json!({"region": global.region, "members": list})
}
