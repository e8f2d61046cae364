//! The global tier's side of the request path: this gateway as a router
//! in front of other gateways and endpoints ("members", `spec.global`;
//! docs/global.md).
//!
//! - [`member`]: one member's state — its latest load summary, its health
//!   (the `global` crate's state machine), what the router saw of its
//!   answers, its requests in flight.
//! - [`watch`]: the tasks that keep that state current — each member's
//!   summary stream (with a poll fallback and reconnects with back-off),
//!   probes of members down for their failures, and the health tick that
//!   takes a silent member down and logs every change.
//! - [`forward`]: a request for a model no local pool serves, sent to the
//!   member the picker chooses and retried on the next one only when it
//!   failed before the first response byte.
//! - [`roster`]: the members in force, kept in the gateway's state, and
//!   the member pick.
//! - [`debug`](mod@debug): the page `/debug/members`.
//!
//! The roster lives as long as the gateway: a reload that keeps a member
//! unchanged keeps its health and summary.

pub mod answer_body;
pub mod debug;
pub mod forward;
pub mod member;
pub mod roster;
mod watch;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::state::State;
use member::Member;
use roster::Roster;

/// Header a caller may send to hold its request to members carrying one
/// of the listed residency tags (comma-separated), honoured only when its
/// tenant has `residencyHeader: true`.
pub const RESIDENCY_HEADER: &str = "x-infergate-residency";

/// Put `spec.global` in force: watch its members (keeping the state
/// of those that did not change). Must run on the gateway's runtime.
/// `idle` bounds the wait for each chunk of a member's answer.
pub fn configure(state: &Arc<State>, global: Option<&config::Global>, idle: Duration) {
    let members = &state.members;
    let old = members.roster();
    if old.as_ref().map(|r| (&r.global, r.idle)) == global.map(|g| (g, idle)) {
        return;
    }
    let Some(global) = global else {
        members.replace(None);
        return;
    };
    let now = Instant::now();
    let kept = |spec: &config::Member| {
        old.as_ref()
            .filter(|o| o.global.failover == global.failover)
            .and_then(|o| o.members.iter().find(|m| &m.spec == spec))
            .cloned()
    };
    let list: Vec<Arc<Member>> = global
        .members
        .iter()
        .map(|spec| {
            kept(spec).unwrap_or_else(|| Arc::new(Member::new(spec.clone(), &global.failover, now)))
        })
        .collect();
    let client = match watch::client(idle) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the HTTP client for global members");
            return;
        }
    };
    let weak: Weak<State> = Arc::downgrade(state);
    let silence = global.failover.unhealthy_after();
    let tasks = watch::spawn(&weak, &list, &client, silence);
    for m in &list {
        tracing::info!(member = m.name(), url = %m.spec.url, kind = m.spec.kind.as_str(),
            tier = m.spec.tier.as_str(), summaries = m.spec.admin_url.is_some(), "global member");
    }
    members.replace(Some(Roster {
        global: global.clone(),
        idle,
        members: list,
        client,
        tasks,
    }));
}

/// The residency tags a request is held to: its tenant's, narrowed by
/// `x-infergate-residency` when the tenant allows the header. `None`:
/// anywhere.
pub fn residency(
    tenant: Option<&config::Tenant>,
    headers: &http::HeaderMap,
) -> Option<Vec<String>> {
    let own = tenant
        .map(|t| t.residency.clone())
        .filter(|r| !r.is_empty());
    let asked: Option<Vec<String>> = tenant
        .filter(|t| t.residency_header)
        .and_then(|_| headers.get(RESIDENCY_HEADER))
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect()
        });
    match (own, asked) {
        (own, None) => own,
        (None, Some(asked)) => Some(asked),
        // Narrows, never widens: tags the tenant does not have are dropped
        // (and with none left, no member may take it).
        (Some(own), Some(asked)) => Some(asked.into_iter().filter(|t| own.contains(t)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(residency: &[&str], header: bool) -> config::Tenant {
        serde_json::from_value(serde_json::json!({
            "name": "t", "residency": residency, "residencyHeader": header,
        }))
        .expect("a tenant")
    }

    fn with_header(v: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(RESIDENCY_HEADER, v.parse().unwrap());
        h
    }

    #[test]
    fn the_header_narrows_a_tenants_residency_and_is_ignored_unless_allowed() {
        let none = http::HeaderMap::new();
        assert_eq!(residency(None, &with_header("eu")), None);
        let eu_us = tenant(&["eu", "us"], true);
        assert_eq!(
            residency(Some(&eu_us), &none),
            Some(vec!["eu".into(), "us".into()])
        );
        assert_eq!(
            residency(Some(&eu_us), &with_header("eu")),
            Some(vec!["eu".into()])
        );
        // Never wider than the tenant's own.
        assert_eq!(residency(Some(&eu_us), &with_header("asia")), Some(vec![]));
        let anywhere = tenant(&[], true);
        assert_eq!(
            residency(Some(&anywhere), &with_header("eu, us")),
            Some(vec!["eu".into(), "us".into()])
        );
        let not_allowed = tenant(&[], false);
        assert_eq!(residency(Some(&not_allowed), &with_header("eu")), None);
    }
}
