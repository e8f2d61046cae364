//! A pool's `continuation` and `drain`: the limits that keep a broken
//! generation's continuation bounded.

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
}
