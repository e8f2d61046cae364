//! One rewrite's live state, which outlives generations (it carries over
//! a reload by the rewrite's name while its targets stay the same): the
//! targets' current weights, their guard windows, promotion and rollback,
//! the sessions and what happened, for `/debug/rewrites`.
//!
//! Weights move only between the stable target (the first) and the
//! others: a rollback gives the canary's share back to the stable target,
//! a promotion step takes it from there. A guard is judged each time one
//! of the canary's answers ends; a promotion when a request arrives after
//! its step is due. Neither needs a task of its own.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use serde_json::{Value, json};

use super::sticky::SessionTable;
use super::window::{Figures, Outcome, Window};
use crate::telemetry::rollout::TargetMetrics;

/// Events kept for `/debug/rewrites`.
const EVENTS_KEPT: usize = 32;

pub struct Rollout {
    pub name: String,
    /// As configured; the state is kept across reloads only while these
    /// stay the same.
    pub targets_spec: Vec<config::RewriteTarget>,
    state: Mutex<State>,
    sessions: Mutex<SessionTable>,
    /// Requests without a session, counted to spread them exactly.
    arrivals: AtomicU64,
    metrics: Vec<TargetMetrics>,
}

struct State {
    targets: Vec<Target>,
    events: VecDeque<Event>,
}

struct Target {
    weight: u32,
    status: Status,
    window: Window,
    /// When the next promotion step is due.
    next_step: Option<Instant>,
}

#[derive(Debug, Clone)]
enum Status {
    Serving,
    RolledBack { why: String, at: SystemTime },
    Promoted { at: SystemTime },
}

struct Event {
    at: SystemTime,
    target: String,
    what: String,
}

impl Rollout {
    pub fn new(
        rewrite: &config::Rewrite,
        sessions: &config::Sessions,
        metrics: Vec<TargetMetrics>,
        now: Instant,
    ) -> Self {
        let mut targets = rewrite
            .targets
            .iter()
            .map(|t| Target {
                weight: t.weight,
                status: Status::Serving,
                window: Window::new(
                    t.guard
                        .as_ref()
                        .map_or(config::defaults::GUARD_WINDOW, |g| g.window()),
                ),
                next_step: t.promote.as_ref().map(|p| now + p.every),
            })
            .collect::<Vec<_>>();
        // The stable target's window is as long as the longest guard's, so
        // each canary compares with the same span.
        let longest = rewrite
            .targets
            .iter()
            .filter_map(|t| t.guard.as_ref().map(|g| g.window()))
            .max();
        if let (Some(longest), Some(stable)) = (longest, targets.first_mut()) {
            stable.window = Window::new(longest);
        }
        for (m, t) in metrics.iter().zip(&targets) {
            m.weight.set(i64::from(t.weight));
        }
        Self {
            name: rewrite.name.clone(),
            targets_spec: rewrite.targets.clone(),
            state: Mutex::new(State {
                targets,
                events: VecDeque::new(),
            }),
            sessions: Mutex::new(SessionTable::new(
                sessions.max_sessions(),
                sessions.idle_timeout(),
                now,
            )),
            arrivals: AtomicU64::new(0),
            metrics,
        }
    }

    /// Carried over to a generation whose sessions settings may differ.
    pub fn configure_sessions(&self, sessions: &config::Sessions) {
        self.sessions
            .lock()
            .configure(sessions.max_sessions(), sessions.idle_timeout());
    }

    /// The target (an index into the targets) for one request.
    pub fn choose(&self, session: Option<u64>, now: Instant) -> usize {
        let weights = {
            let mut state = self.state.lock();
            self.promote_due(&mut state, now);
            state.targets.iter().map(|t| t.weight).collect::<Vec<_>>()
        };
        let chosen = match session {
            Some(key) => {
                let mut table = self.sessions.lock();
                match table.get(key, now) {
                    // A session keeps its target unless that was rolled back.
                    Some(t) if weights.get(t).is_some_and(|&w| w > 0 || t == 0) => t,
                    _ => {
                        let t = by_weight(&weights, key % 100);
                        table.set(key, t, now);
                        t
                    }
                }
            }
            None => {
                // 37 and 100 share no divisor: every 100 arrivals visit
                // each of the 100 points once, so shares are exact per
                // hundred and interleaved within it.
                let n = self.arrivals.fetch_add(1, Ordering::Relaxed);
                by_weight(&weights, n.wrapping_mul(37) % 100)
            }
        };
        self.metrics[chosen].requests.inc();
        chosen
    }

    /// One answer of `target` ended; judge its guard.
    pub fn observe(&self, target: usize, outcome: Outcome, now: Instant) {
        if matches!(outcome, Outcome::Failed) {
            self.metrics[target].failures.inc();
        }
        let mut state = self.state.lock();
        let Some(t) = state.targets.get_mut(target) else {
            return;
        };
        t.window.add(outcome, now);
        if target == 0 || !matches!(t.status, Status::Serving) || t.weight == 0 {
            return;
        }
        if let Some(why) = self.breach(&mut state, target, now) {
            self.roll_back(&mut state, target, why);
        }
    }

    /// Why `target` breaches its guard now, if it does (and has enough
    /// answers to be judged).
    fn breach(&self, state: &mut State, target: usize, now: Instant) -> Option<String> {
        let guard = self.targets_spec[target].guard.as_ref()?;
        let canary = state.targets[target].window.figures(now);
        if canary.answers < guard.min_requests() {
            return None;
        }
        let stable = state.targets[0].window.figures(now);
        let against_stable = guard.baseline == config::GuardBaseline::Stable
            && stable.answers >= guard.min_requests();
        judge(guard, &canary, against_stable.then_some(&stable))
    }

    fn roll_back(&self, state: &mut State, target: usize, why: String) {
        let freed = std::mem::take(&mut state.targets[target].weight);
        state.targets[0].weight += freed;
        state.targets[target].status = Status::RolledBack {
            why: why.clone(),
            at: SystemTime::now(),
        };
        self.publish_weights(state);
        self.metrics[target].rollbacks.inc();
        let model = &self.targets_spec[target].model;
        tracing::warn!(rewrite = %self.name, target = %model, reason = %why,
            "canary rolled back: its weight is 0 and its share went to the stable target");
        push_event(state, model, format!("rolled back: {why}"));
    }

    /// Raise each target whose promotion step is due and whose guard holds
    /// with enough answers.
    fn promote_due(&self, state: &mut State, now: Instant) {
        for i in 1..state.targets.len() {
            let Some(promote) = &self.targets_spec[i].promote else {
                continue;
            };
            let t = &state.targets[i];
            let due = t.next_step.is_some_and(|at| now >= at);
            if !due || !matches!(t.status, Status::Serving) {
                continue;
            }
            let guard = self.targets_spec[i].guard.as_ref();
            let enough = guard
                .is_some_and(|g| state.targets[i].window.figures(now).answers >= g.min_requests());
            if !enough || self.breach(state, i, now).is_some() {
                // Not yet judged, or failing: the next request asks again
                // (a breach also rolls back when its answer ends).
                continue;
            }
            let step = promote.step.min(state.targets[0].weight);
            state.targets[i].weight += step;
            state.targets[0].weight -= step;
            state.targets[i].next_step = Some(now + promote.every);
            self.metrics[i].promotions.inc();
            let weight = state.targets[i].weight;
            let model = self.targets_spec[i].model.clone();
            tracing::info!(rewrite = %self.name, target = %model, weight, "canary promoted a step");
            if weight >= 100 || state.targets[0].weight == 0 {
                state.targets[i].status = Status::Promoted {
                    at: SystemTime::now(),
                };
                push_event(
                    state,
                    &model,
                    format!("promoted to {weight} %: fully promoted"),
                );
            } else {
                push_event(state, &model, format!("promoted to {weight} %"));
            }
            self.publish_weights(state);
        }
    }

    fn publish_weights(&self, state: &State) {
        for (m, t) in self.metrics.iter().zip(&state.targets) {
            m.weight.set(i64::from(t.weight));
        }
    }

    /// For `/debug/rewrites`.
    pub fn debug_json(&self, now: Instant) -> Value {
        let mut state = self.state.lock();
        let targets: Vec<Value> = (0..state.targets.len())
            .map(|i| {
                let spec = &self.targets_spec[i];
                let figures = state.targets[i].window.figures(now);
                let t = &state.targets[i];
                let (status, why, at) = match &t.status {
                    Status::Serving => ("serving", None, None),
                    Status::RolledBack { why, at } => ("rolled-back", Some(why.clone()), Some(*at)),
                    Status::Promoted { at } => ("promoted", None, Some(*at)),
                };
                json!({
                    "model": spec.model,
                    "stable": i == 0,
                    "configuredWeight": spec.weight,
                    "weight": t.weight,
                    "status": status,
                    "reason": why,
                    "since": at.map(|at| humantime::format_rfc3339_millis(at).to_string()),
                    "nextPromotionInMs": t.next_step
                        .filter(|_| matches!(t.status, Status::Serving))
                        .map(|at| at.saturating_duration_since(now).as_millis() as u64),
                    "window": {
                        "answers": figures.answers,
                        "failures": figures.failures,
                        "errorRate": figures.error_rate(),
                        "ttftP95Ms": figures.ttft_p95.map(|d| d.as_secs_f64() * 1e3),
                    },
                    "guard": spec.guard,
                    "promote": spec.promote,
                })
            })
            .collect();
        let events: Vec<Value> = state
            .events
            .iter()
            .map(|e| {
                json!({
                    "at": humantime::format_rfc3339_millis(e.at).to_string(),
                    "target": e.target,
                    "event": e.what,
                })
            })
            .collect();
        json!({
            "name": self.name,
            "targets": targets,
            "sessions": self.sessions.lock().len(),
            "events": events,
        })
    }
}

fn push_event(state: &mut State, target: &str, what: String) {
    if state.events.len() == EVENTS_KEPT {
        state.events.pop_front();
    }
    state.events.push_back(Event {
        at: SystemTime::now(),
        target: target.to_owned(),
        what,
    });
}

/// The target whose share of 0..100 holds `point` (weights add up to 100).
fn by_weight(weights: &[u32], point: u64) -> usize {
    let mut upto = 0u64;
    for (i, &w) in weights.iter().enumerate() {
        upto += u64::from(w);
        if point < upto {
            return i;
        }
    }
    0
}

/// Why `canary` breaches `guard`, against the stable target's figures or,
/// without them, against the guard's figures as ceilings.
fn judge(guard: &config::Guard, canary: &Figures, stable: Option<&Figures>) -> Option<String> {
    if let Some(allowed) = guard.ttft_p95 {
        let (limit, basis) = match stable.and_then(|s| s.ttft_p95) {
            Some(stable_p95) => (
                stable_p95 + allowed,
                format!("the stable target's {} + {}", ms(stable_p95), ms(allowed)),
            ),
            None => (allowed, "its ceiling".to_owned()),
        };
        if let Some(p95) = canary.ttft_p95
            && p95 > limit
        {
            return Some(format!(
                "TTFT p95 {} over {} answers exceeds {basis} = {}",
                ms(p95),
                canary.answers,
                ms(limit)
            ));
        }
    }
    if let Some(allowed) = guard.error_rate {
        let (limit, basis) = match stable {
            Some(s) => (
                s.error_rate() + allowed,
                format!("the stable target's {:.3} + {allowed}", s.error_rate()),
            ),
            None => (allowed, "its ceiling".to_owned()),
        };
        if canary.error_rate() > limit {
            return Some(format!(
                "error rate {:.3} ({} of {} answers) exceeds {basis} = {limit:.3}",
                canary.error_rate(),
                canary.failures,
                canary.answers
            ));
        }
    }
    None
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_split_points_in_order() {
        let w = [90, 10];
        assert_eq!((0..100).filter(|&p| by_weight(&w, p) == 1).count(), 10);
        let w = [0, 100];
        assert!((0..100).all(|p| by_weight(&w, p) == 1));
        // Every hundred arrivals visit each point once.
        let mut seen: Vec<u64> = (0..100u64).map(|n| n.wrapping_mul(37) % 100).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..100).collect::<Vec<_>>());
    }

    fn guard(baseline: config::GuardBaseline) -> config::Guard {
        config::Guard {
            ttft_p95: Some(Duration::from_millis(500)),
            error_rate: Some(0.02),
            baseline,
            ..config::Guard::default()
        }
    }

    fn figures(answers: u64, failures: u64, p95_ms: u64) -> Figures {
        Figures {
            answers,
            failures,
            ttft_p95: Some(Duration::from_millis(p95_ms)),
        }
    }

    #[test]
    fn a_guard_judges_against_the_stable_target_or_ceilings() {
        let stable = figures(1000, 10, 800);
        let g = guard(config::GuardBaseline::Stable);
        // 1.2 s is within 0.8 s + 0.5 s; 1.4 s is not.
        assert_eq!(judge(&g, &figures(200, 0, 1200), Some(&stable)), None);
        let why = judge(&g, &figures(200, 0, 1400), Some(&stable)).unwrap();
        assert!(why.starts_with("TTFT p95 1400 ms"), "{why}");
        // 2.5 % errors is within 1 % + 2 %; 4 % is not.
        assert_eq!(judge(&g, &figures(200, 5, 100), Some(&stable)), None);
        let why = judge(&g, &figures(200, 8, 100), Some(&stable)).unwrap();
        assert!(why.starts_with("error rate 0.040"), "{why}");
        // Absolute: the same figures are ceilings.
        let g = guard(config::GuardBaseline::Absolute);
        assert!(judge(&g, &figures(200, 0, 600), None).is_some());
        assert_eq!(judge(&g, &figures(200, 2, 400), None), None);
    }
}
