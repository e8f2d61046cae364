//! The request side of prefill/decode disaggregation (see
//! [`crate::disaggregation`]): which leg a generation request is, checked
//! against the replica's role, and the hand-off each leg makes.

use std::net::SocketAddr;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::body::ApiError;
use crate::disaggregation::{
    self, DisaggregationSpec, HELD_BLOCKS, HELD_KV_TIMEOUT_SECONDS, HeldKv, ROOM_TIMEOUT_SECONDS,
    ROOMS, Release, Role, RoomState,
};
use crate::engine::KvLink;

/// A replica's side of disaggregation, as its handlers need it.
pub(crate) struct Disaggregated {
    pub spec: DisaggregationSpec,
    /// vLLM's engine id, unique per replica start.
    pub engine_id: String,
    pub addr: SocketAddr,
    pub block_size: u32,
    pub tensor_parallel: u32,
    pub time_scale: f64,
}

/// What part of a disaggregated request a body asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Leg {
    /// An ordinary request: prefill and decode here.
    Whole,
    /// vLLM: compute the prompt and hold its KV for a remote decode.
    VllmPrefill,
    /// vLLM: pull the prompt's KV from a prefill replica, then decode.
    VllmDecode { engine_id: String, first_block: u64 },
    /// SGLang: compute the prompt for the decode paired by `room`.
    SglangPrefill { room: u64 },
    /// SGLang: wait for `room`'s prefill at the bootstrap address, pull,
    /// decode.
    SglangDecode { room: u64, bootstrap: (String, u16) },
}

impl Leg {
    /// The leg `body` asks for, or the engine's 400 for malformed or
    /// misdirected parameters.
    pub(super) fn of(body: &[u8], side: &Disaggregated) -> Result<Leg, ApiError> {
        // The body is parsed in full by the endpoint after this; a body
        // that is not a JSON object gets its error there.
        let Ok(Value::Object(fields)) = serde_json::from_slice::<Value>(body) else {
            return Ok(Leg::Whole);
        };
        if let Some(params) = fields.get("kv_transfer_params").filter(|v| !v.is_null()) {
            return vllm_leg(params, side.spec.role);
        }
        if fields.get("bootstrap_room").is_some_and(|v| !v.is_null()) {
            return sglang_leg(&fields, side);
        }
        Ok(Leg::Whole)
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message).with_param("kv_transfer_params")
}

fn vllm_leg(params: &Value, role: Role) -> Result<Leg, ApiError> {
    let Value::Object(params) = params else {
        return Err(invalid("kv_transfer_params must be an object"));
    };
    let flag = |name: &str| match params.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(flag)) => Ok(*flag),
        Some(other) => Err(invalid(format!(
            "kv_transfer_params.{name} must be a boolean, got {other}"
        ))),
    };
    match (flag("do_remote_decode")?, flag("do_remote_prefill")?) {
        (true, true) => Err(invalid(
            "kv_transfer_params cannot ask for both do_remote_decode and do_remote_prefill",
        )),
        (true, false) if role == Role::Decode => Err(invalid(
            "this replica is a KV consumer (decode role) and cannot prefill for a remote decode",
        )),
        (true, false) => Ok(Leg::VllmPrefill),
        (false, true) if role == Role::Prefill => Err(invalid(
            "this replica is a KV producer (prefill role) and cannot decode from a remote prefill",
        )),
        (false, true) => {
            let engine_id = match params.get("remote_engine_id") {
                Some(Value::String(id)) if !id.is_empty() => id.clone(),
                _ => {
                    return Err(invalid(
                        "do_remote_prefill needs kv_transfer_params.remote_engine_id (a string)",
                    ));
                }
            };
            let blocks = match params.get("remote_block_ids") {
                Some(Value::Array(ids)) => {
                    ids.iter().map(Value::as_u64).collect::<Option<Vec<_>>>()
                }
                _ => None,
            };
            let Some(first_block) = blocks.and_then(|ids| ids.first().copied()) else {
                return Err(invalid(
                    "do_remote_prefill needs kv_transfer_params.remote_block_ids (a non-empty list of block ids)",
                ));
            };
            if !params.get("remote_host").is_some_and(Value::is_string) {
                return Err(invalid(
                    "do_remote_prefill needs kv_transfer_params.remote_host (a string)",
                ));
            }
            let port = params.get("remote_port").and_then(Value::as_u64);
            if port.is_none_or(|port| port > u64::from(u16::MAX)) {
                return Err(invalid(
                    "do_remote_prefill needs kv_transfer_params.remote_port (a port number)",
                ));
            }
            Ok(Leg::VllmDecode {
                engine_id,
                first_block,
            })
        }
        (false, false) => Ok(Leg::Whole),
    }
}

fn sglang_leg(
    fields: &serde_json::Map<String, Value>,
    side: &Disaggregated,
) -> Result<Leg, ApiError> {
    let room = fields
        .get("bootstrap_room")
        .and_then(Value::as_u64)
        .filter(|room| *room <= i64::MAX as u64)
        .ok_or_else(|| {
            ApiError::bad_request("bootstrap_room must be an integer in 0..2^63-1")
                .with_param("bootstrap_room")
        })?;
    let host = match fields.get("bootstrap_host") {
        Some(Value::String(host)) if !host.is_empty() => host.clone(),
        _ => {
            return Err(ApiError::bad_request(
                "bootstrap_room needs bootstrap_host (the prefill's host)",
            )
            .with_param("bootstrap_host"));
        }
    };
    let port = fields
        .get("bootstrap_port")
        .and_then(Value::as_u64)
        .and_then(|port| u16::try_from(port).ok())
        .ok_or_else(|| {
            ApiError::bad_request(
                "bootstrap_room needs bootstrap_port (the prefill's bootstrap port)",
            )
            .with_param("bootstrap_port")
        })?;
    match side.spec.role {
        // A server outside disaggregation mode ignores the fields.
        Role::Both => Ok(Leg::Whole),
        Role::Prefill => {
            let own_host = side.addr.ip();
            let named = host.trim_start_matches('[').trim_end_matches(']');
            if named.parse().ok() != Some(own_host) || port != side.spec.bootstrap_port {
                return Err(ApiError::bad_request(format!(
                    "bootstrap address {host}:{port} is not this prefill server's ({}:{})",
                    bracketed(own_host),
                    side.spec.bootstrap_port
                ))
                .with_param("bootstrap_host"));
            }
            Ok(Leg::SglangPrefill { room })
        }
        Role::Decode => Ok(Leg::SglangDecode {
            room,
            bootstrap: (host, port),
        }),
    }
}

/// A host as it goes in a `host:port` string (IPv6 in brackets).
pub(crate) fn bracketed(ip: std::net::IpAddr) -> String {
    match ip {
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        std::net::IpAddr::V4(v4) => v4.to_string(),
    }
}

impl Disaggregated {
    fn deadline(&self, engine_seconds: f64) -> Instant {
        Instant::now() + disaggregation::wall(engine_seconds, self.time_scale)
    }

    /// vLLM prefill done: hold the prompt's KV (freed by `release` when a
    /// decode pulls it, or when the hold expires) and say how to pull it.
    pub(super) fn hold_for_remote_decode(&self, prompt_tokens: u32, release: Release) -> Value {
        let blocks = prompt_tokens.div_ceil(self.block_size.max(1));
        let ids = HELD_BLOCKS.hold(
            &self.engine_id,
            HeldKv { prompt_tokens },
            blocks,
            Some(release),
            self.deadline(HELD_KV_TIMEOUT_SECONDS),
        );
        json!({
            "do_remote_prefill": true,
            "do_remote_decode": false,
            "remote_block_ids": ids,
            "remote_engine_id": self.engine_id,
            "remote_host": self.addr.ip().to_string(),
            "remote_port": self.addr.port(),
            "tp_size": self.tensor_parallel,
        })
    }

    /// vLLM decode: the link to pull the held KV over, or `None` when it is
    /// gone (expired, pulled, or another prompt's): the prompt is then
    /// recomputed here, as vLLM's `recompute` load-failure policy does.
    pub(super) fn pull_held(
        &self,
        engine_id: &str,
        first_block: u64,
        prompt_tokens: u32,
    ) -> Option<KvLink> {
        match HELD_BLOCKS.take(engine_id, first_block) {
            Some(held) if held.prompt_tokens == prompt_tokens => Some(self.spec.link),
            found => {
                tracing::warn!(
                    engine_id,
                    first_block,
                    found = found.is_some(),
                    "remote KV not available: recomputing the prompt"
                );
                None
            }
        }
    }

    /// SGLang prefill: the decode of `room` may pull now, the prefill's KV
    /// held until it does (or must give up).
    pub(super) fn settle_room(&self, room: u64, outcome: Result<(u32, Release), String>) {
        let (state, release) = match outcome {
            Ok((prompt_tokens, release)) => (
                RoomState::Ready {
                    bootstrap: (bracketed(self.addr.ip()), self.spec.bootstrap_port),
                    prompt_tokens,
                },
                Some(release),
            ),
            Err(reason) => (RoomState::Failed(reason), None),
        };
        ROOMS.settle(room, state, release, self.deadline(ROOM_TIMEOUT_SECONDS));
    }

    /// SGLang decode: waits for `room`'s prefill; the link to pull over, or
    /// the error the decode answers with.
    pub(super) async fn wait_room(
        &self,
        room: u64,
        bootstrap: &(String, u16),
        prompt_tokens: u32,
    ) -> Result<KvLink, ApiError> {
        let failed = |reason: String| {
            ApiError::internal(format!(
                "KV transfer for bootstrap room {room} failed: {reason}"
            ))
        };
        match ROOMS.wait(room, self.deadline(ROOM_TIMEOUT_SECONDS)).await {
            RoomState::Ready {
                bootstrap: (host, port),
                prompt_tokens: computed,
            } => {
                let named = bootstrap.0.trim_start_matches('[').trim_end_matches(']');
                let served = host.trim_start_matches('[').trim_end_matches(']');
                if named != served || bootstrap.1 != port {
                    return Err(failed(format!(
                        "the room was prefilled at {host}:{port}, not at {}:{}",
                        bootstrap.0, bootstrap.1
                    )));
                }
                if computed != prompt_tokens {
                    return Err(failed(format!(
                        "the prefill computed {computed} tokens, this prompt has {prompt_tokens}"
                    )));
                }
                // Pulled: the prefill's copy is free.
                ROOMS.release(room);
                Ok(self.spec.link)
            }
            RoomState::Failed(reason) => Err(failed(reason)),
            RoomState::Pending => unreachable!("a room is waited on until settled"),
        }
    }
}

/// Settles an SGLang room as failed unless the prefill completed: a
/// prefill that errs or whose client goes away releases its decode.
pub(super) struct RoomGuard<'a> {
    side: &'a Disaggregated,
    room: Option<u64>,
}

impl<'a> RoomGuard<'a> {
    pub(super) fn new(side: &'a Disaggregated, room: Option<u64>) -> Self {
        Self { side, room }
    }

    pub(super) fn complete(mut self, prompt_tokens: u32, release: Release) {
        if let Some(room) = self.room.take() {
            self.side.settle_room(room, Ok((prompt_tokens, release)));
        }
    }
}

impl Drop for RoomGuard<'_> {
    fn drop(&mut self) {
        if let Some(room) = self.room.take() {
            self.side.settle_room(
                room,
                Err("the prefill request ended without a result".into()),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(role: Role) -> Disaggregated {
        Disaggregated {
            spec: DisaggregationSpec {
                role,
                ..DisaggregationSpec::default()
            },
            engine_id: "e".into(),
            addr: "127.0.0.1:8000".parse().unwrap(),
            block_size: 16,
            tensor_parallel: 1,
            time_scale: 1.0,
        }
    }

    fn leg(body: Value, role: Role) -> Result<Leg, ApiError> {
        Leg::of(body.to_string().as_bytes(), &side(role))
    }

    #[test]
    fn vllm_legs_are_read_and_checked_against_the_role() {
        let prefill = json!({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null, "remote_host": null, "remote_port": null}});
        assert_eq!(
            leg(prefill.clone(), Role::Prefill).unwrap(),
            Leg::VllmPrefill
        );
        assert_eq!(leg(prefill.clone(), Role::Both).unwrap(), Leg::VllmPrefill);
        assert_eq!(leg(prefill, Role::Decode).unwrap_err().status, 400);
        let decode = json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "x",
            "remote_block_ids": [4, 5], "remote_host": "10.0.0.1", "remote_port": 5600}});
        assert_eq!(
            leg(decode.clone(), Role::Decode).unwrap(),
            Leg::VllmDecode {
                engine_id: "x".into(),
                first_block: 4
            }
        );
        assert_eq!(leg(decode, Role::Prefill).unwrap_err().status, 400);
        for broken in [
            json!({"kv_transfer_params": "yes"}),
            json!({"kv_transfer_params": {"do_remote_decode": "true"}}),
            json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "x",
                "remote_block_ids": [], "remote_host": "h", "remote_port": 1}}),
            json!({"kv_transfer_params": {"do_remote_prefill": true, "remote_engine_id": "x",
                "remote_block_ids": [1], "remote_host": "h", "remote_port": 70000}}),
        ] {
            let error = leg(broken.clone(), Role::Decode).unwrap_err();
            assert_eq!(error.status, 400, "{broken}");
            assert_eq!(error.param, Some("kv_transfer_params"));
        }
        assert_eq!(
            leg(json!({"kv_transfer_params": null}), Role::Decode).unwrap(),
            Leg::Whole
        );
    }

    #[test]
    fn sglang_legs_pair_by_room_and_the_prefill_checks_its_address() {
        let body = |host: &str, port: u16| json!({"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 42});
        assert_eq!(
            leg(body("127.0.0.1", 8998), Role::Prefill).unwrap(),
            Leg::SglangPrefill { room: 42 }
        );
        assert_eq!(
            leg(body("127.0.0.2", 8998), Role::Prefill)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            leg(body("127.0.0.1", 9000), Role::Prefill)
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            leg(body("[::1]", 8998), Role::Decode).unwrap(),
            Leg::SglangDecode {
                room: 42,
                bootstrap: ("[::1]".into(), 8998)
            }
        );
        assert_eq!(
            leg(body("127.0.0.1", 8998), Role::Both).unwrap(),
            Leg::Whole
        );
        let too_big =
            json!({"bootstrap_host": "h", "bootstrap_port": 1, "bootstrap_room": u64::MAX});
        assert_eq!(
            leg(too_big, Role::Decode).unwrap_err().param,
            Some("bootstrap_room")
        );
        let no_port = json!({"bootstrap_host": "h", "bootstrap_room": 1});
        assert_eq!(
            leg(no_port, Role::Decode).unwrap_err().param,
            Some("bootstrap_port")
        );
    }
}
