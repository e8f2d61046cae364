//! Talking to replicas: each worker's connections to each pool
//! ([`connections`]), and the request a replica receives.

pub mod connections;

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

/// Copy end-to-end headers, dropping hop-by-hop ones and any header the
/// `Connection` header names.
pub fn copy_headers(from: &HeaderMap, to: &mut HeaderMap) {
    let named_by_connection: Vec<&str> = from
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .collect();
    for (name, value) in from {
        if is_hop_by_hop(name)
            || named_by_connection
                .iter()
                .any(|n| n.eq_ignore_ascii_case(name.as_str()))
        {
            continue;
        }
        to.append(name.clone(), value.clone());
    }
}

/// [`copy_headers`] in place: drop hop-by-hop headers and any header the
/// `Connection` header names, keeping the first `Content-Length` if
/// `keep_content_length`. Allocates nothing unless a `Connection` header is
/// present.
pub fn remove_hop_by_hop(headers: &mut HeaderMap, keep_content_length: bool) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderValue> = headers
            .get_all(header::CONNECTION)
            .iter()
            .cloned()
            .collect();
        for name in named
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
        {
            if !(keep_content_length && name.eq_ignore_ascii_case(header::CONTENT_LENGTH.as_str()))
            {
                // Not a valid header name: nothing has it.
                headers.remove(name);
            }
        }
    }
    let drop = |name: &HeaderName| {
        is_hop_by_hop(name) && !(keep_content_length && name == header::CONTENT_LENGTH)
    };
    if headers.keys().any(drop) {
        let names: Vec<HeaderName> = headers.keys().filter(|n| drop(n)).cloned().collect();
        for name in names {
            headers.remove(name);
        }
    }
    if keep_content_length {
        let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
        if let (Some(first), Some(_)) = (lengths.next(), lengths.next()) {
            let first = first.clone();
            headers.insert(header::CONTENT_LENGTH, first);
        }
    }
}

/// The request sent to `addr`: same method, path, query and end-to-end
/// headers, the body byte for byte, the gateway's request id and the trace
/// context for the replica (see [`crate::telemetry::trace_context`]).
/// HTTP/1.1 gets the path alone and a `Host` header; HTTP/2 the whole URI,
/// from which hyper sends `:scheme` and `:authority`.
pub fn request(
    parts: &http::request::Parts,
    addr: &str,
    protocol: config::Protocol,
    body: Bytes,
    request_id: &HeaderValue,
    traceparent: &HeaderValue,
) -> Request<Full<Bytes>> {
    let path = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/"));
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = parts.method.clone();
    let headers = req.headers_mut();
    // Room for the request id, trace context and host added below.
    headers.reserve(parts.headers.len() + 3);
    copy_headers(&parts.headers, headers);
    headers.insert(REQUEST_ID, request_id.clone());
    headers.insert(TRACEPARENT, traceparent.clone());
    match protocol {
        config::Protocol::Http1 => {
            if let Ok(host) = HeaderValue::from_str(addr) {
                headers.insert(header::HOST, host);
            }
            *req.uri_mut() = Uri::from(path);
        }
        config::Protocol::H2c => {
            *req.version_mut() = http::Version::HTTP_2;
            *req.uri_mut() = format!("http://{addr}{path}")
                .parse()
                .expect("host:port and an already-parsed path form a valid URI");
        }
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mut to = HeaderMap::new();
        copy_headers(&from, &mut to);
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
            let mut copied = HeaderMap::new();
            copy_headers(&from, &mut copied);
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
        let ours = "00-11111111111111111111111111111111-3333333333333333-01";
        let make = |protocol| {
            request(
                &parts,
                "10.0.0.1:8000",
                protocol,
                Bytes::from_static(b"{}"),
                &HeaderValue::from_static("req-1"),
                &HeaderValue::from_static(ours),
            )
        };
        let req = make(config::Protocol::Http1);
        assert_eq!(req.uri(), "/v1/chat/completions?x=1");
        let headers = req.headers();
        assert_eq!(headers[REQUEST_ID], "req-1");
        assert_eq!(headers.get_all(TRACEPARENT).iter().count(), 1);
        assert_eq!(headers[TRACEPARENT], ours);
        assert_eq!(headers["tracestate"], "vendor=1");
        // The replica's address, not the gateway's.
        assert_eq!(headers[header::HOST], "10.0.0.1:8000");

        let req = make(config::Protocol::H2c);
        assert_eq!(req.uri(), "http://10.0.0.1:8000/v1/chat/completions?x=1");
        assert_eq!(req.version(), http::Version::HTTP_2);
        assert!(req.headers().get(header::HOST).is_none());
    }
}
