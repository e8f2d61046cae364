//! Limits counted in this process: exact for one gateway replica. Every
//! worker thread shares one map of TATs behind a lock held for a few
//! hundred nanoseconds per request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::gcra::{self, Cell, Verdict};

/// Keys are pruned once the map holds this many, dropping the buckets
/// that are full again (a full bucket and no entry are the same).
const PRUNE_AT: usize = 4096;

pub struct LocalStore {
    epoch: Instant,
    tats: Mutex<HashMap<Arc<str>, f64>>,
}

impl Default for LocalStore {
    fn default() -> Self {
        Self {
            epoch: Instant::now(),
            tats: Mutex::new(HashMap::new()),
        }
    }
}

impl LocalStore {
    fn now(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64() * 1e3
    }

    /// Charge every key at once, or none.
    pub fn charge(&self, keys: &[Arc<str>], cells: &[Cell], costs: &[f64]) -> (bool, Vec<Verdict>) {
        let now = self.now();
        let mut tats = self.tats.lock();
        let current: Vec<Option<f64>> = keys.iter().map(|k| tats.get(k).copied()).collect();
        let (charged, verdicts) = gcra::charge(cells, &current, costs, now);
        let Some(new_tats) = charged else {
            return (false, verdicts);
        };
        if tats.len() >= PRUNE_AT {
            tats.retain(|_, tat| *tat > now);
        }
        for (key, tat) in keys.iter().zip(new_tats) {
            tats.insert(Arc::clone(key), tat);
        }
        (true, verdicts)
    }

    /// Add `deltas[i]` units to key `i` (negative: give them back).
    pub fn adjust(&self, keys: &[Arc<str>], cells: &[Cell], deltas: &[f64]) {
        let now = self.now();
        let mut tats = self.tats.lock();
        for ((key, cell), delta) in keys.iter().zip(cells).zip(deltas) {
            let tat = gcra::adjust(cell, tats.get(key).copied(), *delta, now);
            tats.insert(Arc::clone(key), tat);
        }
    }
}
