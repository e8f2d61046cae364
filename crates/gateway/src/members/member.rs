//! One member as this router knows it: its config, its latest load
//! summary, its health, and what the router saw of its recent answers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use config::defaults::{GLOBAL_ERROR_WINDOW, GLOBAL_RTT_SAMPLES};
use global::health::Transition;
use global::{LoadSummary, MemberHealth, Verdict};
use http::HeaderValue;
use parking_lot::Mutex;

/// How a request sent to a member ended, as far as its health goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Answered (anything but a 5xx or a 429).
    Answered,
    /// Throttled (429): the member is up but refusing; counts against
    /// its error rate, not its health.
    Throttled,
    /// Could not connect, or answered 5xx, or failed mid-answer.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Answered => "answered",
            Outcome::Throttled => "throttled",
            Outcome::Failed => "failed",
        }
    }
}

pub struct Member {
    pub spec: config::Member,
    /// `Bearer <key>` from `apiKeyFile`, read when the config was applied.
    pub authorization: Option<HeaderValue>,
    /// `url` without a trailing slash, for appending the request's path.
    pub base_url: String,
    /// Requests this router has sent to it that have not ended.
    pub in_flight: AtomicU64,
    state: Mutex<MemberState>,
}

struct MemberState {
    health: MemberHealth,
    summary: Option<LoadSummary>,
    summary_at: Option<Instant>,
    /// Recent outcomes, oldest first, within [`GLOBAL_ERROR_WINDOW`].
    recent: VecDeque<(Instant, Outcome)>,
    /// The last [`GLOBAL_RTT_SAMPLES`] measured round trips, oldest first.
    round_trips: VecDeque<Duration>,
}

/// What `/debug/members` and the picker read of a member at one moment.
pub struct Snapshot {
    pub verdict: Verdict,
    pub summary: Option<LoadSummary>,
    pub summary_age: Option<Duration>,
    pub error_rate: f64,
    /// The round trip to the member: the lowest of the last few measured.
    pub rtt: Option<Duration>,
}

impl Member {
    pub fn new(spec: config::Member, failover: &config::Failover, now: Instant) -> Self {
        let authorization = spec.api_key_file.as_deref().and_then(read_key);
        let base_url = spec.url.trim_end_matches('/').to_owned();
        let health = MemberHealth::new(
            now,
            failover.unhealthy_after(),
            failover.ramp_up(),
            spec.admin_url.is_some(),
        );
        Self {
            spec,
            authorization,
            base_url,
            in_flight: AtomicU64::new(0),
            state: Mutex::new(MemberState {
                health,
                summary: None,
                summary_at: None,
                recent: VecDeque::new(),
                round_trips: VecDeque::new(),
            }),
        }
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The member's name for `model` when it serves it: the `models` map
    /// when given (the only word for members without a summary), else the
    /// models its latest summary lists, under the same name.
    pub fn model_for<'a>(&'a self, model: &'a str) -> Option<String> {
        if !self.spec.models.is_empty() {
            return self.spec.models.get(model).cloned();
        }
        let state = self.state.lock();
        state
            .summary
            .as_ref()
            .filter(|s| s.models.contains_key(model))
            .map(|_| model.to_owned())
    }

    pub fn on_summary(&self, summary: LoadSummary, now: Instant) -> Option<Transition> {
        let mut state = self.state.lock();
        state.summary = Some(summary);
        state.summary_at = Some(now);
        let transition = state.health.on_summary(now);
        state.moved(transition)
    }

    pub fn on_outcome(&self, outcome: Outcome, now: Instant) -> Option<Transition> {
        let mut state = self.state.lock();
        state.recent.push_back((now, outcome));
        trim(&mut state.recent, now);
        let transition = match outcome {
            Outcome::Failed => state.health.on_failure(now),
            Outcome::Answered | Outcome::Throttled => state.health.on_success(now),
        };
        state.moved(transition)
    }

    /// A measured round trip (a small request's time to its answer).
    pub fn on_round_trip(&self, rtt: Duration) {
        let mut state = self.state.lock();
        if state.round_trips.len() == GLOBAL_RTT_SAMPLES {
            state.round_trips.pop_front();
        }
        state.round_trips.push_back(rtt);
    }

    /// The verdict now, moving the health state on.
    pub fn verdict(&self, now: Instant) -> (Verdict, Option<Transition>) {
        let mut state = self.state.lock();
        let (verdict, transition) = state.health.verdict(now);
        (verdict, state.moved(transition))
    }

    pub fn needs_probe(&self) -> bool {
        self.state.lock().health.needs_probe()
    }

    pub fn snapshot(&self, now: Instant) -> Snapshot {
        let mut state = self.state.lock();
        trim(&mut state.recent, now);
        let bad = state
            .recent
            .iter()
            .filter(|(_, o)| *o != Outcome::Answered)
            .count();
        let error_rate = if state.recent.is_empty() {
            0.0
        } else {
            bad as f64 / state.recent.len() as f64
        };
        Snapshot {
            verdict: state.health.peek(now),
            summary: state.summary.clone(),
            summary_age: state.summary_at.map(|at| now.saturating_duration_since(at)),
            error_rate,
            rtt: state.round_trips.iter().min().copied(),
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

impl MemberState {
    /// A member that comes back starts with a clean record: the failures
    /// of its outage would otherwise count it as refusing for the whole
    /// error window, and keep its ramp from starting.
    fn moved(&mut self, transition: Option<Transition>) -> Option<Transition> {
        if transition == Some(Transition::CameBack) {
            self.recent.clear();
        }
        transition
    }
}

fn trim(recent: &mut VecDeque<(Instant, Outcome)>, now: Instant) {
    while recent
        .front()
        .is_some_and(|(at, _)| now.saturating_duration_since(*at) > GLOBAL_ERROR_WINDOW)
    {
        recent.pop_front();
    }
}

/// The bearer credential in `path`; `None` (and an error logged) when it
/// cannot be read, so the member is sent requests without it and its
/// 401s say why.
fn read_key(path: &str) -> Option<HeaderValue> {
    match std::fs::read_to_string(path) {
        Ok(key) => HeaderValue::from_str(&format!("Bearer {}", key.trim()))
            .map_err(|_| {
                tracing::error!(
                    file = path,
                    "the member's API key is not a valid header value"
                )
            })
            .ok()
            .map(|mut v| {
                v.set_sensitive(true);
                v
            }),
        Err(e) => {
            tracing::error!(file = path, error = %e, "cannot read the member's API key file");
            None
        }
    }
}

/// Keeps a request counted in its member's in-flight count until dropped.
pub struct InFlight(std::sync::Arc<Member>);

impl InFlight {
    pub fn new(member: std::sync::Arc<Member>) -> Self {
        member.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(member)
    }

    pub fn member(&self) -> &std::sync::Arc<Member> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Log a change of a member's health and update its gauge.
pub fn noted(member: &Member, transition: Option<Transition>, metrics: &crate::telemetry::Metrics) {
    let Some(transition) = transition else {
        return;
    };
    let name = member.name();
    match transition {
        Transition::WentDown(reason) => {
            tracing::warn!(
                member = name,
                reason = reason.as_str(),
                "global member out of rotation: it gets no new requests"
            );
            metrics.set_member_up(name, false);
        }
        Transition::CameBack => {
            tracing::info!(
                member = name,
                "global member recovered: back in rotation, its share ramping up"
            );
            metrics.set_member_up(name, true);
        }
        Transition::FullyBack => {
            tracing::info!(member = name, "global member fully back: ramp-up finished");
            metrics.set_member_up(name, true);
        }
    }
}
