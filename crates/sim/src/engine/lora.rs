//! LoRA adapters: which the server knows, which are resident in the
//! `max_loras` GPU slots, and which the running batch uses.
//!
//! Mirrors vLLM: a batch may use at most `max_loras` distinct adapters (the
//! scheduler skips waiting requests for another adapter while that many are
//! running); the worker keeps up to `max_loras` adapters resident and, when a
//! batch needs one that is not, evicts the least recently used adapter no
//! running request uses and loads the new one (a swap that costs time).

use std::collections::HashMap;

/// Index of a registered adapter; stable for the engine's lifetime.
pub(crate) type AdapterId = u32;

struct Adapter {
    name: String,
    /// Known to the server (listed, accepted in new requests).
    registered: bool,
    /// Root of this adapter's prefix-cache hash chains.
    hash_root: u64,
    /// Running requests that use it.
    running: u32,
}

pub(crate) struct LoraManager {
    max_loras: usize,
    adapters: Vec<Adapter>,
    by_name: HashMap<String, AdapterId>,
    /// Adapters with running requests (at most `max_loras`).
    in_use: Vec<AdapterId>,
    /// GPU slots: resident adapters and the step that last used each.
    resident: Vec<(AdapterId, u64)>,
    loads_total: u64,
}

impl LoraManager {
    pub(crate) fn new(max_loras: u32) -> Self {
        LoraManager {
            max_loras: max_loras as usize,
            adapters: Vec::new(),
            by_name: HashMap::new(),
            in_use: Vec::new(),
            resident: Vec::new(),
            loads_total: 0,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.max_loras > 0
    }

    /// Make an adapter known (idempotent). Returns its id.
    pub(crate) fn register(&mut self, name: &str, hash_root: u64) -> AdapterId {
        if let Some(&id) = self.by_name.get(name) {
            self.adapters[id as usize].registered = true;
            return id;
        }
        let id = self.adapters.len() as AdapterId;
        self.adapters.push(Adapter {
            name: name.to_owned(),
            registered: true,
            hash_root,
            running: 0,
        });
        self.by_name.insert(name.to_owned(), id);
        id
    }

    /// Forget an adapter for new requests. Requests already accepted keep
    /// it; its GPU slot is released at once when none of them is running.
    pub(crate) fn unregister(&mut self, name: &str) -> bool {
        let Some(&id) = self.by_name.get(name) else {
            return false;
        };
        let adapter = &mut self.adapters[id as usize];
        if !adapter.registered {
            return false;
        }
        adapter.registered = false;
        if adapter.running == 0 {
            self.resident.retain(|(a, _)| *a != id);
        }
        true
    }

    /// A registered adapter's id.
    pub(crate) fn lookup(&self, name: &str) -> Option<AdapterId> {
        self.by_name
            .get(name)
            .copied()
            .filter(|id| self.adapters[*id as usize].registered)
    }

    pub(crate) fn name(&self, id: AdapterId) -> &str {
        &self.adapters[id as usize].name
    }

    pub(crate) fn hash_root(&self, id: AdapterId) -> u64 {
        self.adapters[id as usize].hash_root
    }

    pub(crate) fn known(&self) -> Vec<String> {
        self.adapters
            .iter()
            .filter(|a| a.registered)
            .map(|a| a.name.clone())
            .collect()
    }

    /// Adapters used by running requests.
    pub(crate) fn in_use(&self) -> &[AdapterId] {
        &self.in_use
    }

    /// Every slot is taken by an adapter the batch uses: only requests for
    /// those adapters (or the base model) can join.
    pub(crate) fn slots_full(&self) -> bool {
        self.in_use.len() >= self.max_loras
    }

    pub(crate) fn can_admit(&self, id: AdapterId) -> bool {
        self.adapters[id as usize].running > 0 || !self.slots_full()
    }

    /// A request for `id` joins the batch at `step`. Returns true when the
    /// adapter had to be loaded into a slot (the step pays the swap).
    pub(crate) fn admit(&mut self, id: AdapterId, step: u64) -> bool {
        debug_assert!(self.can_admit(id));
        let adapter = &mut self.adapters[id as usize];
        adapter.running += 1;
        if adapter.running == 1 {
            self.in_use.push(id);
        }
        if let Some(slot) = self.resident.iter_mut().find(|(a, _)| *a == id) {
            slot.1 = step;
            return false;
        }
        if self.resident.len() >= self.max_loras {
            // Evict the least recently used adapter that nothing running uses;
            // one exists because fewer than max_loras adapters were in use.
            let victim = self
                .resident
                .iter()
                .enumerate()
                .filter(|(_, (a, _))| self.adapters[*a as usize].running == 0)
                .min_by_key(|(_, (_, last))| *last)
                .map(|(i, _)| i)
                .expect("an idle adapter slot to evict");
            self.resident.swap_remove(victim);
        }
        self.resident.push((id, step));
        self.loads_total += 1;
        true
    }

    /// A running request for `id` finished, was aborted or was preempted.
    pub(crate) fn release(&mut self, id: AdapterId) {
        let adapter = &mut self.adapters[id as usize];
        debug_assert!(adapter.running > 0);
        adapter.running -= 1;
        if adapter.running == 0 {
            self.in_use.retain(|a| *a != id);
            if !adapter.registered {
                self.resident.retain(|(a, _)| *a != id);
            }
        }
    }

    /// Record that the batch of `step` used every in-use adapter (LRU clock).
    pub(crate) fn touch_in_use(&mut self, step: u64) {
        for (id, last) in &mut self.resident {
            if self.adapters[*id as usize].running > 0 {
                *last = step;
            }
        }
    }

    /// Adapters currently in GPU slots.
    pub(crate) fn resident(&self) -> impl Iterator<Item = AdapterId> + '_ {
        self.resident.iter().map(|(id, _)| *id)
    }

    pub(crate) fn loads_total(&self) -> u64 {
        self.loads_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_limit_distinct_running_adapters() {
        let mut lora = LoraManager::new(2);
        let a = lora.register("a", 1);
        let b = lora.register("b", 2);
        let c = lora.register("c", 3);
        assert!(lora.admit(a, 1), "first use loads");
        assert!(!lora.admit(a, 1), "second request shares the slot");
        assert!(lora.admit(b, 1));
        assert!(lora.slots_full());
        assert!(!lora.can_admit(c));
        assert!(lora.can_admit(a));
        lora.release(b);
        assert!(lora.can_admit(c));
        assert!(lora.admit(c, 2), "c evicts idle b");
        assert!(lora.resident().all(|id| id != b));
        assert_eq!(lora.loads_total(), 3);
    }

    #[test]
    fn eviction_picks_the_least_recently_used_idle_adapter() {
        let mut lora = LoraManager::new(2);
        let a = lora.register("a", 1);
        let b = lora.register("b", 2);
        let c = lora.register("c", 3);
        lora.admit(a, 1);
        lora.admit(b, 2);
        lora.touch_in_use(5);
        lora.release(b); // b last used at 5
        lora.touch_in_use(6);
        lora.release(a); // a last used at 6
        lora.admit(c, 7);
        let resident: Vec<_> = lora.resident().collect();
        assert!(
            resident.contains(&a) && resident.contains(&c),
            "{resident:?}"
        );
    }

    #[test]
    fn unregister_hides_the_adapter_from_new_requests() {
        let mut lora = LoraManager::new(1);
        let a = lora.register("a", 1);
        lora.admit(a, 1);
        assert!(lora.unregister("a"));
        assert!(!lora.unregister("a"));
        assert_eq!(lora.lookup("a"), None);
        assert!(lora.known().is_empty());
        assert_eq!(
            lora.resident().count(),
            1,
            "still used by a running request"
        );
        lora.release(a);
        assert_eq!(lora.resident().count(), 0);
        assert_eq!(lora.register("a", 1), a, "re-registering keeps the id");
    }
}
