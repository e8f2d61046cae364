//! The request a replica is sent.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::Full;

use super::forwarded::{Forwarded, X_FORWARDED_FOR};
use crate::headers::{self, OWN_PREFIX};
use crate::telemetry::trace_context::TRACEPARENT;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What the replica is told about the caller, beyond what the client sent:
/// fields of the client's it does not get (the credential the gateway
/// consumed, any client copy of the tenant header) and the tenant header
/// the gateway sets.
#[derive(Debug, Clone, Copy, Default)]
pub struct CallerFields<'a> {
    pub removed: [Option<&'a HeaderName>; 2],
    pub tenant: Option<(&'a HeaderName, &'a HeaderValue)>,
}

/// The request a replica is sent: the client's method, path, query and
/// end-to-end headers, its body byte for byte, and the fields the gateway
/// sets itself, which replace any the client sent: the request id, the
/// trace context for the replica (see
/// [`crate::telemetry::trace_context`]), the forwarding fields and the
/// caller's tenant. The client's `x-infergate-*` fields are the gateway's
/// to read, not the replica's.
pub struct Outgoing<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    pub request_id: &'a HeaderValue,
    pub traceparent: &'a HeaderValue,
    pub forwarded: &'a Forwarded,
    pub caller: CallerFields<'a>,
}

impl<'a> Outgoing<'a> {
    /// The same request with another body (a disaggregated request's legs).
    pub fn with_body<'b>(&self, body: &'b Bytes) -> Outgoing<'b>
    where
        'a: 'b,
    {
        Outgoing {
            method: self.method,
            uri: self.uri,
            headers: self.headers,
            body,
            request_id: self.request_id,
            traceparent: self.traceparent,
            forwarded: self.forwarded,
            caller: self.caller,
        }
    }

    fn path(&self) -> &str {
        self.uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str)
    }

    /// The fields the replica receives, but `Host` (HTTP/1.1) or
    /// `:authority` (HTTP/2), which depend on the protocol.
    pub(crate) fn header_map(&self) -> HeaderMap {
        let replaced = [
            &REQUEST_ID,
            &TRACEPARENT,
            &X_FORWARDED_FOR,
            &header::FORWARDED,
            &header::HOST,
            &header::EXPECT,
        ];
        let mut map = HeaderMap::with_capacity(self.headers.len() + 4);
        let removed = |name: &HeaderName| self.caller.removed.contains(&Some(name));
        for (name, value) in headers::end_to_end(self.headers) {
            if !replaced.contains(&name) && !name.as_str().starts_with(OWN_PREFIX) && !removed(name)
            {
                map.append(name.clone(), value.clone());
            }
        }
        if let Some((name, value)) = self.caller.tenant {
            map.insert(name.clone(), value.clone());
        }
        map.insert(REQUEST_ID, self.request_id.clone());
        map.insert(TRACEPARENT, self.traceparent.clone());
        map.insert(X_FORWARDED_FOR, self.forwarded.x_forwarded_for.clone());
        map.insert(header::FORWARDED, self.forwarded.forwarded.clone());
        map
    }

    /// The request as it is, kept to be sent again with another body (a
    /// continuation) after the stages that lent its parts are over.
    pub fn keep(&self) -> KeptRequest {
        KeptRequest {
            method: self.method.clone(),
            uri: self.uri.clone(),
            headers: self.header_map(),
        }
    }
}

/// A request in the shape a replica receives it, HTTP/1.1 or HTTP/2.
pub trait ToReplica {
    fn http1(&self, addr: &str) -> Result<Request<Full<Bytes>>, InvalidTarget>;
    fn http2(&self, addr: &str) -> Result<Request<Full<Bytes>>, InvalidTarget>;
}

impl ToReplica for Outgoing<'_> {
    fn http1(&self, addr: &str) -> Result<Request<Full<Bytes>>, InvalidTarget> {
        http1(self.method, self.uri, self.header_map(), self.body, addr)
    }

    fn http2(&self, addr: &str) -> Result<Request<Full<Bytes>>, InvalidTarget> {
        http2(self.method, self.path(), self.header_map(), self.body, addr)
    }
}

/// The request a replica was sent, its fields as the replica got them.
pub struct KeptRequest {
    method: Method,
    uri: Uri,
    headers: HeaderMap,
}

impl KeptRequest {
    pub fn path(&self) -> &str {
        self.uri.path()
    }

    /// The same request with `body`.
    pub fn with_body(&self, body: Bytes) -> WithBody<'_> {
        WithBody {
            request: self,
            body,
        }
    }
}

/// A kept request with a new body.
pub struct WithBody<'a> {
    request: &'a KeptRequest,
    body: Bytes,
}

impl ToReplica for WithBody<'_> {
    fn http1(&self, addr: &str) -> Result<Request<Full<Bytes>>, InvalidTarget> {
        let r = self.request;
        http1(&r.method, &r.uri, r.headers.clone(), &self.body, addr)
    }

    fn http2(&self, addr: &str) -> Result<Request<Full<Bytes>>, InvalidTarget> {
        let r = self.request;
        let path = r.uri.path_and_query().map_or("/", |p| p.as_str());
        http2(&r.method, path, r.headers.clone(), &self.body, addr)
    }
}

/// The HTTP/1.1 request for the replica at `addr`: the path alone on the
/// request line, `Host` the replica's `host:port`; hyper adds the body's
/// length.
fn http1(
    method: &Method,
    uri: &Uri,
    mut headers: HeaderMap,
    body: &Bytes,
    addr: &str,
) -> Result<Request<Full<Bytes>>, InvalidTarget> {
    let host_port = config::endpoint_scheme(addr).1;
    let mut req = Request::new(Full::new(body.clone()));
    *req.method_mut() = method.clone();
    // The client's path and query as they are (already parsed, so not
    // parsed again): a cheap clone of shared bytes.
    let mut target = http::uri::Parts::default();
    target.path_and_query = Some(
        uri.path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/")),
    );
    *req.uri_mut() = Uri::from_parts(target).map_err(|_| InvalidTarget)?;
    headers.insert(
        header::HOST,
        HeaderValue::from_str(host_port).map_err(|_| InvalidTarget)?,
    );
    *req.headers_mut() = headers;
    Ok(req)
}

/// The HTTP/2 request for the replica at `addr`: the whole URI, from which
/// hyper sends `:scheme` (`https` for an `https://` replica) and
/// `:authority`.
fn http2(
    method: &Method,
    path: &str,
    headers: HeaderMap,
    body: &Bytes,
    addr: &str,
) -> Result<Request<Full<Bytes>>, InvalidTarget> {
    let (scheme, host_port) = config::endpoint_scheme(addr);
    let scheme = match scheme {
        config::Scheme::Http => "http",
        config::Scheme::Https => "https",
    };
    let mut req = Request::new(Full::new(body.clone()));
    *req.method_mut() = method.clone();
    *req.version_mut() = http::Version::HTTP_2;
    *req.uri_mut() = Uri::builder()
        .scheme(scheme)
        .authority(host_port)
        .path_and_query(path)
        .build()
        .map_err(|_| InvalidTarget)?;
    *req.headers_mut() = headers;
    Ok(req)
}

/// The replica's address and the request's target make no valid URI.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the replica address and the request path do not form a valid request target")]
pub struct InvalidTarget;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbound::forwarded::TrustedProxies;

    fn pairs(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in pairs {
            map.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn the_replica_gets_the_gateways_own_fields_and_the_clients_end_to_end_ones() {
        let headers = pairs(&[
            (
                "traceparent",
                "00-11111111111111111111111111111111-2222222222222222-01",
            ),
            ("tracestate", "vendor=1"),
            ("host", "gw"),
            ("connection", "x-hop"),
            ("x-hop", "1"),
            ("x-request-id", "theirs"),
            ("x-infergate-priority", "critical"),
            ("x-forwarded-for", "6.6.6.6"),
            ("expect", "100-continue"),
            ("content-length", "2"),
        ]);
        let uri = Uri::from_static("/v1/chat/completions?x=1");
        let ours =
            HeaderValue::from_static("00-11111111111111111111111111111111-3333333333333333-01");
        let body = Bytes::from_static(b"{}");
        let request_id = HeaderValue::from_static("req-1");
        let forwarded = Forwarded::new(
            &headers,
            "192.0.2.7:4000".parse().unwrap(),
            "http",
            &TrustedProxies::default(),
        );
        let outgoing = Outgoing {
            method: &Method::POST,
            uri: &uri,
            headers: &headers,
            body: &body,
            request_id: &request_id,
            traceparent: &ours,
            forwarded: &forwarded,
            caller: CallerFields::default(),
        };
        let expected = |req: &Request<Full<Bytes>>, host: Option<&str>| {
            let mut fields: Vec<String> = req
                .headers()
                .iter()
                .map(|(n, v)| format!("{n}: {}", v.to_str().unwrap()))
                .collect();
            fields.sort();
            let mut want = vec![
                "forwarded: for=192.0.2.7;proto=http".to_owned(),
                format!("traceparent: {}", ours.to_str().unwrap()),
                "tracestate: vendor=1".to_owned(),
                "x-forwarded-for: 192.0.2.7".to_owned(),
                "x-request-id: req-1".to_owned(),
            ];
            if let Some(host) = host {
                want.insert(1, format!("host: {host}"));
            }
            assert_eq!(fields, want);
        };

        let req = outgoing.http1("10.0.0.1:8000").unwrap();
        assert_eq!(req.uri(), "/v1/chat/completions?x=1");
        // The replica's address as host, not the gateway's.
        expected(&req, Some("10.0.0.1:8000"));

        let req = outgoing.http2("10.0.0.1:8000").unwrap();
        assert_eq!(req.uri(), "http://10.0.0.1:8000/v1/chat/completions?x=1");
        assert_eq!(req.version(), http::Version::HTTP_2);
        expected(&req, None);
        // An https:// replica: the scheme is the URI's, never the Host's.
        let req = outgoing.http1("https://10.0.0.1:8443").unwrap();
        expected(&req, Some("10.0.0.1:8443"));
        let req = outgoing.http2("https://10.0.0.1:8443").unwrap();
        assert_eq!(req.uri(), "https://10.0.0.1:8443/v1/chat/completions?x=1");
        expected(&req, None);
    }

    #[test]
    fn the_replica_gets_the_gateways_tenant_field_not_the_clients_credential() {
        let headers = pairs(&[
            ("authorization", "Bearer ig-secret"),
            ("x-tenant", "forged"),
            ("x-tenant", "forged again"),
            ("x-api-key", "kept: not the one consumed"),
        ]);
        let uri = Uri::from_static("/v1/chat/completions");
        let (body, value) = (Bytes::new(), HeaderValue::from_static("x"));
        let forwarded = Forwarded::new(
            &headers,
            "127.0.0.1:1".parse().unwrap(),
            "http",
            &TrustedProxies::default(),
        );
        let (tenant_header, tenant) = (
            HeaderName::from_static("x-tenant"),
            HeaderValue::from_static("team-a"),
        );
        let outgoing = Outgoing {
            method: &Method::POST,
            uri: &uri,
            headers: &headers,
            body: &body,
            request_id: &value,
            traceparent: &value,
            forwarded: &forwarded,
            caller: CallerFields {
                removed: [Some(&header::AUTHORIZATION), Some(&tenant_header)],
                tenant: Some((&tenant_header, &tenant)),
            },
        };
        let req = outgoing.http1("10.0.0.1:80").unwrap();
        assert!(req.headers().get(header::AUTHORIZATION).is_none());
        let tenants: Vec<_> = req.headers().get_all("x-tenant").iter().collect();
        assert_eq!(tenants, [&tenant]);
        assert_eq!(req.headers()["x-api-key"], "kept: not the one consumed");
    }

    #[test]
    fn an_address_that_makes_no_uri_is_an_error_not_a_panic() {
        let headers = HeaderMap::new();
        // Near the longest URI `http` parses from a string, which a URI
        // formatted with a Kubernetes service name in front once exceeded
        // (and panicked on): built from its parts, it is fine.
        let path = format!("/v1/{}", "a".repeat(65_450));
        let uri: Uri = path.parse().unwrap();
        let (body, value) = (Bytes::new(), HeaderValue::from_static("x"));
        let forwarded = Forwarded::new(
            &headers,
            "127.0.0.1:1".parse().unwrap(),
            "http",
            &TrustedProxies::default(),
        );
        let outgoing = Outgoing {
            method: &Method::POST,
            uri: &uri,
            headers: &headers,
            body: &body,
            request_id: &value,
            traceparent: &value,
            forwarded: &forwarded,
            caller: CallerFields::default(),
        };
        assert!(outgoing.http2("10.0.0.1:80").is_ok());
        let long_host = "vllm-llama-8b.inference.svc.cluster.local:8000";
        assert!(outgoing.http2(long_host).is_ok());
        assert!(outgoing.http2("not an authority").is_err());
        assert!(outgoing.http1("bad\naddr").is_err());
    }
}
