//! A pool's `continuation`, `drain` and `coldStart`: the limits that keep
//! a broken generation's continuation bounded, and how a cold pool wakes.

use crate::problem::Problems;
use crate::schema::{Pool, Wake};

pub fn check(p: &mut Problems, path: &str, pool: &Pool) {
    let c = &pool.continuation;
    if c.max_attempts == Some(0) {
        p.add(
            format!("{path}.continuation.maxAttempts"),
            "must be at least 1 (turn continuation off with enabled: false)",
        );
    }
    if c.idle_timeout.is_some_and(|t| t.is_zero()) {
        p.add(
            format!("{path}.continuation.idleTimeout"),
            "must be more than 0",
        );
    }
    if c.max_text_bytes == Some(0) {
        p.add(
            format!("{path}.continuation.maxTextBytes"),
            "must be at least 1 (turn continuation off with enabled: false)",
        );
    }
    if pool.cold_start.heartbeat.is_some_and(|t| t.is_zero()) {
        p.add(
            format!("{path}.coldStart.heartbeat"),
            "must be more than 0 (leave it out to send none)",
        );
    }
    if let Some(wake) = &pool.cold_start.wake {
        check_wake(p, &format!("{path}.coldStart.wake"), wake);
    }
}

fn check_wake(p: &mut Problems, path: &str, wake: &Wake) {
    let names_workload = wake.kind.is_some()
        || wake.name.is_some()
        || wake.namespace.is_some()
        || wake.replicas.is_some();
    match (&wake.webhook, names_workload) {
        (Some(_), true) => p.add(
            path.to_owned(),
            "give either `webhook` or a workload (`kind`, `name`), not both",
        ),
        (None, false) => p.add(
            path.to_owned(),
            "give a `webhook` URL or a workload to scale (`kind`, `name`)",
        ),
        (Some(url), false) => {
            let host = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"))
                .and_then(|rest| rest.split('/').next());
            let valid = host.is_some_and(|h| !h.is_empty())
                && !url.chars().any(|c| c.is_whitespace() || c.is_control());
            if !valid {
                p.add(
                    format!("{path}.webhook"),
                    "must be an http:// or https:// URL",
                );
            }
        }
        (None, true) => {
            if wake.kind.is_none() {
                p.add(
                    format!("{path}.kind"),
                    "is required with `name`: Deployment, StatefulSet or LeaderWorkerSet",
                );
            }
            match wake.name.as_deref() {
                None => p.add(format!("{path}.name"), "is required with `kind`"),
                Some(name) if !is_dns_subdomain(name) => p.add(
                    format!("{path}.name"),
                    "must be a Kubernetes object name (lower-case letters, digits, '-' and '.')",
                ),
                Some(_) => {}
            }
            if let Some(ns) = wake.namespace.as_deref()
                && !is_dns_subdomain(ns)
            {
                p.add(
                    format!("{path}.namespace"),
                    "must be a Kubernetes namespace name",
                );
            }
            if wake.replicas == Some(0) {
                p.add(
                    format!("{path}.replicas"),
                    "must be at least 1: the gateway never scales a pool down",
                );
            }
        }
    }
}

/// A Kubernetes object name (RFC 1123 subdomain).
fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(pool: serde_json::Value) -> Vec<String> {
        let pool: Pool = serde_json::from_value(pool).unwrap();
        let mut p = Problems(Vec::new());
        check(&mut p, "spec.pools[0]", &pool);
        p.0.into_iter().map(|problem| problem.to_string()).collect()
    }

    #[test]
    fn a_wake_webhook_must_be_an_http_url() {
        let pool = |url: &str| {
            serde_json::json!({"name": "p", "models": ["m"], "endpoints": ["a:1"],
                "coldStart": {"timeout": "2m", "wake": {"webhook": url}}})
        };
        assert!(problems(pool("https://scaler.internal/wake")).is_empty());
        assert!(problems(pool("http://10.0.0.1:8080")).is_empty());
        for bad in [
            "scaler.internal/wake",
            "https://",
            "http://a b/",
            "ftp://x/",
        ] {
            let found = problems(pool(bad)).join("\n");
            assert!(found.contains("coldStart.wake.webhook"), "{bad}: {found}");
        }
    }

    #[test]
    fn a_wake_names_a_webhook_or_a_workload() {
        let pool = |wake: serde_json::Value| {
            serde_json::json!({"name": "p", "models": ["m"], "endpoints": ["a:1"],
                "coldStart": {"wake": wake}})
        };
        let ok = pool(serde_json::json!({"kind": "Deployment", "name": "vllm-llama"}));
        assert!(problems(ok).is_empty());
        let ok = pool(serde_json::json!({"kind": "LeaderWorkerSet", "name": "big",
            "namespace": "ml", "replicas": 2}));
        assert!(problems(ok).is_empty());
        for (wake, expected) in [
            (serde_json::json!({}), "coldStart.wake: give a `webhook`"),
            (
                serde_json::json!({"webhook": "http://a/", "kind": "Deployment", "name": "x"}),
                "not both",
            ),
            (serde_json::json!({"name": "x"}), "coldStart.wake.kind"),
            (
                serde_json::json!({"kind": "StatefulSet"}),
                "coldStart.wake.name",
            ),
            (
                serde_json::json!({"kind": "Deployment", "name": "Bad_Name"}),
                "coldStart.wake.name",
            ),
            (
                serde_json::json!({"kind": "Deployment", "name": "x", "replicas": 0}),
                "coldStart.wake.replicas",
            ),
        ] {
            let found = problems(pool(wake.clone())).join("\n");
            assert!(found.contains(expected), "{wake}: {found}");
        }
        let unknown: Result<Pool, _> =
            serde_json::from_value(pool(serde_json::json!({"kind": "ReplicaSet", "name": "x"})));
        assert!(unknown.is_err());
    }
}
