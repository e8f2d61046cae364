//! A member's health as the router judges it: failures and a silent
//! summary stream take it out of rotation within `unhealthyAfter`, and a
//! member that comes back takes a share of its traffic that rises over
//! `rampUp`, so a recovered cluster is not hit by every request at once.
//!
//! ```text
//!   (start: Down until the first summary, which brings it straight Up)
//!            failing or silent ≥ unhealthyAfter
//!   Up ───────────────────────────────────────────▶ Down
//!   ▲                                                │ a success, or a
//!   │ rampUp elapsed      failing or silent ≥ …      │ summary after the
//!   └──────────── Ramping ◀──────────────────────────┘ silence
//!                   │ ────────────────────────────▶ Down
//! ```
//!
//! Time is an argument: nothing here reads a clock.

use std::time::{Duration, Instant};

/// What the router may do with a member now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Takes new requests.
    Healthy,
    /// Back after being down: takes this share (0 to 1) of what it would
    /// take if healthy.
    Ramping { share: f64 },
    /// Takes no new requests.
    Unhealthy { reason: DownReason },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Ramping { .. } => "ramping",
            Verdict::Unhealthy { .. } => "unhealthy",
        }
    }
}

/// Why a member was taken out of rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownReason {
    /// Its requests failed (refused connections, 5xx) for `unhealthyAfter`
    /// without a success in between.
    Failing,
    /// Its summary stream sent nothing for `unhealthyAfter`.
    Silent,
}

impl DownReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DownReason::Failing => "failing",
            DownReason::Silent => "summary stream silent",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Up,
    Ramping { since: Instant },
    Down { reason: DownReason },
}

/// A change of verdict worth a log line: the member went down or came
/// back (started ramping), or finished ramping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    WentDown(DownReason),
    CameBack,
    FullyBack,
}

/// The smallest share a ramping member gets, so that it is tried at all
/// at the start of its ramp.
pub const MIN_RAMP_SHARE: f64 = 0.01;

#[derive(Debug, Clone)]
pub struct MemberHealth {
    unhealthy_after: Duration,
    ramp_up: Duration,
    state: State,
    /// The first failure since the last success.
    failing_since: Option<Instant>,
    /// `Some` for members that publish a summary: when the last one
    /// arrived (or, before the first, when the router started watching).
    last_summary: Option<Instant>,
    /// A summary has arrived since the router started watching.
    heard: bool,
    /// It has been up since the router started: only a member that was
    /// taken out of rotation ramps back; one first seen ready (at the
    /// router's start) takes its full share at once.
    was_up: bool,
}

impl MemberHealth {
    /// A member that publishes no summary starts up; one that does starts
    /// down until its first summary arrives, so a router that starts
    /// beside a dead member never sends it anything. A member's first
    /// summary brings it straight up, without a ramp: ramps are for
    /// members coming back, not for a router starting.
    pub fn new(
        now: Instant,
        unhealthy_after: Duration,
        ramp_up: Duration,
        summaries: bool,
    ) -> Self {
        Self {
            unhealthy_after,
            ramp_up,
            state: if summaries {
                State::Down {
                    reason: DownReason::Silent,
                }
            } else {
                State::Up
            },
            failing_since: None,
            last_summary: summaries.then_some(now),
            heard: false,
            was_up: !summaries,
        }
    }

    /// New settings (a reload); the state stays.
    pub fn configure(&mut self, unhealthy_after: Duration, ramp_up: Duration) {
        self.unhealthy_after = unhealthy_after;
        self.ramp_up = ramp_up;
    }

    /// A request reached the member and was answered (anything but a
    /// refused connection or a 5xx).
    pub fn on_success(&mut self, now: Instant) -> Option<Transition> {
        self.failing_since = None;
        self.advance(now)
    }

    /// A request failed at the member: the connection failed, or it
    /// answered 5xx.
    pub fn on_failure(&mut self, now: Instant) -> Option<Transition> {
        self.failing_since.get_or_insert(now);
        self.advance(now)
    }

    /// A summary arrived from the member.
    pub fn on_summary(&mut self, now: Instant) -> Option<Transition> {
        self.last_summary = Some(now);
        self.heard = true;
        self.advance(now)
    }

    /// The verdict at `now`, after moving the state on for the time that
    /// passed.
    pub fn verdict(&mut self, now: Instant) -> (Verdict, Option<Transition>) {
        let transition = self.advance(now);
        (self.peek(now), transition)
    }

    /// The verdict at `now` as of the last event, without moving on.
    pub fn peek(&self, now: Instant) -> Verdict {
        match self.state {
            State::Up => Verdict::Healthy,
            State::Ramping { since } => Verdict::Ramping {
                share: self.share(since, now),
            },
            State::Down { reason } => Verdict::Unhealthy { reason },
        }
    }

    fn share(&self, since: Instant, now: Instant) -> f64 {
        if self.ramp_up.is_zero() {
            return 1.0;
        }
        let elapsed = now.saturating_duration_since(since).as_secs_f64();
        (elapsed / self.ramp_up.as_secs_f64()).clamp(MIN_RAMP_SHARE, 1.0)
    }

    /// Why the member should be down at `now`, if it should.
    fn trouble(&self, now: Instant) -> Option<DownReason> {
        let over = |since: Instant| now.saturating_duration_since(since) >= self.unhealthy_after;
        if self.last_summary.is_some_and(over) {
            Some(DownReason::Silent)
        } else if self.failing_since.is_some_and(over) {
            Some(DownReason::Failing)
        } else {
            None
        }
    }

    fn advance(&mut self, now: Instant) -> Option<Transition> {
        let trouble = self.trouble(now);
        let (next, transition) = match (self.state, trouble) {
            (State::Up | State::Ramping { .. }, Some(reason)) => {
                (State::Down { reason }, Some(Transition::WentDown(reason)))
            }
            (State::Ramping { since }, None) if self.share(since, now) >= 1.0 => {
                (State::Up, Some(Transition::FullyBack))
            }
            (State::Down { .. }, None) if self.recovered() => {
                let next = if self.ramp_up.is_zero() || !self.was_up {
                    State::Up
                } else {
                    State::Ramping { since: now }
                };
                (next, Some(Transition::CameBack))
            }
            (state, _) => (state, None),
        };
        self.state = next;
        self.was_up |= matches!(next, State::Up | State::Ramping { .. });
        transition
    }

    /// Whether what took the member down is over: no failure streak is
    /// running and, for a member with summaries, one has been heard (a
    /// silence that lasts is `trouble` already).
    fn recovered(&self) -> bool {
        self.failing_since.is_none() && (self.last_summary.is_none() || self.heard)
    }

    /// Whether a member down for its failures should be probed (sent a
    /// cheap request such as `GET /v1/models`): it gets no requests, so
    /// only a probe's success can bring it back. (A member down for a
    /// silent stream comes back with its next summary.)
    pub fn needs_probe(&self) -> bool {
        matches!(self.state, State::Down { .. }) && self.failing_since.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(2);
    const RAMP: Duration = Duration::from_secs(60);

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn a_member_with_summaries_is_down_until_the_first_one() {
        let t0 = Instant::now();
        let mut h = MemberHealth::new(t0, AFTER, Duration::ZERO, true);
        assert_eq!(
            h.peek(t0),
            Verdict::Unhealthy {
                reason: DownReason::Silent
            }
        );
        assert_eq!(h.verdict(t0 + secs(0.05)).1, None);
        assert!(!h.needs_probe());
        assert_eq!(h.on_summary(t0 + secs(0.1)), Some(Transition::CameBack));
        assert_eq!(h.verdict(t0 + secs(0.2)).0, Verdict::Healthy);
    }

    #[test]
    fn a_silent_stream_takes_it_down_at_unhealthy_after_not_before() {
        let t0 = Instant::now();
        let mut h = MemberHealth::new(t0, AFTER, Duration::ZERO, true);
        h.on_summary(t0);
        assert_eq!(h.verdict(t0 + secs(1.99)).0, Verdict::Healthy);
        let (verdict, transition) = h.verdict(t0 + secs(2.0));
        assert_eq!(
            verdict,
            Verdict::Unhealthy {
                reason: DownReason::Silent
            }
        );
        assert_eq!(transition, Some(Transition::WentDown(DownReason::Silent)));
        // Said once.
        assert_eq!(h.verdict(t0 + secs(2.5)).1, None);
    }

    #[test]
    fn failures_take_it_down_only_when_they_last_without_a_success() {
        let t0 = Instant::now();
        let mut h = MemberHealth::new(t0, AFTER, RAMP, false);
        h.on_failure(t0);
        h.on_failure(t0 + secs(1.5));
        assert_eq!(h.on_success(t0 + secs(1.9)), None);
        // The streak restarted at 2.1: down at 4.1, not at 2.1 + anything less.
        h.on_failure(t0 + secs(2.1));
        assert_eq!(h.verdict(t0 + secs(4.0)).0, Verdict::Healthy);
        assert_eq!(
            h.on_failure(t0 + secs(4.1)),
            Some(Transition::WentDown(DownReason::Failing))
        );
        assert!(h.needs_probe());
    }

    #[test]
    fn a_recovered_member_ramps_up_over_ramp_up() {
        let t0 = Instant::now();
        let mut h = MemberHealth::new(t0, AFTER, RAMP, false);
        h.on_failure(t0);
        h.verdict(t0 + secs(2.0));
        // A probe succeeds at 10 s.
        assert_eq!(h.on_success(t0 + secs(10.0)), Some(Transition::CameBack));
        assert_eq!(
            h.verdict(t0 + secs(10.0)).0,
            Verdict::Ramping {
                share: MIN_RAMP_SHARE
            }
        );
        let Verdict::Ramping { share } = h.verdict(t0 + secs(40.0)).0 else {
            panic!("not ramping at half time");
        };
        assert!((share - 0.5).abs() < 1e-9, "{share}");
        assert_eq!(
            h.verdict(t0 + secs(70.0)),
            (Verdict::Healthy, Some(Transition::FullyBack))
        );
    }

    #[test]
    fn a_member_that_fails_while_ramping_goes_down_again() {
        let t0 = Instant::now();
        let mut h = MemberHealth::new(t0, AFTER, RAMP, true);
        // First seen at the router's start: up at once, no ramp.
        assert_eq!(h.on_summary(t0), Some(Transition::CameBack));
        assert_eq!(h.peek(t0), Verdict::Healthy);
        // Silent for 2 s, then back: this time it ramps.
        h.verdict(t0 + secs(2.0));
        assert_eq!(h.on_summary(t0 + secs(5.0)), Some(Transition::CameBack));
        assert!(matches!(h.peek(t0 + secs(5.0)), Verdict::Ramping { .. }));
        h.on_failure(t0 + secs(6.0));
        h.on_summary(t0 + secs(7.0));
        assert_eq!(
            h.on_summary(t0 + secs(8.0)),
            Some(Transition::WentDown(DownReason::Failing))
        );
        // Summaries alone do not bring it back while the failures last...
        assert_eq!(h.on_summary(t0 + secs(8.5)), None);
        // ...a success does.
        assert_eq!(h.on_success(t0 + secs(9.0)), Some(Transition::CameBack));
        assert!(!h.needs_probe());
    }
}
