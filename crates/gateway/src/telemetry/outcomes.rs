//! How each model's requests ended, as plain counters: the load summary
//! (`load_summary.rs`) reads recent error and 429 rates from them at up to
//! ten times a second, far more often than encoding `/metrics` would be
//! cheap. One relaxed increment per request, in `count_request`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Requests of one (pool, model) by how they ended, since start.
#[derive(Debug, Default)]
pub struct Outcomes {
    answered: AtomicU64,
    /// 5xx.
    errors: AtomicU64,
    /// 429.
    throttled: AtomicU64,
}

/// A reading of [`Outcomes`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    pub answered: u64,
    pub errors: u64,
    pub throttled: u64,
}

impl OutcomeCounts {
    /// `self - earlier`; a counter that went back (it cannot, but a
    /// reading of another book could) counts from zero.
    pub fn since(self, earlier: OutcomeCounts) -> OutcomeCounts {
        let delta = |now: u64, then: u64| now.checked_sub(then).unwrap_or(now);
        OutcomeCounts {
            answered: delta(self.answered, earlier.answered),
            errors: delta(self.errors, earlier.errors),
            throttled: delta(self.throttled, earlier.throttled),
        }
    }
}

impl Outcomes {
    pub fn count(&self, code: u16) {
        self.answered.fetch_add(1, Ordering::Relaxed);
        match code {
            429 => self.throttled.fetch_add(1, Ordering::Relaxed),
            500..=599 => self.errors.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
    }

    pub fn read(&self) -> OutcomeCounts {
        OutcomeCounts {
            answered: self.answered.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            throttled: self.throttled.load(Ordering::Relaxed),
        }
    }
}

/// A (pool, model) pair, by name.
pub type RouteKey = (String, String);

/// Every (pool, model)'s counters, made on first use and kept across
/// reloads (as Prometheus counters are), so rates never jump at a reload.
#[derive(Debug, Clone, Default)]
pub struct OutcomeBook(Arc<Mutex<HashMap<RouteKey, Arc<Outcomes>>>>);

impl OutcomeBook {
    pub fn of(&self, pool: &str, model: &str) -> Arc<Outcomes> {
        let mut book = self.0.lock();
        Arc::clone(book.entry((pool.to_owned(), model.to_owned())).or_default())
    }

    /// The counts of (pool, model); zero when it has had no request.
    pub fn read(&self, pool: &str, model: &str) -> OutcomeCounts {
        self.0
            .lock()
            .get(&(pool.to_owned(), model.to_owned()))
            .map(|o| o.read())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_and_429s_are_counted_apart_and_read_back() {
        let book = OutcomeBook::default();
        let o = book.of("p", "m");
        for code in [200, 200, 429, 503, 500, 404] {
            o.count(code);
        }
        let read = book.read("p", "m");
        assert_eq!(
            read,
            OutcomeCounts {
                answered: 6,
                errors: 2,
                throttled: 1
            }
        );
        assert!(Arc::ptr_eq(&o, &book.of("p", "m")));
        assert_eq!(book.read("p", "other"), OutcomeCounts::default());
        let earlier = OutcomeCounts {
            answered: 4,
            errors: 1,
            throttled: 1,
        };
        assert_eq!(
            read.since(earlier),
            OutcomeCounts {
                answered: 2,
                errors: 1,
                throttled: 0
            }
        );
    }
}
