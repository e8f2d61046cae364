//! Checks of the TLS sections that the document alone can answer. What
//! the files they name hold is checked by the gateway (`gateway::tls::
//! problems`), which reads them as `serve` would.

use crate::problem::Problems;
use crate::problem::Unreadable;
use crate::schema::{Scheme, Spec, endpoint_scheme};
use crate::security::{ClientAuth, ListenerTls, UpstreamTls};

pub(super) fn check(p: &mut Problems, spec: &Spec, unreadable: &Unreadable) {
    for (i, l) in spec.listeners.iter().enumerate() {
        if let Some(tls) = &l.tls {
            check_listener(p, &format!("spec.listeners[{i}].tls"), tls);
        }
    }
    if let Some(tls) = spec.admin.as_ref().and_then(|a| a.tls.as_ref()) {
        check_listener(p, "spec.admin.tls", tls);
    }
    for (i, pool) in spec.pools.iter().enumerate() {
        let Some(tls) = &pool.tls else {
            continue;
        };
        let path = format!("spec.pools[{i}].tls");
        let https = pool
            .endpoints
            .iter()
            .any(|e| endpoint_scheme(e).0 == Scheme::Https);
        if !https && unreadable.was_read(&format!("spec.pools[{i}].endpoints")) {
            p.add(
                &path,
                "no endpoint is https://host:port, so these settings would never be used",
            );
        }
        check_upstream(p, &path, tls);
    }
}

fn check_listener(p: &mut Problems, path: &str, tls: &ListenerTls) {
    for (field, value) in [
        ("certFile", Some(&tls.cert_file)),
        ("keyFile", Some(&tls.key_file)),
        ("clientCaFile", tls.client_ca_file.as_ref()),
    ] {
        if value.is_some_and(String::is_empty) {
            p.add(format!("{path}.{field}"), "must not be empty");
        }
    }
    if tls.client_auth == ClientAuth::Optional && tls.client_ca_file.is_none() {
        p.add(
            format!("{path}.clientAuth"),
            "optional needs clientCaFile, the CAs client certificates are checked against",
        );
    }
}

fn check_upstream(p: &mut Problems, path: &str, tls: &UpstreamTls) {
    check_file_pair(
        p,
        path,
        [("caFile", &tls.ca_file), ("serverName", &tls.server_name)],
        (&tls.cert_file, &tls.key_file),
    );
    if tls.insecure_skip_verify && tls.ca_file.is_some() {
        p.add(
            format!("{path}.caFile"),
            "is not used with insecureSkipVerify: true, which checks no certificate; remove one of them",
        );
    }
}

/// What a client's TLS section must hold: no empty names, and a client
/// certificate with its key.
pub(super) fn check_file_pair<const N: usize>(
    p: &mut Problems,
    path: &str,
    named: [(&str, &Option<String>); N],
    (cert_file, key_file): (&Option<String>, &Option<String>),
) {
    let pair = [("certFile", cert_file), ("keyFile", key_file)];
    for (field, value) in named.into_iter().chain(pair) {
        if value.as_deref() == Some("") {
            p.add(format!("{path}.{field}"), "must not be empty");
        }
    }
    match (cert_file, key_file) {
        (Some(_), None) => p.add(format!("{path}.keyFile"), "certFile needs its keyFile"),
        (None, Some(_)) => p.add(format!("{path}.certFile"), "keyFile needs its certFile"),
        _ => {}
    }
}
