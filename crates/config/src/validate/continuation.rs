//! A pool's `continuation`, `drain` and `coldStart`: the limits that keep
//! a broken generation's continuation bounded, and how a cold pool wakes.

use crate::problem::Problems;
use crate::schema::Pool;

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
    if let Some(wake) = &pool.cold_start.wake {
        let url = wake.webhook.as_str();
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"))
            .and_then(|rest| rest.split('/').next());
        let valid = host.is_some_and(|h| !h.is_empty())
            && !url.chars().any(|c| c.is_whitespace() || c.is_control());
        if !valid {
            p.add(
                format!("{path}.coldStart.wake.webhook"),
                "must be an http:// or https:// URL",
            );
        }
    }
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
}
