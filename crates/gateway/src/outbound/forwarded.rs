//! Who the client is, as the replica is told: `X-Forwarded-For` and
//! `Forwarded` (RFC 7239), from the socket's peer address. What a client
//! claims in them is kept only when the peer is a trusted proxy; from
//! anyone else it is replaced, so a replica's logs and per-client limits
//! cannot be fooled by a header.

use std::cell::RefCell;
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

thread_local! {
    /// The last peer's own values, built once: every request of a
    /// connection, and every connection of a client, comes from one
    /// address, and formatting it cost more than the rest of the
    /// forwarding headers together.
    static OWN: RefCell<Option<(IpAddr, bool, Forwarded)>> = const { RefCell::new(None) };
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
        let own = Self::own(ip, proto);
        if !trusted.trusts(ip) {
            return own;
        }
        let earlier = |name| {
            client
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|v| !v.is_empty())
                .collect::<Vec<&str>>()
                .join(", ")
        };
        let join = |earlier: String, own: HeaderValue| {
            if earlier.is_empty() {
                return own;
            }
            let own = own.to_str().expect("built from an address");
            // Built from visible ASCII only: the client's values passed
            // `to_str`, and ours are addresses.
            HeaderValue::from_str(&format!("{earlier}, {own}"))
                .expect("visible ASCII is a valid header value")
        };
        Self {
            x_forwarded_for: join(earlier(X_FORWARDED_FOR), own.x_forwarded_for),
            forwarded: join(earlier(FORWARDED), own.forwarded),
        }
    }

    /// The values for a request from `ip` alone, as an untrusted peer's.
    fn own(ip: IpAddr, proto: &str) -> Self {
        let https = proto == "https";
        OWN.with_borrow_mut(|last| {
            if let Some((at, tls, own)) = last.as_ref()
                && *at == ip
                && *tls == https
            {
                return own.clone();
            }
            let node = match ip {
                IpAddr::V4(v4) => v4.to_string(),
                // An IPv6 node is quoted and bracketed (RFC 7239 §6).
                IpAddr::V6(v6) => format!("\"[{v6}]\""),
            };
            let value = |text: String| {
                HeaderValue::from_str(&text).expect("an address is a valid header value")
            };
            let own = Self {
                x_forwarded_for: value(ip.to_string()),
                forwarded: value(format!("for={node};proto={proto}")),
            };
            *last = Some((ip, https, own.clone()));
            own
        })
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
    fn each_peer_gets_its_own_values_whatever_came_before() {
        let untrusted = TrustedProxies::default();
        for (peer, proto, xff) in [
            ("10.0.0.9:5000", "http", "10.0.0.9"),
            ("10.0.0.9:5001", "http", "10.0.0.9"),
            ("10.0.0.9:5001", "https", "10.0.0.9"),
            ("10.0.0.7:5001", "https", "10.0.0.7"),
        ] {
            let f = Forwarded::new(&client(), peer.parse().unwrap(), proto, &untrusted);
            assert_eq!(f.x_forwarded_for, xff);
            let ip = xff;
            assert_eq!(f.forwarded, format!("for={ip};proto={proto}").as_str());
        }
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
