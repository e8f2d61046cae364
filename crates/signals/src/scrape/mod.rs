//! The scrape loop: one task per replica, so a hanging replica never delays
//! the others. Each tick fetches `/metrics` (or, for [`Dialect::None`],
//! only opens a TCP connection), stores a new [`Observation`] in the
//! endpoint and tells the gateway through `on_update` (or `on_scrape`, which
//! also gets the scrape's duration and outcome).

mod client;
mod context;
mod error;
mod probe;

pub use client::{MAX_BODY_BYTES, ScrapeClient, ScrapeTls};
pub use error::ScrapeError;

use std::sync::Arc;
use std::time::{Duration, Instant};

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
    let mut target = if cfg.dialect.has_metrics() {
        match client::metrics_uri(&endpoint.addr).and_then(|uri| client.connection(&uri)) {
            Ok(connection) => Some(connection),
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
    let mut models = ModelList::for_replica(&endpoint.addr, cfg.dialect, &client);
    loop {
        ticker.tick().await;
        let started = Instant::now();
        let outcome = match &mut target {
            Some(connection) => {
                let scraped = tokio::time::timeout(cfg.timeout, scrape(connection, cfg.dialect))
                    .await
                    .unwrap_or(Err(ScrapeError::Timeout(cfg.timeout)));
                if let Err(ScrapeError::Timeout(_)) = scraped {
                    // A request may still be on it, its answer unread.
                    connection.reset();
                }
                scraped
            }
            None => probe::connect(crate::endpoint_scheme(&endpoint.addr).1, cfg.timeout)
                .await
                .map(|()| EngineState::default()),
        };
        let failed = outcome.is_err();
        let now = Instant::now();
        log_outcome(
            &endpoint,
            &outcome,
            now.duration_since(started),
            &mut failing,
        );
        record(&endpoint, outcome, now);
        let report = ScrapeReport {
            duration: now.duration_since(started),
            failed,
        };
        on_scrape(&endpoint, report);
        if let Some(models) = models.as_mut().filter(|m| !failed && m.due(now)) {
            models.read(&endpoint, cfg.timeout).await;
        }
    }
}

/// The replica's model list, read for its context length now and then
/// (only for engines that give it there).
struct ModelList {
    connection: client::Connection,
    last_read: Option<Instant>,
}

impl ModelList {
    fn for_replica(addr: &str, dialect: Dialect, client: &ScrapeClient) -> Option<Self> {
        if !dialect.lists_context_length() {
            return None;
        }
        let connection = client::models_uri(addr)
            .and_then(|uri| client.connection(&uri))
            .ok()?;
        Some(Self {
            connection,
            last_read: None,
        })
    }

    fn due(&self, now: Instant) -> bool {
        self.last_read
            .is_none_or(|at| now.duration_since(at) >= context::REFRESH)
    }

    /// One read; a failure waits for the next refresh like a success (the
    /// metrics scrape is what says whether the replica is up).
    async fn read(&mut self, endpoint: &Endpoint, timeout: Duration) {
        self.last_read = Some(Instant::now());
        let body = match tokio::time::timeout(timeout, self.connection.get()).await {
            Ok(Ok(body)) => body,
            Ok(Err(err)) => {
                tracing::debug!(endpoint = %endpoint.addr, error = %err, "model list not read");
                return;
            }
            Err(_) => {
                self.connection.reset();
                return;
            }
        };
        if let Some(limit) = context::from_model_list(&body) {
            if endpoint.context_limit() != Some(limit) {
                tracing::info!(endpoint = %endpoint.addr, context_length = limit, "replica context length");
            }
            endpoint.set_context_limit(limit);
        }
    }
}

async fn scrape(
    connection: &mut client::Connection,
    dialect: Dialect,
) -> Result<EngineState, ScrapeError> {
    let body = connection.get().await?;
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

/// Log when a replica starts or stops failing at `warn` and `info`, a
/// failure that goes on at `debug`, and a success at `trace` only: 100
/// replicas scraped every 50 ms would flood any other level.
fn log_outcome(
    endpoint: &Endpoint,
    outcome: &Result<EngineState, ScrapeError>,
    took: Duration,
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
        Ok(_) => tracing::trace!(endpoint = %endpoint.addr, ?took, "replica scraped"),
    }
    *failing = outcome.is_err();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::{ParseError, ParseErrorKind};

    mod logging {
        //! What a scraper logs, at which level, against a real replica.

        use std::convert::Infallible;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, LazyLock, Mutex};

        use bytes::Bytes;
        use http::{Response, StatusCode};
        use http_body_util::Full;
        use hyper::service::service_fn;
        use hyper_util::rt::TokioIo;
        use tokio::net::TcpListener;
        use tokio::sync::mpsc;
        use tracing::span::{Attributes, Id, Record};
        use tracing::{Dispatch, Event, Level, Metadata, Subscriber};

        use super::super::*;

        const BODY: &str = "# TYPE vllm:num_requests_waiting gauge\n\
                            vllm:num_requests_waiting{model_name=\"m\"} 3\n";

        /// Registered for the whole run: with two dispatchers registered,
        /// every call site asks the thread's own one whether it is wanted,
        /// so a scraper of another test cannot make one silent for this.
        static BYSTANDER: LazyLock<Dispatch> =
            LazyLock::new(|| Dispatch::new(tracing::subscriber::NoSubscriber::default()));

        /// Every event's level, target and message.
        #[derive(Clone, Default)]
        struct Recorded(Arc<Mutex<Vec<(Level, String, String)>>>);

        impl Recorded {
            fn messages(&self, level: Level) -> Vec<String> {
                let events = self.0.lock().unwrap();
                events
                    .iter()
                    .filter(|(l, ..)| *l == level)
                    .map(|(_, target, message)| format!("{target}: {message}"))
                    .collect()
            }

            fn count(&self, level: Level, message: &str) -> usize {
                let suffix = format!(": {message}");
                self.messages(level)
                    .iter()
                    .filter(|m| m.ends_with(&suffix))
                    .count()
            }
        }

        struct Message<'a>(&'a mut String);

        impl tracing::field::Visit for Message<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    *self.0 = format!("{value:?}");
                }
            }
        }

        impl Subscriber for Recorded {
            fn enabled(&self, _: &Metadata<'_>) -> bool {
                true
            }
            fn new_span(&self, _: &Attributes<'_>) -> Id {
                Id::from_u64(1)
            }
            fn record(&self, _: &Id, _: &Record<'_>) {}
            fn record_follows_from(&self, _: &Id, _: &Id) {}
            fn event(&self, event: &Event<'_>) {
                let mut message = String::new();
                event.record(&mut Message(&mut message));
                let meta = event.metadata();
                self.0
                    .lock()
                    .unwrap()
                    .push((*meta.level(), meta.target().to_owned(), message));
            }
            fn enter(&self, _: &Id) {}
            fn exit(&self, _: &Id) {}
        }

        /// A replica answering `/metrics` with [`BODY`], or 503 while
        /// `failing` is set.
        async fn replica(failing: Arc<AtomicBool>) -> String {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap().to_string();
            tokio::spawn(async move {
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    let failing = Arc::clone(&failing);
                    let service = service_fn(move |_request| {
                        let mut response =
                            Response::new(Full::new(Bytes::from_static(BODY.as_bytes())));
                        if failing.load(Ordering::SeqCst) {
                            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                        }
                        async move { Ok::<_, Infallible>(response) }
                    });
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service),
                    );
                }
            });
            addr
        }

        /// Scrapes `addr` every millisecond; each scrape's error (or `None`)
        /// arrives on the receiver.
        fn watch(addr: &str) -> (Scraper, mpsc::UnboundedReceiver<Option<String>>) {
            let cfg = ScrapeConfig {
                dialect: Dialect::Vllm,
                interval: Duration::from_millis(1),
                timeout: Duration::from_secs(30),
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let scraper = spawn_scraper(
                Endpoint::new(0, addr),
                cfg,
                ScrapeClient::new(Duration::from_secs(10)),
                move |endpoint| {
                    let _ = tx.send(endpoint.observation().last_error.clone());
                },
            );
            (scraper, rx)
        }

        // The default test runtime runs every task on this thread, under
        // this thread's subscriber.
        #[tokio::test]
        async fn successful_scrapes_log_at_trace_only() {
            LazyLock::force(&BYSTANDER);
            let recorded = Recorded::default();
            let _guard = tracing::subscriber::set_default(recorded.clone());
            let addr = replica(Arc::new(AtomicBool::new(false))).await;

            let (scraper, mut scrapes) = watch(&addr);
            for _ in 0..20 {
                assert_eq!(scrapes.recv().await.unwrap(), None, "a good scrape");
            }
            drop(scraper);

            for level in [Level::ERROR, Level::WARN, Level::INFO, Level::DEBUG] {
                assert_eq!(recorded.messages(level), Vec::<String>::new(), "{level}");
            }
            assert!(recorded.count(Level::TRACE, "replica scraped") >= 20);
            // One for every metrics scrape, one for the model list (read
            // once here: it is read again only after 30 s).
            assert_eq!(
                recorded.count(Level::TRACE, "scrape connection opened"),
                2,
                "one keep-alive connection for every scrape"
            );
        }

        #[tokio::test]
        async fn failures_and_recoveries_keep_their_levels() {
            LazyLock::force(&BYSTANDER);
            let recorded = Recorded::default();
            let _guard = tracing::subscriber::set_default(recorded.clone());
            let failing = Arc::new(AtomicBool::new(true));
            let addr = replica(Arc::clone(&failing)).await;

            let (scraper, mut scrapes) = watch(&addr);
            for _ in 0..3 {
                let error = scrapes.recv().await.unwrap();
                assert_eq!(error.as_deref(), Some("HTTP 503 Service Unavailable"));
            }
            failing.store(false, Ordering::SeqCst);
            while scrapes.recv().await.unwrap().is_some() {}
            drop(scraper);

            assert_eq!(recorded.count(Level::WARN, "replica scrape failing"), 1);
            assert!(recorded.count(Level::DEBUG, "replica scrape still failing") >= 2);
            assert_eq!(recorded.count(Level::INFO, "replica scrape recovered"), 1);
        }
    }

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
