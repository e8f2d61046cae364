//! infergate as the endpoint picker of another proxy: the Gateway API
//! Inference Extension's endpoint-picker protocol (its proposal 004) over
//! Envoy's external-processing gRPC service.
//!
//! The data plane (Envoy Gateway, kgateway, Istio, ...) receives the
//! client's request and opens one `ExternalProcessor/Process` stream for
//! it. Over that stream this picker reads the request's head and body,
//! runs the same stages as its own listeners (pipeline.rs: parse, route,
//! authorize, limit, admit) against the same pools, flow control, limits
//! and metrics, and answers with the admitted replica; then it follows
//! the answer the data plane streams back to account for it:
//!
//! - stream.rs — one stream, message by message, in order;
//! - request.rs — the request phase: head, body, the decision;
//! - answer.rs — the messages the picker sends back;
//! - response.rs — the response phase: the served replica, tokens,
//!   the request's end;
//! - protocol.rs — the protocol's header names and dynamic metadata (the
//!   subset hint in, the endpoint list out, the served endpoint back);
//! - health.rs — gRPC health for liveness, readiness and the service.
//!
//! Every replica of the picker decides alone from its own scrapes (and
//! shares rate limits through Redis when configured): no leader.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::state::State;

mod answer;
mod health;
mod protocol;
mod request;
mod response;
mod stream;

/// The running endpoint-picker listener.
pub struct EndpointPicker {
    addr: SocketAddr,
    health: health::Health,
    server: JoinHandle<()>,
}

impl EndpointPicker {
    /// Bind `address` and serve the protocol and gRPC health on it until
    /// `stop`.
    pub async fn start(
        state: Arc<State>,
        address: &str,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|e| anyhow::anyhow!("endpoint picker: cannot listen on {address}: {e}"))?;
        let addr = listener.local_addr()?;
        let (health, health_service) = health::Health::start(Arc::clone(&state)).await;
        let processor = ExternalProcessorServer::new(stream::Processor::new(state))
            // Bodies are bounded by the gateway's own limit, not gRPC's
            // default 4 MiB per message.
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let server = tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let served = tonic::transport::Server::builder()
                .http2_keepalive_interval(Some(KEEPALIVE))
                .add_service(health_service)
                .add_service(processor)
                .serve_with_incoming_shutdown(incoming, stopped)
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "endpoint picker listener failed");
            }
        });
        tracing::info!(%addr, "endpoint picker listening");
        Ok(Self {
            addr,
            health,
            server,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Tell the data planes the picker is going: readiness and the
    /// service turn NOT_SERVING (liveness stays SERVING while the process
    /// runs), so they stop sending new requests before the listener
    /// closes.
    pub async fn going(&self) {
        self.health.going().await;
    }

    /// Wait up to `limit` for the streams running to end (the listener
    /// stopped accepting when the gateway's stop was sent); then cut them.
    pub async fn finish(self, limit: Duration) -> bool {
        let mut server = self.server;
        let finished = tokio::time::timeout(limit, &mut server).await.is_ok();
        if !finished {
            server.abort();
        }
        self.health.stop();
        finished
    }
}

/// How often an idle data-plane connection is pinged, so one whose peer
/// vanished is closed rather than kept.
const KEEPALIVE: Duration = Duration::from_secs(30);
