//! Reachability probe for replicas without metrics: a TCP connect, closed
//! as soon as it succeeds (for an `https://` replica too: reachability is
//! the network's, a TLS failure shows on the requests).

use std::time::Duration;

use tokio::net::TcpStream;

use super::ScrapeError;

pub(super) async fn connect(addr: &str, timeout: Duration) -> Result<(), ScrapeError> {
    match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
        Ok(Ok(_stream)) => Ok(()),
        Ok(Err(err)) => Err(ScrapeError::Connect(err.to_string())),
        Err(_) => Err(ScrapeError::Connect(format!(
            "no connection within {timeout:?}"
        ))),
    }
}
