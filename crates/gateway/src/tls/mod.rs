//! TLS, with rustls and its ring provider.
//!
//! - [`server`]: a listener's TLS: TLS 1.3 and 1.2, ALPN `h2` and
//!   `http/1.1`, client certificates, and certificates put in force while
//!   the listener runs ([`reload`]).
//! - [`client`]: TLS to a pool's `https://` replicas, for requests and
//!   metric scrapes.
//! - [`redis`]: the files of TLS to Redis, for shared rate limits.
//! - [`files`]: the PEM files they all read, and what is wrong with them.
//! - [`ClientCertificate`]: the names in a client's verified certificate,
//!   handed to every request on its connection.
//!
//! [`problems`] reads every file the config names, as `serve` would, so
//! that `infergate check` refuses what `serve` would refuse.

pub(crate) mod client;
mod files;
mod identity;
mod provider;
pub(crate) mod redis;
mod reload;
pub(crate) mod server;
#[cfg(test)]
mod tests;

pub use files::FileProblem;
pub use identity::ClientCertificate;
pub(crate) use provider::install_process_default;

/// What `serve` would refuse in the files the config's TLS sections name
/// (certificates, keys, CA bundles): unreadable, not PEM, a key that is
/// not its certificate's. Each problem is at its field
/// (`spec.listeners[0].tls.certFile`) and names the file and the reason.
pub fn problems(config: &config::InferenceGatewayConfig) -> Vec<config::Problem> {
    let spec = &config.spec;
    let listeners = spec
        .listeners
        .iter()
        .enumerate()
        .filter_map(|(i, l)| Some((format!("spec.listeners[{i}].tls"), l.tls.as_ref()?)))
        .chain(
            spec.admin
                .as_ref()
                .and_then(|a| Some(("spec.admin.tls".to_owned(), a.tls.as_ref()?))),
        );
    let mut found = Vec::new();
    for (at, tls) in listeners {
        found.extend(server::problems(tls).into_iter().map(|p| (at.clone(), p)));
    }
    for (i, pool) in spec.pools.iter().enumerate() {
        let at = format!("spec.pools[{i}].tls");
        found.extend(client::problems(pool).into_iter().map(|p| (at.clone(), p)));
    }
    let at = "spec.rateLimits.redis.tls";
    found.extend(
        redis::problems(&spec.rate_limits)
            .into_iter()
            .map(|p| (at.to_owned(), p)),
    );
    found
        .into_iter()
        .map(|(at, p)| config::Problem {
            path: format!("{at}.{}", p.field),
            message: p.message,
        })
        .collect()
}
