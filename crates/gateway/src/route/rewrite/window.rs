//! A target's figures over a sliding window: answers, failures and a TTFT
//! histogram, kept in time slots so old ones fall out whole. Judging a
//! guard merges the slots: a fixed cost, whatever the request rate.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Slots per window: a window's figures are those of the last `window`,
/// give or take a twentieth of it.
const SLOTS: u32 = 20;
/// TTFT histogram: bucket `i` holds times up to `FIRST_BOUND_MS * GROWTH^i`.
/// 1 ms to beyond 10 minutes in steps of 10 %, so a p95 is read within
/// 10 % of its true value.
const FIRST_BOUND_MS: f64 = 1.0;
const GROWTH: f64 = 1.1;
const BUCKETS: usize = 144;

/// How one answer of a target ended, as its guard counts it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Outcome {
    /// A successful answer, its time to first token.
    Served(Duration),
    /// 5xx, a timeout, or 429 from the target's pool or replica.
    Failed,
}

#[derive(Debug, Clone)]
struct Slot {
    start: Instant,
    answers: u64,
    failures: u64,
    ttft: Box<[u32; BUCKETS]>,
}

/// The figures of a target over its window.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Figures {
    pub answers: u64,
    pub failures: u64,
    /// Upper bound of the bucket holding the 95th percentile of TTFT;
    /// `None` without a successful answer.
    pub ttft_p95: Option<Duration>,
}

impl Figures {
    pub fn error_rate(&self) -> f64 {
        if self.answers == 0 {
            0.0
        } else {
            self.failures as f64 / self.answers as f64
        }
    }
}

#[derive(Debug)]
pub struct Window {
    length: Duration,
    slot: Duration,
    slots: VecDeque<Slot>,
}

impl Window {
    pub fn new(length: Duration) -> Self {
        Self {
            length,
            slot: (length / SLOTS).max(Duration::from_millis(1)),
            slots: VecDeque::with_capacity(SLOTS as usize + 1),
        }
    }

    pub fn add(&mut self, outcome: Outcome, now: Instant) {
        self.expire(now);
        let fresh = self
            .slots
            .back()
            .is_none_or(|s| now.saturating_duration_since(s.start) >= self.slot);
        if fresh {
            self.slots.push_back(Slot {
                start: now,
                answers: 0,
                failures: 0,
                ttft: Box::new([0; BUCKETS]),
            });
        }
        let slot = self.slots.back_mut().expect("a slot was just ensured");
        slot.answers += 1;
        match outcome {
            Outcome::Served(ttft) => slot.ttft[bucket(ttft)] += 1,
            Outcome::Failed => slot.failures += 1,
        }
    }

    pub fn figures(&mut self, now: Instant) -> Figures {
        self.expire(now);
        let mut merged = [0u64; BUCKETS];
        let mut figures = Figures::default();
        for slot in &self.slots {
            figures.answers += slot.answers;
            figures.failures += slot.failures;
            for (m, &c) in merged.iter_mut().zip(slot.ttft.iter()) {
                *m += u64::from(c);
            }
        }
        let served: u64 = merged.iter().sum();
        if served > 0 {
            // The smallest bucket with at least 95 % of answers at or below.
            let rank = (served * 95).div_ceil(100);
            let mut seen = 0;
            for (i, &c) in merged.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    figures.ttft_p95 = Some(bound(i));
                    break;
                }
            }
        }
        figures
    }

    fn expire(&mut self, now: Instant) {
        while self
            .slots
            .front()
            .is_some_and(|s| now.saturating_duration_since(s.start) >= self.length)
        {
            self.slots.pop_front();
        }
    }
}

fn bucket(ttft: Duration) -> usize {
    let ms = ttft.as_secs_f64() * 1e3;
    if ms <= FIRST_BOUND_MS {
        return 0;
    }
    let i = ((ms / FIRST_BOUND_MS).ln() / GROWTH.ln()).ceil() as usize;
    i.min(BUCKETS - 1)
}

fn bound(i: usize) -> Duration {
    Duration::from_secs_f64(FIRST_BOUND_MS * GROWTH.powi(i as i32) / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p95_and_error_rate_over_the_window() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(10));
        for i in 0..95 {
            w.add(
                Outcome::Served(Duration::from_millis(100)),
                t0 + Duration::from_millis(i),
            );
        }
        for i in 0..5 {
            w.add(
                Outcome::Served(Duration::from_secs(3)),
                t0 + Duration::from_millis(100 + i),
            );
        }
        w.add(Outcome::Failed, t0 + Duration::from_millis(200));
        let f = w.figures(t0 + Duration::from_secs(1));
        assert_eq!((f.answers, f.failures), (101, 1));
        let p95 = f.ttft_p95.unwrap();
        assert!(
            p95 >= Duration::from_millis(100) && p95 <= Duration::from_millis(110),
            "{p95:?}"
        );
        // One more slow answer tips the 95th percentile to the slow ones.
        w.add(
            Outcome::Served(Duration::from_secs(3)),
            t0 + Duration::from_secs(1),
        );
        let p95 = w.figures(t0 + Duration::from_secs(1)).ttft_p95.unwrap();
        assert!(
            p95 >= Duration::from_secs(3) && p95 <= Duration::from_millis(3300),
            "{p95:?}"
        );
    }

    #[test]
    fn old_answers_leave_the_window() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(10));
        w.add(Outcome::Failed, t0);
        w.add(
            Outcome::Served(Duration::from_millis(5)),
            t0 + Duration::from_secs(6),
        );
        assert_eq!(w.figures(t0 + Duration::from_secs(9)).answers, 2);
        let later = w.figures(t0 + Duration::from_secs(11));
        assert_eq!((later.answers, later.failures), (1, 0));
        assert_eq!(w.figures(t0 + Duration::from_secs(17)), Figures::default());
    }
}
