//! Where a publisher's stream stands: which batch comes next, and what a
//! batch's sequence number says about the ones in between.
//!
//! Pure, so every case is tested without sockets. The subscriber asks
//! [`Tracker::classify`] about each live batch and acts on the verdict.

use std::collections::HashSet;

/// What a live batch's sequence number means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The next one: apply it.
    InOrder,
    /// Batches `from..seq` were not heard (a gap, or the stream was joined
    /// after it started): fill them in by replay if possible, then apply.
    Missing { from: u64 },
    /// Already applied, from a replay that overtook the live stream.
    Duplicate,
    /// The sequence went back: the engine restarted, and every block the
    /// index holds is gone.
    Restarted,
}

#[derive(Debug, Default)]
pub struct Tracker {
    /// The sequence number expected next; `None` before the first batch.
    next: Option<u64>,
    /// The last batch applied, as (sequence, payload digest): asking the
    /// replay socket for it again proves the publisher is the same engine.
    last: Option<(u64, u64)>,
    /// Batches brought by the last replays, as (sequence, payload digest):
    /// the live stream may still deliver them. A live batch with the same
    /// number but another payload is a restarted engine's.
    replayed: HashSet<(u64, u64)>,
}

impl Tracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// The sequence number expected next.
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// The last batch applied, as (sequence, payload digest).
    pub fn last(&self) -> Option<(u64, u64)> {
        self.last
    }

    pub fn classify(&self, seq: u64, digest: u64) -> Verdict {
        match self.next {
            None if seq == 0 => Verdict::InOrder,
            None => Verdict::Missing { from: 0 },
            Some(next) if seq == next => Verdict::InOrder,
            Some(next) if seq > next => Verdict::Missing { from: next },
            Some(_) if self.replayed.contains(&(seq, digest)) => Verdict::Duplicate,
            Some(_) => Verdict::Restarted,
        }
    }

    /// A live batch was applied (or lost for good: it will not come again).
    /// The live stream is in order, so nothing replayed before it can still
    /// arrive live.
    pub fn live(&mut self, seq: u64, digest: u64) {
        self.next = Some(seq + 1);
        self.last = Some((seq, digest));
        self.replayed.clear();
    }

    /// A replayed batch was applied.
    pub fn replayed(&mut self, seq: u64, digest: u64) {
        self.next = Some(seq + 1);
        self.last = Some((seq, digest));
        self.replayed.insert((seq, digest));
    }

    /// The stream is known to be at `next` (an engine that has published
    /// nothing is at 0).
    pub fn expect(&mut self, next: u64) {
        self.next = Some(next);
    }

    /// Start over: the engine restarted.
    pub fn reset(&mut self) {
        self.next = None;
        self.last = None;
        self.replayed.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_stream_starts_at_zero() {
        let mut t = Tracker::new();
        assert_eq!(t.classify(0, 1), Verdict::InOrder);
        t.live(0, 7);
        assert_eq!(t.classify(1, 1), Verdict::InOrder);
        assert_eq!(t.next(), Some(1));
        assert_eq!(t.last(), Some((0, 7)));
    }

    #[test]
    fn joining_late_misses_everything_before() {
        let t = Tracker::new();
        assert_eq!(t.classify(5, 1), Verdict::Missing { from: 0 });
    }

    #[test]
    fn a_hole_is_missing_batches() {
        let mut t = Tracker::new();
        t.live(0, 1);
        assert_eq!(t.classify(4, 1), Verdict::Missing { from: 1 });
    }

    #[test]
    fn going_back_is_a_restart_unless_replay_brought_the_same_batch() {
        let mut t = Tracker::new();
        t.live(0, 1);
        t.replayed(1, 11);
        t.replayed(2, 22);
        assert_eq!(t.classify(1, 11), Verdict::Duplicate);
        assert_eq!(
            t.classify(2, 99),
            Verdict::Restarted,
            "same number, other batch"
        );
        assert_eq!(t.classify(0, 5), Verdict::Restarted);
        assert_eq!(t.classify(3, 33), Verdict::InOrder);
        t.live(3, 33);
        assert_eq!(t.classify(1, 11), Verdict::Restarted, "replays forgotten");
        t.reset();
        assert_eq!(t.classify(0, 1), Verdict::InOrder);
        assert_eq!(t.last(), None);
    }
}
