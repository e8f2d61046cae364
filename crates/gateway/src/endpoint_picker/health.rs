//! gRPC health, as data planes and Kubernetes probe an endpoint picker:
//! `liveness` while the process runs, `readiness` while it can pick (the
//! gateway's own readiness: a pool with a ready replica), and the
//! `envoy.service.ext_proc.v3.ExternalProcessor` service itself. Going
//! down, readiness and the service turn NOT_SERVING first.

use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tonic::server::NamedService;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::HealthReporter;

use super::stream::Processor;
use crate::state::State;

pub const LIVENESS: &str = "liveness";
pub const READINESS: &str = "readiness";
/// How often readiness is looked at again: replicas turn ready or not
/// with scrapes, which come no faster than this.
const READINESS_INTERVAL: Duration = Duration::from_millis(250);

pub struct Health {
    reporter: HealthReporter,
    watcher: tokio::task::JoinHandle<()>,
}

fn service_name() -> &'static str {
    <ExternalProcessorServer<Processor> as NamedService>::NAME
}

impl Health {
    /// Serving from now on; readiness follows the gateway's. Every
    /// service is known before the listener opens: a probe never finds
    /// one missing.
    pub async fn start(
        state: Arc<State>,
    ) -> (
        Self,
        HealthServer<impl tonic_health::pb::health_server::Health>,
    ) {
        let (reporter, server) = tonic_health::server::health_reporter();
        for (name, status) in [
            (LIVENESS, ServingStatus::Serving),
            (service_name(), ServingStatus::Serving),
            (READINESS, ServingStatus::NotServing),
        ] {
            reporter.set_service_status(name, status).await;
        }
        let watched = reporter.clone();
        let watcher = tokio::spawn(async move {
            let mut last = Some(false);
            let mut tick = tokio::time::interval(READINESS_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if state.is_shutting_down() {
                    return;
                }
                let ready = state.readiness().is_ok();
                if last != Some(ready) {
                    last = Some(ready);
                    let status = if ready {
                        ServingStatus::Serving
                    } else {
                        ServingStatus::NotServing
                    };
                    watched.set_service_status(READINESS, status).await;
                }
            }
        });
        (Self { reporter, watcher }, server)
    }

    /// Shutting down: no new requests, please.
    pub async fn going(&self) {
        self.watcher.abort();
        for name in [READINESS, service_name(), ""] {
            self.reporter
                .set_service_status(name, ServingStatus::NotServing)
                .await;
        }
    }

    pub fn stop(self) {
        self.watcher.abort();
    }
}
