//! How long a client should wait before retrying a saturated pool.
//!
//! The pool measures its own drain rate from the completions its
//! [`crate::LoadGuard`]s report, sampled against the `now` handed to each
//! pick, so neither the gateway nor the simulation has to supply one.

use std::time::{Duration, Instant};

use crate::policy::retry_after::{
    ASSUMED_DRAIN_PER_REPLICA, MAX, MAX_SAMPLE_WINDOW, MIN, SAMPLE_EVERY,
};

/// Time for the pool to work through `waiting` queued requests at
/// `drain_per_sec` completions per second, rounded up to whole seconds
/// (what `Retry-After` carries) and clamped to `[1 s, 60 s]`. An unknown or
/// zero rate gives the maximum.
pub fn estimate_retry_after(waiting: u64, drain_per_sec: f64) -> Duration {
    if !(drain_per_sec.is_finite() && drain_per_sec > 0.0) {
        return MAX;
    }
    let secs = (waiting as f64 / drain_per_sec).ceil();
    Duration::from_secs_f64(secs).clamp(MIN, MAX)
}

/// The drain rate to assume for `replicas` replicas before one is measured.
pub fn assumed_drain(replicas: usize) -> f64 {
    ASSUMED_DRAIN_PER_REPLICA * replicas.max(1) as f64
}

/// Completions per second, smoothed over samples at least
/// [`SAMPLE_EVERY`] apart.
#[derive(Debug, Default)]
pub(crate) struct DrainMeter {
    last: Option<(Instant, u64)>,
    rate: Option<f64>,
}

impl DrainMeter {
    /// Take a sample if the last one is old enough. `completed` is read only
    /// then: summing it over a large pool is not free.
    pub(crate) fn observe(&mut self, now: Instant, completed: impl FnOnce() -> u64) {
        let recent = |&(at, _): &(Instant, u64)| now.saturating_duration_since(at) < SAMPLE_EVERY;
        if self.last.as_ref().is_some_and(recent) {
            return;
        }
        let completed = completed();
        if let Some((at, before)) = self.last {
            let window = now.saturating_duration_since(at);
            // An idle window says nothing about capacity, and a very long
            // one (no picks for a while) describes another load; a drop
            // means endpoints were replaced. None of them updates the rate.
            if window <= MAX_SAMPLE_WINDOW && completed > before {
                let rate = (completed - before) as f64 / window.as_secs_f64();
                self.rate = Some(match self.rate {
                    Some(previous) => 0.5 * (previous + rate),
                    None => rate,
                });
            }
        }
        self.last = Some((now, completed));
    }

    pub(crate) fn rate(&self) -> Option<f64> {
        self.rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_queue_over_rate_clamped() {
        assert_eq!(estimate_retry_after(100, 10.0), Duration::from_secs(10));
        assert_eq!(estimate_retry_after(101, 10.0), Duration::from_secs(11));
        assert_eq!(estimate_retry_after(0, 10.0), MIN);
        assert_eq!(estimate_retry_after(1_000_000, 1.0), MAX);
        assert_eq!(estimate_retry_after(5, 0.0), MAX);
        assert_eq!(estimate_retry_after(5, f64::NAN), MAX);
        assert!(MIN >= Duration::from_secs(1));
    }

    #[test]
    fn meter_measures_completions_per_second() {
        let t0 = Instant::now();
        let mut meter = DrainMeter::default();
        meter.observe(t0, || 100);
        assert_eq!(meter.rate(), None);
        // Too soon: the counter is not even read.
        meter.observe(t0 + Duration::from_millis(10), || unreachable!());
        meter.observe(t0 + Duration::from_secs(2), || 140);
        assert_eq!(meter.rate(), Some(20.0));
        meter.observe(t0 + Duration::from_secs(3), || 180);
        assert_eq!(meter.rate(), Some(30.0), "smoothed: (20 + 40) / 2");
    }

    #[test]
    fn idle_or_long_windows_keep_the_last_rate() {
        let t0 = Instant::now();
        let mut meter = DrainMeter::default();
        meter.observe(t0, || 0);
        meter.observe(t0 + Duration::from_secs(1), || 10);
        assert_eq!(meter.rate(), Some(10.0));
        meter.observe(t0 + Duration::from_secs(2), || 10);
        assert_eq!(meter.rate(), Some(10.0), "idle second");
        meter.observe(t0 + Duration::from_secs(3600), || 20);
        assert_eq!(meter.rate(), Some(10.0), "window too long");
        meter.observe(t0 + Duration::from_secs(3601), || 5);
        assert_eq!(meter.rate(), Some(10.0), "counter went down");
    }
}
