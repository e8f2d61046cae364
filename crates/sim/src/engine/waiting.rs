//! The waiting queue: first come, first served, with preempted requests put
//! back at the front.
//!
//! vLLM keeps one list and, when every LoRA slot is taken, walks past
//! requests for other adapters. Walking a deep queue every step would cost
//! O(queue) per step, so the queue is split into one FCFS lane per adapter
//! (lane 0 is the base model) and ordered globally by a sequence number:
//! the FCFS head is the smallest head sequence over the lanes allowed to run.
//!
//! Aborted requests are left in their lane and skipped when they reach its
//! head, so an abort costs O(1) instead of a scan.

use std::collections::{BTreeSet, VecDeque};

/// Position of a request in the engine's request table, with the table
/// slot's generation so stale entries can be recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRef {
    pub slot: u32,
    pub generation: u32,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    seq: i64,
    at: SlotRef,
}

#[derive(Default)]
pub(crate) struct WaitingQueue {
    lanes: Vec<VecDeque<Entry>>,
    /// Live (not aborted) entries per lane.
    live: Vec<u32>,
    /// `(sequence of the lane's head, lane)` for every non-empty lane; every
    /// lane head is live.
    heads: BTreeSet<(i64, usize)>,
    next_back: i64,
    next_front: i64,
    len: usize,
}

impl WaitingQueue {
    pub(crate) fn new() -> Self {
        WaitingQueue {
            next_back: 0,
            next_front: -1,
            ..WaitingQueue::default()
        }
    }

    /// Live waiting requests.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Live waiting requests in `lane`.
    pub(crate) fn lane_len(&self, lane: usize) -> u32 {
        self.live.get(lane).copied().unwrap_or(0)
    }

    /// Lanes that exist (`0..lanes`).
    pub(crate) fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// A new arrival joins the back.
    pub(crate) fn push_back(&mut self, lane: usize, at: SlotRef) {
        let seq = self.next_back;
        self.next_back += 1;
        self.ensure_lane(lane);
        let was_empty = self.lanes[lane].is_empty();
        self.lanes[lane].push_back(Entry { seq, at });
        if was_empty {
            self.heads.insert((seq, lane));
        }
        self.live[lane] += 1;
        self.len += 1;
    }

    /// A preempted request goes ahead of everyone waiting.
    pub(crate) fn push_front(&mut self, lane: usize, at: SlotRef) {
        let seq = self.next_front;
        self.next_front -= 1;
        self.ensure_lane(lane);
        if let Some(old) = self.lanes[lane].front() {
            self.heads.remove(&(old.seq, lane));
        }
        self.lanes[lane].push_front(Entry { seq, at });
        self.heads.insert((seq, lane));
        self.live[lane] += 1;
        self.len += 1;
    }

    /// The head of `lane`, if any.
    pub(crate) fn head(&self, lane: usize) -> Option<(i64, SlotRef)> {
        self.lanes
            .get(lane)
            .and_then(|l| l.front())
            .map(|e| (e.seq, e.at))
    }

    /// The overall FCFS head: `(lane, request)`.
    pub(crate) fn first(&self) -> Option<(usize, SlotRef)> {
        let &(_, lane) = self.heads.first()?;
        self.head(lane).map(|(_, at)| (lane, at))
    }

    /// Remove the head of `lane` (it was admitted), then skip dead entries.
    pub(crate) fn pop_head(&mut self, lane: usize, is_live: impl Fn(SlotRef) -> bool) {
        let entry = self.lanes[lane]
            .pop_front()
            .expect("pop_head on an empty lane");
        self.heads.remove(&(entry.seq, lane));
        self.live[lane] -= 1;
        self.len -= 1;
        self.settle_head(lane, is_live);
    }

    /// A request of `lane` left the queue without being popped (aborted).
    /// Its entry is dropped lazily once it reaches the head.
    pub(crate) fn forget(&mut self, lane: usize, is_live: impl Fn(SlotRef) -> bool) {
        self.live[lane] -= 1;
        self.len -= 1;
        if let Some(front) = self.lanes[lane].front() {
            let key = (front.seq, lane);
            if !is_live(front.at) {
                self.heads.remove(&key);
                self.lanes[lane].pop_front();
                self.settle_head(lane, is_live);
            }
        }
    }

    /// Drop dead entries at the head of `lane` and index the new head.
    fn settle_head(&mut self, lane: usize, is_live: impl Fn(SlotRef) -> bool) {
        let queue = &mut self.lanes[lane];
        while let Some(front) = queue.front() {
            if is_live(front.at) {
                self.heads.insert((front.seq, lane));
                return;
            }
            queue.pop_front();
        }
    }

    fn ensure_lane(&mut self, lane: usize) {
        if self.lanes.len() <= lane {
            self.lanes.resize_with(lane + 1, VecDeque::new);
            self.live.resize(lane + 1, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashSet;

    fn at(slot: u32) -> SlotRef {
        SlotRef {
            slot,
            generation: 0,
        }
    }

    #[test]
    fn fcfs_across_lanes_with_preempted_first() {
        let mut q = WaitingQueue::new();
        q.push_back(0, at(1));
        q.push_back(2, at(2));
        q.push_back(0, at(3));
        assert_eq!(q.first(), Some((0, at(1))));
        q.push_front(2, at(9));
        assert_eq!(q.first(), Some((2, at(9))));
        q.pop_head(2, |_| true);
        assert_eq!(q.first(), Some((0, at(1))));
        q.pop_head(0, |_| true);
        assert_eq!(q.first(), Some((2, at(2))));
        assert_eq!(q.len(), 2);
        assert_eq!(q.lane_len(0), 1);
        assert_eq!(q.lane_len(2), 1);
    }

    #[test]
    fn aborted_entries_are_skipped() {
        let dead = RefCell::new(HashSet::new());
        let live = |s: SlotRef| !dead.borrow().contains(&s.slot);
        let mut q = WaitingQueue::new();
        for slot in 1..=4 {
            q.push_back(0, at(slot));
        }
        dead.borrow_mut().insert(2);
        q.forget(0, live);
        dead.borrow_mut().insert(1);
        q.forget(0, live);
        assert_eq!(q.first(), Some((0, at(3))), "dead head and next skipped");
        assert_eq!(q.len(), 2);
        q.pop_head(0, live);
        q.pop_head(0, live);
        assert_eq!(q.first(), None);
        assert_eq!(q.len(), 0);
    }
}
