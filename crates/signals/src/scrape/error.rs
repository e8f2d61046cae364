//! Why a scrape failed, and what that says about the replica's
//! reachability.

use std::error::Error;
use std::io;
use std::time::Duration;

use http::StatusCode;

use crate::prom::ParseError;

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("invalid replica address `{0}`")]
    InvalidAddress(String),
    /// Refused, reset, unreachable or not connected in time.
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("no complete answer within {0:?}")]
    Timeout(Duration),
    #[error("HTTP {0}")]
    Status(StatusCode),
    /// Any other transport failure, e.g. the replica closed the connection
    /// mid-response.
    #[error("request failed: {0}")]
    Request(String),
    #[error("response body larger than {0} bytes")]
    TooLarge(usize),
    #[error("not a Prometheus exposition: {0}")]
    Invalid(#[from] ParseError),
    /// The TLS handshake failed (an untrusted certificate, a name that
    /// does not match). The replica may well be up: it says nothing about
    /// reachability, and requests to it fail the same way, with a 502.
    #[error("TLS handshake failed: {0}")]
    Tls(String),
}

impl ScrapeError {
    /// The replica cannot be reached at all: it should not get traffic even
    /// when every replica of its pool is failing.
    pub fn is_connection_failure(&self) -> bool {
        matches!(self, ScrapeError::Connect(_))
    }

    /// The replica sent an HTTP response, so it is reachable even though
    /// the scrape failed.
    pub fn replica_answered(&self) -> bool {
        matches!(
            self,
            ScrapeError::Status(_) | ScrapeError::TooLarge(_) | ScrapeError::Invalid(_)
        )
    }

    pub(super) fn tls(err: &(dyn Error + 'static)) -> Self {
        ScrapeError::Tls(describe(err))
    }

    /// Classify a transport error from the HTTP client. `connecting` is the
    /// client's own verdict that the connector failed.
    pub(super) fn from_transport(err: &(dyn Error + 'static), connecting: bool) -> Self {
        let message = describe(err);
        if connecting || io_kinds(err).any(is_connection_kind) {
            ScrapeError::Connect(message)
        } else {
            ScrapeError::Request(message)
        }
    }
}

fn is_connection_kind(kind: io::ErrorKind) -> bool {
    use io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | BrokenPipe
            | TimedOut
            | HostUnreachable
            | NetworkUnreachable
            | AddrNotAvailable
    )
}

/// The kinds of every I/O error in the source chain.
fn io_kinds<'a>(err: &'a (dyn Error + 'static)) -> impl Iterator<Item = io::ErrorKind> + 'a {
    std::iter::successors(Some(err), |err| (*err).source())
        .filter_map(|err| err.downcast_ref::<io::Error>().map(io::Error::kind))
}

/// The error and its sources, outermost first: the client's own message
/// ("client error (Connect)") says little without the OS error under it.
fn describe(err: &(dyn Error + 'static)) -> String {
    let mut message = err.to_string();
    for source in std::iter::successors(err.source(), |err| (*err).source()) {
        let text = source.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("client error")]
    struct Wrapper(#[source] io::Error);

    #[test]
    fn resets_deep_in_the_chain_are_connection_failures() {
        let err = Wrapper(io::Error::from(io::ErrorKind::ConnectionReset));
        let scrape = ScrapeError::from_transport(&err, false);
        assert!(scrape.is_connection_failure(), "{scrape}");
        assert!(scrape.to_string().contains("client error: "), "{scrape}");
    }

    #[test]
    fn other_transport_errors_are_not() {
        let err = Wrapper(io::Error::new(io::ErrorKind::InvalidData, "bad chunk"));
        let scrape = ScrapeError::from_transport(&err, false);
        assert!(!scrape.is_connection_failure());
        assert!(!scrape.replica_answered());
        assert_eq!(
            scrape.to_string(),
            "request failed: client error: bad chunk"
        );
    }

    #[test]
    fn the_clients_connect_verdict_counts() {
        let err = Wrapper(io::Error::other("dns"));
        assert!(ScrapeError::from_transport(&err, true).is_connection_failure());
    }
}
