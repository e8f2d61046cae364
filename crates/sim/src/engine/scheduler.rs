//! The engine: vLLM V1's scheduling loop as a discrete-event state machine.
//!
//! One step at a time is in flight. When it completes, its requests advance
//! (a prefill chunk is stored, or a token is sampled) and the next step is
//! formed at once, as vLLM's busy loop does:
//!
//! 1. Running requests, oldest first, each get their next tokens (one for a
//!    decode, the rest of the prompt up to the budget for a chunked prefill)
//!    within `max_num_batched_tokens`. A request that needs a KV block when
//!    none is free preempts the newest running request (its blocks are freed
//!    and it goes back to the front of the waiting queue, to be recomputed),
//!    repeatedly, down to preempting itself.
//! 2. If nothing was preempted, waiting requests are admitted first come,
//!    first served while the budget, `max_num_seqs`, KV blocks and LoRA slots
//!    allow. Each takes its longest cached prefix from the prefix cache and
//!    prefills the rest, chunked to the remaining budget. The first request
//!    that does not fit in KV memory stops admission (head-of-line), while a
//!    request blocked only by LoRA slots is passed over.
//!
//! Under priority scheduling (vLLM's `--scheduling-policy priority`), both
//! queues are ordered by (priority, arrival) instead: running requests are
//! kept in that order, so step 1 serves the best first and preempts the
//! worst; the waiting queue is led by the best priority; and before a step
//! is formed, a waiting head that does not fit in free KV memory preempts
//! running requests of a worse priority, worst first, until it fits
//! (vLLM's priority preemption).
//!
//! The step's duration comes from the roofline model ([`super::timing`]).

use std::collections::HashMap;

use super::config::{EngineConfig, SchedulingPolicy};
use super::interface::{
    EngineCounters, EngineEvent, EngineStats, FinishReason, KvCacheEvent, SimRequest,
};
use super::kv_cache::{BlockHasher, KvCache};
use super::kv_transfer::KvLink;
use super::lora::LoraManager;
use super::request::{Phase, RequestTable};
use super::timing::{Roofline, StepLoad};
use super::waiting::{SlotRef, WaitingQueue};

/// A request's rank in the waiting queue: its priority under priority
/// scheduling, else the same for every request.
fn rank(policy: SchedulingPolicy, priority: i64) -> i64 {
    match policy {
        SchedulingPolicy::Fcfs => 0,
        SchedulingPolicy::Priority => priority,
    }
}

/// The step in flight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepInfo {
    /// When it completes.
    pub end: f64,
    /// Requests it advances.
    pub sequences: u32,
    /// Tokens it computes (at most `max_num_batched_tokens`).
    pub tokens: u32,
}

/// One request's share of the step in flight.
#[derive(Clone, Copy, Debug)]
struct Scheduled {
    at: SlotRef,
    new_tokens: u32,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    prefix_cache_queries: u64,
    prefix_cache_hits: u64,
    prompt_tokens: u64,
    generation_tokens: u64,
    preemptions: u64,
    finished: u64,
    aborted: u64,
    rejected: u64,
    steps: u64,
}

/// A simulated vLLM engine. See the module documentation for the model.
pub struct Engine {
    cfg: EngineConfig,
    roofline: Roofline,
    kv: KvCache,
    lora: LoraManager,
    waiting: WaitingQueue,
    requests: RequestTable,
    by_id: HashMap<u64, u32>,
    /// Running requests in admission order, or by (priority, arrival) under
    /// priority scheduling (the last is preempted first).
    running: Vec<u32>,
    /// End time of the step in flight.
    step_end: Option<f64>,
    /// An idle engine received work: the next step starts at this time, at
    /// the next `advance`, so every request that arrives at the same instant
    /// joins it (vLLM drains its input queue before scheduling).
    start_at: Option<f64>,
    /// Work of the step in flight (reused between steps).
    batch: Vec<Scheduled>,
    /// Tokens computed by the step in flight.
    batch_tokens: u32,
    /// Events produced outside `advance` (rejections, aborts, and steps that
    /// completed while catching up in `submit`/`abort`).
    pending: Vec<EngineEvent>,
    /// Latest time the engine has been told about.
    clock: f64,
    token_events: bool,
    next_serial: u64,
    hasher: BlockHasher,
    /// Scratch for prefix-cache lookups.
    hits: Vec<u32>,
    counters: Counters,
    /// Requests whose prompt KV is in transit, by the time it lands
    /// (ascending); entries of aborted requests go stale.
    arriving: Vec<(f64, SlotRef)>,
    /// KV blocks of finished requests held for a remote decode, by id.
    held: HashMap<u64, Vec<u32>>,
}

impl Engine {
    /// An idle engine. Call [`EngineConfig::validate`] first: out-of-range
    /// values are clamped here rather than refused.
    pub fn new(mut cfg: EngineConfig) -> Self {
        cfg.max_num_seqs = cfg.max_num_seqs.max(1);
        cfg.max_num_batched_tokens = cfg.max_num_batched_tokens.max(1);
        cfg.block_size = cfg.block_size.max(1);
        if !(cfg.slowdown.is_finite() && cfg.slowdown > 0.0) {
            cfg.slowdown = 1.0;
        }
        let num_blocks = u32::try_from(cfg.num_gpu_blocks()).unwrap_or(u32::MAX - 1);
        Engine {
            roofline: Roofline::new(&cfg),
            kv: KvCache::new(num_blocks, cfg.block_size, cfg.enable_prefix_caching),
            lora: LoraManager::new(cfg.max_loras),
            waiting: WaitingQueue::new(),
            requests: RequestTable::new(),
            by_id: HashMap::new(),
            running: Vec::new(),
            step_end: None,
            start_at: None,
            batch: Vec::new(),
            batch_tokens: 0,
            pending: Vec::new(),
            clock: f64::NEG_INFINITY,
            token_events: true,
            next_serial: 0,
            hasher: BlockHasher::new(),
            hits: Vec::new(),
            counters: Counters::default(),
            arriving: Vec::new(),
            held: HashMap::new(),
            cfg,
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The step-time model this engine uses.
    pub fn roofline(&self) -> &Roofline {
        &self.roofline
    }

    /// Emit [`EngineEvent::Token`] for every output token after the first
    /// (default), or only first tokens and completions — the fleet
    /// benchmark's choice, since per-token events dominate its cost.
    pub fn set_token_events(&mut self, enabled: bool) {
        self.token_events = enabled;
    }

    /// Record what enters and leaves the prefix cache, for
    /// [`Engine::drain_kv_events`] (off by default: it costs a copy of every
    /// cached block's tokens). Turning it off drops what was recorded.
    pub fn set_kv_events(&mut self, enabled: bool) {
        self.kv.set_logging(enabled);
    }

    /// Move the prefix-cache changes recorded since the last call to `out`,
    /// in the order they happened.
    pub fn drain_kv_events(&mut self, out: &mut Vec<KvCacheEvent>) {
        self.kv.drain_log(out);
    }

    /// The chained hashes of every block in the prefix cache, sorted: what
    /// the KV events describe.
    pub fn cached_block_hashes(&self) -> Vec<u64> {
        self.kv.cached_hashes()
    }

    /// The chained hashes of `prompt`'s full blocks, as an engine of
    /// `block_size` hashes them for a request with `adapter`. They are the
    /// same on every engine of that block size (an adapter's chain starts
    /// from its name), so a caller asking many engines hashes once.
    pub fn prompt_block_hashes(prompt: &[u32], adapter: Option<&str>, block_size: u32) -> Vec<u64> {
        let mut hasher = BlockHasher::new();
        let mut parent = BlockHasher::root(adapter);
        prompt
            .chunks_exact(block_size.max(1) as usize)
            .map(|block| {
                parent = hasher.hash(parent, block.iter().copied());
                parent
            })
            .collect()
    }

    /// How many leading blocks of `hashes` (from
    /// [`Engine::prompt_block_hashes`]) the prefix cache holds now: what its
    /// KV events say it holds of that prompt, and what a request with it
    /// would find (less the last block when the prompt ends on a block
    /// boundary, since the last token is always computed). Changes nothing.
    pub fn cached_prefix_blocks(&self, hashes: &[u64]) -> usize {
        self.kv.cached_prefix_len(hashes)
    }

    /// Accept a request arriving at `now`. Problems (too long, unknown
    /// adapter, duplicate id) produce [`EngineEvent::Rejected`] at the next
    /// [`Engine::advance`]. An idle engine starts a step at `now`; the step
    /// is formed at the next `advance`, so requests arriving at the same
    /// instant share it.
    pub fn submit(&mut self, now: f64, req: SimRequest) {
        let now = self.catch_up(now);
        if !self.accept(now, &req) {
            return;
        }
        let slot = self.insert_request(req);
        self.enqueue(now, slot);
    }

    /// Accept a request whose prompt was computed by a prefill replica: the
    /// prompt blocks this engine's prefix cache lacks cross `link` (vLLM's
    /// NIXL pull, SGLang's transfer), then the request waits for a slot like
    /// any other, and at admission computes only the last prompt token.
    /// The blocks being written are not reserved during the transfer (vLLM
    /// allocates them first), so a full engine admits the request later
    /// instead of holding memory for it.
    pub fn submit_with_remote_kv(&mut self, now: f64, req: SimRequest, link: KvLink) {
        let now = self.catch_up(now);
        if !self.accept(now, &req) {
            return;
        }
        let slot = self.insert_request(req);
        let transferred = {
            let r = self.requests.get(slot);
            r.prompt_len() - self.local_prefix_tokens(r)
        };
        let at = now + link.transfer_seconds(transferred, self.cfg.model.kv_bytes_per_token());
        let r = self.requests.get_mut(slot);
        r.phase = Phase::Arriving;
        r.remote_kv = true;
        let entry = (at, self.requests.slot_ref(slot));
        let index = self.arriving.partition_point(|(t, _)| *t <= at);
        self.arriving.insert(index, entry);
    }

    /// Accept a request whose KV a remote decode will pull (a prefill
    /// replica's): when it finishes, its blocks stay in use until
    /// [`Engine::release_held`], as vLLM's prefill holds them for the
    /// decode's read.
    pub fn submit_holding_kv(&mut self, now: f64, req: SimRequest) {
        let id = req.id;
        self.submit(now, req);
        if let Some(&slot) = self.by_id.get(&id) {
            self.requests.get_mut(slot).hold_kv = true;
        }
    }

    /// The KV a finished request held for a remote decode is free: pulled,
    /// or its hold expired. Unknown ids are ignored.
    pub fn release_held(&mut self, now: f64, id: u64) {
        self.catch_up(now);
        if let Some(mut blocks) = self.held.remove(&id) {
            self.kv.free(&mut blocks);
        }
    }

    /// Prompt tokens of `r` the prefix cache holds now (never the last).
    fn local_prefix_tokens(&self, r: &super::request::Request) -> u32 {
        let block_size = self.cfg.block_size;
        let max_hit_blocks = ((r.prompt_len().max(1) - 1) / block_size) as usize;
        let hashes = &r.block_hashes[..max_hit_blocks.min(r.block_hashes.len())];
        self.kv.cached_prefix_len(hashes) as u32 * block_size
    }

    /// `false` (and a rejection event) when `req` cannot be taken.
    fn accept(&mut self, now: f64, req: &SimRequest) -> bool {
        if let Err(reason) = self.admissible(req) {
            self.counters.rejected += 1;
            self.pending.push(EngineEvent::Rejected {
                id: req.id,
                at: now,
                reason,
            });
            return false;
        }
        true
    }

    /// A table slot for an accepted request, hashed for the prefix cache.
    fn insert_request(&mut self, req: SimRequest) -> u32 {
        let adapter = req
            .adapter
            .as_deref()
            .and_then(|name| self.lora.lookup(name));
        let hash_root = match adapter {
            Some(a) => self.lora.hash_root(a),
            None => BlockHasher::root(None),
        };
        let slot = self.requests.insert();
        let r = self.requests.get_mut(slot);
        r.id = req.id;
        r.serial = self.next_serial;
        r.phase = Phase::Waiting;
        r.prompt = req.prompt;
        r.max_tokens = req.max_tokens;
        r.output_len = 0;
        r.num_computed = 0;
        r.cached_tokens = None;
        r.adapter = adapter;
        r.priority = req.priority;
        r.hash_root = hash_root;
        r.registered_blocks = 0;
        r.remote_kv = false;
        r.hold_kv = false;
        if self.cfg.enable_prefix_caching {
            let prompt_len = r.prompt_len();
            r.hash_blocks(&mut self.hasher, self.cfg.block_size, prompt_len);
        }
        self.next_serial += 1;
        self.by_id.insert(req.id, slot);
        slot
    }

    /// Put a waiting request in the queue at `now`; an idle engine starts a
    /// step then.
    fn enqueue(&mut self, now: f64, slot: u32) {
        let r = self.requests.get(slot);
        let lane = r.lane();
        let rank = rank(self.cfg.scheduling_policy, r.priority);
        self.waiting
            .push_back(lane, rank, self.requests.slot_ref(slot));
        if self.step_end.is_none() && self.start_at.is_none() {
            self.start_at = Some(now);
        }
    }

    /// Move every request whose KV has landed by `until` to the waiting
    /// queue, but none past the step in flight or the step about to start,
    /// so an arrival never joins a step that began before it.
    fn deliver_arrivals(&mut self, until: f64) {
        while let Some(&(at, slot_ref)) = self.arriving.first() {
            let bound = self
                .step_end
                .or(self.start_at)
                .map_or(until, |t| t.min(until));
            if at > bound {
                break;
            }
            self.arriving.remove(0);
            if self.requests.is(slot_ref, Phase::Arriving) {
                self.requests.get_mut(slot_ref.slot).phase = Phase::Waiting;
                self.enqueue(at, slot_ref.slot);
            }
        }
    }

    /// Abort a request: its KV blocks are freed at once and
    /// `Finished { reason: Aborted }` is emitted at the next advance.
    /// Unknown or already finished ids are ignored.
    pub fn abort(&mut self, now: f64, id: u64) {
        let now = self.catch_up(now);
        let Some(slot) = self.by_id.remove(&id) else {
            return;
        };
        let r = self.requests.get_mut(slot);
        let phase = r.phase;
        let lane = r.lane();
        let adapter = r.adapter;
        self.pending.push(EngineEvent::Finished {
            id,
            at: now,
            prompt_tokens: r.prompt_len(),
            completion_tokens: r.output_len,
            cached_tokens: r.cached_tokens.unwrap_or(0),
            reason: FinishReason::Aborted,
        });
        self.kv.free(&mut r.blocks);
        self.requests.remove(slot);
        match phase {
            Phase::Waiting => {
                let requests = &self.requests;
                self.waiting
                    .forget(lane, |at| requests.is(at, Phase::Waiting));
            }
            Phase::Running => {
                self.running.retain(|&s| s != slot);
                if let Some(a) = adapter {
                    self.lora.release(a);
                }
            }
            // Its entry in `arriving` goes stale with the slot.
            Phase::Arriving => {}
            Phase::Free => unreachable!("a request in by_id is never free"),
        }
        self.counters.aborted += 1;
    }

    /// Make an adapter known to the server (like `--lora-modules` or the
    /// load endpoint). It becomes resident only when a request uses it.
    pub fn register_adapter(&mut self, name: &str) {
        self.lora.register(name, BlockHasher::root(Some(name)));
    }

    /// Forget an adapter for new requests; requests already accepted finish.
    pub fn unregister_adapter(&mut self, name: &str) -> bool {
        self.lora.unregister(name)
    }

    /// Registered adapters, in registration order.
    pub fn known_adapters(&self) -> Vec<String> {
        self.lora.known()
    }

    /// Step-time multiplier for steps started from now on (1.0 = normal).
    /// Non-positive or non-finite factors are ignored.
    pub fn set_slowdown(&mut self, factor: f64) {
        if factor.is_finite() && factor > 0.0 {
            self.cfg.slowdown = factor;
        }
    }

    /// When [`Engine::advance`] must next be called: the end of the step in
    /// flight, the start of a step for newly submitted work, or the time of
    /// an event already pending. `None` when idle.
    pub fn next_event_at(&self) -> Option<f64> {
        self.pending
            .iter()
            .map(EngineEvent::at)
            .chain(self.step_end)
            .chain(self.start_at)
            .chain(self.arriving.first().map(|&(at, _)| at))
            .reduce(f64::min)
    }

    /// Run every step that completes at or before `until`, starting the next
    /// one as soon as each ends, and append the events in time order.
    pub fn advance(&mut self, until: f64, out: &mut Vec<EngineEvent>) {
        out.append(&mut self.pending);
        self.run_until(until, out, true);
        self.clock = self.clock.max(until);
    }

    /// The step in flight, if any.
    pub fn current_step(&self) -> Option<StepInfo> {
        self.step_end.map(|end| StepInfo {
            end,
            sequences: self.batch.len() as u32,
            tokens: self.batch_tokens,
        })
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.counters;
        let names = |ids: &mut dyn Iterator<Item = u32>| -> Vec<String> {
            ids.map(|a| self.lora.name(a).to_owned()).collect()
        };
        let waiting_adapters = (1..self.waiting.lanes())
            .filter(|&lane| self.waiting.lane_len(lane) > 0)
            .map(|lane| self.lora.name((lane - 1) as u32).to_owned())
            .collect();
        EngineStats {
            waiting: self.waiting.len() as u64,
            running: self.running.len() as u64,
            kv_usage: self.kv.usage(),
            num_gpu_blocks: u64::from(self.kv.num_blocks()),
            block_size: self.cfg.block_size,
            running_adapters: names(&mut self.lora.in_use().iter().copied()),
            waiting_adapters,
            max_loras: self.cfg.max_loras,
            prefix_cache_queries: c.prefix_cache_queries,
            prefix_cache_hits: c.prefix_cache_hits,
            prompt_tokens_total: c.prompt_tokens,
            generation_tokens_total: c.generation_tokens,
            preemptions_total: c.preemptions,
            requests_finished_total: c.finished,
        }
    }

    /// Counters not in [`EngineStats`].
    pub fn counters(&self) -> EngineCounters {
        EngineCounters {
            requests_aborted_total: self.counters.aborted,
            requests_rejected_total: self.counters.rejected,
            lora_loads_total: self.lora.loads_total(),
            steps_total: self.counters.steps,
            resident_adapters: self
                .lora
                .resident()
                .map(|a| self.lora.name(a).to_owned())
                .collect(),
        }
    }

    /// Why `req` cannot be accepted, in the words vLLM uses where it has some.
    fn admissible(&self, req: &SimRequest) -> Result<(), String> {
        if self.by_id.contains_key(&req.id) {
            return Err(format!("request id {} is already in flight", req.id));
        }
        if req.prompt.is_empty() {
            return Err("the prompt is empty".to_owned());
        }
        if req.max_tokens == 0 {
            return Err("max_tokens must be at least 1".to_owned());
        }
        let total = req.prompt.len() as u64 + u64::from(req.max_tokens);
        if total > u64::from(self.cfg.max_model_len) {
            return Err(format!(
                "This model's maximum context length is {} tokens. However, you requested {} \
                 tokens ({} in the messages, {} in the completion). Please reduce the length of \
                 the messages or completion.",
                self.cfg.max_model_len,
                total,
                req.prompt.len(),
                req.max_tokens
            ));
        }
        // The last sampled token is never written to the cache.
        let blocks = (total - 1).div_ceil(u64::from(self.cfg.block_size));
        if blocks > u64::from(self.kv.num_blocks()) {
            return Err(format!(
                "the request needs {blocks} KV-cache blocks but the cache holds {}",
                self.kv.num_blocks()
            ));
        }
        if let Some(name) = &req.adapter {
            if !self.lora.enabled() {
                return Err(format!(
                    "LoRA adapter `{name}` requested but LoRA is not enabled (max_loras = 0)"
                ));
            }
            if self.lora.lookup(name).is_none() {
                return Err(format!("The model `{name}` does not exist."));
            }
        }
        Ok(())
    }

    /// Process everything up to `now` into `pending` so a new input sees the
    /// engine as it is at `now`. Time never goes backwards.
    fn catch_up(&mut self, now: f64) -> f64 {
        let now = now.max(self.clock);
        let mut pending = std::mem::take(&mut self.pending);
        self.run_until(now, &mut pending, false);
        self.pending = pending;
        self.clock = now;
        now
    }

    /// Complete every step that ends at or before `until`. A step due to
    /// start exactly at `until` is started only when `start_at_until` (in
    /// `advance`); `submit` and `abort` leave it pending so that more work
    /// arriving at the same instant still joins it.
    fn run_until(&mut self, until: f64, out: &mut Vec<EngineEvent>, start_at_until: bool) {
        loop {
            self.deliver_arrivals(until);
            if let Some(end) = self.step_end {
                if end > until {
                    break;
                }
                self.complete_step(end, out);
                self.step_end = None;
                self.start_at = Some(end);
                continue;
            }
            match self.start_at {
                Some(start) if start < until || (start_at_until && start == until) => {
                    self.start_at = None;
                    self.start_step(start);
                    if self.step_end.is_none() {
                        break; // nothing to do: idle
                    }
                }
                _ => break,
            }
        }
    }

    /// Form the next step at `start`; stay idle when there is no work.
    fn start_step(&mut self, start: f64) {
        let (load, lora_loads) = self.schedule();
        if self.batch.is_empty() {
            return;
        }
        self.counters.steps += 1;
        self.batch_tokens = load.tokens as u32;
        self.lora.touch_in_use(self.counters.steps);
        let gpu = self.roofline.step_seconds(&load);
        let swaps = f64::from(lora_loads) * self.cfg.lora_load_seconds;
        self.step_end = Some(start + (gpu + swaps) * self.cfg.slowdown);
    }

    /// Fill `self.batch` for the next step. Returns its load and how many
    /// adapters it must load.
    fn schedule(&mut self) -> (StepLoad, u32) {
        let (load, loads, preempted) = self.schedule_pass();
        if self.batch.is_empty() && preempted {
            // Every running request was preempted: the freed memory goes to
            // the waiting queue (led by the preempted) in a second pass.
            let (load, loads, _) = self.schedule_pass();
            return (load, loads);
        }
        (load, loads)
    }

    fn schedule_pass(&mut self) -> (StepLoad, u32, bool) {
        self.batch.clear();
        let mut load = StepLoad::default();
        let mut lora_loads = 0;
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut preempted = false;
        let block_size = self.cfg.block_size;
        let this_step = self.counters.steps + 1;

        // 0. Priority preemption: room for a better waiting head. It does
        // not stop admission below, since making room is its point.
        if self.cfg.scheduling_policy == SchedulingPolicy::Priority {
            self.preempt_for_waiting_head();
        }

        // 1. Running requests: decodes and unfinished chunked prefills.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let slot = self.running[i];
            let r = self.requests.get(slot);
            let computed = r.num_computed;
            let new = (r.num_tokens() - computed).min(budget);
            let scheduled = loop {
                let r = self.requests.get_mut(slot);
                if self.kv.grow(&mut r.blocks, computed + new) {
                    break true;
                }
                let victim = self.running.pop().expect("the request itself is running");
                self.preempt(victim);
                preempted = true;
                if victim == slot {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            self.register_blocks(slot, computed + new);
            let r = self.requests.get(slot);
            let samples = computed + new >= r.num_tokens();
            load.add_chunk(computed, new, samples, r.adapter.is_some());
            self.batch.push(Scheduled {
                at: self.requests.slot_ref(slot),
                new_tokens: new,
            });
            budget -= new;
            i += 1;
        }

        // 2. Waiting requests, first come first served.
        while !preempted && budget > 0 && self.running.len() < self.cfg.max_num_seqs as usize {
            let Some((lane, at)) = self.next_candidate() else {
                break;
            };
            let slot = at.slot;
            let r = self.requests.get_mut(slot);
            let num_tokens = r.num_tokens();
            if self.cfg.enable_prefix_caching {
                r.hash_blocks(&mut self.hasher, block_size, num_tokens);
            }
            // At least the last token is computed, to produce logits.
            let max_hit_blocks = ((num_tokens - 1) / block_size) as usize;
            let lookup = &r.block_hashes[..max_hit_blocks.min(r.block_hashes.len())];
            let hit_blocks = self.kv.find_cached_prefix(lookup, &mut self.hits);
            let hit_tokens = hit_blocks as u32 * block_size;
            // A remote prefill delivered the rest of the prompt's KV.
            let computed = if r.remote_kv {
                num_tokens - 1
            } else {
                hit_tokens
            };
            let new = (num_tokens - computed).min(budget);
            if !self
                .kv
                .allocate_with_prefix(&mut r.blocks, &self.hits, computed + new)
            {
                break;
            }
            r.num_computed = computed;
            r.registered_blocks = hit_blocks as u32;
            // A preempted request recomputes its prompt here, as vLLM does.
            r.remote_kv = false;
            r.phase = Phase::Running;
            if r.cached_tokens.is_none() {
                r.cached_tokens = Some(hit_tokens);
                self.counters.prefix_cache_queries += u64::from(num_tokens);
                self.counters.prefix_cache_hits += u64::from(hit_tokens);
            }
            let adapter = r.adapter;
            let requests = &self.requests;
            self.waiting
                .pop_head(lane, |s| requests.is(s, Phase::Waiting));
            if let Some(a) = adapter
                && self.lora.admit(a, this_step)
            {
                lora_loads += 1;
            }
            self.add_running(slot);
            self.register_blocks(slot, computed + new);
            load.add_chunk(
                computed,
                new,
                computed + new >= num_tokens,
                adapter.is_some(),
            );
            self.batch.push(Scheduled {
                at,
                new_tokens: new,
            });
            budget -= new;
        }
        load.adapters = self.lora.in_use().len() as u32;
        (load, lora_loads, preempted)
    }

    /// Where a running request stands under priority scheduling: smaller
    /// is better, the last of `running` is the worst.
    fn running_key(&self, slot: u32) -> (i64, u64) {
        let r = self.requests.get(slot);
        (r.priority, r.serial)
    }

    /// Add an admitted request to `running`: at the end, or at its place
    /// by (priority, arrival) under priority scheduling.
    fn add_running(&mut self, slot: u32) {
        match self.cfg.scheduling_policy {
            SchedulingPolicy::Fcfs => self.running.push(slot),
            SchedulingPolicy::Priority => {
                let key = self.running_key(slot);
                let at = self.running.partition_point(|&s| self.running_key(s) < key);
                self.running.insert(at, slot);
            }
        }
    }

    /// Preempt running requests of a worse priority than the waiting head,
    /// worst first, while the head's first chunk does not fit in the free
    /// KV blocks (counting its cached prefix as found).
    fn preempt_for_waiting_head(&mut self) {
        let Some((_, head)) = self.next_candidate() else {
            return;
        };
        let r = self.requests.get(head.slot);
        let (priority, num_tokens) = (r.priority, r.num_tokens());
        let block_size = self.cfg.block_size;
        let max_hit_blocks = ((num_tokens - 1) / block_size) as usize;
        let hashes = &r.block_hashes[..max_hit_blocks.min(r.block_hashes.len())];
        let hit_blocks = self.kv.find_cached_prefix(hashes, &mut self.hits) as u32;
        let first_chunk = num_tokens.min(hit_blocks * block_size + self.cfg.max_num_batched_tokens);
        let needed = self.kv.blocks_for(first_chunk).saturating_sub(hit_blocks);
        while self.kv.num_free() < needed {
            let Some(&worst) = self.running.last() else {
                return;
            };
            if self.requests.get(worst).priority <= priority {
                return;
            }
            self.running.pop();
            self.preempt(worst);
        }
    }

    /// The waiting head among the requests allowed to run: when every LoRA slot
    /// is taken by a running adapter, only the base model and those adapters.
    fn next_candidate(&self) -> Option<(usize, SlotRef)> {
        if !(self.lora.enabled() && self.lora.slots_full()) {
            return self.waiting.first();
        }
        let lanes = std::iter::once(0).chain(self.lora.in_use().iter().map(|&a| a as usize + 1));
        lanes
            .filter_map(|lane| self.waiting.head(lane).map(|(order, at)| (order, lane, at)))
            .min_by_key(|&(order, _, _)| order)
            .map(|(_, lane, at)| (lane, at))
    }

    /// Preemption by recompute: free the request's blocks (they stay in the
    /// prefix cache until evicted) and put it at the front of the queue.
    fn preempt(&mut self, slot: u32) {
        let computed = self.requests.get(slot).num_computed;
        self.offer_blocks(slot, computed);
        let r = self.requests.get_mut(slot);
        self.kv.free(&mut r.blocks);
        r.num_computed = 0;
        r.registered_blocks = 0;
        r.phase = Phase::Waiting;
        let lane = r.lane();
        let rank = rank(self.cfg.scheduling_policy, r.priority);
        if let Some(a) = r.adapter {
            self.lora.release(a);
        }
        self.waiting
            .push_front(lane, rank, self.requests.slot_ref(slot));
        self.counters.preemptions += 1;
    }

    /// Offer the request's blocks that are full once `tokens` are computed to
    /// the prefix cache (vLLM does this when it schedules them, so requests
    /// admitted in the same step can already share them).
    ///
    /// Only blocks within the prompt are offered here. A block holding
    /// output tokens is unique to its request (the tokens are synthetic), so
    /// only that request can ever find it again, after a preemption: it is
    /// offered then (`preempt`), which has the same effect as offering it
    /// when it fills, without hashing and indexing every output block of
    /// every request that never needs them.
    fn register_blocks(&mut self, slot: u32, tokens: u32) {
        let prompt_len = self.requests.get(slot).prompt_len();
        self.offer_blocks(slot, tokens.min(prompt_len));
    }

    /// Offer every block that is full within the first `tokens` to the
    /// prefix cache, hashing them as needed.
    fn offer_blocks(&mut self, slot: u32, tokens: u32) {
        if !self.cfg.enable_prefix_caching {
            return;
        }
        let block_size = self.cfg.block_size;
        let r = self.requests.get_mut(slot);
        r.hash_blocks(&mut self.hasher, block_size, tokens);
        let full = tokens / block_size;
        let first = r.registered_blocks;
        let mut newly_cached = Vec::new();
        for k in first..full {
            let cached = self
                .kv
                .register(r.blocks[k as usize], r.block_hashes[k as usize]);
            if cached && self.kv.logging() {
                newly_cached.push(k);
            }
        }
        r.registered_blocks = r.registered_blocks.max(full);
        if !newly_cached.is_empty() {
            self.log_stored(slot, &newly_cached);
        }
    }

    /// Record the request's blocks `blocks` (ascending) as stored: one event
    /// per run of consecutive blocks, as vLLM sends them.
    fn log_stored(&mut self, slot: u32, blocks: &[u32]) {
        let block_size = self.cfg.block_size;
        let r = self.requests.get(slot);
        let adapter = r.adapter.map(|a| self.lora.name(a).to_owned());
        for run in blocks.chunk_by(|a, b| a + 1 == *b) {
            let first = run[0];
            let tokens = (first * block_size..(first + run.len() as u32) * block_size)
                .map(|p| r.token_at(p))
                .collect();
            self.kv.log_stored(KvCacheEvent::Stored {
                hashes: run.iter().map(|&k| r.block_hashes[k as usize]).collect(),
                parent: first.checked_sub(1).map(|k| r.block_hashes[k as usize]),
                tokens,
                adapter: adapter.clone(),
            });
        }
    }

    /// The step in flight ends at `end`: store prefill chunks, sample tokens,
    /// finish requests.
    fn complete_step(&mut self, end: f64, out: &mut Vec<EngineEvent>) {
        let mut finished_any = false;
        for k in 0..self.batch.len() {
            let Scheduled { at, new_tokens } = self.batch[k];
            if !self.requests.is(at, Phase::Running) {
                continue; // aborted while the step ran
            }
            let r = self.requests.get_mut(at.slot);
            r.num_computed += new_tokens;
            if r.num_computed < r.num_tokens() {
                continue; // a prefill chunk; the prompt is not done yet
            }
            r.output_len += 1;
            self.counters.generation_tokens += 1;
            let cached_tokens = r.cached_tokens.unwrap_or(0);
            if r.output_len == 1 {
                self.counters.prompt_tokens += u64::from(r.prompt_len());
                out.push(EngineEvent::FirstToken {
                    id: r.id,
                    at: end,
                    cached_tokens,
                });
            } else if self.token_events {
                out.push(EngineEvent::Token { id: r.id, at: end });
            }
            if r.output_len < r.max_tokens {
                continue;
            }
            out.push(EngineEvent::Finished {
                id: r.id,
                at: end,
                prompt_tokens: r.prompt_len(),
                completion_tokens: r.output_len,
                cached_tokens,
                reason: FinishReason::Length,
            });
            if r.hold_kv {
                self.held.insert(r.id, std::mem::take(&mut r.blocks));
            } else {
                self.kv.free(&mut r.blocks);
            }
            let (id, adapter) = (r.id, r.adapter);
            if let Some(a) = adapter {
                self.lora.release(a);
            }
            self.by_id.remove(&id);
            self.requests.remove(at.slot);
            self.counters.finished += 1;
            finished_any = true;
        }
        if finished_any {
            let requests = &self.requests;
            self.running
                .retain(|&s| requests.get(s).phase == Phase::Running);
        }
    }
}
