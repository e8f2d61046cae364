//! The HTTP client that fetches `/metrics`: keep-alive connections pooled
//! per replica, `TCP_NODELAY` set, bodies capped.

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, HeaderValue, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::ScrapeError;

/// Largest `/metrics` body accepted. A vLLM replica with many LoRA
/// adapters and histograms serves well under 1 MiB; anything far larger is
/// a misbehaving replica, not one to buffer.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Ask for the 0.0.4 text format, the one the parser reads.
const ACCEPT_EXPOSITION: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";

/// An HTTP/1.1 client for scraping. Cheap to clone; share one between all
/// scrapers so that idle connections live in one pool.
#[derive(Debug, Clone)]
pub struct ScrapeClient {
    http: Client<HttpConnector, Empty<Bytes>>,
}

impl ScrapeClient {
    /// `connect_timeout` bounds the TCP handshake. Keep it below the scrape
    /// timeout: then a replica that never answers the handshake is reported
    /// as unreachable rather than merely slow.
    pub fn new(connect_timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        // Small request and response on a reused connection: without
        // NODELAY, Nagle's algorithm against delayed ACKs adds ~40 ms.
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(connect_timeout));
        let http = Client::builder(TokioExecutor::new()).build(connector);
        Self { http }
    }

    /// GET `uri` and return its body when the status is 200.
    pub(super) async fn get(&self, uri: &Uri) -> Result<Bytes, ScrapeError> {
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = uri.clone();
        let headers = request.headers_mut();
        headers.insert(ACCEPT, HeaderValue::from_static(ACCEPT_EXPOSITION));
        headers.insert(USER_AGENT, HeaderValue::from_static("infergate"));

        let response = self
            .http
            .request(request)
            .await
            .map_err(|err| ScrapeError::from_transport(&err, err.is_connect()))?;
        if response.status() != StatusCode::OK {
            return Err(ScrapeError::Status(response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|err| {
                if err.is::<LengthLimitError>() {
                    ScrapeError::TooLarge(MAX_BODY_BYTES)
                } else {
                    ScrapeError::from_transport(&*err, false)
                }
            })?;
        Ok(body.to_bytes())
    }
}

/// `http://{addr}/metrics`, checked once when the scraper starts.
pub(super) fn metrics_uri(addr: &str) -> Result<Uri, ScrapeError> {
    format!("http://{addr}/metrics")
        .parse::<Uri>()
        .ok()
        .filter(|uri| uri.host().is_some_and(|host| !host.is_empty()) && uri.path() == "/metrics")
        .ok_or_else(|| ScrapeError::InvalidAddress(addr.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_uri_accepts_host_port_forms() {
        assert_eq!(
            metrics_uri("127.0.0.1:8000").unwrap(),
            "http://127.0.0.1:8000/metrics"
        );
        assert_eq!(
            metrics_uri("[::1]:8000").unwrap(),
            "http://[::1]:8000/metrics"
        );
        assert_eq!(
            metrics_uri("vllm-0.vllm.svc:8000").unwrap(),
            "http://vllm-0.vllm.svc:8000/metrics"
        );
    }

    #[test]
    fn metrics_uri_rejects_non_addresses() {
        for addr in ["", "a b:80", "host/path", "host:80/x", "http://host:80"] {
            assert!(
                matches!(metrics_uri(addr), Err(ScrapeError::InvalidAddress(_))),
                "{addr:?}"
            );
        }
    }
}
