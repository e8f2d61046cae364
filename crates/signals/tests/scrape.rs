//! The scrape loop against a real HTTP replica on 127.0.0.1 whose
//! `/metrics` answer each test controls.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use picker::{Endpoint, EngineState, Observation};
use signals::{Dialect, Health, ScrapeClient, ScrapeConfig, Scraper, health, spawn_scraper};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};

const VLLM_IDLE: &str = include_str!("../testdata/metrics/vllm-v1-llmd-none.prom");
const VLLM_BUSY: &str = "\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 7.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 12.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5
";
const HTML: &str = "<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>";

/// Upper bound on waiting for an expected update, so a broken scraper fails
/// the test instead of hanging it. Never reached when things work.
const GUARD: Duration = Duration::from_secs(60);
/// `stale_after` for checks that must see a fresh scrape as healthy even on
/// a slow machine.
const GENEROUS: Duration = Duration::from_secs(60);

#[derive(Clone)]
enum Mode {
    Serve(&'static str),
    Status(StatusCode),
    /// Hold every request until the mode changes.
    Hang,
}

/// A stand-in replica: an HTTP/1.1 server whose `/metrics` answer follows
/// `mode`. Dropping it (or `stop`) closes the listener and every
/// connection, as a crashed replica would.
struct Replica {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    /// One message per request that started hanging.
    hanging: mpsc::UnboundedReceiver<()>,
    task: JoinHandle<()>,
}

impl Replica {
    async fn start(mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mode_tx, mode_rx) = watch::channel(mode);
        let (hang_tx, hanging) = mpsc::unbounded_channel();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn({
            let connections = Arc::clone(&connections);
            let requests = Arc::clone(&requests);
            async move {
                let mut open = JoinSet::new();
                loop {
                    let (stream, _) = listener.accept().await.unwrap();
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (mode_rx, hang_tx, requests) =
                        (mode_rx.clone(), hang_tx.clone(), Arc::clone(&requests));
                    let service = service_fn(move |request| {
                        requests.fetch_add(1, Ordering::SeqCst);
                        answer(request, mode_rx.clone(), hang_tx.clone())
                    });
                    open.spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service),
                    );
                }
            }
        });
        Self {
            addr,
            mode: mode_tx,
            connections,
            requests,
            hanging,
            task,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    fn stop(self) {}
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(
    request: Request<Incoming>,
    mut mode: watch::Receiver<Mode>,
    hanging: mpsc::UnboundedSender<()>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    assert_eq!(request.uri().path(), "/metrics");
    let mut current = mode.borrow_and_update().clone();
    if matches!(current, Mode::Hang) {
        let _ = hanging.send(());
        let released = mode
            .wait_for(|m| !matches!(m, Mode::Hang))
            .await
            .map(|m| m.clone());
        current = match released {
            Ok(m) => m,
            // The test ended: never answer.
            Err(_) => std::future::pending().await,
        };
    }
    let response = match current {
        Mode::Serve(body) => Response::new(Full::new(Bytes::from_static(body.as_bytes()))),
        Mode::Status(status) => {
            let mut response = Response::new(Full::new(Bytes::from_static(b"overloaded")));
            *response.status_mut() = status;
            response
        }
        Mode::Hang => unreachable!("waited for a mode other than Hang"),
    };
    Ok(response)
}

/// What `on_update` saw.
#[derive(Debug)]
struct Update {
    observation: Observation,
    reachable: bool,
}

impl Update {
    fn waiting(&self) -> Option<u64> {
        self.observation.state.as_ref().and_then(|s| s.waiting)
    }

    fn health(&self, stale_after: Duration) -> Health {
        health(&self.observation, Instant::now(), stale_after)
    }
}

struct Watched {
    endpoint: Arc<Endpoint>,
    scraper: Scraper,
    updates: mpsc::UnboundedReceiver<Update>,
}

impl Watched {
    fn start(addr: &str, dialect: Dialect, timeout: Duration) -> Self {
        let endpoint = Endpoint::new(0, addr);
        let cfg = ScrapeConfig {
            dialect,
            interval: Duration::from_millis(20),
            timeout,
        };
        let (tx, updates) = mpsc::unbounded_channel();
        let on_update = move |endpoint: &Endpoint| {
            let _ = tx.send(Update {
                observation: Observation::clone(&endpoint.observation()),
                reachable: endpoint.is_reachable(),
            });
        };
        let client = ScrapeClient::new(Duration::from_secs(5));
        let scraper = spawn_scraper(Arc::clone(&endpoint), cfg, client, on_update);
        Self {
            endpoint,
            scraper,
            updates,
        }
    }

    /// The first update that satisfies `condition`.
    async fn until(&mut self, what: &str, condition: impl Fn(&Update) -> bool) -> Update {
        let wait = async {
            loop {
                let update = self.updates.recv().await.expect("scraper stopped");
                if condition(&update) {
                    return update;
                }
            }
        };
        tokio::time::timeout(GUARD, wait)
            .await
            .unwrap_or_else(|_| panic!("never saw: {what}"))
    }

    /// Wait for the scrape task to end (its `on_update` is dropped with it).
    async fn until_stopped(&mut self) {
        let drained = async { while self.updates.recv().await.is_some() {} };
        tokio::time::timeout(GUARD, drained)
            .await
            .expect("scraper task never ended");
    }
}

fn idle_vllm_state() -> EngineState {
    EngineState {
        waiting: Some(0),
        kv_usage: Some(0.0),
        block_size: Some(16),
        kv_capacity_blocks: Some(74272),
        ..EngineState::default()
    }
}

#[tokio::test]
async fn observation_follows_the_body_and_garbage_is_unhealthy() {
    let replica = Replica::start(Mode::Serve(VLLM_IDLE)).await;
    let mut watched = Watched::start(
        &replica.addr.to_string(),
        Dialect::Vllm,
        Duration::from_secs(10),
    );

    let first = watched
        .until("a good scrape", |u| u.observation.state.is_some())
        .await;
    assert_eq!(first.observation.state.as_deref(), Some(&idle_vllm_state()));
    assert_eq!(first.observation.last_error, None);
    assert_eq!(first.health(GENEROUS), Health::Healthy);
    assert!(first.reachable);

    replica.set(Mode::Serve(VLLM_BUSY));
    let busy = watched
        .until("the busy state", |u| u.waiting() == Some(7))
        .await;
    let state = busy.observation.state.as_deref().unwrap();
    assert_eq!((state.running, state.kv_usage), (Some(12), Some(0.5)));
    let busy_at = busy.observation.last_good.unwrap();

    replica.set(Mode::Serve(HTML));
    let garbage = watched
        .until("a failed scrape", |u| u.observation.last_error.is_some())
        .await;
    let error = garbage.observation.last_error.as_deref().unwrap();
    assert!(error.contains("not a Prometheus exposition"), "{error}");
    assert!(error.contains("<!DOCTYPE html>"), "{error}");
    assert_eq!(garbage.health(GENEROUS), Health::Unhealthy);
    // The last good state and its time are kept; the replica did answer.
    assert_eq!(garbage.waiting(), Some(7));
    assert!(garbage.observation.last_good.unwrap() >= busy_at);
    assert!(garbage.reachable);

    replica.set(Mode::Serve(VLLM_IDLE));
    let back = watched
        .until("recovery", |u| u.observation.last_error.is_none())
        .await;
    assert_eq!(back.observation.state.as_deref(), Some(&idle_vllm_state()));
    assert_eq!(back.health(GENEROUS), Health::Healthy);

    // Keep-alive: scrapes share connections rather than opening one each.
    let requests = replica.requests.load(Ordering::SeqCst);
    let connections = replica.connections.load(Ordering::SeqCst);
    assert!(requests >= 4, "{requests} requests");
    assert!(
        connections < requests,
        "{connections} connections for {requests} requests"
    );
}

#[tokio::test]
async fn non_200_is_a_failure_from_a_reachable_replica() {
    let replica = Replica::start(Mode::Status(StatusCode::SERVICE_UNAVAILABLE)).await;
    let mut watched = Watched::start(
        &replica.addr.to_string(),
        Dialect::Vllm,
        Duration::from_secs(10),
    );
    let update = watched
        .until("a failed scrape", |u| u.observation.last_error.is_some())
        .await;
    assert_eq!(
        update.observation.last_error.as_deref(),
        Some("HTTP 503 Service Unavailable")
    );
    assert_eq!(update.observation.state, None);
    assert_eq!(update.health(GENEROUS), Health::Unhealthy);
    assert!(update.reachable);
}

#[tokio::test]
async fn a_hanging_replica_goes_stale_and_recovers() {
    const STALE_AFTER: Duration = Duration::from_millis(200);
    let mut replica = Replica::start(Mode::Serve(VLLM_IDLE)).await;
    // A timeout far beyond `STALE_AFTER`: staleness, not the timeout,
    // must be what excludes the replica here.
    let mut watched = Watched::start(
        &replica.addr.to_string(),
        Dialect::Vllm,
        Duration::from_secs(600),
    );
    watched
        .until("a good scrape", |u| u.observation.state.is_some())
        .await;

    replica.set(Mode::Hang);
    replica
        .hanging
        .recv()
        .await
        .expect("a scrape reaches the hanging replica");
    // The scraper is now blocked in that request: nothing will update the
    // observation until the replica answers, so the time passing is the
    // thing under test.
    let held = watched.endpoint.observation().clone();
    let last_good = held.last_good.expect("a good scrape came first");
    assert_eq!(held.last_error, None);
    tokio::time::sleep_until((last_good + STALE_AFTER + Duration::from_millis(1)).into()).await;
    let now_held = watched.endpoint.observation().clone();
    assert_eq!(
        now_held.last_good,
        Some(last_good),
        "no scrape completed while hanging"
    );
    assert_eq!(
        health(&now_held, Instant::now(), STALE_AFTER),
        Health::Stale
    );

    replica.set(Mode::Serve(VLLM_IDLE));
    let back = watched
        .until("a good scrape after the hang", |u| {
            u.observation.last_good > Some(last_good)
        })
        .await;
    assert_eq!(back.health(GENEROUS), Health::Healthy);
}

#[tokio::test]
async fn a_slow_replica_times_out_but_stays_reachable() {
    let replica = Replica::start(Mode::Hang).await;
    let mut watched = Watched::start(
        &replica.addr.to_string(),
        Dialect::Vllm,
        Duration::from_millis(100),
    );
    let update = watched
        .until("a timeout", |u| u.observation.last_error.is_some())
        .await;
    let error = update.observation.last_error.as_deref().unwrap();
    assert!(error.contains("no complete answer within 100ms"), "{error}");
    assert_eq!(update.health(GENEROUS), Health::Unhealthy);
    assert!(update.reachable);
}

#[tokio::test]
async fn a_dead_replica_is_unreachable() {
    let replica = Replica::start(Mode::Serve(VLLM_IDLE)).await;
    let mut watched = Watched::start(
        &replica.addr.to_string(),
        Dialect::Vllm,
        Duration::from_secs(10),
    );
    watched
        .until("a good scrape", |u| u.observation.state.is_some())
        .await;

    replica.stop();
    let dead = watched.until("unreachable", |u| !u.reachable).await;
    let error = dead.observation.last_error.as_deref().unwrap();
    assert!(error.starts_with("connection failed"), "{error}");
    assert_eq!(dead.health(GENEROUS), Health::Unhealthy);
    assert_eq!(dead.observation.state.as_deref(), Some(&idle_vllm_state()));
}

#[tokio::test]
async fn dialect_none_probes_reachability_only() {
    // The replica would answer /metrics, but a `none` scraper never asks.
    let replica = Replica::start(Mode::Serve(HTML)).await;
    let mut watched = Watched::start(
        &replica.addr.to_string(),
        Dialect::None,
        Duration::from_secs(10),
    );
    let up = watched
        .until("a probe", |u| u.observation.last_good.is_some())
        .await;
    assert!(up.reachable);
    assert_eq!(
        up.observation.state.as_deref(),
        Some(&EngineState::default())
    );
    assert_eq!(up.health(GENEROUS), Health::Healthy);
    assert!(replica.connections.load(Ordering::SeqCst) >= 1);
    assert_eq!(replica.requests.load(Ordering::SeqCst), 0);

    replica.stop();
    let down = watched.until("unreachable", |u| !u.reachable).await;
    assert_eq!(down.health(GENEROUS), Health::Unhealthy);
}

#[tokio::test]
async fn dropping_the_scraper_ends_its_task() {
    let replica = Replica::start(Mode::Serve(VLLM_IDLE)).await;
    let mut watched = Watched::start(
        &replica.addr.to_string(),
        Dialect::Vllm,
        Duration::from_secs(10),
    );
    watched
        .until("a good scrape", |u| u.observation.state.is_some())
        .await;
    let Watched {
        scraper,
        mut updates,
        ..
    } = watched;
    drop(scraper);
    let drained = async { while updates.recv().await.is_some() {} };
    tokio::time::timeout(GUARD, drained)
        .await
        .expect("scraper task never ended");
}

#[tokio::test]
async fn an_invalid_address_is_reported_once() {
    let mut watched = Watched::start("not an address", Dialect::Vllm, Duration::from_secs(10));
    let update = watched
        .until("an error", |u| u.observation.last_error.is_some())
        .await;
    assert_eq!(
        update.observation.last_error.as_deref(),
        Some("invalid replica address `not an address`")
    );
    assert_eq!(update.health(GENEROUS), Health::Unhealthy);
    // The task ends: nothing more to try at that address.
    watched.until_stopped().await;
}
