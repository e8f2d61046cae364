//! Which header fields cross the gateway, in either direction.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Largest message head accepted, from a client (request line and
/// headers; the HTTP/2 header list) or from a replica (status line and
/// headers).
pub const HEAD_LIMIT: usize = 64 * 1024;

/// The gateway's own header prefix: set by the gateway on responses, read
/// from clients (priority, fairness key), never forwarded to a replica.
pub const OWN_PREFIX: &str = "x-infergate-";

/// Fields that describe one hop or frame one message (RFC 9110 §7.6.1):
/// never forwarded, in either direction. The next hop's framing is set by
/// hyper from the body.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::CONTENT_LENGTH,
];

/// The fields of `headers` that go on to the next hop: all but hop-by-hop
/// ones and any the `Connection` field names.
pub fn end_to_end(headers: &HeaderMap) -> impl Iterator<Item = (&HeaderName, &HeaderValue)> {
    let named: Vec<&str> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    headers.iter().filter(move |(name, _)| {
        !HOP_BY_HOP.contains(name) && !named.iter().any(|n| n.eq_ignore_ascii_case(name.as_str()))
    })
}

/// The one value of a field that must appear once, if it does.
pub fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    values.next().is_none().then_some(first)
}

/// Whether a response is a stream of server-sent events.
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"))
}

/// Whether a message is framed only by the chunked coding (or by its
/// length). Any other transfer coding (`gzip, chunked`, or `chunked`
/// twice) would reach the next hop re-framed without it, its body still
/// encoded: such a message is refused instead.
pub fn plain_transfer_coding(headers: &HeaderMap) -> bool {
    let mut codings = headers
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.as_bytes().split(|&b| b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|c| !c.is_empty());
    match codings.next() {
        None => true,
        Some(c) => c.eq_ignore_ascii_case(b"chunked") && codings.next().is_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_and_connection_named_fields_stay_behind() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("connection", "keep-alive, X-Hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-length", "3"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("content-type", "application/json"),
            ("x-kept", "yes"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        let mut kept: Vec<&str> = end_to_end(&h).map(|(n, _)| n.as_str()).collect();
        kept.sort();
        assert_eq!(kept, ["content-type", "x-kept"]);
    }

    #[test]
    fn only_chunked_alone_is_a_plain_transfer_coding() {
        let te = |v: &'static str| {
            let mut h = HeaderMap::new();
            if !v.is_empty() {
                h.append(header::TRANSFER_ENCODING, HeaderValue::from_static(v));
            }
            plain_transfer_coding(&h)
        };
        assert!(te(""));
        assert!(te("chunked"));
        assert!(te("Chunked "));
        assert!(!te("gzip"));
        assert!(!te("gzip, chunked"));
        assert!(!te("chunked, chunked"));
    }

    #[test]
    fn a_field_given_twice_has_no_single_value() {
        let mut h = HeaderMap::new();
        assert!(single(&h, &header::HOST).is_none());
        h.append(header::HOST, HeaderValue::from_static("a"));
        assert_eq!(single(&h, &header::HOST).unwrap(), "a");
        h.append(header::HOST, HeaderValue::from_static("b"));
        assert!(single(&h, &header::HOST).is_none());
    }
}
