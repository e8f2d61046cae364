//! Who the client is, as the replica is told: `X-Forwarded-For` and
//! `Forwarded` (RFC 7239), from the socket's peer address. What a client
//! claims in them is kept only when the peer is a trusted proxy; from
//! anyone else it is replaced, so a replica's logs and per-client limits
//! cannot be fooled by a header.

use std::net::{IpAddr, SocketAddr};

use http::header::{FORWARDED, HeaderMap, HeaderValue};
use ipnet::IpNet;

pub const X_FORWARDED_FOR: http::HeaderName = http::HeaderName::from_static("x-forwarded-for");

/// Which peers' forwarding headers are believed.
#[derive(Debug, Clone, Default)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    pub fn new(nets: Vec<IpNet>) -> Self {
        Self(nets)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }
}

/// The two fields a replica receives for a request from `peer`.
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub x_forwarded_for: HeaderValue,
    pub forwarded: HeaderValue,
}

impl Forwarded {
    /// `proto` is the scheme the client used (`http` or `https`).
    pub fn new(
        client: &HeaderMap,
        peer: SocketAddr,
        proto: &str,
        trusted: &TrustedProxies,
    ) -> Self {
        let ip = peer.ip().to_canonical();
        let keep = trusted.trusts(ip);
        let earlier = |name| {
            let values: Vec<&str> = if keep {
                client
                    .get_all(name)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .collect()
            } else {
                Vec::new()
            };
            values.join(", ")
        };
        let join = |earlier: String, own: String| {
            let value = if earlier.is_empty() {
                own
            } else {
                format!("{earlier}, {own}")
            };
            // Built from visible ASCII only: the client's values passed
            // `to_str`, and ours are addresses.
            HeaderValue::from_str(&value).expect("visible ASCII is a valid header value")
        };
        let node = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            // An IPv6 node is quoted and bracketed (RFC 7239 §6).
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        Self {
            x_forwarded_for: join(earlier(X_FORWARDED_FOR), ip.to_string()),
            forwarded: join(earlier(FORWARDED), format!("for={node};proto={proto}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.append(X_FORWARDED_FOR, HeaderValue::from_static("1.2.3.4"));
        h.append(FORWARDED, HeaderValue::from_static("for=1.2.3.4"));
        h
    }

    #[test]
    fn an_untrusted_peers_claims_are_replaced() {
        let f = Forwarded::new(
            &client(),
            "10.0.0.9:5000".parse().unwrap(),
            "http",
            &TrustedProxies::default(),
        );
        assert_eq!(f.x_forwarded_for, "10.0.0.9");
        assert_eq!(f.forwarded, "for=10.0.0.9;proto=http");
    }

    #[test]
    fn a_trusted_proxys_claims_are_kept_and_extended() {
        let trusted = TrustedProxies::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let f = Forwarded::new(
            &client(),
            "10.0.0.9:5000".parse().unwrap(),
            "https",
            &trusted,
        );
        assert_eq!(f.x_forwarded_for, "1.2.3.4, 10.0.0.9");
        assert_eq!(f.forwarded, "for=1.2.3.4, for=10.0.0.9;proto=https");
    }

    #[test]
    fn ipv6_peers_are_bracketed_and_mapped_ipv4_is_plain() {
        let f = Forwarded::new(
            &HeaderMap::new(),
            "[2001:db8::1]:80".parse().unwrap(),
            "http",
            &TrustedProxies::default(),
        );
        assert_eq!(f.x_forwarded_for, "2001:db8::1");
        assert_eq!(f.forwarded, "for=\"[2001:db8::1]\";proto=http");
        let trusted = TrustedProxies::new(vec!["127.0.0.1/32".parse().unwrap()]);
        assert!(trusted.trusts("::ffff:127.0.0.1".parse().unwrap()));
    }
}
