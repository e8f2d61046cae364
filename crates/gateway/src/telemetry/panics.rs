//! Panics as log events, at most one a second. A panic in a request's task
//! is answered with a 500 by the server, and the gateway goes on; the
//! default hook would print each one to stderr, so a request that panics
//! every time could flood the logs as fast as clients send it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Replace the panic hook with one that logs through `tracing`, rate
/// limited, and counts what it left out.
pub fn install_hook() {
    static LAST_SECOND: AtomicU64 = AtomicU64::new(0);
    static SUPPRESSED: AtomicU64 = AtomicU64::new(0);
    std::panic::set_hook(Box::new(|info| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if LAST_SECOND.swap(now, Ordering::Relaxed) == now {
            SUPPRESSED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let suppressed = SUPPRESSED.swap(0, Ordering::Relaxed);
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(not a string)");
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        tracing::error!(
            thread = thread.name().unwrap_or("unnamed"),
            %location,
            suppressed,
            "panicked: {message}"
        );
    }));
}
