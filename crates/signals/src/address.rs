//! A replica's address as the config writes it: `host:port` for plain
//! HTTP, `https://host:port` for TLS. The address is kept as written
//! wherever it names the replica (logs, metric labels, the picker's
//! endpoints); what dials it splits the scheme off here.

/// How a replica is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

/// An endpoint's scheme and the `host:port` after it: `https://h:p` is
/// TLS, a bare `h:p` is plain HTTP.
pub fn endpoint_scheme(endpoint: &str) -> (Scheme, &str) {
    match endpoint.strip_prefix("https://") {
        Some(rest) => (Scheme::Https, rest),
        None => (Scheme::Http, endpoint),
    }
}

/// The host of `host:port`, without the brackets of an IPv6 address: the
/// name a replica's certificate is checked against.
pub fn host(host_port: &str) -> &str {
    let host = host_port
        .rsplit_once(':')
        .map_or(host_port, |(host, _port)| host);
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes() {
        assert_eq!(endpoint_scheme("https://a:443"), (Scheme::Https, "a:443"));
        assert_eq!(endpoint_scheme("a:80"), (Scheme::Http, "a:80"));
    }

    #[test]
    fn hosts() {
        assert_eq!(host("vllm-0.svc:8000"), "vllm-0.svc");
        assert_eq!(host("127.0.0.1:8000"), "127.0.0.1");
        assert_eq!(host("[::1]:8000"), "::1");
    }
}
