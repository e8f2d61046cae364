//! The files of TLS to Redis (`spec.rateLimits.redis.tls`), read and
//! checked as a pool's are; the redis crate makes the connection with
//! them. A `rediss://` URL without this section trusts the system's roots.

use super::files::{self, FileProblem};
use super::provider::provider;

/// PEM bytes, checked: a CA bundle with at least one usable certificate,
/// and a client certificate that its key belongs to.
#[derive(Clone, Default, PartialEq)]
pub struct RedisTlsFiles {
    pub ca: Option<Vec<u8>>,
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

pub fn read(spec: &config::RedisTls) -> Result<RedisTlsFiles, Vec<FileProblem>> {
    let mut problems = Vec::new();
    let mut read = |field, path: &str| {
        files::read(field, path)
            .map_err(|p| problems.push(p))
            .ok()
            .map(|bytes| (path.to_owned(), bytes))
    };
    let ca = spec.ca_file.as_deref().and_then(|p| read("caFile", p));
    let cert = spec.cert_file.as_deref().and_then(|p| read("certFile", p));
    let key = spec.key_file.as_deref().and_then(|p| read("keyFile", p));
    let mut found = RedisTlsFiles::default();
    if let Some((path, bytes)) = ca {
        match files::roots("caFile", &path, &bytes) {
            Ok(_) => found.ca = Some(bytes),
            Err(p) => problems.push(p),
        }
    }
    if let (Some((cert_path, cert)), Some((key_path, key))) = (cert, key) {
        match files::certified_key(
            &provider(),
            ("certFile", &cert_path, &cert),
            ("keyFile", &key_path, &key),
        ) {
            Ok(_) => found.client = Some((cert, key)),
            Err(p) => problems.extend(p),
        }
    }
    if problems.is_empty() {
        Ok(found)
    } else {
        Err(problems)
    }
}

/// What `check` and `serve` refuse in the Redis TLS files.
pub fn problems(limits: &config::RateLimits) -> Vec<FileProblem> {
    match limits.redis.as_ref().and_then(|r| r.tls.as_ref()) {
        Some(tls) => read(tls).err().unwrap_or_default(),
        None => Vec::new(),
    }
}
