//! One run of a fleet layout in virtual time (see the module above).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use sim::engine::calibration::synthetic_prompt;
use sim::engine::{Engine, EngineConfig, EngineEvent, KvLink, SimRequest};

/// A fleet of `gpus` one-GPU replicas, the first `prefill` of them prefill
/// replicas (none: an aggregated fleet).
#[derive(Debug, Clone, Copy)]
pub struct Fleet {
    pub gpus: usize,
    pub prefill: usize,
    /// Uncached prompt tokens below which the decode replica prefills.
    pub threshold: u32,
    pub link: KvLink,
}

/// One request: when it arrives, its prompt (unique, synthetic) and answer
/// lengths.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub id: u64,
    pub at: f64,
    pub prompt_tokens: u32,
    pub max_tokens: u32,
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Served {
    pub ttft: Option<f64>,
    pub itl: Option<f64>,
    /// A prefill replica computed its prompt.
    pub remote: bool,
}

#[derive(Debug, Clone, Default)]
pub struct Results {
    pub requests: Vec<Served>,
    pub output_tokens: u64,
    /// From the first arrival to the last answer's end.
    pub makespan: f64,
}

/// A request on its way through the fleet.
struct Live {
    request: Request,
    decode: usize,
    /// Work counted on the decode replica until the request ends.
    decode_work: u64,
    /// The prefill replica and the work counted on it, while it prefills.
    prefill: Option<(usize, u64)>,
    /// The prefill replica holding the prompt's KV until the decode has it.
    held_on: Option<usize>,
    first_token: Option<f64>,
}

struct Simulation<'a> {
    fleet: &'a Fleet,
    engines: Vec<Engine>,
    /// Work outstanding per replica, as the gateway counts it.
    work: Vec<u64>,
    scheduled: Vec<Option<f64>>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    live: HashMap<u64, Live>,
    results: Results,
    events: Vec<EngineEvent>,
}

/// Runs `requests` (in arrival order, ids 0, 1, ...) through `fleet`.
pub fn run(fleet: &Fleet, requests: &[Request]) -> Results {
    let config =
        EngineConfig::new("h100", "llama-3.1-8b", Some(1)).expect("an 8B model fits an H100");
    let engines = (0..fleet.gpus)
        .map(|_| {
            let mut engine = Engine::new(config.clone());
            engine.set_token_events(false);
            engine
        })
        .collect();
    let mut sim = Simulation {
        fleet,
        engines,
        work: vec![0; fleet.gpus],
        scheduled: vec![None; fleet.gpus],
        heap: BinaryHeap::new(),
        live: HashMap::new(),
        results: Results {
            requests: vec![Served::default(); requests.len()],
            ..Results::default()
        },
        events: Vec::new(),
    };
    let mut arrivals = requests.iter().peekable();
    loop {
        let next_engine = sim.heap.peek().map(|Reverse((at, _))| f64::from_bits(*at));
        match (arrivals.peek(), next_engine) {
            (Some(request), Some(at)) if request.at < at => {
                sim.arrive(**request);
                arrivals.next();
            }
            (Some(request), None) => {
                sim.arrive(**request);
                arrivals.next();
            }
            (_, Some(_)) => {
                let Reverse((at, engine)) = sim.heap.pop().expect("peeked");
                sim.step(engine, f64::from_bits(at));
            }
            (None, None) => break,
        }
    }
    let first = requests.first().map_or(0.0, |r| r.at);
    sim.results.makespan = (sim.results.makespan - first).max(f64::EPSILON);
    sim.results
}

impl Simulation<'_> {
    fn decode_replicas(&self) -> std::ops::Range<usize> {
        self.fleet.prefill..self.fleet.gpus
    }

    fn least_work(&self, replicas: std::ops::Range<usize>) -> usize {
        replicas
            .min_by_key(|&i| self.work[i])
            .expect("every layout has decode and (when used) prefill replicas")
    }

    fn arrive(&mut self, request: Request) {
        let at = request.at;
        let prompt = synthetic_prompt(request.id, request.prompt_tokens);
        let decode = self.least_work(self.decode_replicas());
        let engine = &self.engines[decode];
        let block = engine.config().block_size;
        let hashes = Engine::prompt_block_hashes(&prompt, None, block);
        let cached = (engine.cached_prefix_blocks(&hashes) as u32 * block)
            .min(request.prompt_tokens.saturating_sub(1));
        let uncached = request.prompt_tokens - cached;
        let local = self.fleet.prefill == 0 || uncached < self.fleet.threshold;
        let decode_work =
            u64::from(if local { uncached } else { 1 }) + u64::from(request.max_tokens);
        self.work[decode] += decode_work;
        let mut live = Live {
            request,
            decode,
            decode_work,
            prefill: None,
            held_on: None,
            first_token: None,
        };
        if local {
            self.engines[decode].submit(at, sim_request(&request, prompt, request.max_tokens));
            self.reschedule(decode);
        } else {
            let prefill = self.least_work(0..self.fleet.prefill);
            self.work[prefill] += u64::from(uncached);
            live.prefill = Some((prefill, u64::from(uncached)));
            self.engines[prefill].submit_holding_kv(at, sim_request(&request, prompt, 1));
            self.reschedule(prefill);
            self.results.requests[request.id as usize].remote = true;
        }
        self.live.insert(request.id, live);
    }

    fn reschedule(&mut self, engine: usize) {
        let next = self.engines[engine].next_event_at();
        if next != self.scheduled[engine] {
            self.scheduled[engine] = next;
            if let Some(at) = next {
                self.heap.push(Reverse((at.to_bits(), engine)));
            }
        }
    }

    fn step(&mut self, engine: usize, at: f64) {
        if self.scheduled[engine] != Some(at) {
            return; // superseded
        }
        self.scheduled[engine] = None;
        let mut events = std::mem::take(&mut self.events);
        self.engines[engine].advance(at, &mut events);
        for event in events.drain(..) {
            self.on_event(engine, event);
        }
        self.events = events;
        self.reschedule(engine);
    }

    fn on_event(&mut self, engine: usize, event: EngineEvent) {
        let id = event.id();
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        let prefilling = live.prefill.is_some_and(|(p, _)| p == engine);
        match event {
            // The prefill replica is done: the decode replica pulls the KV.
            EngineEvent::Finished { at, .. } if prefilling => {
                let (prefill, work) = live.prefill.take().expect("prefilling");
                self.work[prefill] -= work;
                live.held_on = Some(prefill);
                let request = live.request;
                let decode = live.decode;
                let prompt = synthetic_prompt(request.id, request.prompt_tokens);
                self.engines[decode].submit_with_remote_kv(
                    at,
                    sim_request(&request, prompt, request.max_tokens),
                    self.fleet.link,
                );
                self.reschedule(decode);
            }
            EngineEvent::FirstToken { at, .. } if !prefilling => {
                live.first_token = Some(at);
                // The decode has the KV: the prefill replica's copy is free.
                if let Some(prefill) = live.held_on.take() {
                    self.engines[prefill].release_held(at, id);
                    self.reschedule(prefill);
                }
            }
            EngineEvent::Finished {
                at,
                completion_tokens,
                ..
            } => {
                let live = self.live.remove(&id).expect("live");
                self.work[live.decode] -= live.decode_work;
                let served = &mut self.results.requests[id as usize];
                served.ttft = live.first_token.map(|t| t - live.request.at);
                served.itl = live
                    .first_token
                    .filter(|_| completion_tokens > 1)
                    .map(|t| (at - t) / f64::from(completion_tokens - 1));
                self.results.output_tokens += u64::from(completion_tokens);
                self.results.makespan = self.results.makespan.max(at);
            }
            EngineEvent::Rejected { reason, .. } => {
                panic!("request {id} refused by the engine: {reason}")
            }
            EngineEvent::FirstToken { .. } | EngineEvent::Token { .. } => {}
        }
    }
}

fn sim_request(request: &Request, prompt: Vec<u32>, max_tokens: u32) -> SimRequest {
    SimRequest {
        id: request.id,
        prompt,
        max_tokens,
        adapter: None,
        priority: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sim::engine::kv_transfer::RDMA_400G;

    fn requests(prompt_tokens: u32, count: u64, gap: f64) -> Vec<Request> {
        (0..count)
            .map(|id| Request {
                id,
                at: id as f64 * gap,
                prompt_tokens,
                max_tokens: 64,
            })
            .collect()
    }

    #[test]
    fn long_prompts_on_their_own_replicas_keep_decode_steps_short() {
        let rag = requests(8000, 200, 0.15);
        let fleet = |prefill| Fleet {
            gpus: 4,
            prefill,
            threshold: 512,
            link: RDMA_400G,
        };
        let aggregated = run(&fleet(0), &rag);
        let disaggregated = run(&fleet(1), &rag);
        assert!(
            disaggregated
                .requests
                .iter()
                .all(|r| r.remote && r.ttft.is_some())
        );
        let p99 = |r: &Results| {
            let mut itl: Vec<f64> = r.requests.iter().filter_map(|s| s.itl).collect();
            crate::stats::percentile(&mut itl, 99.0).unwrap()
        };
        assert!(
            p99(&disaggregated) < p99(&aggregated),
            "ITL p99 {} disaggregated vs {} aggregated",
            p99(&disaggregated),
            p99(&aggregated)
        );
        assert_eq!(aggregated.output_tokens, 200 * 64);
        assert_eq!(disaggregated.output_tokens, 200 * 64);
    }

    #[test]
    fn the_decider_keeps_short_prompts_on_the_decode_replica() {
        let chat = requests(200, 50, 0.05);
        let fleet = Fleet {
            gpus: 2,
            prefill: 1,
            threshold: 512,
            link: RDMA_400G,
        };
        let results = run(&fleet, &chat);
        assert!(
            results
                .requests
                .iter()
                .all(|r| !r.remote && r.ttft.is_some())
        );
        let always = run(
            &Fleet {
                threshold: 0,
                ..fleet
            },
            &chat,
        );
        assert!(always.requests.iter().all(|r| r.remote));
    }
}
