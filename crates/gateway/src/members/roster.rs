//! The members in force and the tasks watching them: what the gateway's
//! state holds (it lives as long as the gateway), and the member pick.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use global::pick::Demand;
use global::{Candidate, NoMember, Verdict};

use super::member::{Member, noted};

/// Every member, and the tasks watching them; empty without `spec.global`.
#[derive(Default)]
pub struct Members {
    roster: ArcSwapOption<Roster>,
}

pub struct Roster {
    pub global: config::Global,
    /// The idle timeout the client was built with.
    pub idle: Duration,
    pub members: Vec<Arc<Member>>,
    pub client: reqwest::Client,
    pub tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Roster {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The members a request may go to, in order: the picker's choice first,
/// then the others of its preference group for retries.
pub struct Choice {
    pub order: Vec<Arc<Member>>,
    /// The request spilled to the fallback tier.
    pub fallback: bool,
    pub score: f64,
}

impl Members {
    pub fn roster(&self) -> Option<Arc<Roster>> {
        self.roster.load_full()
    }

    /// Put a new roster in force; the old one's tasks stop.
    pub fn replace(&self, roster: Option<Roster>) {
        self.roster.store(roster.map(Arc::new));
    }

    /// Some member serves `model` (healthy or not): requests for it that
    /// no local pool takes go to the members.
    pub fn serves(&self, model: &str) -> bool {
        self.roster
            .load()
            .as_ref()
            .is_some_and(|r| r.members.iter().any(|m| m.model_for(model).is_some()))
    }

    /// Some member takes requests now (for readiness).
    pub fn any_up(&self) -> Option<bool> {
        let roster = self.roster.load();
        let roster = roster.as_ref()?;
        let now = Instant::now();
        Some(
            roster
                .members
                .iter()
                .any(|m| !matches!(m.verdict(now).0, Verdict::Unhealthy { .. })),
        )
    }
}

impl Roster {
    /// The members `model` may go to, best first, or why none may.
    pub fn choose(
        &self,
        model: &str,
        residency: Option<&[String]>,
        metrics: &crate::telemetry::Metrics,
    ) -> Result<Choice, NoMember> {
        let now = Instant::now();
        let global = &self.global;
        let snapshots: Vec<_> = self
            .members
            .iter()
            .map(|m| {
                let (_, transition) = m.verdict(now);
                noted(m, transition, metrics);
                (m.model_for(model), m.snapshot(now))
            })
            .collect();
        let candidates: Vec<Candidate<'_>> = self
            .members
            .iter()
            .zip(&snapshots)
            .map(|(m, (mapped, snap))| Candidate {
                name: m.name(),
                tier: m.spec.tier,
                residency: &m.spec.residency,
                serves: mapped.is_some(),
                verdict: snap.verdict,
                load: mapped
                    .as_deref()
                    .and_then(|name| snap.summary.as_ref()?.models.get(name)),
                in_flight: m.in_flight(),
                error_rate: snap.error_rate,
                distance: global.distance_to(m.spec.region(global)),
                rtt: snap.rtt,
                cost: m.spec.cost_per_million_tokens,
            })
            .collect();
        let demand = Demand {
            residency,
            weights: &global.weights,
            farthest: global.farthest(),
            max_error_rate: global.failover.max_error_rate(),
        };
        let pick = global::pick(&candidates, &demand, rand::random::<f64>)?;
        let order = std::iter::once(pick.index)
            .chain(pick.next.iter().copied())
            .map(|i| Arc::clone(&self.members[i]))
            .collect();
        Ok(Choice {
            order,
            fallback: pick.fallback,
            score: pick.score,
        })
    }
}
