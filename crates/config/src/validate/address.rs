//! The shape of an address in the config. A leaf, so the top-level
//! checks and each section's can use it.

/// `host:port` with a non-empty host and a numeric port; IPv6 hosts in
/// brackets.
pub fn is_host_port(s: &str) -> bool {
    if s.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    !host.is_empty()
        && port.parse::<u16>().is_ok()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
}
