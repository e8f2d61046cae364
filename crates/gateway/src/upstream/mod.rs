//! Talking to replicas: each worker's connections to each pool
//! ([`connections`]), the HTTP/1.1 client they use ([`http1`]), and the
//! request a replica receives ([`Outgoing`]).

pub mod connections;
pub mod http1;

use std::io::Write as _;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::Full;

use crate::fields::{self, Fields};
use crate::telemetry::trace_context::TRACEPARENT;

pub use connections::Connections;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request a replica is sent: the client's method, path, query and
/// end-to-end headers, its body byte for byte, the gateway's request id and
/// the trace context for the replica (see
/// [`crate::telemetry::trace_context`]), which replace any the client sent.
pub struct Outgoing<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a Fields,
    pub body: &'a Bytes,
    pub request_id: &'a HeaderValue,
    pub traceparent: &'a HeaderValue,
}

/// A replica's answer: its status, its head's fields as they arrived, and
/// its body, which streams from the connection.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub headers: Fields,
    pub body: connections::Body,
}

impl Outgoing<'_> {
    fn path(&self) -> &str {
        self.uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
    }

    /// The client's headers that go on, minus the two the gateway sets.
    fn forwarded_headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers.end_to_end().filter(|(name, _)| {
            !name.eq_ignore_ascii_case(REQUEST_ID.as_str().as_bytes())
                && !name.eq_ignore_ascii_case(TRACEPARENT.as_str().as_bytes())
        })
    }

    /// The HTTP/1.1 request head for the replica at `addr`: the path alone
    /// on the request line, `Host` the replica's address, and the body's
    /// length.
    pub fn http1_head(&self, addr: &str) -> Vec<u8> {
        let mut head = Vec::with_capacity(256 + 64 * self.headers.len());
        head.extend_from_slice(self.method.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(self.path().as_bytes());
        head.extend_from_slice(b" HTTP/1.1\r\n");
        let mut field = |name: &[u8], value: &[u8]| {
            head.extend_from_slice(name);
            head.extend_from_slice(b": ");
            head.extend_from_slice(value);
            head.extend_from_slice(b"\r\n");
        };
        field(b"host", addr.as_bytes());
        for (name, value) in self.forwarded_headers() {
            field(name, value);
        }
        field(REQUEST_ID.as_str().as_bytes(), self.request_id.as_bytes());
        field(TRACEPARENT.as_str().as_bytes(), self.traceparent.as_bytes());
        // Into the head directly: no string per request.
        let _ = write!(head, "content-length: {}\r\n\r\n", self.body.len());
        head
    }

    /// The HTTP/2 request for the replica at `addr`: the whole URI, from
    /// which hyper sends `:scheme` and `:authority`.
    pub fn http2(&self, addr: &str) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::new(self.body.clone()));
        *req.method_mut() = self.method.clone();
        *req.version_mut() = http::Version::HTTP_2;
        *req.uri_mut() = format!("http://{addr}{}", self.path())
            .parse::<Uri>()
            .expect("host:port and an already-parsed path form a valid URI");
        let headers = req.headers_mut();
        *headers = fields::header_map(self.forwarded_headers());
        headers.insert(REQUEST_ID, self.request_id.clone());
        headers.insert(TRACEPARENT, self.traceparent.clone());
        req
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_gets_the_request_id_and_trace_context() {
        let headers = Fields::from_pairs(&[
            (
                "traceparent",
                "00-11111111111111111111111111111111-2222222222222222-01",
            ),
            ("tracestate", "vendor=1"),
            ("host", "gw"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("x-request-id", "theirs"),
        ]);
        let uri = Uri::from_static("/v1/chat/completions?x=1");
        let ours =
            HeaderValue::from_static("00-11111111111111111111111111111111-3333333333333333-01");
        let body = Bytes::from_static(b"{}");
        let request_id = HeaderValue::from_static("req-1");
        let outgoing = Outgoing {
            method: &Method::POST,
            uri: &uri,
            headers: &headers,
            body: &body,
            request_id: &request_id,
            traceparent: &ours,
        };
        let head = String::from_utf8(outgoing.http1_head("10.0.0.1:8000")).unwrap();
        let mut lines: Vec<&str> = head.split("\r\n").collect();
        // The replica's address as host, not the gateway's.
        assert_eq!(
            lines[..2],
            [
                "POST /v1/chat/completions?x=1 HTTP/1.1",
                "host: 10.0.0.1:8000"
            ]
        );
        assert_eq!(lines.split_off(lines.len() - 2), ["", ""], "{head}");
        let mut fields = lines.split_off(2);
        fields.sort();
        assert_eq!(
            fields,
            [
                "content-length: 2",
                &format!("traceparent: {}", ours.to_str().unwrap()),
                "tracestate: vendor=1",
                "x-request-id: req-1",
            ]
        );

        let req = outgoing.http2("10.0.0.1:8000");
        assert_eq!(req.uri(), "http://10.0.0.1:8000/v1/chat/completions?x=1");
        assert_eq!(req.version(), http::Version::HTTP_2);
        let headers = req.headers();
        assert!(headers.get(http::header::HOST).is_none());
        assert!(headers.get("x-hop").is_none());
        assert!(headers.get(http::header::CONNECTION).is_none());
        assert_eq!(headers.get_all(REQUEST_ID).iter().count(), 1);
        assert_eq!(headers[REQUEST_ID], "req-1");
        assert_eq!(headers.get_all(TRACEPARENT).iter().count(), 1);
        assert_eq!(headers[TRACEPARENT], ours);
        assert_eq!(headers["tracestate"], "vendor=1");
    }
}
