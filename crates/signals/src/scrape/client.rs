//! Fetching `/metrics`: each scraper keeps one HTTP/1.1 keep-alive
//! connection to its replica, with `TCP_NODELAY` set, and caps the body.
//! A replica written `https://host:port` is scraped over TLS, with the
//! settings its pool gives ([`ScrapeTls`]).
//!
//! The connection is the scraper's own rather than one from a shared pool:
//! a scraper sends one request at a time to one replica, so a pool has
//! nothing to share, and a pool logs every checkout and return at `debug`
//! (two lines per scrape, a few hundred a second for a fleet scraped every
//! 50 ms). Successful scrapes log nothing above `trace`.

use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, HOST, HeaderValue, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::ScrapeError;
use crate::address::{self, Scheme};

/// Largest `/metrics` body accepted. A vLLM replica with many LoRA
/// adapters and histograms serves well under 1 MiB; anything far larger is
/// a misbehaving replica, not one to buffer.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Ask for the 0.0.4 text format, the one the parser reads.
const ACCEPT_EXPOSITION: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";

/// How scrapers connect. Cheap to clone; it holds settings only, each
/// scraper keeps its own connection.
#[derive(Debug, Clone)]
pub struct ScrapeClient {
    connect_timeout: Duration,
    tls: Option<ScrapeTls>,
}

/// How `https://` replicas are scraped: the pool's TLS client settings
/// (roots, client certificate; ALPN `http/1.1`, the only protocol a
/// scraper speaks), and the name their certificates must carry when it is
/// not the host of the address.
#[derive(Clone)]
pub struct ScrapeTls {
    pub connector: TlsConnector,
    pub server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for ScrapeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeTls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl ScrapeClient {
    /// `connect_timeout` bounds the TCP handshake (name resolution
    /// included). Keep it below the scrape timeout: then a replica that
    /// never answers the handshake is reported as unreachable rather than
    /// merely slow.
    pub fn new(connect_timeout: Duration) -> Self {
        Self {
            connect_timeout,
            tls: None,
        }
    }

    /// Scrape `https://` replicas with `tls`. The TLS handshake is bounded
    /// by the connect timeout too.
    pub fn with_tls(mut self, tls: ScrapeTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// A connection to `uri`'s replica, opened at its first request.
    pub(super) fn connection(&self, uri: &Uri) -> Result<Connection, ScrapeError> {
        let authority = uri
            .authority()
            .map_or_else(String::new, |a| a.as_str().to_owned());
        let tls = if uri.scheme_str() == Some("https") {
            let Some(tls) = &self.tls else {
                return Err(ScrapeError::Tls(
                    "the replica is https:// but its pool has no TLS settings".to_owned(),
                ));
            };
            let name = match &tls.server_name {
                Some(name) => name.clone(),
                None => ServerName::try_from(address::host(&authority).to_owned())
                    .map_err(|_| ScrapeError::InvalidAddress(authority.clone()))?,
            };
            Some((tls.connector.clone(), name))
        } else {
            None
        };
        Ok(Connection {
            host: HeaderValue::from_str(&authority).ok(),
            authority,
            path: uri
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            connect_timeout: self.connect_timeout,
            tls,
            sender: None,
        })
    }
}

/// One scraper's keep-alive connection to its replica: opened when needed,
/// dropped after any failure so the next scrape starts on a fresh one.
pub(super) struct Connection {
    /// `host:port`, as dialled and sent in `Host`.
    authority: String,
    host: Option<HeaderValue>,
    path: String,
    connect_timeout: Duration,
    /// For an `https://` replica: how to shake hands, and the name its
    /// certificate must carry.
    tls: Option<(TlsConnector, ServerName<'static>)>,
    sender: Option<SendRequest<Empty<Bytes>>>,
}

/// How a request on an open connection failed.
enum Failure {
    /// Before any answer came: on a connection kept from an earlier
    /// scrape, the replica may just have closed it.
    Unanswered(ScrapeError),
    Answered(ScrapeError),
}

impl Connection {
    /// GET the metrics and return the body when the status is 200.
    pub(super) async fn get(&mut self) -> Result<Bytes, ScrapeError> {
        if let Some(mut sender) = self.sender.take()
            && sender.ready().await.is_ok()
        {
            match self.request(&mut sender).await {
                Ok(body) => {
                    self.sender = Some(sender);
                    return Ok(body);
                }
                Err(Failure::Answered(err)) => return Err(err),
                // A GET is safe to send again, on a new connection.
                Err(Failure::Unanswered(_)) => {}
            }
        }
        let mut sender = self.connect().await?;
        match self.request(&mut sender).await {
            Ok(body) => {
                self.sender = Some(sender);
                Ok(body)
            }
            Err(Failure::Answered(err) | Failure::Unanswered(err)) => Err(err),
        }
    }

    /// Forget the connection, e.g. after a scrape that timed out with a
    /// request still on it.
    pub(super) fn reset(&mut self) {
        self.sender = None;
    }

    async fn connect(&self) -> Result<SendRequest<Empty<Bytes>>, ScrapeError> {
        let stream =
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.authority))
                .await
            {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => return Err(ScrapeError::from_transport(&err, true)),
                Err(_) => {
                    return Err(ScrapeError::Connect(format!(
                        "no connection within {:?}",
                        self.connect_timeout
                    )));
                }
            };
        // Small request and response on a reused connection: without
        // NODELAY, Nagle's algorithm against delayed ACKs adds ~40 ms.
        if let Err(err) = stream.set_nodelay(true) {
            tracing::trace!(endpoint = %self.authority, error = %err, "could not set TCP_NODELAY");
        }
        let sender = match &self.tls {
            None => handshake(stream).await?,
            Some((connector, name)) => {
                let shaken = tokio::time::timeout(
                    self.connect_timeout,
                    connector.connect(name.clone(), stream),
                )
                .await
                .map_err(|_| {
                    ScrapeError::Tls(format!(
                        "no TLS handshake within {:?}",
                        self.connect_timeout
                    ))
                })?
                .map_err(|err| ScrapeError::tls(&err))?;
                handshake(shaken).await?
            }
        };
        tracing::trace!(endpoint = %self.authority, "scrape connection opened");
        Ok(sender)
    }

    async fn request(&self, sender: &mut SendRequest<Empty<Bytes>>) -> Result<Bytes, Failure> {
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = Uri::try_from(self.path.as_str())
            .map_err(|err| Failure::Answered(ScrapeError::Request(err.to_string())))?;
        let headers = request.headers_mut();
        if let Some(host) = &self.host {
            headers.insert(HOST, host.clone());
        }
        headers.insert(ACCEPT, HeaderValue::from_static(ACCEPT_EXPOSITION));
        headers.insert(USER_AGENT, HeaderValue::from_static("infergate"));

        let response = sender
            .send_request(request)
            .await
            .map_err(|err| Failure::Unanswered(ScrapeError::from_transport(&err, false)))?;
        if response.status() != StatusCode::OK {
            // The body is left unread: the connection goes with it.
            return Err(Failure::Answered(ScrapeError::Status(response.status())));
        }
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|err| {
                Failure::Answered(if err.is::<LengthLimitError>() {
                    ScrapeError::TooLarge(MAX_BODY_BYTES)
                } else {
                    ScrapeError::from_transport(&*err, false)
                })
            })?;
        Ok(body.to_bytes())
    }
}

/// An HTTP/1.1 connection over `io`, its task running.
async fn handshake<I>(io: I) -> Result<SendRequest<Empty<Bytes>>, ScrapeError>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(io))
        .await
        .map_err(|err| ScrapeError::from_transport(&err, false))?;
    // Ends when the sender is dropped or the replica closes the
    // connection; its errors reach the request that sees them.
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// `http://{addr}/metrics` (or `https://` for an `https://` address),
/// checked once when the scraper starts.
pub(super) fn metrics_uri(addr: &str) -> Result<Uri, ScrapeError> {
    uri(addr, "/metrics")
}

/// The replica's OpenAI model list, where vLLM and SGLang give their
/// context length.
pub(super) fn models_uri(addr: &str) -> Result<Uri, ScrapeError> {
    uri(addr, "/v1/models")
}

fn uri(addr: &str, path: &str) -> Result<Uri, ScrapeError> {
    let (scheme, host_port) = address::endpoint_scheme(addr);
    let scheme = match scheme {
        Scheme::Http => "http",
        Scheme::Https => "https",
    };
    format!("{scheme}://{host_port}{path}")
        .parse::<Uri>()
        .ok()
        .filter(|uri| uri.host().is_some_and(|host| !host.is_empty()) && uri.path() == path)
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
        for addr in [
            "",
            "a b:80",
            "host/path",
            "host:80/x",
            "http://host:80",
            "https://",
        ] {
            assert!(
                matches!(metrics_uri(addr), Err(ScrapeError::InvalidAddress(_))),
                "{addr:?}"
            );
        }
    }

    #[test]
    fn a_connection_dials_the_authority_and_asks_for_the_path() {
        let client = ScrapeClient::new(Duration::from_secs(1));
        let connection = client
            .connection(&metrics_uri("[::1]:8000").unwrap())
            .unwrap();
        assert_eq!(connection.authority, "[::1]:8000");
        assert_eq!(connection.host.as_ref().unwrap(), "[::1]:8000");
        assert_eq!(connection.path, "/metrics");
        assert!(connection.tls.is_none(), "plain HTTP");
        assert!(connection.sender.is_none(), "nothing opened before use");
    }

    #[test]
    fn an_https_replica_is_dialled_by_its_host_port() {
        assert_eq!(
            metrics_uri("https://vllm-0.svc:8443").unwrap(),
            "https://vllm-0.svc:8443/metrics"
        );
        let client = ScrapeClient::new(Duration::from_secs(1));
        let refused = client.connection(&metrics_uri("https://vllm-0.svc:8443").unwrap());
        assert!(
            matches!(refused, Err(ScrapeError::Tls(_))),
            "an https replica needs TLS settings"
        );
    }
}
