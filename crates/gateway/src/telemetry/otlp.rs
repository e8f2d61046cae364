//! Trace export over OTLP/HTTP (protobuf), configured by
//! `spec.telemetry.otlp`.
//!
//! Spans are batched on the SDK's own thread; each export is sent by a
//! small hyper client running on the gateway's Tokio runtime, so the
//! exporter adds no second HTTP stack and never blocks a request.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, Tracer};

/// A collector's answer is a small protobuf; anything larger is not one.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// A tracer exporting to the collector in `otlp`, and the provider that
/// must be shut down to flush the last spans. Needs a Tokio runtime.
pub fn tracer(otlp: &config::Otlp) -> anyhow::Result<(Tracer, SdkTracerProvider)> {
    let client = ExportClient::new(otlp.timeout())?;
    let exporter = SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(otlp.traces_url())
        .with_timeout(otlp.timeout())
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        // A caller's sampling decision (its traceparent flags) wins, when
        // `forwarding.clientSampling` lets the caller decide (the pipeline
        // otherwise replaces the flag); the ratio applies to traces that
        // start here.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            otlp.sample_ratio(),
        ))))
        .with_resource(
            Resource::builder()
                .with_service_name(otlp.service_name().to_owned())
                .build(),
        )
        .build();
    Ok((provider.tracer("infergate"), provider))
}

/// Sends export requests from the SDK's batch thread through the Tokio
/// runtime the gateway runs on.
#[derive(Debug, Clone)]
struct ExportClient {
    http: Client<HttpConnector, Full<Bytes>>,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl ExportClient {
    fn new(timeout: Duration) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| anyhow::anyhow!("trace export needs a Tokio runtime"))?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(timeout));
        Ok(Self {
            http: Client::builder(TokioExecutor::new()).build(connector),
            runtime,
            timeout,
        })
    }
}

#[async_trait::async_trait]
impl HttpClient for ExportClient {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let http = self.http.clone();
        let timeout = self.timeout;
        let exchange = async move {
            let response = http.request(request.map(Full::new)).await?;
            let (head, body) = response.into_parts();
            let body = Limited::new(body, MAX_RESPONSE_BYTES).collect().await?;
            Ok::<_, HttpError>(Response::from_parts(head, body.to_bytes()))
        };
        self.runtime
            .spawn(async move {
                tokio::time::timeout(timeout, exchange)
                    .await
                    .map_err(|_| HttpError::from(format!("no answer within {timeout:?}")))?
            })
            .await?
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Empty;
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::sync::mpsc;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;
    use crate::telemetry::trace_context::{self, TRACEPARENT, TraceParent};

    /// An OTLP/HTTP collector that hands over every request it receives.
    async fn collector() -> (
        std::net::SocketAddr,
        mpsc::UnboundedReceiver<(String, Bytes)>,
    ) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<Incoming>| {
                        let tx = tx.clone();
                        async move {
                            let path = req.uri().path().to_owned();
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let _ = tx.send((path, body));
                            Ok::<_, Infallible>(http::Response::new(Empty::<Bytes>::new()))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (addr, rx)
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        memchr::memmem::find(haystack, needle).is_some()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn spans_reach_the_collector_and_join_the_callers_trace() {
        let (addr, mut received) = collector().await;
        let otlp = config::Otlp {
            endpoint: format!("http://{addr}"),
            service_name: Some("test-gateway".into()),
            sample_ratio: None,
            timeout: None,
        };
        let (tracer, provider) = tracer(&otlp).unwrap();
        let subscriber = tracing_subscriber::Registry::default()
            .with(super::super::logging::span_export_layer(tracer));

        let caller =
            TraceParent::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, caller.to_header());
        let (sent, value) = tracing::subscriber::with_default(subscriber, || {
            let span = crate::telemetry::request_span(
                &http::Method::POST,
                "/v1/chat/completions",
                &http::HeaderValue::from_static("req-1"),
            );
            let sent = trace_context::upstream(&headers, &span, None);
            span.in_scope(|| {});
            sent
        });
        // Same trace, the gateway's span as the replica's parent.
        assert_eq!(sent.trace_id, caller.trace_id);
        assert_ne!(sent.parent_id, caller.parent_id);
        assert!(sent.sampled());
        assert_eq!(TraceParent::parse(value.as_bytes()), Some(sent));

        tokio::task::spawn_blocking(move || provider.shutdown())
            .await
            .unwrap()
            .unwrap();
        let (path, body) = received.recv().await.unwrap();
        assert_eq!(path, "/v1/traces");
        assert!(contains(&body, b"request"), "span name");
        assert!(contains(&body, b"test-gateway"), "service name");
        assert!(contains(&body, &caller.trace_id.to_be_bytes()), "trace id");
        assert!(contains(&body, &sent.parent_id.to_be_bytes()), "span id");
        assert!(
            contains(&body, &caller.parent_id.to_be_bytes()),
            "parent span id"
        );
    }
}
