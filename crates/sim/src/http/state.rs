//! What the handlers of one replica share: its state and the stop signal.
//! Kept out of the router so the handlers can use it without using the
//! router that calls them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{Notify, watch};

use super::body::ApiError;
use crate::engine::SchedulingPolicy;
use crate::faults::FaultState;
use crate::metrics::{Dialect, Exporter};
use crate::replica::EngineClient;

/// How a replica is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum StopMode {
    Running,
    /// Stop accepting, let in-flight requests finish (bounded), then close.
    Graceful,
    /// Stop listening and drop every connection at once.
    Crash,
}

/// Shared by the replica's handle, its admin API and its server loop.
#[derive(Debug)]
pub(crate) struct StopSignal(watch::Sender<StopMode>);

impl StopSignal {
    pub(crate) fn new() -> Self {
        Self(watch::Sender::new(StopMode::Running))
    }

    /// Escalates only: a crash overrides a graceful stop, never the reverse.
    pub(crate) fn request(&self, mode: StopMode) {
        self.0.send_if_modified(|current| {
            let escalate = mode > *current;
            if escalate {
                *current = mode;
            }
            escalate
        });
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<StopMode> {
        self.0.subscribe()
    }
}

/// The inference requests in flight, and whether new ones are still taken
/// (a graceful stop refuses them and waits for these to end).
#[derive(Debug, Default)]
pub(crate) struct Drain {
    draining: AtomicBool,
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Drain {
    /// Counts a new inference request in until the guard is dropped;
    /// `None` once draining.
    pub(super) fn enter(self: &Arc<Self>) -> Option<InFlight> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self.clone());
        (!self.draining.load(Ordering::SeqCst)).then_some(guard)
    }

    /// Refuses new requests from now on; `true` the first time.
    pub(crate) fn start(&self) -> bool {
        !self.draining.swap(true, Ordering::SeqCst)
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Resolves once no inference request is in flight.
    pub(crate) async fn idle(&self) {
        loop {
            let notified = self.idle.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One inference request in flight (see [`Drain`]).
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Drain>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A LoRA adapter the server lists and accepts as `model`.
#[derive(Debug, Clone)]
pub(crate) struct LoadedAdapter {
    pub name: String,
    pub path: String,
}

/// Everything the handlers of one replica share.
pub(crate) struct AppState {
    /// The name clients use for the base model.
    pub served_model: String,
    /// `root` of the base model card (the model path, i.e. the HF id).
    pub model_root: String,
    pub max_model_len: u32,
    /// The engine the replica passes for (llama.cpp continues a final
    /// assistant message by itself).
    pub dialect: Dialect,
    /// Whether adapters can be loaded (`max_loras > 0`).
    pub lora_enabled: bool,
    /// Seeds answer lengths and words.
    pub seed: u64,
    /// The engine's `--scheduling-policy`: whether a request's `priority`
    /// is accepted.
    pub scheduling_policy: SchedulingPolicy,
    pub engine: EngineClient,
    pub adapters: Mutex<Vec<LoadedAdapter>>,
    pub faults: FaultState,
    pub exporter: Mutex<Exporter>,
    /// The last `/metrics` text served, for the `frozen` fault.
    pub last_metrics: Mutex<Option<Bytes>>,
    pub stop: Arc<StopSignal>,
    pub drain: Arc<Drain>,
    /// Its role in prefill/decode disaggregation.
    pub disaggregated: super::Disaggregated,
}

impl AppState {
    /// A graceful stop: new inference requests get a 503 from now on, and
    /// the replica stops once the ones in flight have ended (a crash
    /// meanwhile stops it at once).
    pub(crate) fn begin_drain(self: &Arc<Self>) {
        if !self.drain.start() {
            return;
        }
        tracing::info!(
            in_flight = self.drain.in_flight(),
            "draining: refusing new requests"
        );
        let state = self.clone();
        tokio::spawn(async move {
            let mut stop = state.stop.subscribe();
            tokio::select! {
                () = state.drain.idle() => state.stop.request(StopMode::Graceful),
                _ = stop.wait_for(|mode| *mode == StopMode::Crash) => {}
            }
        });
    }

    /// Maps a request's `model` to the name to answer with and the adapter
    /// to run (vLLM: base model if absent, 404 if unknown).
    pub(crate) fn resolve_model(
        &self,
        requested: Option<&str>,
    ) -> Result<(String, Option<String>), ApiError> {
        match requested {
            None => Ok((self.served_model.clone(), None)),
            Some(name) if name == self.served_model => Ok((self.served_model.clone(), None)),
            Some(name) if self.adapters.lock().iter().any(|a| a.name == name) => {
                Ok((name.to_owned(), Some(name.to_owned())))
            }
            Some(name) => Err(
                ApiError::not_found(format!("The model `{name}` does not exist."))
                    .with_param("model"),
            ),
        }
    }
}
