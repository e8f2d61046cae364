//! Whether a replica's metrics can be trusted right now.
//!
//! This is the one definition of health: the scraper reports it, the picker
//! filters on it, and both read it from here.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::observation::Observation;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Health {
    /// The last scrape succeeded within `stale_after`.
    Healthy,
    /// No successful scrape yet, or the last one is older than `stale_after`.
    Stale,
    /// The most recent scrape failed (unreachable, bad status, garbage).
    Unhealthy,
}

impl Health {
    pub fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Stale => "stale",
            Health::Unhealthy => "unhealthy",
        }
    }
}

/// Unhealthy if the last scrape failed; Stale if there has been no good
/// scrape or the last good one is more than `stale_after` before `now`;
/// otherwise Healthy. A `last_good` later than `now` (clocks handed in by
/// different callers) counts as fresh.
pub fn health(obs: &Observation, now: Instant, stale_after: Duration) -> Health {
    health_of(obs.last_error.is_some(), obs.last_good, now, stale_after)
}

/// [`health`] from its two inputs: whether the last scrape failed, and when
/// the last good one completed.
pub fn health_of(
    failed: bool,
    last_good: Option<Instant>,
    now: Instant,
    stale_after: Duration,
) -> Health {
    if failed {
        return Health::Unhealthy;
    }
    match last_good {
        Some(at) if now.saturating_duration_since(at) <= stale_after => Health::Healthy,
        _ => Health::Stale,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STALE_AFTER: Duration = Duration::from_secs(1);

    fn observed(last_good: Option<Instant>, last_error: Option<&str>) -> Observation {
        Observation {
            state: None,
            last_good,
            last_error: last_error.map(str::to_owned),
        }
    }

    #[test]
    fn fresh_scrape_is_healthy_up_to_the_threshold() {
        let t0 = Instant::now();
        let obs = observed(Some(t0), None);
        assert_eq!(health(&obs, t0, STALE_AFTER), Health::Healthy);
        assert_eq!(health(&obs, t0 + STALE_AFTER, STALE_AFTER), Health::Healthy);
        assert_eq!(
            health(
                &obs,
                t0 + STALE_AFTER + Duration::from_millis(1),
                STALE_AFTER
            ),
            Health::Stale
        );
    }

    #[test]
    fn never_scraped_is_stale() {
        let obs = observed(None, None);
        assert_eq!(health(&obs, Instant::now(), STALE_AFTER), Health::Stale);
    }

    #[test]
    fn failed_scrape_is_unhealthy_even_with_a_recent_good_one() {
        let t0 = Instant::now();
        let obs = observed(Some(t0), Some("connection refused"));
        assert_eq!(health(&obs, t0, STALE_AFTER), Health::Unhealthy);
    }

    #[test]
    fn last_good_after_now_counts_as_fresh() {
        let t0 = Instant::now();
        let obs = observed(Some(t0 + Duration::from_secs(5)), None);
        assert_eq!(health(&obs, t0, STALE_AFTER), Health::Healthy);
    }

    #[test]
    fn recovers_when_metrics_resume() {
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(10);
        assert_eq!(
            health(&observed(Some(t0), None), later, STALE_AFTER),
            Health::Stale
        );
        assert_eq!(
            health(&observed(Some(later), None), later, STALE_AFTER),
            Health::Healthy
        );
    }
}
