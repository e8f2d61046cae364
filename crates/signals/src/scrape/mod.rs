//! The scrape loop: one task per replica, so a hanging replica never delays
//! the others. Each tick fetches `/metrics` (or, for [`Dialect::None`],
//! only opens a TCP connection), stores a new [`Observation`] in the
//! endpoint and tells the gateway through `on_update` (or `on_scrape`, which
//! also gets the scrape's duration and outcome).

mod client;
mod error;
mod probe;

pub use client::{MAX_BODY_BYTES, ScrapeClient};
pub use error::ScrapeError;

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Uri;
use picker::{Endpoint, EngineState, Observation};
use tokio::task::JoinHandle;
use tokio::time::MissedTickBehavior;

use crate::dialect::Dialect;
use crate::prom;

/// How one replica is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeConfig {
    pub dialect: Dialect,
    /// Time between the starts of two scrapes. A scrape that takes longer
    /// delays the next one rather than piling up.
    pub interval: Duration,
    /// Longest time one scrape may take, connection and body included.
    pub timeout: Duration,
}

/// A running scraper. Dropping it stops the scrape task.
#[derive(Debug)]
#[must_use = "dropping a Scraper stops it"]
pub struct Scraper {
    task: JoinHandle<()>,
}

impl Scraper {
    /// Whether the task has ended: only when the replica address is
    /// invalid (recorded as the observation's error) or `on_update`
    /// panicked.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Start watching `endpoint`; the first scrape starts at once. The scraper
/// must be the only writer of the endpoint's observation. `on_update` runs on
/// the scrape task after every stored observation, so it must be quick.
///
/// # Panics
///
/// When called outside a Tokio runtime.
pub fn spawn_scraper(
    endpoint: Arc<Endpoint>,
    cfg: ScrapeConfig,
    client: ScrapeClient,
    on_update: impl Fn(&Endpoint) + Send + Sync + 'static,
) -> Scraper {
    spawn_reporting_scraper(endpoint, cfg, client, move |endpoint, _| {
        on_update(endpoint)
    })
}

/// How one scrape went, for the gateway's own metrics about scraping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeReport {
    /// From the start of the request (or probe) to the stored observation.
    pub duration: Duration,
    pub failed: bool,
}

/// [`spawn_scraper`], with `on_scrape` also told how long each scrape
/// took and whether it failed.
///
/// # Panics
///
/// When called outside a Tokio runtime.
pub fn spawn_reporting_scraper(
    endpoint: Arc<Endpoint>,
    cfg: ScrapeConfig,
    client: ScrapeClient,
    on_scrape: impl Fn(&Endpoint, ScrapeReport) + Send + Sync + 'static,
) -> Scraper {
    let task = tokio::spawn(run(endpoint, cfg, client, on_scrape));
    Scraper { task }
}

/// Shortest period between reachability probes of a replica without
/// metrics.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);

async fn run(
    endpoint: Arc<Endpoint>,
    cfg: ScrapeConfig,
    client: ScrapeClient,
    on_scrape: impl Fn(&Endpoint, ScrapeReport),
) {
    let target = if cfg.dialect.has_metrics() {
        match client::metrics_uri(&endpoint.addr) {
            Ok(uri) => Some(uri),
            Err(err) => {
                tracing::error!(endpoint = %endpoint.addr, error = %err, "replica cannot be scraped");
                record(&endpoint, Err(err), Instant::now());
                let report = ScrapeReport {
                    duration: Duration::ZERO,
                    failed: true,
                };
                on_scrape(&endpoint, report);
                return;
            }
        }
    } else {
        None
    };
    // `interval` panics on zero; a zero interval can only mean "as often as
    // reasonable". A reachability probe opens a new connection each time,
    // and nothing but reachability depends on it, so it runs less often.
    let period = match target {
        Some(_) => cfg.interval.max(Duration::from_millis(1)),
        None => cfg.interval.max(PROBE_INTERVAL),
    };
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticker.tick().await;
        let started = Instant::now();
        let outcome = match &target {
            Some(uri) => tokio::time::timeout(cfg.timeout, scrape(&client, uri, cfg.dialect))
                .await
                .unwrap_or(Err(ScrapeError::Timeout(cfg.timeout))),
            None => probe::connect(&endpoint.addr, cfg.timeout)
                .await
                .map(|()| EngineState::default()),
        };
        log_transition(&endpoint, &outcome, &mut failing);
        let failed = outcome.is_err();
        let now = Instant::now();
        record(&endpoint, outcome, now);
        let report = ScrapeReport {
            duration: now.duration_since(started),
            failed,
        };
        on_scrape(&endpoint, report);
    }
}

async fn scrape(
    client: &ScrapeClient,
    uri: &Uri,
    dialect: Dialect,
) -> Result<EngineState, ScrapeError> {
    let body = client.get(uri).await?;
    let text = prom::from_utf8(&body)?;
    Ok(dialect.extract(text)?)
}

/// Store the outcome of one scrape. A failure keeps the last good state
/// and its time, so the picker can still tell how old it is.
fn record(endpoint: &Endpoint, outcome: Result<EngineState, ScrapeError>, now: Instant) {
    let previous = endpoint.observation();
    let next = match outcome {
        Ok(state) => {
            endpoint.set_reachable(true);
            // Reuse an unchanged state so readers can skip work with
            // `Arc::ptr_eq`.
            let state = match &previous.state {
                Some(old) if **old == state => Arc::clone(old),
                _ => Arc::new(state),
            };
            Observation {
                state: Some(state),
                last_good: Some(now),
                last_error: None,
            }
        }
        Err(err) => {
            if err.is_connection_failure() {
                endpoint.set_reachable(false);
            } else if err.replica_answered() {
                endpoint.set_reachable(true);
            }
            Observation {
                state: previous.state.clone(),
                last_good: previous.last_good,
                last_error: Some(err.to_string()),
            }
        }
    };
    endpoint.observe(next);
}

/// Log when a replica starts or stops failing, not on every tick: 100
/// replicas scraped every 50 ms would flood the log.
fn log_transition(
    endpoint: &Endpoint,
    outcome: &Result<EngineState, ScrapeError>,
    failing: &mut bool,
) {
    match outcome {
        Err(err) if !*failing => {
            tracing::warn!(endpoint = %endpoint.addr, error = %err, "replica scrape failing");
        }
        Err(err) => {
            tracing::debug!(endpoint = %endpoint.addr, error = %err, "replica scrape still failing")
        }
        Ok(_) if *failing => tracing::info!(endpoint = %endpoint.addr, "replica scrape recovered"),
        Ok(_) => {}
    }
    *failing = outcome.is_err();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::{ParseError, ParseErrorKind};

    fn state(waiting: u64) -> EngineState {
        EngineState {
            waiting: Some(waiting),
            ..EngineState::default()
        }
    }

    #[test]
    fn success_replaces_the_observation_and_marks_reachable() {
        let endpoint = Endpoint::new(0, "127.0.0.1:1");
        endpoint.set_reachable(false);
        let now = Instant::now();
        record(&endpoint, Ok(state(3)), now);
        let obs = endpoint.observation();
        assert_eq!(obs.state.as_deref(), Some(&state(3)));
        assert_eq!(obs.last_good, Some(now));
        assert_eq!(obs.last_error, None);
        assert!(endpoint.is_reachable());
    }

    #[test]
    fn unchanged_state_is_shared() {
        let endpoint = Endpoint::new(0, "127.0.0.1:1");
        record(&endpoint, Ok(state(3)), Instant::now());
        let first = endpoint.observation().state.clone().unwrap();
        record(&endpoint, Ok(state(3)), Instant::now());
        let second = endpoint.observation().state.clone().unwrap();
        assert!(Arc::ptr_eq(&first, &second));
        record(&endpoint, Ok(state(4)), Instant::now());
        let third = endpoint.observation().state.clone().unwrap();
        assert!(!Arc::ptr_eq(&first, &third));
    }

    #[test]
    fn failure_keeps_the_last_good_state() {
        let endpoint = Endpoint::new(0, "127.0.0.1:1");
        let good = Instant::now();
        record(&endpoint, Ok(state(3)), good);
        let invalid = ParseError {
            line: 1,
            kind: ParseErrorKind::InvalidMetricName,
            excerpt: "<html>".to_owned(),
        };
        record(
            &endpoint,
            Err(ScrapeError::Invalid(invalid)),
            good + Duration::from_secs(1),
        );
        let obs = endpoint.observation();
        assert_eq!(obs.state.as_deref(), Some(&state(3)));
        assert_eq!(obs.last_good, Some(good));
        assert!(
            obs.last_error
                .as_deref()
                .unwrap()
                .contains("invalid metric name")
        );
        assert!(endpoint.is_reachable());
    }

    #[test]
    fn reachability_follows_the_kind_of_failure() {
        let endpoint = Endpoint::new(0, "127.0.0.1:1");
        record(
            &endpoint,
            Err(ScrapeError::Connect("refused".into())),
            Instant::now(),
        );
        assert!(!endpoint.is_reachable());
        // A timeout says nothing about the network: unchanged.
        record(
            &endpoint,
            Err(ScrapeError::Timeout(Duration::from_secs(1))),
            Instant::now(),
        );
        assert!(!endpoint.is_reachable());
        // An HTTP answer proves the replica is reachable.
        record(
            &endpoint,
            Err(ScrapeError::Status(http::StatusCode::SERVICE_UNAVAILABLE)),
            Instant::now(),
        );
        assert!(endpoint.is_reachable());
        record(
            &endpoint,
            Err(ScrapeError::Timeout(Duration::from_secs(1))),
            Instant::now(),
        );
        assert!(endpoint.is_reachable());
    }
}
