//! What the server hands a request handler.

use std::net::SocketAddr;

use http::{HeaderMap, Method, Uri, Version};

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
}

impl Request {
    pub fn path(&self) -> &str {
        self.uri.path()
    }
}
