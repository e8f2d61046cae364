//! Recency order of the blocks one replica holds: a doubly linked list in a
//! slab, so touching, inserting and evicting are O(1) and, once the slab
//! has grown to the replica's capacity, allocation-free. Written by hand
//! because it sits on the request path and needs stable node ids that the
//! index can store.

/// Marks "no node" in links.
const NIL: u32 = u32::MAX;

/// Identifies a node for as long as its block stays in the list.
pub(super) type NodeId = u32;

#[derive(Debug, Clone, Copy)]
struct Node {
    hash: u64,
    /// Towards the most recent end.
    newer: u32,
    /// Towards the least recent end.
    older: u32,
}

#[derive(Debug, Clone)]
pub(super) struct LruList {
    nodes: Vec<Node>,
    newest: u32,
    oldest: u32,
    /// Head of the free-node list, linked through `older`.
    free: u32,
    len: usize,
}

impl Default for LruList {
    fn default() -> Self {
        LruList {
            nodes: Vec::new(),
            newest: NIL,
            oldest: NIL,
            free: NIL,
            len: 0,
        }
    }
}

impl LruList {
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Insert `hash` as the most recent entry.
    pub(super) fn push_newest(&mut self, hash: u64) -> NodeId {
        let node = Node {
            hash,
            newer: NIL,
            older: self.newest,
        };
        let id = if self.free == NIL {
            let id =
                u32::try_from(self.nodes.len()).expect("more than u32::MAX blocks per replica");
            self.nodes.push(node);
            id
        } else {
            let id = self.free;
            self.free = self.nodes[id as usize].older;
            self.nodes[id as usize] = node;
            id
        };
        if self.newest != NIL {
            self.nodes[self.newest as usize].newer = id;
        } else {
            self.oldest = id;
        }
        self.newest = id;
        self.len += 1;
        id
    }

    /// Make `id` the most recent entry.
    pub(super) fn touch(&mut self, id: NodeId) {
        if self.newest == id {
            return;
        }
        self.unlink(id);
        let node = &mut self.nodes[id as usize];
        node.newer = NIL;
        node.older = self.newest;
        self.nodes[self.newest as usize].newer = id;
        self.newest = id;
    }

    /// Remove and return the least recent hash.
    pub(super) fn pop_oldest(&mut self) -> Option<u64> {
        if self.oldest == NIL {
            return None;
        }
        let id = self.oldest;
        let hash = self.nodes[id as usize].hash;
        self.unlink(id);
        self.nodes[id as usize].older = self.free;
        self.free = id;
        self.len -= 1;
        Some(hash)
    }

    /// Hashes from most to least recent.
    pub(super) fn iter_newest_first(&self) -> impl Iterator<Item = u64> + '_ {
        let mut id = self.newest;
        std::iter::from_fn(move || {
            if id == NIL {
                return None;
            }
            let node = &self.nodes[id as usize];
            id = node.older;
            Some(node.hash)
        })
    }

    /// Detach `id` from its neighbours (it stays allocated).
    fn unlink(&mut self, id: NodeId) {
        let Node { newer, older, .. } = self.nodes[id as usize];
        if newer != NIL {
            self.nodes[newer as usize].older = older;
        } else {
            self.newest = older;
        }
        if older != NIL {
            self.nodes[older as usize].newer = newer;
        } else {
            self.oldest = newer;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn order(list: &LruList) -> Vec<u64> {
        list.iter_newest_first().collect()
    }

    #[test]
    fn push_touch_pop_keep_recency_order() {
        let mut list = LruList::default();
        let a = list.push_newest(1);
        list.push_newest(2);
        let c = list.push_newest(3);
        assert_eq!(order(&list), [3, 2, 1]);
        list.touch(a);
        assert_eq!(order(&list), [1, 3, 2]);
        list.touch(a);
        assert_eq!(order(&list), [1, 3, 2]);
        assert_eq!(list.pop_oldest(), Some(2));
        list.touch(c);
        assert_eq!(order(&list), [3, 1]);
        assert_eq!(list.len(), 2);
        assert_eq!(list.pop_oldest(), Some(1));
        assert_eq!(list.pop_oldest(), Some(3));
        assert_eq!(list.pop_oldest(), None);
        assert_eq!(list.len(), 0);
    }

    #[test]
    fn freed_nodes_are_reused() {
        let mut list = LruList::default();
        for h in 0..4 {
            list.push_newest(h);
        }
        for _ in 0..4 {
            list.pop_oldest();
        }
        for h in 10..14 {
            assert!(list.push_newest(h) < 4, "reuses a freed slot");
        }
        assert_eq!(list.nodes.len(), 4);
        assert_eq!(order(&list), [13, 12, 11, 10]);
    }
}
