//! A bounded map from a credential's SHA-256 to what checking it found, so
//! the expensive check (a signature, argon2) runs once per credential, not
//! once per request.
//!
//! Two generations of entries: lookups find an entry in either, inserts go
//! to the young one, and when the young one is full the old one is dropped
//! whole and the young one takes its place. Entries in use keep moving
//! back to the young generation; entries nobody asks for leave within two
//! fills. Every operation is O(1), and the map never holds more than
//! `capacity` entries. Values carry their own expiry where they have one.

use std::collections::HashMap;
use std::mem;

use parking_lot::Mutex;

pub type Digest = [u8; 32];

pub struct Bounded<V> {
    generations: Mutex<Generations<V>>,
    /// Entries per generation: half the capacity.
    half: usize,
}

struct Generations<V> {
    young: HashMap<Digest, V>,
    old: HashMap<Digest, V>,
}

impl<V: Clone> Bounded<V> {
    pub fn new(capacity: usize) -> Self {
        let half = (capacity / 2).max(1);
        Self {
            generations: Mutex::new(Generations {
                young: HashMap::new(),
                old: HashMap::new(),
            }),
            half,
        }
    }

    pub fn get(&self, key: &Digest) -> Option<V> {
        let mut g = self.generations.lock();
        if let Some(v) = g.young.get(key) {
            return Some(v.clone());
        }
        let v = g.old.remove(key)?;
        g.insert(*key, v.clone(), self.half);
        Some(v)
    }

    pub fn insert(&self, key: Digest, value: V) {
        self.generations.lock().insert(key, value, self.half);
    }

    pub fn remove(&self, key: &Digest) {
        let mut g = self.generations.lock();
        g.young.remove(key);
        g.old.remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let g = self.generations.lock();
        g.young.len() + g.old.len()
    }
}

impl<V> Generations<V> {
    fn insert(&mut self, key: Digest, value: V, half: usize) {
        if self.young.len() >= half && !self.young.contains_key(&key) {
            self.old = mem::take(&mut self.young);
        }
        self.old.remove(&key);
        self.young.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Digest {
        [n; 32]
    }

    #[test]
    fn holds_at_most_its_capacity_and_keeps_what_is_used() {
        let cache = Bounded::new(4);
        for n in 0..4 {
            cache.insert(key(n), n);
        }
        assert_eq!(cache.len(), 4);
        // 0 and 1 are old; asking for 0 brings it back young.
        assert_eq!(cache.get(&key(0)), Some(0));
        for n in 4..6 {
            cache.insert(key(n), n);
        }
        assert!(cache.len() <= 4);
        assert_eq!(cache.get(&key(1)), None, "not used: gone");
        for n in 0..100 {
            cache.insert(key(n), n);
            assert!(cache.len() <= 4);
        }
        cache.remove(&key(99));
        assert_eq!(cache.get(&key(99)), None);
        assert_eq!(cache.get(&key(98)), Some(98));
    }
}
