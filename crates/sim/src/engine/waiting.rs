//! The waiting queue: first come, first served, with preempted requests put
//! back at the front; under priority scheduling, ordered by priority first
//! (lower value first, as vLLM's `--scheduling-policy priority`), then the
//! same way within a priority.
//!
//! vLLM keeps one list and, when every LoRA slot is taken, walks past
//! requests for other adapters. Walking a deep queue every step would cost
//! O(queue) per step, so the queue is split into one lane per adapter
//! (lane 0 is the base model), each a heap on its requests' [`Order`], and
//! the lane heads are indexed by that order: the overall head is the
//! smallest head over the lanes allowed to run. Under first come, first
//! served every rank is 0 and arrivals come in increasing order, so a
//! lane's heap behaves as the FIFO it models (a push costs one comparison).
//!
//! Aborted requests are left in their lane and skipped when they reach its
//! head, so an abort costs O(1) instead of a scan.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

/// Position of a request in the engine's request table, with the table
/// slot's generation so stale entries can be recognised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotRef {
    pub slot: u32,
    pub generation: u32,
}

/// Where a request stands in the queue, smallest first: its rank (its
/// priority under priority scheduling, else 0), then its sequence (arrival
/// order; negative for preempted requests, which go ahead of the rest of
/// their rank).
pub(crate) type Order = (i64, i64);

#[derive(Clone, Copy, Debug)]
struct Entry {
    order: Order,
    at: SlotRef,
}

// Sequences are unique, so the order alone identifies an entry.
impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.order == other.order
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.order.cmp(&other.order)
    }
}

#[derive(Default)]
pub(crate) struct WaitingQueue {
    /// Min-heaps on [`Order`].
    lanes: Vec<BinaryHeap<Reverse<Entry>>>,
    /// Live (not aborted) entries per lane.
    live: Vec<u32>,
    /// `(order of the lane's head, lane)` for every non-empty lane; every
    /// lane head is live.
    heads: BTreeSet<(Order, usize)>,
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

    /// A new arrival of `rank` joins the back of its rank.
    pub(crate) fn push_back(&mut self, lane: usize, rank: i64, at: SlotRef) {
        let seq = self.next_back;
        self.next_back += 1;
        self.push(lane, (rank, seq), at);
    }

    /// A preempted request of `rank` goes ahead of everyone waiting with
    /// its rank.
    pub(crate) fn push_front(&mut self, lane: usize, rank: i64, at: SlotRef) {
        let seq = self.next_front;
        self.next_front -= 1;
        self.push(lane, (rank, seq), at);
    }

    fn push(&mut self, lane: usize, order: Order, at: SlotRef) {
        self.ensure_lane(lane);
        let old_head = self.lanes[lane].peek().map(|e| e.0.order);
        self.lanes[lane].push(Reverse(Entry { order, at }));
        if old_head.is_none_or(|old| order < old) {
            if let Some(old) = old_head {
                self.heads.remove(&(old, lane));
            }
            self.heads.insert((order, lane));
        }
        self.live[lane] += 1;
        self.len += 1;
    }

    /// The head of `lane`, if any.
    pub(crate) fn head(&self, lane: usize) -> Option<(Order, SlotRef)> {
        self.lanes
            .get(lane)
            .and_then(|l| l.peek())
            .map(|e| (e.0.order, e.0.at))
    }

    /// The overall head: `(lane, request)`.
    pub(crate) fn first(&self) -> Option<(usize, SlotRef)> {
        let &(_, lane) = self.heads.first()?;
        self.head(lane).map(|(_, at)| (lane, at))
    }

    /// Remove the head of `lane` (it was admitted), then skip dead entries.
    pub(crate) fn pop_head(&mut self, lane: usize, is_live: impl Fn(SlotRef) -> bool) {
        let Reverse(entry) = self.lanes[lane].pop().expect("pop_head on an empty lane");
        self.heads.remove(&(entry.order, lane));
        self.live[lane] -= 1;
        self.len -= 1;
        self.settle_head(lane, is_live);
    }

    /// A request of `lane` left the queue without being popped (aborted).
    /// Its entry is dropped lazily once it reaches the head.
    pub(crate) fn forget(&mut self, lane: usize, is_live: impl Fn(SlotRef) -> bool) {
        self.live[lane] -= 1;
        self.len -= 1;
        if let Some(Reverse(front)) = self.lanes[lane].peek().copied()
            && !is_live(front.at)
        {
            self.heads.remove(&(front.order, lane));
            self.lanes[lane].pop();
            self.settle_head(lane, is_live);
        }
    }

    /// Drop dead entries at the head of `lane` and index the new head.
    fn settle_head(&mut self, lane: usize, is_live: impl Fn(SlotRef) -> bool) {
        let queue = &mut self.lanes[lane];
        while let Some(Reverse(front)) = queue.peek() {
            if is_live(front.at) {
                self.heads.insert((front.order, lane));
                return;
            }
            queue.pop();
        }
    }

    fn ensure_lane(&mut self, lane: usize) {
        if self.lanes.len() <= lane {
            self.lanes.resize_with(lane + 1, BinaryHeap::new);
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
        q.push_back(0, 0, at(1));
        q.push_back(2, 0, at(2));
        q.push_back(0, 0, at(3));
        assert_eq!(q.first(), Some((0, at(1))));
        q.push_front(2, 0, at(9));
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
    fn lower_ranks_go_first_then_arrival_order() {
        let mut q = WaitingQueue::new();
        q.push_back(0, 2, at(1));
        q.push_back(0, 1, at(2));
        q.push_back(1, 0, at(3));
        q.push_back(0, 1, at(4));
        q.push_back(0, 0, at(5));
        // A preempted request leads its rank, not the ranks above it.
        q.push_front(0, 1, at(6));
        let mut order = Vec::new();
        while let Some((lane, head)) = q.first() {
            order.push(head.slot);
            q.pop_head(lane, |_| true);
        }
        assert_eq!(order, [3, 5, 6, 2, 4, 1]);
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn aborted_entries_are_skipped() {
        let dead = RefCell::new(HashSet::new());
        let live = |s: SlotRef| !dead.borrow().contains(&s.slot);
        let mut q = WaitingQueue::new();
        for slot in 1..=4 {
            q.push_back(0, 0, at(slot));
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
