//! The engine actor of one replica: a task that owns the [`Engine`], maps wall
//! time to engine time, and routes engine events to the HTTP requests that
//! wait for them.
//!
//! Engine time runs `time_scale` times faster than wall time
//! (`engine_time = elapsed_wall × time_scale`). The actor sleeps until the
//! wall instant of the engine's next event or until a command arrives,
//! advances the engine to "now", and forwards each event to its request's
//! channel. A request whose client goes away is aborted in the engine (see
//! [`RequestHandle`]), which frees its KV blocks as a real server would.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::engine::{Engine, EngineEvent, EngineStats, FinishReason, KvLink, SimRequest};
use crate::kv_cache_events::KvEventSink;
use crate::metrics::{FinishKind, FinishedTokens, LatencyBuckets, RequestTotals, RequestTracker};

/// What a waiting request hears from the engine.
#[derive(Debug, Clone, PartialEq)]
pub enum RequestEvent {
    /// The first output token; `cached_tokens` of the prompt came from the
    /// prefix cache.
    FirstToken { cached_tokens: u32 },
    /// One more output token.
    Token,
    /// The request is complete (or was aborted).
    Finished {
        tokens: FinishedTokens,
        finish: FinishKind,
    },
    /// The engine refused the request.
    Rejected { reason: String },
}

/// A point-in-time view for `/metrics`.
#[derive(Debug, Clone)]
pub struct EngineSnapshot {
    pub stats: EngineStats,
    pub requests: RequestTotals,
}

/// What to run: the prompt and how long the answer is.
#[derive(Debug, Clone)]
pub struct Generation {
    pub prompt: Vec<u32>,
    pub max_tokens: u32,
    pub adapter: Option<String>,
    /// The request's `priority` (vLLM's field; lower is served first under
    /// priority scheduling).
    pub priority: i64,
    /// Whether the client set `max_tokens` (the answer then ends by length,
    /// otherwise the simulated model stops by itself).
    pub limited_by_max_tokens: bool,
}

/// Where a request's prompt KV comes from and goes to, in prefill/decode
/// disaggregation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvHandoff {
    /// Computed here, freed at the end: an ordinary request.
    Local,
    /// Pulled over this link from a prefill replica (a decode).
    Pull(KvLink),
    /// Computed here and held after the end for a decode to pull (a
    /// prefill), until [`EngineClient::release_held`].
    Hold,
}

enum Command {
    Submit {
        id: u64,
        generation: Generation,
        handoff: KvHandoff,
        events: mpsc::UnboundedSender<RequestEvent>,
    },
    ReleaseHeld {
        id: u64,
    },
    Abort {
        id: u64,
    },
    RegisterAdapter {
        name: String,
    },
    UnregisterAdapter {
        name: String,
    },
    SetSlowdown {
        factor: f64,
    },
    Snapshot {
        reply: oneshot::Sender<EngineSnapshot>,
    },
    CachedBlocks {
        reply: oneshot::Sender<Vec<u64>>,
    },
}

/// A cloneable handle to a running engine actor.
#[derive(Clone)]
pub struct EngineClient {
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
}

impl EngineClient {
    /// Starts the actor on the current runtime. With `kv_events`, each
    /// engine step's prefix-cache changes are published as one batch.
    pub(crate) fn spawn(
        mut engine: Engine,
        time_scale: f64,
        latency_buckets: LatencyBuckets,
        kv_events: Option<KvEventSink>,
    ) -> (EngineClient, tokio::task::JoinHandle<()>) {
        engine.set_kv_events(kv_events.is_some());
        let (commands, inbox) = mpsc::unbounded_channel();
        let max_model_len = engine.config().max_model_len;
        let actor = EngineActor {
            engine,
            clock: EngineClock::start(time_scale),
            now: 0.0,
            requests: HashMap::new(),
            tracker: RequestTracker::new(latency_buckets, max_model_len),
            events: Vec::new(),
            kv_events,
        };
        let task = tokio::spawn(actor.run(inbox));
        let client = EngineClient {
            commands,
            next_id: Arc::new(AtomicU64::new(1)),
        };
        (client, task)
    }

    /// Hands a request to the engine. Its events arrive on the returned
    /// handle; dropping the handle before the end aborts the request.
    pub fn submit(&self, generation: Generation) -> Result<RequestHandle, EngineGone> {
        self.submit_with(generation, KvHandoff::Local)
    }

    /// [`submit`](Self::submit), with the prompt's KV pulled from a
    /// prefill replica, or held for a decode replica.
    pub fn submit_with(
        &self,
        generation: Generation,
        handoff: KvHandoff,
    ) -> Result<RequestHandle, EngineGone> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events_tx, events) = mpsc::unbounded_channel();
        self.commands
            .send(Command::Submit {
                id,
                generation,
                handoff,
                events: events_tx,
            })
            .map_err(|_| EngineGone)?;
        Ok(RequestHandle {
            events,
            abort: AbortOnDrop {
                id,
                commands: self.commands.clone(),
                armed: true,
            },
        })
    }

    pub fn register_adapter(&self, name: &str) -> Result<(), EngineGone> {
        self.send(Command::RegisterAdapter {
            name: name.to_owned(),
        })
    }

    pub fn unregister_adapter(&self, name: &str) -> Result<(), EngineGone> {
        self.send(Command::UnregisterAdapter {
            name: name.to_owned(),
        })
    }

    /// The KV request `id` held for a decode is free (pulled or expired).
    pub fn release_held(&self, id: u64) -> Result<(), EngineGone> {
        self.send(Command::ReleaseHeld { id })
    }

    pub fn set_slowdown(&self, factor: f64) -> Result<(), EngineGone> {
        self.send(Command::SetSlowdown { factor })
    }

    /// The chained hashes of the blocks in the engine's prefix cache, as of
    /// now (what its KV events describe).
    pub async fn cached_blocks(&self) -> Result<Vec<u64>, EngineGone> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::CachedBlocks { reply })?;
        answer.await.map_err(|_| EngineGone)
    }

    /// Engine statistics and request totals as of now.
    pub async fn snapshot(&self) -> Result<EngineSnapshot, EngineGone> {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Snapshot { reply })?;
        answer.await.map_err(|_| EngineGone)
    }

    fn send(&self, command: Command) -> Result<(), EngineGone> {
        self.commands.send(command).map_err(|_| EngineGone)
    }
}

/// The engine actor has stopped (the replica crashed or is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the engine has stopped")]
pub struct EngineGone;

/// One submitted request: its event stream, and an abort that fires if the
/// handle is dropped before the request ended.
pub struct RequestHandle {
    events: mpsc::UnboundedReceiver<RequestEvent>,
    abort: AbortOnDrop,
}

impl RequestHandle {
    /// The request's id in its engine.
    pub fn id(&self) -> u64 {
        self.abort.id
    }

    /// The next event; `None` if the engine stopped.
    pub async fn next(&mut self) -> Option<RequestEvent> {
        let event = self.events.recv().await;
        self.disarm_if_final(&event);
        event
    }

    /// Poll form of [`next`](Self::next), for response bodies.
    pub fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<RequestEvent>> {
        let polled = self.events.poll_recv(cx);
        if let std::task::Poll::Ready(event) = &polled {
            self.disarm_if_final(event);
        }
        polled
    }

    fn disarm_if_final(&mut self, event: &Option<RequestEvent>) {
        if matches!(
            event,
            None | Some(RequestEvent::Finished { .. } | RequestEvent::Rejected { .. })
        ) {
            self.abort.armed = false;
        }
    }
}

struct AbortOnDrop {
    id: u64,
    commands: mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if self.armed {
            // The actor may already be gone; nothing is left to free then.
            let _ = self.commands.send(Command::Abort { id: self.id });
        }
    }
}

/// Maps wall time to engine time.
struct EngineClock {
    origin: Instant,
    scale: f64,
}

impl EngineClock {
    fn start(scale: f64) -> Self {
        assert!(
            scale.is_finite() && scale > 0.0,
            "time scale must be positive"
        );
        Self {
            origin: Instant::now(),
            scale,
        }
    }

    fn engine_now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * self.scale
    }

    /// The wall instant at which engine time reaches `at`.
    fn wall_instant(&self, at: f64) -> Instant {
        let wall = Duration::try_from_secs_f64(at / self.scale).unwrap_or(FAR_FUTURE);
        self.origin
            .checked_add(wall)
            .unwrap_or_else(|| Instant::now() + FAR_FUTURE)
    }
}

/// "Never" for timers; long enough to outlive any run.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365);

/// What the actor keeps per live request.
struct LiveRequest {
    events: mpsc::UnboundedSender<RequestEvent>,
    prompt_tokens: u32,
    cached_tokens: u32,
    completion_tokens: u32,
}

struct EngineActor {
    engine: Engine,
    clock: EngineClock,
    /// Engine time the engine has been advanced to; never goes back.
    now: f64,
    requests: HashMap<u64, LiveRequest>,
    tracker: RequestTracker,
    /// Reused buffer for `Engine::advance`.
    events: Vec<EngineEvent>,
    kv_events: Option<KvEventSink>,
}

impl EngineActor {
    async fn run(mut self, mut inbox: mpsc::UnboundedReceiver<Command>) {
        loop {
            self.advance_to(self.clock.engine_now());
            let next_event = self.engine.next_event_at();
            let wake = next_event.map(|at| self.clock.wall_instant(at));
            tokio::select! {
                biased;
                command = inbox.recv() => match command {
                    Some(command) => {
                        self.advance_to(self.clock.engine_now());
                        self.handle(command);
                    }
                    None => break,
                },
                () = tokio::time::sleep_until(wake.unwrap_or_else(|| Instant::now() + FAR_FUTURE)),
                    if wake.is_some() =>
                {
                    // The timer fires at or after the event's wall instant;
                    // rounding must not leave the engine just short of it.
                    let due = next_event.unwrap_or(self.now);
                    self.advance_to(self.clock.engine_now().max(due));
                }
            }
            self.publish_kv_events();
        }
    }

    /// Whatever entered or left the prefix cache since the last call, as one
    /// batch (vLLM publishes once per engine step).
    fn publish_kv_events(&mut self) {
        if let Some(sink) = &mut self.kv_events {
            self.engine.drain_kv_events(&mut sink.scratch);
            sink.publish();
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit {
                id,
                generation,
                handoff,
                events,
            } => {
                self.tracker
                    .on_submit(id, self.now, generation.limited_by_max_tokens);
                let live = LiveRequest {
                    events,
                    prompt_tokens: u32::try_from(generation.prompt.len()).unwrap_or(u32::MAX),
                    cached_tokens: 0,
                    completion_tokens: 0,
                };
                self.requests.insert(id, live);
                let request = SimRequest {
                    id,
                    prompt: generation.prompt,
                    max_tokens: generation.max_tokens,
                    adapter: generation.adapter,
                    priority: generation.priority,
                };
                match handoff {
                    KvHandoff::Local => self.engine.submit(self.now, request),
                    KvHandoff::Pull(link) => {
                        self.engine.submit_with_remote_kv(self.now, request, link);
                    }
                    KvHandoff::Hold => self.engine.submit_holding_kv(self.now, request),
                }
            }
            Command::ReleaseHeld { id } => self.engine.release_held(self.now, id),
            Command::Abort { id } => {
                if let Some(live) = self.requests.remove(&id) {
                    self.engine.abort(self.now, id);
                    let tokens = FinishedTokens {
                        prompt: live.prompt_tokens,
                        completion: live.completion_tokens,
                        cached: live.cached_tokens,
                    };
                    self.tracker.on_finished(id, self.now, tokens, true);
                }
            }
            Command::RegisterAdapter { name } => self.engine.register_adapter(&name),
            Command::UnregisterAdapter { name } => {
                self.engine.unregister_adapter(&name);
            }
            Command::SetSlowdown { factor } => self.engine.set_slowdown(factor),
            Command::Snapshot { reply } => {
                let snapshot = EngineSnapshot {
                    stats: self.engine.stats(),
                    requests: self.tracker.totals().clone(),
                };
                let _ = reply.send(snapshot);
            }
            Command::CachedBlocks { reply } => {
                // Every change up to this state is published before the
                // caller hears of it.
                self.publish_kv_events();
                let _ = reply.send(self.engine.cached_block_hashes());
            }
        }
    }

    fn advance_to(&mut self, until: f64) {
        self.now = self.now.max(until);
        let mut events = std::mem::take(&mut self.events);
        self.engine.advance(self.now, &mut events);
        for event in events.drain(..) {
            self.route(event);
        }
        self.events = events;
    }

    fn route(&mut self, event: EngineEvent) {
        match event {
            EngineEvent::FirstToken {
                id,
                at,
                cached_tokens,
            } => {
                self.tracker.on_first_token(id, at);
                if let Some(live) = self.requests.get_mut(&id) {
                    live.cached_tokens = cached_tokens;
                    live.completion_tokens += 1;
                    let _ = live.events.send(RequestEvent::FirstToken { cached_tokens });
                }
            }
            EngineEvent::Token { id, at } => {
                self.tracker.on_token(id, at);
                if let Some(live) = self.requests.get_mut(&id) {
                    live.completion_tokens += 1;
                    let _ = live.events.send(RequestEvent::Token);
                }
            }
            EngineEvent::Finished {
                id,
                at,
                prompt_tokens,
                completion_tokens,
                cached_tokens,
                reason,
            } => {
                let tokens = FinishedTokens {
                    prompt: prompt_tokens,
                    completion: completion_tokens,
                    cached: cached_tokens,
                };
                let aborted = matches!(reason, FinishReason::Aborted);
                let finish = self.tracker.on_finished(id, at, tokens, aborted);
                if let Some(live) = self.requests.remove(&id) {
                    let _ = live.events.send(RequestEvent::Finished { tokens, finish });
                }
            }
            EngineEvent::Rejected { id, reason, .. } => {
                self.tracker.on_rejected(id);
                if let Some(live) = self.requests.remove(&id) {
                    let _ = live.events.send(RequestEvent::Rejected { reason });
                }
            }
        }
    }
}
