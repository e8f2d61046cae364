//! Talking to replicas: each worker's connections to each pool
//! ([`connections`]), the HTTP/1.1 client they use ([`http1`]), and the
//! request a replica receives ([`Outgoing`]).

pub mod connections;
pub mod http1;

use std::io::Write as _;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Uri};
use http_body_util::Full;

use crate::telemetry::trace_context::TRACEPARENT;

pub use connections::Connections;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name == header::PROXY_AUTHORIZATION
        || name == header::PROXY_AUTHENTICATE
        || name == header::HOST
        || name == header::CONTENT_LENGTH
        || name.as_str() == "keep-alive"
}

/// The end-to-end headers of `from`: all but hop-by-hop ones and any
/// header the `Connection` header names.
fn end_to_end(from: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
    // Collected only when there is a `Connection` header, which clients
    // rarely send on a keep-alive HTTP/1.1 connection and never over h2.
    let named_by_connection: Vec<&str> = if from.contains_key(header::CONNECTION) {
        from.get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect()
    } else {
        Vec::new()
    };
    from.iter().filter(move |(name, _)| {
        !is_hop_by_hop(name)
            && !named_by_connection
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name.as_str()))
    })
}

/// [`end_to_end`] in place: drop hop-by-hop headers and any header the
/// `Connection` header names, keeping the first `Content-Length` if
/// `keep_content_length`. Allocates only for a `Connection` header naming
/// a header beyond `close` and `keep-alive`, which replicas rarely send.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, keep_content_length: bool) {
    if headers.contains_key(header::CONNECTION) {
        // `close` names no header, and `keep-alive` one dropped below.
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.eq_ignore_ascii_case("close") && !t.eq_ignore_ascii_case("keep-alive"))
            .filter(|t| !(keep_content_length && t.eq_ignore_ascii_case("content-length")))
            // Not a valid header name: nothing has it.
            .filter_map(|t| HeaderName::from_bytes(t.as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    let drop = |name: &HeaderName| {
        is_hop_by_hop(name) && !(keep_content_length && name == header::CONTENT_LENGTH)
    };
    // Every hop-by-hop name at most once: a fixed array suffices.
    let mut found: [Option<HeaderName>; 10] = Default::default();
    for (slot, name) in found.iter_mut().zip(headers.keys().filter(|n| drop(n))) {
        *slot = Some(name.clone());
    }
    for name in found.into_iter().flatten() {
        headers.remove(name);
    }
    if keep_content_length {
        let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
        if let (Some(first), Some(_)) = (lengths.next(), lengths.next()) {
            let first = first.clone();
            headers.insert(header::CONTENT_LENGTH, first);
        }
    }
}

/// The request a replica is sent: the client's method, path, query and
/// end-to-end headers, its body byte for byte, the gateway's request id and
/// the trace context for the replica (see
/// [`crate::telemetry::trace_context`]), which replace any the client sent.
pub struct Outgoing<'a> {
    pub parts: &'a http::request::Parts,
    pub body: &'a Bytes,
    pub request_id: &'a HeaderValue,
    pub traceparent: &'a HeaderValue,
}

impl Outgoing<'_> {
    fn path(&self) -> &str {
        self.parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
    }

    /// The client's headers that go on, minus the two the gateway sets.
    fn forwarded_headers(&self) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
        end_to_end(&self.parts.headers)
            .filter(|(name, _)| **name != REQUEST_ID && **name != TRACEPARENT)
    }

    /// The HTTP/1.1 request head for the replica at `addr`: the path alone
    /// on the request line, `Host` the replica's address, and the body's
    /// length.
    pub fn http1_head(&self, addr: &str) -> Vec<u8> {
        let mut head = Vec::with_capacity(256 + 64 * self.parts.headers.len());
        head.extend_from_slice(self.parts.method.as_str().as_bytes());
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
            field(name.as_str().as_bytes(), value.as_bytes());
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
        *req.method_mut() = self.parts.method.clone();
        *req.version_mut() = http::Version::HTTP_2;
        *req.uri_mut() = format!("http://{addr}{}", self.path())
            .parse::<Uri>()
            .expect("host:port and an already-parsed path form a valid URI");
        let headers = req.headers_mut();
        headers.reserve(self.parts.headers.len() + 2);
        for (name, value) in self.forwarded_headers() {
            headers.append(name.clone(), value.clone());
        }
        headers.insert(REQUEST_ID, self.request_id.clone());
        headers.insert(TRACEPARENT, self.traceparent.clone());
        req
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copied(from: &HeaderMap) -> HeaderMap {
        let mut to = HeaderMap::new();
        for (name, value) in end_to_end(from) {
            to.append(name.clone(), value.clone());
        }
        to
    }

    #[test]
    fn hop_by_hop_and_connection_named_headers_are_dropped() {
        let mut from = HeaderMap::new();
        from.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret"),
        );
        from.insert("x-secret", HeaderValue::from_static("1"));
        from.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        from.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        from.insert(header::HOST, HeaderValue::from_static("gw"));
        let to = copied(&from);
        assert_eq!(to.len(), 1);
        assert_eq!(to[header::AUTHORIZATION], "Bearer t");
    }

    #[test]
    fn removing_in_place_drops_what_copying_drops() {
        let mut from = HeaderMap::new();
        from.append(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, x-secret, Content-Length"),
        );
        from.append(header::CONNECTION, HeaderValue::from_static("X-Other, ,"));
        from.insert("x-secret", HeaderValue::from_static("1"));
        from.insert("x-other", HeaderValue::from_static("2"));
        from.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        from.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        from.insert(header::SERVER, HeaderValue::from_static("nginx"));
        from.append(header::SET_COOKIE, HeaderValue::from_static("a=1"));
        from.append(header::SET_COOKIE, HeaderValue::from_static("b=2"));
        from.append(header::CONTENT_LENGTH, HeaderValue::from_static("12"));
        from.append(header::CONTENT_LENGTH, HeaderValue::from_static("13"));
        from.insert(header::HOST, HeaderValue::from_static("gw"));
        let sorted = |h: &HeaderMap| {
            let mut all: Vec<(String, Vec<Vec<u8>>)> = h
                .keys()
                .map(|k| {
                    let values = h.get_all(k).iter().map(|v| v.as_bytes().to_vec()).collect();
                    (k.to_string(), values)
                })
                .collect();
            all.sort();
            all
        };
        for keep_content_length in [false, true] {
            let mut copied = copied(&from);
            if keep_content_length {
                let len = from.get(header::CONTENT_LENGTH).unwrap().clone();
                copied.insert(header::CONTENT_LENGTH, len);
            }
            let mut in_place = from.clone();
            remove_hop_by_hop(&mut in_place, keep_content_length);
            assert_eq!(sorted(&in_place), sorted(&copied));
        }
        let mut plain = HeaderMap::new();
        plain.insert(header::SERVER, HeaderValue::from_static("nginx"));
        plain.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        let before = plain.clone();
        remove_hop_by_hop(&mut plain, true);
        assert_eq!(plain, before);
    }

    #[test]
    fn the_replica_gets_the_request_id_and_trace_context() {
        let mut incoming = Request::post("/v1/chat/completions?x=1")
            .header(
                TRACEPARENT,
                "00-11111111111111111111111111111111-2222222222222222-01",
            )
            .header("tracestate", "vendor=1")
            .body(())
            .unwrap();
        incoming
            .headers_mut()
            .insert(header::HOST, HeaderValue::from_static("gw"));
        let (parts, ()) = incoming.into_parts();
        let ours =
            HeaderValue::from_static("00-11111111111111111111111111111111-3333333333333333-01");
        let body = Bytes::from_static(b"{}");
        let request_id = HeaderValue::from_static("req-1");
        let outgoing = Outgoing {
            parts: &parts,
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
        assert!(headers.get(header::HOST).is_none());
        assert_eq!(headers[REQUEST_ID], "req-1");
        assert_eq!(headers.get_all(TRACEPARENT).iter().count(), 1);
        assert_eq!(headers[TRACEPARENT], ours);
        assert_eq!(headers["tracestate"], "vendor=1");
    }
}
