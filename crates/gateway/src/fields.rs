//! A message's header fields as its HTTP/1.1 head carried them: each name
//! and value a slice of the head's own bytes, in arrival order.
//!
//! The gateway looks up a handful of a request's headers and forwards the
//! rest; of a replica's response it reads one and forwards the rest. A
//! scan over a dozen fields is cheaper than building an `http::HeaderMap`,
//! which parses and lower-cases each name, hashes it, and counts a
//! reference to the head per value — work an SDK's dozen-odd headers paid
//! twice per request for nothing. `httparse` has already checked names and
//! values, so nothing is validated again. Names compare in any case and go
//! on as received; HTTP/2 messages, which arrive as maps, are converted at
//! the edge ([`Fields::from_map`], [`header_map`]).

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Where a field's name and value lie in the head.
#[derive(Debug, Clone, Copy)]
pub struct Span {
    name: (u32, u32),
    value: (u32, u32),
}

#[derive(Debug, Clone, Default)]
pub struct Fields {
    head: Bytes,
    spans: Vec<Span>,
}

/// `fields` (names and values as a head carried them) as a map, for
/// hyper's HTTP/2; any named invalidly for HTTP/2 is dropped (an HTTP/1.1
/// name may be anything `httparse` reads as a token).
pub fn header_map<'a>(fields: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in fields {
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            map.append(name, value);
        }
    }
    map
}

/// Where `s`, a slice of `buf`, lies in it.
pub fn span_in(buf: &[u8], s: &[u8]) -> Range<usize> {
    let at = s.as_ptr() as usize - buf.as_ptr() as usize;
    at..at + s.len()
}

/// Where each of `headers`, parsed from `buf`, lies in it: taken before
/// the head is split off the buffer, for [`Fields::new`] over it.
pub fn spans(buf: &[u8], headers: &[httparse::Header<'_>]) -> Vec<Span> {
    let pair = |r: Range<usize>| (r.start as u32, r.end as u32);
    headers
        .iter()
        .map(|h| Span {
            name: pair(span_in(buf, h.name.as_bytes())),
            value: pair(span_in(buf, h.value)),
        })
        .collect()
}

impl Fields {
    /// The fields at `spans` of `head` (from [`spans`]).
    pub fn new(head: Bytes, spans: Vec<Span>) -> Self {
        Self { head, spans }
    }

    /// An HTTP/2 message's headers, or a test's.
    pub fn from_map(map: &HeaderMap) -> Self {
        let size = map.iter().map(|(n, v)| n.as_str().len() + v.len()).sum();
        let mut head = BytesMut::with_capacity(size);
        let mut spans = Vec::with_capacity(map.len());
        let mut put = |bytes: &[u8]| {
            let start = head.len() as u32;
            head.put_slice(bytes);
            (start, head.len() as u32)
        };
        for (name, value) in map {
            let name = put(name.as_str().as_bytes());
            let value = put(value.as_bytes());
            spans.push(Span { name, value });
        }
        Self {
            head: head.freeze(),
            spans,
        }
    }

    /// Fields from `(name, value)` pairs, for tests.
    #[cfg(test)]
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Self {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).expect("a valid name"),
                HeaderValue::from_str(value).expect("a valid value"),
            );
        }
        Self::from_map(&map)
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Every field, names as received.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.spans
            .iter()
            .map(|s| (self.at(s.name), self.at(s.value)))
    }

    /// The values of every field named `name` (lower case), in order.
    pub fn get_all<'a>(&'a self, name: &'a str) -> impl DoubleEndedIterator<Item = &'a [u8]> {
        debug_assert!(!name.bytes().any(|b| b.is_ascii_uppercase()));
        self.spans
            .iter()
            .filter(move |s| self.at(s.name).eq_ignore_ascii_case(name.as_bytes()))
            .map(|s| self.at(s.value))
    }

    /// The first field named `name` (lower case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        debug_assert!(!name.bytes().any(|b| b.is_ascii_uppercase()));
        let span = self
            .spans
            .iter()
            .find(|s| self.at(s.name).eq_ignore_ascii_case(name.as_bytes()))?;
        Some(self.at(span.value))
    }

    /// [`Fields::get`], sharing the head's bytes rather than borrowing them.
    pub fn get_shared(&self, name: &str) -> Option<Bytes> {
        let value = self.get(name)?;
        Some(self.head.slice_ref(value))
    }

    pub fn contains(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// Whether a comma-separated field lists `token`, in any case.
    pub fn has_token(&self, name: &str, token: &[u8]) -> bool {
        self.get_all(name)
            .flat_map(|v| v.split(|&b| b == b','))
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
    }

    /// Whether the last transfer coding applied is chunked, which is then
    /// how the body is delimited.
    pub fn ends_chunked(&self) -> bool {
        self.get_all("transfer-encoding")
            .next_back()
            .and_then(|v| v.split(|&b| b == b',').next_back())
            .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"))
    }

    /// The length the `Content-Length` fields declare, `None` without one.
    /// Repeated equal values are one length; differing or malformed ones
    /// are an error, as the message's end is then unknown.
    pub fn declared_length(&self) -> Result<Option<u64>, &'static str> {
        let mut length = None;
        for value in self.get_all("content-length") {
            for item in value.split(|&b| b == b',') {
                let item = item.trim_ascii();
                if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
                    return Err("an invalid Content-Length");
                }
                let n = item.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
                if length.is_some_and(|l| l != n) {
                    return Err("conflicting Content-Length values");
                }
                length = Some(n);
            }
        }
        Ok(length)
    }

    /// The fields that go on to the next hop: all but hop-by-hop ones
    /// (RFC 9110 §7.6.1), the framing ones the next hop's message sets
    /// itself, and any the `Connection` field names.
    pub fn end_to_end(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        // Most `Connection` fields say only `keep-alive` or `close`, which
        // name no field that goes on: then no field needs checking.
        let names_fields = self
            .get_all("connection")
            .flat_map(|v| v.split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .any(|t| {
                !(t.is_empty()
                    || t.eq_ignore_ascii_case(b"keep-alive")
                    || t.eq_ignore_ascii_case(b"close"))
            });
        self.iter().filter(move |&(name, _)| {
            let named = names_fields && self.has_token("connection", name);
            !(is_hop_by_hop(name) || named)
        })
    }

    fn at(&self, (start, end): (u32, u32)) -> &[u8] {
        &self.head[start as usize..end as usize]
    }
}

/// Fields that describe one hop, or frame one message, in any case: never
/// forwarded. Compared by length first, as this runs for every field.
fn is_hop_by_hop(name: &[u8]) -> bool {
    let candidates: &[&[u8]] = match name.len() {
        2 => &[b"te"],
        4 => &[b"host"],
        7 => &[b"trailer", b"upgrade"],
        10 => &[b"connection", b"keep-alive"],
        14 => &[b"content-length"],
        17 => &[b"transfer-encoding"],
        18 => &[b"proxy-authenticate"],
        19 => &[b"proxy-authorization"],
        _ => return false,
    };
    candidates.iter().any(|c| name.eq_ignore_ascii_case(c))
}

#[cfg(test)]
mod tests;
