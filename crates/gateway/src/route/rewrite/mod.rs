//! Model rewrites (the route stage's canaries): a request for a model a
//! rewrite matches is sent to one of the rewrite's targets by weight, and
//! its body's `model` is rewritten to the target's name (`body`). A
//! target may carry a guard, judged on the figures the gateway measures
//! for it (`window`), that rolls it back at once when it breaches, and a
//! promotion that raises its weight step by step while the guard holds
//! (`rollout`). A session keeps the target it first got (`sessions`).
//!
//! [`Rewrites`] is one generation's table; each rewrite's [`Rollout`]
//! outlives generations, carried over by name in [`Rollouts`] while its
//! targets stay the same.

pub mod model_field;
mod rollout;
mod sticky;
pub mod window;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderMap, HeaderName};
use serde_json::{Value, json};

pub use rollout::Rollout;
use window::Outcome;

use crate::rate_limits::glob_matches;
use crate::telemetry::Metrics;

/// One generation's rewrites, in config order: the first that matches a
/// request applies.
#[derive(Default)]
pub struct Rewrites {
    rules: Vec<Rule>,
}

struct Rule {
    model: String,
    tenants: Vec<String>,
    headers: Vec<(HeaderName, String)>,
    rollout: Arc<Rollout>,
    /// The targets' model names, in target order.
    targets: Vec<Arc<str>>,
}

/// A rewrite chose a target for a request.
pub struct Chosen {
    pub rewrite: Arc<Rollout>,
    pub target: usize,
    /// The target's model name.
    pub model: Arc<str>,
}

/// What the record stage reports of a rewritten request: the rewrite, the
/// target, and, once the request has passed its own limits, the target's
/// guard to tell how the answer went.
pub struct Served {
    pub rewrite: Arc<Rollout>,
    pub target: usize,
    pub model: Arc<str>,
    /// Set from admission on: earlier refusals are the caller's, not the
    /// target's.
    pub judged: bool,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served")
            .field("rewrite", &self.rewrite.name)
            .field("model", &self.model)
            .field("judged", &self.judged)
            .finish()
    }
}

impl Served {
    /// The request ended with `status` (and this TTFT when it succeeded).
    pub fn finish(&self, status: u16, ttft: Option<std::time::Duration>) {
        if !self.judged {
            return;
        }
        let outcome = match status {
            200..=299 => Outcome::Served(ttft.unwrap_or_default()),
            429 | 500..=599 => Outcome::Failed,
            // The client's mistake or the client leaving says nothing
            // about the target.
            _ => return,
        };
        self.rewrite.observe(self.target, outcome, Instant::now());
    }
}

impl From<Chosen> for Served {
    fn from(c: Chosen) -> Self {
        Served {
            rewrite: c.rewrite,
            target: c.target,
            model: c.model,
            judged: false,
        }
    }
}

impl Rewrites {
    /// The rewrite for a request for `model` from `tenant` with these
    /// headers, and the target it chose; `None` when no rewrite matches.
    pub fn choose(
        &self,
        model: &str,
        tenant: &str,
        headers: &HeaderMap,
        session: Option<u64>,
    ) -> Option<Chosen> {
        let rule = self
            .rules
            .iter()
            .find(|r| r.matches(model, tenant, headers))?;
        let target = rule.rollout.choose(session, Instant::now());
        Some(Chosen {
            rewrite: Arc::clone(&rule.rollout),
            target,
            model: Arc::clone(&rule.targets[target]),
        })
    }

    /// `/debug/rewrites`.
    pub fn debug_json(&self) -> Value {
        let now = Instant::now();
        let rewrites: Vec<Value> = self
            .rules
            .iter()
            .map(|r| {
                let mut v = r.rollout.debug_json(now);
                v["model"] = json!(r.model);
                v
            })
            .collect();
        json!({ "rewrites": rewrites })
    }
}

impl Rule {
    fn matches(&self, model: &str, tenant: &str, headers: &HeaderMap) -> bool {
        glob_matches(&self.model, model)
            && (self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant))
            && self.headers.iter().all(|(name, value)| {
                headers
                    .get_all(name)
                    .iter()
                    .any(|v| v.as_bytes() == value.as_bytes())
            })
    }
}

/// Every rewrite's rollout by name: what one generation hands the next.
#[derive(Default)]
pub struct Rollouts {
    by_name: HashMap<String, Arc<Rollout>>,
}

impl Rollouts {
    /// The rewrites of `spec`, keeping the rollout (weights, windows,
    /// sessions) of each rewrite whose name and targets are unchanged.
    pub fn build(&mut self, spec: &config::Spec, metrics: &Metrics) -> Rewrites {
        let now = Instant::now();
        let sessions = spec.sessions.clone().unwrap_or_default();
        let mut by_name = HashMap::with_capacity(spec.rewrites.len());
        let rules = spec
            .rewrites
            .iter()
            .map(|r| {
                let rollout = match self.by_name.remove(&r.name) {
                    Some(kept) if kept.targets_spec == r.targets => {
                        kept.configure_sessions(&sessions);
                        kept
                    }
                    _ => {
                        let handles = r
                            .targets
                            .iter()
                            .map(|t| metrics.rollout.target(&r.name, &t.model))
                            .collect();
                        Arc::new(Rollout::new(r, &sessions, handles, now))
                    }
                };
                by_name.insert(r.name.clone(), Arc::clone(&rollout));
                Rule {
                    model: r.model.clone(),
                    tenants: r.matches.tenants.clone(),
                    // Validation refused names that are not header names.
                    headers: r
                        .matches
                        .headers
                        .iter()
                        .filter_map(|(k, v)| {
                            Some((HeaderName::from_bytes(k.as_bytes()).ok()?, v.clone()))
                        })
                        .collect(),
                    targets: r
                        .targets
                        .iter()
                        .map(|t| Arc::from(t.model.as_str()))
                        .collect(),
                    rollout,
                }
            })
            .collect();
        self.by_name = by_name;
        Rewrites { rules }
    }
}
