//! Checks of TLS, authentication, tenants and rate limits that need more
//! than one field. Files named here (certificates, keys, JWKS) are read
//! by the gateway, which reports them the same way.

use std::collections::HashMap;
use std::net::IpAddr;

use crate::defaults;
use crate::problem::Problems;
use crate::schema::Spec;
use crate::security::{ApiKey, AuthMode, JwtIssuer, LimitBackend, RateLimit};

/// Algorithms an issuer may be pinned to: asymmetric only. `none` and the
/// HMAC family are refused by name, so a public key can never be used as
/// a shared secret.
pub const JWT_ALGORITHMS: [&str; 9] = [
    "RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "EdDSA",
];

pub(super) fn check(p: &mut Problems, spec: &Spec) {
    check_exposure(p, spec);
    if let Some(auth) = &spec.auth {
        let configured =
            auth.api_keys.is_some() || auth.jwt.is_some() || auth.client_certificates.is_some();
        if auth.mode == AuthMode::Required && !configured {
            p.add(
                "spec.auth",
                "mode required needs apiKeys, jwt or clientCertificates (or write mode: none to let every caller in)",
            );
        }
        if let Some(keys) = &auth.api_keys {
            for (path, message) in check_api_keys(&keys.keys) {
                p.add(format!("spec.auth.apiKeys.keys{path}"), message);
            }
            if keys.file.as_deref() == Some("") {
                p.add("spec.auth.apiKeys.file", "must not be empty");
            }
        }
        if let Some(jwt) = &auth.jwt {
            if jwt.issuers.is_empty() {
                p.add("spec.auth.jwt.issuers", "at least one issuer is required");
            }
            for (i, issuer) in jwt.issuers.iter().enumerate() {
                check_issuer(p, &format!("spec.auth.jwt.issuers[{i}]"), issuer);
            }
        }
        if let Some(header) = &auth.tenant_header
            && http_header_name(header).is_err()
        {
            p.add(
                "spec.auth.tenantHeader",
                format!("{header:?} is not a valid header name"),
            );
        }
        if auth.client_certificates.is_some()
            && !spec
                .listeners
                .iter()
                .any(|l| l.tls.as_ref().is_some_and(|t| t.client_ca_file.is_some()))
        {
            p.add(
                "spec.auth.clientCertificates",
                "no listener asks for client certificates (listeners[].tls.clientCaFile)",
            );
        }
    }
    let mut tenants: HashMap<&str, usize> = HashMap::new();
    for (i, tenant) in spec.tenants.iter().enumerate() {
        let path = format!("spec.tenants[{i}]");
        if let Err(why) = tenant_name(&tenant.name) {
            p.add(format!("{path}.name"), why);
        } else if tenant.name == defaults::OTHER_TENANTS_LABEL {
            p.add(
                format!("{path}.name"),
                "\"other\" is reserved: it is the metrics label of every tenant not listed here",
            );
        } else {
            super::names::check_name(p, &mut tenants, "spec.tenants", i, &tenant.name);
        }
        if tenant.weight == Some(0) {
            p.add(format!("{path}.weight"), "must be at least 1");
        }
        for (j, glob) in tenant.models.iter().flatten().enumerate() {
            if glob.is_empty() {
                p.add(format!("{path}.models[{j}]"), "must not be empty");
            }
        }
        for (j, tag) in tenant.residency.iter().enumerate() {
            if tag.trim().is_empty() {
                p.add(format!("{path}.residency[{j}]"), "must not be empty");
            }
        }
        check_limit(p, &format!("{path}.limits"), &tenant.limits);
        for (glob, limit) in &tenant.model_limits {
            check_limit(p, &format!("{path}.modelLimits[{glob:?}]"), limit);
        }
    }
    let limits = &spec.rate_limits;
    check_limit(p, "spec.rateLimits.global", &limits.global);
    if limits.default_max_tokens == Some(0) {
        p.add("spec.rateLimits.defaultMaxTokens", "must be at least 1");
    }
    match (limits.backend, &limits.redis) {
        (LimitBackend::Redis, None) => {
            p.add("spec.rateLimits.redis", "backend redis needs redis.url")
        }
        (LimitBackend::Local, Some(_)) => p.add(
            "spec.rateLimits.backend",
            "redis is configured but the backend is local; write backend: redis",
        ),
        _ => {}
    }
    if let Some(redis) = &limits.redis {
        let tls = redis.url.starts_with("rediss://");
        if !tls && !redis.url.starts_with("redis://") {
            p.add(
                "spec.rateLimits.redis.url",
                format!(
                    "{:?} must start with redis:// or rediss:// (TLS)",
                    redis.url
                ),
            );
        }
        if let Some(t) = &redis.tls {
            if !tls {
                p.add(
                    "spec.rateLimits.redis.tls",
                    "is only used with a rediss:// url; write rediss:// to speak TLS to Redis",
                );
            }
            super::tls::check_file_pair(
                p,
                "spec.rateLimits.redis.tls",
                [("caFile", &t.ca_file)],
                (&t.cert_file, &t.key_file),
            );
        }
        if redis.timeout.is_some_and(|t| t.is_zero()) {
            p.add("spec.rateLimits.redis.timeout", "must be greater than 0");
        }
    }
}

/// Secure by default: a listener other callers can reach needs `auth`.
fn check_exposure(p: &mut Problems, spec: &Spec) {
    if spec.auth.is_some() {
        return;
    }
    for (i, l) in spec.listeners.iter().enumerate() {
        if !is_loopback(&l.address) {
            p.add(
                format!("spec.listeners[{i}].address"),
                format!(
                    "{:?} is reachable beyond this machine, and spec.auth is not configured: \
                     configure spec.auth (apiKeys, jwt or clientCertificates), or write \
                     `auth: {{mode: none}}` to let every caller in on purpose",
                    l.address
                ),
            );
        }
    }
}

/// `127.0.0.0/8`, `[::1]` or `localhost`: only this machine can connect.
pub fn is_loopback(address: &str) -> bool {
    let Some((host, _port)) = address.rsplit_once(':') else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Problems of a list of keys (the config's or a keys file's), each with
/// its path under the list (`[2].sha256`). A key listed twice would belong
/// to two tenants, or be one too many to revoke.
pub(crate) fn check_api_keys(keys: &[ApiKey]) -> Vec<(String, String)> {
    let mut problems = Vec::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        for (field, message) in check_api_key(key) {
            problems.push((format!("[{i}]{field}"), message));
        }
        let hash = match (&key.sha256, &key.argon2id) {
            (Some(hex), _) => hex.to_ascii_lowercase(),
            (None, Some(phc)) => phc.clone(),
            (None, None) => continue,
        };
        if let Some(first) = seen.insert(hash, i) {
            problems.push((format!("[{i}]"), format!("the same key as [{first}]")));
        }
    }
    problems
}

/// A tenant's name: it is logged, and sent to replicas in a header.
pub fn tenant_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        Err("must not be empty")
    } else if name.len() > 256 {
        Err("must be at most 256 bytes")
    } else if name.chars().any(char::is_control) {
        Err("must not contain control characters")
    } else {
        Ok(())
    }
}

fn check_api_key(key: &ApiKey) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    if let Err(why) = tenant_name(&key.tenant) {
        problems.push((".tenant", why.to_owned()));
    }
    match (&key.sha256, &key.argon2id) {
        (None, None) | (Some(_), Some(_)) => problems.push((
            "",
            "give exactly one of sha256 and argon2id (the key itself is never written in the config)"
                .to_owned(),
        )),
        (Some(hex), None) => {
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                problems.push((
                    ".sha256",
                    "must be 64 hex digits (`infergate keys new` prints one)".to_owned(),
                ));
            }
        }
        (None, Some(phc)) => {
            if !phc.starts_with("$argon2id$") {
                problems.push((".argon2id", "must be a PHC string starting $argon2id$".to_owned()));
            }
        }
    }
    problems
}

fn check_issuer(p: &mut Problems, path: &str, issuer: &JwtIssuer) {
    if issuer.issuer.is_empty() {
        p.add(format!("{path}.issuer"), "must not be empty");
    }
    if issuer.audiences.is_empty() {
        p.add(
            format!("{path}.audiences"),
            "at least one audience is required",
        );
    }
    if issuer.algorithms.is_empty() {
        p.add(format!("{path}.algorithms"), "pin at least one algorithm");
    }
    for (i, alg) in issuer.algorithms.iter().enumerate() {
        if !JWT_ALGORITHMS.contains(&alg.as_str()) {
            p.add(
                format!("{path}.algorithms[{i}]"),
                format!(
                    "{alg:?} is not accepted; use one of {}",
                    JWT_ALGORITHMS.join(", ")
                ),
            );
        }
    }
    match (&issuer.jwks_url, &issuer.jwks_file) {
        (None, None) | (Some(_), Some(_)) => {
            p.add(path, "give exactly one of jwksUrl and jwksFile")
        }
        (Some(url), None) => {
            if let Err(why) = check_jwks_url(url) {
                p.add(format!("{path}.jwksUrl"), why);
            }
        }
        (None, Some(_)) => {}
    }
    if issuer.refresh_interval.is_some_and(|d| d.is_zero()) {
        p.add(format!("{path}.refreshInterval"), "must be greater than 0");
    }
}

/// `https://…`, or `http://` to a loopback host (a sidecar).
fn check_jwks_url(url: &str) -> Result<(), String> {
    if url.starts_with("https://") {
        return Ok(());
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!("{url:?} must be an https:// URL"));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let with_port = if authority.contains(':') && !authority.ends_with(']') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    if is_loopback(&with_port) {
        Ok(())
    } else {
        Err(format!(
            "{url:?}: plain http is allowed only to a loopback host; use https://"
        ))
    }
}

fn check_limit(p: &mut Problems, path: &str, limit: &RateLimit) {
    for (field, value) in [
        ("requestsPerSecond", limit.requests_per_second),
        ("requestsPerMinute", limit.requests_per_minute),
        ("tokensPerMinute", limit.tokens_per_minute),
        ("tokensPerDay", limit.tokens_per_day),
    ] {
        if value == Some(0) {
            p.add(format!("{path}.{field}"), "must be at least 1");
        }
    }
}

/// RFC 9110 token characters.
fn http_header_name(name: &str) -> Result<(), ()> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if ok { Ok(()) } else { Err(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses() {
        for yes in [
            "127.0.0.1:8080",
            "127.8.0.1:1",
            "[::1]:80",
            "localhost:8080",
        ] {
            assert!(is_loopback(yes), "{yes}");
        }
        for no in [
            "0.0.0.0:8080",
            "[::]:80",
            "10.0.0.1:80",
            "gateway:80",
            "8080",
        ] {
            assert!(!is_loopback(no), "{no}");
        }
    }

    #[test]
    fn jwks_urls() {
        assert!(check_jwks_url("https://issuer.example/keys").is_ok());
        assert!(check_jwks_url("http://127.0.0.1:9000/jwks").is_ok());
        assert!(check_jwks_url("http://localhost/jwks").is_ok());
        assert!(check_jwks_url("http://[::1]:9/jwks").is_ok());
        assert!(check_jwks_url("http://issuer.example/keys").is_err());
        assert!(check_jwks_url("ftp://x/keys").is_err());
    }
}
