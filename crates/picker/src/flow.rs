//! Flow control's waiting room: the priority bands and the queue of one
//! pool when every replica is saturated. Strict priority between bands,
//! round-robin between fairness keys within a band, first come first
//! served within a key.
//!
//! A plain data structure, like the rest of the crate: the gateway's
//! dispatcher and waiting requests take turns on it under one lock, and the
//! virtual-time benchmark drives the same queue from its event loop, so the
//! two order waiting requests alike.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A request's priority band under saturation. The serde names are the
/// config names ([`Priority::as_str`]).
#[derive(
    Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Waits longest, is dispatched first, never dropped for lower bands.
    Critical,
    #[default]
    Standard,
    /// Refused at once when its pool is saturated.
    Sheddable,
}

impl Priority {
    /// Every band, most urgent first: the order the queue serves them.
    pub const ALL: [Priority; 3] = [Priority::Critical, Priority::Standard, Priority::Sheddable];

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Critical => "critical",
            Priority::Standard => "standard",
            Priority::Sheddable => "sheddable",
        }
    }

    /// A band by name: any case, surrounding blanks ignored.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
    }
}

/// One waiting request, as the queue sees it.
#[derive(Debug)]
pub struct Entry<T> {
    pub id: u64,
    pub bytes: u64,
    pub item: T,
}

#[derive(Debug)]
struct Band<T> {
    /// Waiting entries per fairness key; a key is present only while it has
    /// entries.
    by_key: HashMap<Arc<str>, VecDeque<Entry<T>>>,
    /// Keys in the order they are served; the front key goes next.
    turn: VecDeque<Arc<str>>,
    len: usize,
    bytes: u64,
}

impl<T> Default for Band<T> {
    fn default() -> Self {
        Self {
            by_key: HashMap::new(),
            turn: VecDeque::new(),
            len: 0,
            bytes: 0,
        }
    }
}

/// The waiting requests of one pool, by band and fairness key.
#[derive(Debug)]
pub struct Queue<T> {
    bands: [Band<T>; 3],
    next_id: u64,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Self {
            bands: Default::default(),
            next_id: 0,
        }
    }
}

impl<T> Queue<T> {
    pub fn len(&self, band: Priority) -> usize {
        self.bands[band as usize].len
    }

    pub fn bytes(&self, band: Priority) -> u64 {
        self.bands[band as usize].bytes
    }

    /// Whether no entry waits in any band.
    pub fn is_empty(&self) -> bool {
        self.bands.iter().all(|b| b.len == 0)
    }

    /// Add an entry; returns its id.
    pub fn push(&mut self, band: Priority, key: Arc<str>, bytes: u64, item: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let b = &mut self.bands[band as usize];
        let entries = b.by_key.entry(Arc::clone(&key)).or_default();
        if entries.is_empty() {
            b.turn.push_back(key);
        }
        entries.push_back(Entry { id, bytes, item });
        b.len += 1;
        b.bytes += bytes;
        id
    }

    /// The entry that goes next, if any.
    pub fn head(&self) -> Option<(Priority, &Entry<T>)> {
        Priority::ALL.into_iter().find_map(|p| {
            let b = &self.bands[p as usize];
            let key = b.turn.front()?;
            b.by_key.get(key)?.front().map(|e| (p, e))
        })
    }

    /// Take the head entry and give its key's turn to the next key.
    pub fn pop_head(&mut self) -> Option<Entry<T>> {
        let band = Priority::ALL
            .into_iter()
            .find(|p| self.bands[*p as usize].len > 0)?;
        let b = &mut self.bands[band as usize];
        let key = b.turn.pop_front()?;
        let entries = b.by_key.get_mut(&key)?;
        let entry = entries.pop_front()?;
        if entries.is_empty() {
            b.by_key.remove(&key);
        } else {
            b.turn.push_back(key);
        }
        b.len -= 1;
        b.bytes -= entry.bytes;
        Some(entry)
    }

    /// Remove an entry wherever it is (it expired or its client left).
    pub fn remove(&mut self, band: Priority, key: &Arc<str>, id: u64) -> Option<Entry<T>> {
        let b = &mut self.bands[band as usize];
        let entries = b.by_key.get_mut(key)?;
        let pos = entries.iter().position(|e| e.id == id)?;
        let entry = entries.remove(pos)?;
        if entries.is_empty() {
            b.by_key.remove(key);
            b.turn.retain(|k| k != key);
        }
        b.len -= 1;
        b.bytes -= entry.bytes;
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    fn drain(q: &mut Queue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| q.pop_head().map(|e| e.item)).collect()
    }

    #[test]
    fn strict_priority_between_bands() {
        let mut q = Queue::default();
        q.push(Priority::Sheddable, key(""), 1, "shed");
        q.push(Priority::Standard, key(""), 1, "std");
        q.push(Priority::Critical, key(""), 1, "crit");
        assert_eq!(drain(&mut q), ["crit", "std", "shed"]);
    }

    #[test]
    fn round_robin_between_keys_fifo_within() {
        let mut q = Queue::default();
        for item in ["a1", "a2", "a3", "a4"] {
            q.push(Priority::Standard, key("a"), 1, item);
        }
        q.push(Priority::Standard, key("b"), 1, "b1");
        q.push(Priority::Standard, key("b"), 1, "b2");
        assert_eq!(drain(&mut q), ["a1", "b1", "a2", "b2", "a3", "a4"]);
    }

    #[test]
    fn counts_and_bytes_follow_push_pop_remove() {
        let mut q = Queue::default();
        let a = q.push(Priority::Standard, key("a"), 100, "a");
        q.push(Priority::Standard, key("b"), 10, "b");
        q.push(Priority::Critical, key("c"), 1, "c");
        assert_eq!(
            (q.len(Priority::Standard), q.bytes(Priority::Standard)),
            (2, 110)
        );
        assert_eq!(
            q.remove(Priority::Standard, &key("a"), a).unwrap().item,
            "a"
        );
        assert!(q.remove(Priority::Standard, &key("a"), a).is_none());
        assert_eq!(
            (q.len(Priority::Standard), q.bytes(Priority::Standard)),
            (1, 10)
        );
        assert_eq!(q.head().unwrap().1.item, "c");
        assert_eq!(drain(&mut q), ["c", "b"]);
        assert!(q.head().is_none());
        assert_eq!(
            (q.len(Priority::Standard), q.bytes(Priority::Standard)),
            (0, 0)
        );
    }

    #[test]
    fn removed_key_loses_its_turn() {
        let mut q = Queue::default();
        let a = q.push(Priority::Standard, key("a"), 1, "a1");
        q.push(Priority::Standard, key("b"), 1, "b1");
        q.remove(Priority::Standard, &key("a"), a);
        q.push(Priority::Standard, key("a"), 1, "a2");
        assert_eq!(drain(&mut q), ["b1", "a2"]);
    }

    #[test]
    fn empty_until_pushed_and_again_once_drained() {
        let mut q = Queue::default();
        assert!(q.is_empty());
        q.push(Priority::Sheddable, key("a"), 1, "a");
        assert!(!q.is_empty());
        drain(&mut q);
        assert!(q.is_empty());
    }

    #[test]
    fn priority_names() {
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.as_str()), Some(p));
        }
        assert_eq!(Priority::parse(" Critical "), Some(Priority::Critical));
        assert_eq!(Priority::parse("urgent"), None);
        assert_eq!(Priority::default(), Priority::Standard);
    }
}
