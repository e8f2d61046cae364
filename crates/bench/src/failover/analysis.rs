//! What a failover run measured, computed from the client's records and
//! the router's metric samples: traffic share per member over time, TTFT
//! before, during and after the failure, errors, retries, the failover
//! time and the time to recover a fair share.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::sampler::{self, Sample};
use super::traffic::Answer;
use crate::stats::percentile;

/// The killed member counts as back once its share of the requests sent
/// over [`SHARE_WINDOW`] reaches this fraction of a fair share.
pub const RECOVERED_FRACTION: f64 = 0.9;
/// Width of the window the share is measured over, and of the plot's bins.
pub const SHARE_WINDOW: Duration = Duration::from_secs(1);
/// Step of the sliding window looking for the recovery.
const RECOVERY_STEP: Duration = Duration::from_millis(100);

/// The timeline of a run, from the start of the traffic.
#[derive(Debug, Clone, Serialize)]
pub struct Timeline {
    pub members: Vec<String>,
    pub victim: String,
    /// When the victim's gateway was told to shut down.
    #[serde(serialize_with = "super::options::seconds")]
    pub killed_at: Duration,
    /// When its new gateway was listening again.
    #[serde(serialize_with = "super::options::seconds")]
    pub restarted_at: Duration,
    #[serde(serialize_with = "super::options::seconds")]
    pub length: Duration,
    /// The router's `failover.unhealthyAfter`.
    #[serde(serialize_with = "super::options::seconds")]
    pub unhealthy_after: Duration,
}

/// Beyond `unhealthyAfter`, how long the router may still send the killed
/// member a request: its health is looked at every 100 ms, and an attempt
/// takes a moment to be counted.
pub const OUT_OF_ROTATION_MARGIN: Duration = Duration::from_millis(500);

/// TTFT and failures of the requests sent in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub requests: usize,
    pub failed: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
}

/// Requests sent in one bin, by the member that answered them.
#[derive(Debug, Clone, Serialize)]
pub struct ShareBin {
    pub start_s: f64,
    pub answered: BTreeMap<String, usize>,
}

impl ShareBin {
    pub fn share(&self, member: &str) -> Option<f64> {
        let total: usize = self.answered.values().sum();
        (total > 0).then(|| *self.answered.get(member).unwrap_or(&0) as f64 / total as f64)
    }
}

/// Everything measured.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub requests: usize,
    pub failed: usize,
    /// Failed requests by cause.
    pub errors: BTreeMap<String, usize>,
    /// Requests that failed at a member before any byte and were sent on
    /// to another one (the router's `infergate_member_failovers_total`,
    /// every member).
    pub retried: f64,
    /// Attempts the router sent the victim after the kill.
    pub attempts_after_kill: f64,
    /// Attempts it sent the victim from `unhealthyAfter` +
    /// [`OUT_OF_ROTATION_MARGIN`] after the kill to the restart: 0 when it
    /// was taken out of rotation on time.
    pub attempts_while_out: f64,
    /// From the kill to the last attempt the router sent the victim, in
    /// milliseconds (to within the sampling period); 0 when none was sent.
    pub failover_ms: Option<f64>,
    /// The sampling period that bounds `failover_ms`'s precision.
    pub sample_period_ms: f64,
    /// From the restart to the end of the first window in which the
    /// victim's share reached [`RECOVERED_FRACTION`] of a fair share.
    pub recovery_ms: Option<f64>,
    /// The victim's share of the requests sent before the kill, while it
    /// was down, and over the last [`SHARE_WINDOW`] × 3 of the run.
    pub victim_share_before: Option<f64>,
    pub victim_share_down: Option<f64>,
    /// Its share over the first [`SHARE_WINDOW`] after the restart: low
    /// while it ramps back.
    pub victim_share_first_back: Option<f64>,
    pub victim_share_end: Option<f64>,
    pub phases: Vec<Phase>,
    pub bins: Vec<ShareBin>,
}

/// Attempts the router sent the victim after the kill, between `from` and
/// `to` (from the start of the traffic), by its metric samples.
pub fn attempts_between(samples: &[Sample], victim: &str, from: Duration, to: Duration) -> f64 {
    let at = |t: Duration| {
        samples
            .iter()
            .rev()
            .find(|s| s.at <= t)
            .and_then(|s| s.unanswered.get(victim).copied())
            .unwrap_or(0.0)
    };
    at(to) - at(from)
}

pub fn measure(timeline: &Timeline, answers: &[Answer], samples: &[Sample]) -> Measured {
    let failed: Vec<&Answer> = answers.iter().filter(|a| a.result.is_err()).collect();
    let mut errors = BTreeMap::new();
    for a in &failed {
        if let Err(cause) = &a.result {
            *errors.entry(cause.clone()).or_default() += 1;
        }
    }
    let victim = timeline.victim.as_str();
    let last = samples.last();
    let retried = last.map_or(0.0, |s| s.failovers.values().sum());
    let unanswered = |s: &Sample| s.unanswered.get(victim).copied().unwrap_or(0.0);
    let up_to_restart: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at <= timeline.restarted_at)
        .collect();
    let at_kill = up_to_restart
        .iter()
        .rev()
        .find(|s| s.at <= timeline.killed_at)
        .map_or(0.0, |s| unanswered(s));
    // The first sample that shows the victim's last unanswered attempt
    // before the restart.
    let final_count = up_to_restart.last().map(|s| unanswered(s));
    let failover_ms = final_count.map(|count| {
        up_to_restart
            .iter()
            .find(|s| s.at > timeline.killed_at && unanswered(s) >= count)
            .filter(|_| count > at_kill)
            .map_or(0.0, |s| (s.at - timeline.killed_at).as_secs_f64() * 1e3)
    });
    let share = |from: Duration, to: Duration| {
        let window: Vec<&Answer> = answers
            .iter()
            .filter(|a| a.sent >= from && a.sent < to && a.member.is_some())
            .collect();
        let to_victim = window
            .iter()
            .filter(|a| a.member.as_deref() == Some(victim))
            .count();
        (!window.is_empty()).then(|| to_victim as f64 / window.len() as f64)
    };
    let fair = 1.0 / timeline.members.len() as f64;
    let mut recovery_ms = None;
    let mut from = timeline.restarted_at;
    while from + SHARE_WINDOW <= timeline.length {
        if share(from, from + SHARE_WINDOW).is_some_and(|s| s >= RECOVERED_FRACTION * fair) {
            recovery_ms = Some((from + SHARE_WINDOW - timeline.restarted_at).as_secs_f64() * 1e3);
            break;
        }
        from += RECOVERY_STEP;
    }
    let phases = vec![
        phase("before", answers, Duration::ZERO, timeline.killed_at),
        phase("during", answers, timeline.killed_at, timeline.restarted_at),
        phase("after", answers, timeline.restarted_at, timeline.length),
    ];
    Measured {
        requests: answers.len(),
        failed: failed.len(),
        errors,
        retried,
        attempts_after_kill: last.map_or(0.0, |s| {
            attempts_between(samples, victim, timeline.killed_at, s.at)
        }),
        attempts_while_out: attempts_between(
            samples,
            victim,
            timeline.killed_at + timeline.unhealthy_after + OUT_OF_ROTATION_MARGIN,
            timeline.restarted_at,
        ),
        failover_ms,
        sample_period_ms: sampler::PERIOD.as_secs_f64() * 1e3,
        recovery_ms,
        victim_share_before: share(Duration::ZERO, timeline.killed_at),
        victim_share_down: share(timeline.killed_at, timeline.restarted_at),
        victim_share_first_back: share(timeline.restarted_at, timeline.restarted_at + SHARE_WINDOW),
        victim_share_end: share(
            timeline.length.saturating_sub(SHARE_WINDOW * 3),
            timeline.length,
        ),
        phases,
        bins: bins(timeline, answers),
    }
}

fn phase(name: &'static str, answers: &[Answer], from: Duration, to: Duration) -> Phase {
    let sent: Vec<&Answer> = answers
        .iter()
        .filter(|a| a.sent >= from && a.sent < to)
        .collect();
    let mut ttfts: Vec<f64> = sent
        .iter()
        .filter(|a| a.result.is_ok())
        .filter_map(|a| a.ttft)
        .map(|t| t.as_secs_f64() * 1e3)
        .collect();
    Phase {
        name,
        requests: sent.len(),
        failed: sent.iter().filter(|a| a.result.is_err()).count(),
        ttft_p50_ms: percentile(&mut ttfts, 50.0),
        ttft_p95_ms: percentile(&mut ttfts, 95.0),
        ttft_p99_ms: percentile(&mut ttfts, 99.0),
    }
}

fn bins(timeline: &Timeline, answers: &[Answer]) -> Vec<ShareBin> {
    let count = timeline.length.as_secs_f64() / SHARE_WINDOW.as_secs_f64();
    let mut bins: Vec<ShareBin> = (0..count.ceil() as usize)
        .map(|i| ShareBin {
            start_s: i as f64 * SHARE_WINDOW.as_secs_f64(),
            answered: timeline.members.iter().map(|m| (m.clone(), 0)).collect(),
        })
        .collect();
    for a in answers {
        let index = (a.sent.as_secs_f64() / SHARE_WINDOW.as_secs_f64()) as usize;
        if let (Some(bin), Some(member)) = (bins.get_mut(index), &a.member) {
            *bin.answered.entry(member.clone()).or_default() += 1;
        }
    }
    bins
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    fn sample(at: f64, victim_unanswered: f64) -> Sample {
        Sample {
            at: secs(at),
            unanswered: [("m1".to_owned(), victim_unanswered)].into(),
            failovers: [("m1".to_owned(), victim_unanswered)].into(),
            ..Sample::default()
        }
    }

    fn answer(at: f64, member: &str) -> Answer {
        Answer {
            sent: secs(at),
            member: Some(member.to_owned()),
            ttft: Some(Duration::from_millis(20)),
            result: Ok(()),
        }
    }

    #[test]
    fn failover_is_the_first_sample_showing_the_last_attempt() {
        let timeline = Timeline {
            members: vec!["m0".into(), "m1".into()],
            victim: "m1".into(),
            killed_at: secs(1.0),
            restarted_at: secs(4.0),
            length: secs(6.0),
            unhealthy_after: secs(1.0),
        };
        let samples = [
            sample(0.95, 0.0),
            sample(1.5, 3.0),
            sample(2.5, 5.0),
            sample(3.0, 5.0),
            sample(4.5, 9.0),
        ];
        // The victim answers half the requests before the kill, none
        // while down, every one from 4.5 s.
        let mut answers = Vec::new();
        for i in 0..120 {
            let at = i as f64 * 0.05 + 0.01;
            let victim = (at < 1.0 && i % 2 == 0) || at >= 4.5;
            answers.push(answer(at, if victim { "m1" } else { "m0" }));
        }
        let m = measure(&timeline, &answers, &samples);
        assert_eq!(m.failover_ms, Some(1500.0));
        assert_eq!(m.attempts_after_kill, 9.0);
        assert_eq!(m.retried, 9.0);
        assert_eq!(m.attempts_while_out, 0.0);
        assert_eq!(attempts_between(&samples, "m1", secs(1.0), secs(2.0)), 3.0);
        assert_eq!(m.failed, 0);
        assert_eq!(m.victim_share_down, Some(0.0));
        assert_eq!(m.victim_share_before, Some(0.5));
        // The first window from the restart already holds half its
        // requests for the victim: back 1 s (one window) after the restart.
        assert_eq!(m.recovery_ms.map(f64::round), Some(1000.0));
        assert_eq!(m.bins.len(), 6);
        assert_eq!(m.bins[0].share("m1"), Some(0.5));
        assert_eq!(m.bins[2].share("m1"), Some(0.0));
        assert_eq!(m.phases[1].requests, 60);
    }

    #[test]
    fn failures_are_counted_by_cause() {
        let timeline = Timeline {
            members: vec!["m0".into()],
            victim: "m0".into(),
            killed_at: secs(1.0),
            restarted_at: secs(2.0),
            length: secs(3.0),
            unhealthy_after: secs(0.5),
        };
        let mut answers = vec![answer(0.1, "m0"), answer(1.1, "m0"), answer(1.2, "m0")];
        answers[1].result = Err("502 -".into());
        answers[2].result = Err("502 -".into());
        let m = measure(&timeline, &answers, &[]);
        assert_eq!(m.failed, 2);
        assert_eq!(m.errors["502 -"], 2);
        assert_eq!(m.phases[1].failed, 2);
        assert_eq!(m.failover_ms, None);
    }
}
