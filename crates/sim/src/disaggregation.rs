//! Prefill/decode disaggregation: a replica's role, the KV link it pulls
//! over, and the hand-offs between prefill and decode replicas.
//!
//! Both engines' protocols are spoken (the request side is in the HTTP
//! front):
//! - **vLLM** (NixlConnector): a request whose `kv_transfer_params` ask
//!   `do_remote_decode` is computed here and its KV held (see
//!   [`HeldKv`]); the answer carries the `kv_transfer_params` a decode
//!   replica needs to pull it. A request whose `kv_transfer_params` carry
//!   `do_remote_prefill` pulls the blocks named there instead of
//!   prefilling; blocks it cannot find are recomputed, as vLLM's default
//!   `recompute` policy does on a failed load.
//! - **SGLang**: a request with `bootstrap_host`, `bootstrap_port` and
//!   `bootstrap_room` goes to a prefill server and a decode server at once;
//!   they pair by room ([`Rooms`]). The decode waits for its room's prefill,
//!   pulls its KV, then streams.
//!
//! The hand-off state lives in this process (every replica of a simulated
//! fleet does), in place of the engines' side channels; the time the KV
//! takes is the decode engine's ([`crate::engine::KvLink`]).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::engine::KvLink;
use crate::replica::EngineClient;

/// Frees the KV a prefill replica's engine holds for a decode.
pub(crate) struct Release {
    pub engine: EngineClient,
    /// The prefill's id in its engine.
    pub id: u64,
}

impl Release {
    pub(crate) fn release(self) {
        // A stopped engine holds nothing any more.
        let _ = self.engine.release_held(self.id);
    }
}

/// SGLang's `--disaggregation-bootstrap-port` default.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// How long a prefill replica holds KV nobody pulled, in engine seconds:
/// vLLM's `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` default.
pub const HELD_KV_TIMEOUT_SECONDS: f64 = 480.0;

/// How long a decode waits for its room's prefill, in engine seconds: the
/// simulator's choice, long enough for any queued prefill (SGLang bounds
/// the same wait with its `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT`).
pub const ROOM_TIMEOUT_SECONDS: f64 = 300.0;

/// What a replica does in a disaggregated deployment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Role {
    /// Computes prompts and generates (a replica of an aggregated fleet;
    /// vLLM's `kv_both` also takes either leg).
    #[default]
    Both,
    /// Computes prompts whose tokens a decode replica generates.
    Prefill,
    /// Generates from KV a prefill replica computed.
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "both" | "" => Ok(Role::Both),
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            other => Err(format!(
                "unknown role `{other}`: use prefill, decode or both"
            )),
        }
    }
}

/// A replica's part in disaggregation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DisaggregationSpec {
    pub role: Role,
    /// The link a decode replica pulls KV over.
    pub link: KvLink,
    /// The SGLang bootstrap port a prefill replica serves.
    pub bootstrap_port: u16,
}

impl Default for DisaggregationSpec {
    fn default() -> Self {
        Self {
            role: Role::Both,
            link: KvLink::default(),
            bootstrap_port: DEFAULT_BOOTSTRAP_PORT,
        }
    }
}

/// KV a vLLM prefill replica computed for a remote decode, until it is
/// pulled or its hold expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldKv {
    pub prompt_tokens: u32,
}

/// One hold: what is held, what frees it, and until when.
type Hold = (HeldKv, Option<Release>, Instant);

/// KV held by vLLM prefill replicas, by (engine id, first block id).
#[derive(Default)]
pub(crate) struct HeldBlocks {
    held: Mutex<HashMap<(String, u64), Hold>>,
    next_block: Mutex<u64>,
}

impl HeldBlocks {
    /// Holds `kv` (its blocks freed by `release` once pulled, or at
    /// `expires`); the block ids a decode names to pull it.
    pub(crate) fn hold(
        &'static self,
        engine_id: &str,
        kv: HeldKv,
        blocks: u32,
        release: Option<Release>,
        expires: Instant,
    ) -> Vec<u64> {
        let first = {
            let mut next = self.next_block.lock();
            let first = *next;
            *next += u64::from(blocks.max(1));
            first
        };
        let key = (engine_id.to_owned(), first);
        self.held.lock().insert(key.clone(), (kv, release, expires));
        tokio::spawn(async move {
            tokio::time::sleep_until(expires).await;
            let expired = self.held.lock().remove(&key);
            if let Some((_, Some(release), _)) = expired {
                release.release();
            }
        });
        (first..first + u64::from(blocks.max(1))).collect()
    }

    /// Takes the KV held under `engine_id` starting at `first_block`, if it
    /// is still held; the prefill's blocks are freed as it is pulled.
    pub(crate) fn take(&self, engine_id: &str, first_block: u64) -> Option<HeldKv> {
        let (kv, release, expires) = self
            .held
            .lock()
            .remove(&(engine_id.to_owned(), first_block))?;
        if let Some(release) = release {
            release.release();
        }
        (expires > Instant::now()).then_some(kv)
    }
}

/// Where an SGLang room stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RoomState {
    /// The prefill has not finished (or not arrived).
    Pending,
    /// The prefill served by `bootstrap` computed `prompt_tokens`.
    Ready {
        bootstrap: (String, u16),
        prompt_tokens: u32,
    },
    /// The prefill failed or was cancelled.
    Failed(String),
}

/// SGLang rooms, by `bootstrap_room`.
#[derive(Default)]
pub(crate) struct Rooms {
    rooms: Mutex<HashMap<u64, (watch::Sender<RoomState>, Instant)>>,
    /// The prefills' held KV, freed when their decode pulls it (or at the
    /// room's expiry).
    held: Mutex<HashMap<u64, Release>>,
}

impl Rooms {
    fn channel(&self, room: u64, expires: Instant) -> watch::Sender<RoomState> {
        let mut rooms = self.rooms.lock();
        let now = Instant::now();
        rooms.retain(|_, (_, until)| *until > now);
        rooms
            .entry(room)
            .or_insert_with(|| (watch::Sender::new(RoomState::Pending), expires))
            .0
            .clone()
    }

    /// The prefill side's end of `room`; `release` frees the KV it holds
    /// once the decode pulls it (or at `expires`).
    pub(crate) fn settle(
        &'static self,
        room: u64,
        state: RoomState,
        release: Option<Release>,
        expires: Instant,
    ) {
        if let Some(release) = release {
            self.held.lock().insert(room, release);
            tokio::spawn(async move {
                tokio::time::sleep_until(expires).await;
                self.release(room);
            });
        }
        self.channel(room, expires).send_replace(state);
    }

    /// Frees the KV `room`'s prefill holds, if it still does.
    pub(crate) fn release(&self, room: u64) {
        let held = self.held.lock().remove(&room);
        if let Some(release) = held {
            release.release();
        }
    }

    /// Waits until `room`'s prefill is done or failed, up to `deadline`;
    /// the room is closed once the decode has its answer.
    pub(crate) async fn wait(&self, room: u64, deadline: Instant) -> RoomState {
        let mut receiver = self.channel(room, deadline).subscribe();
        let settled = tokio::time::timeout_at(
            deadline,
            receiver.wait_for(|state| *state != RoomState::Pending),
        )
        .await;
        let state = match settled {
            Ok(Ok(state)) => state.clone(),
            Ok(Err(_)) => RoomState::Failed("the room was closed".into()),
            Err(_) => RoomState::Failed("timed out waiting for the prefill".into()),
        };
        self.rooms.lock().remove(&room);
        state
    }
}

/// The hand-offs of every replica in this process.
pub(crate) static HELD_BLOCKS: LazyLock<HeldBlocks> = LazyLock::new(HeldBlocks::default);
pub(crate) static ROOMS: LazyLock<Rooms> = LazyLock::new(Rooms::default);

/// Engine seconds as wall time at `time_scale`.
pub(crate) fn wall(engine_seconds: f64, time_scale: f64) -> Duration {
    Duration::try_from_secs_f64(engine_seconds / time_scale).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_and_print() {
        assert_eq!("Prefill".parse::<Role>(), Ok(Role::Prefill));
        assert_eq!(Role::Decode.to_string(), "decode");
        assert!("producer".parse::<Role>().is_err());
    }

    #[tokio::test]
    async fn held_blocks_are_taken_once_and_expire() {
        let blocks: &'static HeldBlocks = Box::leak(Box::default());
        let later = Instant::now() + Duration::from_secs(60);
        let kv = HeldKv { prompt_tokens: 40 };
        let ids = blocks.hold("e", kv, 3, None, later);
        assert_eq!(ids.len(), 3);
        assert_eq!(blocks.take("e", ids[0]), Some(kv));
        assert_eq!(blocks.take("e", ids[0]), None, "pulled once");
        let gone = blocks.hold("e", kv, 1, None, Instant::now());
        assert_eq!(blocks.take("e", gone[0]), None, "expired");
    }

    #[tokio::test]
    async fn a_decode_waiting_first_hears_its_prefill() {
        let rooms: &'static Rooms = Box::leak(Box::default());
        let deadline = Instant::now() + Duration::from_secs(10);
        let waiter = tokio::spawn(async move { rooms.wait(7, deadline).await });
        tokio::task::yield_now().await;
        let ready = RoomState::Ready {
            bootstrap: ("127.0.0.1".into(), 8998),
            prompt_tokens: 12,
        };
        rooms.settle(7, ready.clone(), None, deadline);
        assert_eq!(waiter.await.unwrap(), ready);
        let soon = Instant::now() + Duration::from_millis(10);
        assert!(matches!(rooms.wait(8, soon).await, RoomState::Failed(_)));
    }
}
