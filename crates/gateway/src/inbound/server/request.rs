//! What the server hands a request handler.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderMap, Method, Uri, Version};

use crate::tls::ClientCertificate;

/// Index of the worker thread serving a request; selects its upstream
/// clients.
pub type WorkerId = usize;

/// A request as the server hands it to its handler: its body still
/// arriving.
pub struct Request {
    pub method: Method,
    pub uri: Uri,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: hyper::body::Incoming,
    /// The client's address, as the socket has it.
    pub peer: SocketAddr,
    /// Whether the request came over TLS.
    pub tls: bool,
    /// The client's certificate, verified in the TLS handshake against the
    /// listener's `clientCaFile`; the same for every request of the
    /// connection.
    pub client_cert: Option<Arc<ClientCertificate>>,
}

impl Request {
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// The scheme the client used: `https` over TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }
}

/// What a connection knows of its client, for every request on it.
#[derive(Debug, Clone)]
pub struct Client {
    pub peer: SocketAddr,
    pub tls: bool,
    pub certificate: Option<Arc<ClientCertificate>>,
}

/// A client over plain TCP.
impl From<SocketAddr> for Client {
    fn from(peer: SocketAddr) -> Self {
        Self {
            peer,
            tls: false,
            certificate: None,
        }
    }
}
