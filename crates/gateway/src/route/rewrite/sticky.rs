//! Which target each session of a rewrite got first, so a conversation
//! does not flip between model versions. Bounded: two generations of
//! entries, the older dropped whole when the newer fills up or ages, so
//! memory stays within `max` entries and no sweep ever runs; a session
//! seen again moves to the newer generation.

use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct SessionTable {
    current: HashMap<u64, Seen>,
    previous: HashMap<u64, Seen>,
    /// When `current` started.
    since: Instant,
    max: usize,
    idle: Duration,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    target: usize,
    at: Instant,
}

impl SessionTable {
    pub fn new(max: usize, idle: Duration, now: Instant) -> Self {
        Self {
            current: HashMap::new(),
            previous: HashMap::new(),
            since: now,
            max: max.max(2),
            idle,
        }
    }

    /// Apply new bounds; the sessions known stay.
    pub fn configure(&mut self, max: usize, idle: Duration) {
        self.max = max.max(2);
        self.idle = idle;
    }

    /// The target `session` got, when it was seen within the idle timeout.
    pub fn get(&mut self, session: u64, now: Instant) -> Option<usize> {
        let seen = match self.current.get(&session) {
            Some(seen) => *seen,
            None => self.previous.remove(&session)?,
        };
        if now.saturating_duration_since(seen.at) > self.idle {
            self.current.remove(&session);
            return None;
        }
        self.set(session, seen.target, now);
        Some(seen.target)
    }

    pub fn set(&mut self, session: u64, target: usize, now: Instant) {
        if self.current.len() >= self.max / 2
            || now.saturating_duration_since(self.since) >= self.idle
        {
            self.previous = std::mem::take(&mut self.current);
            self.since = now;
        }
        self.current.insert(session, Seen { target, at: now });
    }

    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_within_bounds_and_forgets_idle_sessions() {
        let t0 = Instant::now();
        let idle = Duration::from_secs(60);
        let mut t = SessionTable::new(100, idle, t0);
        t.set(1, 2, t0);
        assert_eq!(t.get(1, t0 + Duration::from_secs(30)), Some(2));
        assert_eq!(t.get(1, t0 + Duration::from_secs(89)), Some(2));
        assert_eq!(t.get(1, t0 + Duration::from_secs(200)), None);
        for s in 0..1000 {
            t.set(s, 0, t0);
            assert!(t.len() <= 100, "{} entries", t.len());
        }
        // The most recent sessions are still known.
        assert_eq!(t.get(999, t0), Some(0));
    }
}
