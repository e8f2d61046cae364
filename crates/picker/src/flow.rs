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

/// Whose a waiting request is: its tenant, a key of the tenant's own
/// choosing within it, and the tenant's weight. Tenants take turns by
/// weight; a tenant's keys take turns within the tenant's share, so no
/// number of keys gives a tenant more than its share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowKey {
    pub tenant: Arc<str>,
    pub key: Arc<str>,
    /// Dispatches in a row the tenant gets while others wait; at least 1.
    pub weight: u32,
}

impl FlowKey {
    /// One key, no tenant above it, weight 1: plain round-robin between
    /// such keys.
    pub fn plain(key: Arc<str>) -> Self {
        Self {
            tenant: key,
            key: Arc::from(""),
            weight: 1,
        }
    }
}

/// One waiting request, as the queue sees it.
#[derive(Debug)]
pub struct Entry<T> {
    pub id: u64,
    pub bytes: u64,
    pub item: T,
}

/// A tenant's waiting entries, by key.
#[derive(Debug)]
struct Tenant<T> {
    by_key: HashMap<Arc<str>, VecDeque<Entry<T>>>,
    /// Keys in the order they are served; the front key goes next.
    turn: VecDeque<Arc<str>>,
    weight: u32,
    /// Dispatched in the tenant's current turn.
    served: u32,
}

impl<T> Tenant<T> {
    fn new(weight: u32) -> Self {
        Self {
            by_key: HashMap::new(),
            turn: VecDeque::new(),
            weight: weight.max(1),
            served: 0,
        }
    }

    fn head(&self) -> Option<&Entry<T>> {
        self.by_key.get(self.turn.front()?)?.front()
    }

    /// Take the front key's first entry and give the turn to the next key.
    fn pop(&mut self) -> Option<Entry<T>> {
        let key = self.turn.pop_front()?;
        let entries = self.by_key.get_mut(&key)?;
        let entry = entries.pop_front()?;
        if entries.is_empty() {
            self.by_key.remove(&key);
        } else {
            self.turn.push_back(key);
        }
        Some(entry)
    }

    fn is_empty(&self) -> bool {
        self.turn.is_empty()
    }
}

#[derive(Debug)]
struct Band<T> {
    /// Waiting entries per tenant; a tenant is present only while it has
    /// entries.
    tenants: HashMap<Arc<str>, Tenant<T>>,
    /// Tenants in the order they are served; the front tenant goes next.
    turn: VecDeque<Arc<str>>,
    len: usize,
    bytes: u64,
}

impl<T> Default for Band<T> {
    fn default() -> Self {
        Self {
            tenants: HashMap::new(),
            turn: VecDeque::new(),
            len: 0,
            bytes: 0,
        }
    }
}

impl<T> Band<T> {
    fn head(&self) -> Option<&Entry<T>> {
        self.tenants.get(self.turn.front()?)?.head()
    }

    /// Take the head entry. The front tenant keeps the turn until it has
    /// had `weight` dispatches (or has nothing left), then the next
    /// tenant's turn begins.
    fn pop(&mut self) -> Option<Entry<T>> {
        let name = self.turn.front()?;
        let tenant = self.tenants.get_mut(name)?;
        let entry = tenant.pop()?;
        tenant.served += 1;
        if tenant.is_empty() {
            let name = self.turn.pop_front()?;
            self.tenants.remove(&name);
        } else if tenant.served >= tenant.weight {
            tenant.served = 0;
            self.turn.rotate_left(1);
        }
        self.len -= 1;
        self.bytes -= entry.bytes;
        Some(entry)
    }
}

/// The waiting requests of one pool, by band, tenant and key.
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

    /// Add an entry; returns its id. A tenant's weight is the one its
    /// latest entry came with.
    pub fn push(&mut self, band: Priority, flow: &FlowKey, bytes: u64, item: T) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let b = &mut self.bands[band as usize];
        let tenant = b
            .tenants
            .entry(Arc::clone(&flow.tenant))
            .or_insert_with(|| {
                b.turn.push_back(Arc::clone(&flow.tenant));
                Tenant::new(flow.weight)
            });
        tenant.weight = flow.weight.max(1);
        let entries = tenant.by_key.entry(Arc::clone(&flow.key)).or_default();
        if entries.is_empty() {
            tenant.turn.push_back(Arc::clone(&flow.key));
        }
        entries.push_back(Entry { id, bytes, item });
        b.len += 1;
        b.bytes += bytes;
        id
    }

    /// The entry that goes next, if any.
    pub fn head(&self) -> Option<(Priority, &Entry<T>)> {
        Priority::ALL
            .into_iter()
            .find_map(|p| self.bands[p as usize].head().map(|e| (p, e)))
    }

    /// Take the head entry and pass the turn on.
    pub fn pop_head(&mut self) -> Option<Entry<T>> {
        let band = Priority::ALL
            .into_iter()
            .find(|p| self.bands[*p as usize].len > 0)?;
        self.bands[band as usize].pop()
    }

    /// Remove an entry wherever it is (it expired or its client left).
    pub fn remove(&mut self, band: Priority, flow: &FlowKey, id: u64) -> Option<Entry<T>> {
        let b = &mut self.bands[band as usize];
        let tenant = b.tenants.get_mut(&flow.tenant)?;
        let entries = tenant.by_key.get_mut(&flow.key)?;
        let pos = entries.iter().position(|e| e.id == id)?;
        let entry = entries.remove(pos)?;
        if entries.is_empty() {
            tenant.by_key.remove(&flow.key);
            tenant.turn.retain(|k| *k != flow.key);
        }
        if tenant.is_empty() {
            b.tenants.remove(&flow.tenant);
            b.turn.retain(|t| *t != flow.tenant);
        }
        b.len -= 1;
        b.bytes -= entry.bytes;
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> FlowKey {
        FlowKey::plain(Arc::from(s))
    }

    fn of(tenant: &str, sub: &str, weight: u32) -> FlowKey {
        FlowKey {
            tenant: Arc::from(tenant),
            key: Arc::from(sub),
            weight,
        }
    }

    fn drain(q: &mut Queue<&'static str>) -> Vec<&'static str> {
        std::iter::from_fn(|| q.pop_head().map(|e| e.item)).collect()
    }

    #[test]
    fn strict_priority_between_bands() {
        let mut q = Queue::default();
        q.push(Priority::Sheddable, &key(""), 1, "shed");
        q.push(Priority::Standard, &key(""), 1, "std");
        q.push(Priority::Critical, &key(""), 1, "crit");
        assert_eq!(drain(&mut q), ["crit", "std", "shed"]);
    }

    #[test]
    fn round_robin_between_keys_fifo_within() {
        let mut q = Queue::default();
        for item in ["a1", "a2", "a3", "a4"] {
            q.push(Priority::Standard, &key("a"), 1, item);
        }
        q.push(Priority::Standard, &key("b"), 1, "b1");
        q.push(Priority::Standard, &key("b"), 1, "b2");
        assert_eq!(drain(&mut q), ["a1", "b1", "a2", "b2", "a3", "a4"]);
    }

    #[test]
    fn a_tenants_keys_share_its_turns() {
        let mut q = Queue::default();
        // Tenant a spreads its requests over three keys, b uses one: a
        // still gets one turn in two, and its keys take turns within it.
        for (sub, item) in [("x", "ax1"), ("x", "ax2"), ("y", "ay1"), ("z", "az1")] {
            q.push(Priority::Standard, &of("a", sub, 1), 1, item);
        }
        for item in ["b1", "b2", "b3"] {
            q.push(Priority::Standard, &of("b", "x", 1), 1, item);
        }
        assert_eq!(
            drain(&mut q),
            ["ax1", "b1", "ay1", "b2", "az1", "b3", "ax2"]
        );
    }

    #[test]
    fn weights_give_tenants_turns_in_proportion() {
        let mut q = Queue::default();
        for item in ["a1", "a2", "a3", "a4", "a5", "a6", "a7"] {
            q.push(Priority::Standard, &of("a", "", 3), 1, item);
        }
        for item in ["b1", "b2", "b3"] {
            q.push(Priority::Standard, &of("b", "", 1), 1, item);
        }
        assert_eq!(
            drain(&mut q),
            ["a1", "a2", "a3", "b1", "a4", "a5", "a6", "b2", "a7", "b3"]
        );
    }

    #[test]
    fn a_tenant_that_leaves_and_comes_back_starts_a_fresh_turn() {
        let mut q = Queue::default();
        let a = q.push(Priority::Standard, &of("a", "", 2), 1, "a1");
        q.push(Priority::Standard, &of("b", "", 1), 1, "b1");
        q.push(Priority::Standard, &of("b", "", 1), 1, "b2");
        assert_eq!(
            q.remove(Priority::Standard, &of("a", "", 2), a)
                .unwrap()
                .item,
            "a1"
        );
        q.push(Priority::Standard, &of("a", "", 2), 1, "a2");
        q.push(Priority::Standard, &of("a", "", 2), 1, "a3");
        assert_eq!(drain(&mut q), ["b1", "a2", "a3", "b2"]);
    }

    #[test]
    fn counts_and_bytes_follow_push_pop_remove() {
        let mut q = Queue::default();
        let a = q.push(Priority::Standard, &key("a"), 100, "a");
        q.push(Priority::Standard, &key("b"), 10, "b");
        q.push(Priority::Critical, &key("c"), 1, "c");
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
        let a = q.push(Priority::Standard, &key("a"), 1, "a1");
        q.push(Priority::Standard, &key("b"), 1, "b1");
        q.remove(Priority::Standard, &key("a"), a);
        q.push(Priority::Standard, &key("a"), 1, "a2");
        assert_eq!(drain(&mut q), ["b1", "a2"]);
    }

    #[test]
    fn empty_until_pushed_and_again_once_drained() {
        let mut q = Queue::default();
        assert!(q.is_empty());
        q.push(Priority::Sheddable, &key("a"), 1, "a");
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
