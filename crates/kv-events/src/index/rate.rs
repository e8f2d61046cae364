//! A publisher's events per second, for `/debug/pools`: how busy its
//! engine's cache is, and whether a stream that looks in step is in fact
//! silent.

use std::time::{Duration, Instant};

/// Rates are measured over windows of this length: long enough to smooth
/// an engine's steps, short enough to show a change within seconds.
const WINDOW: Duration = Duration::from_secs(10);

/// Events counted over fixed windows: the rate is the last complete
/// window's (the current one's while the first fills).
#[derive(Debug, Clone)]
pub(crate) struct RateMeter {
    started: Instant,
    current: u64,
    /// The last complete window's rate.
    last: Option<f64>,
}

impl RateMeter {
    pub fn new(now: Instant) -> Self {
        RateMeter {
            started: now,
            current: 0,
            last: None,
        }
    }

    pub fn add(&mut self, events: u64, now: Instant) {
        self.roll(now);
        self.current += events;
    }

    /// Events per second as of `now`.
    pub fn rate(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.started);
        // A window no event has closed yet speaks for itself, and as the
        // silence after it grows, its rate falls.
        if elapsed >= WINDOW {
            return self.current as f64 / elapsed.as_secs_f64();
        }
        match self.last {
            Some(rate) => rate,
            None => self.current as f64 / elapsed.as_secs_f64().max(1.0),
        }
    }

    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed >= WINDOW {
            self.last = Some(self.current as f64 / elapsed.as_secs_f64());
            self.started = now;
            self.current = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_the_last_complete_windows() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut m = RateMeter::new(t0);
        assert_eq!(m.rate(at(0)), 0.0);
        // The first window, while it fills: per second so far (at least one).
        m.add(50, at(5));
        assert_eq!(m.rate(at(5)), 10.0);
        m.add(50, at(9));
        // Closed by the next event: 100 events in 10 s.
        m.add(7, at(10));
        assert_eq!(m.rate(at(12)), 10.0);
        // A full window, not yet closed by an event, speaks for itself.
        m.add(193, at(15));
        assert_eq!(m.rate(at(20)), 20.0);
        // Silence: the rate falls, with no event to close a window.
        assert_eq!(m.rate(at(60)), 4.0);
    }
}
