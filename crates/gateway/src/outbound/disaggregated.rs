//! Prefill/decode disaggregation, on the forward stage: the replica
//! admission picked is the decode replica (prefix affinity, KV room,
//! load); this module decides whether a prefill replica computes the
//! prompt first, picks it (the least prefill work outstanding from this
//! gateway), and drives the engines' hand-off.
//!
//! - **vLLM** (a KV connector such as NixlConnector): the prefill leg goes
//!   first, non-streamed, `max_tokens: 1`, without `stream_options`, with
//!   `kv_transfer_params` asking for a remote decode; its answer's
//!   `kv_transfer_params` go into the decode leg's body. A prefill that
//!   fails or times out is tried on another prefill replica, then left to
//!   the decode replica alone.
//! - **SGLang**: the same body, with `bootstrap_host`, `bootstrap_port` and
//!   a random `bootstrap_room`, goes to the prefill and the decode at once;
//!   the decode's answer is the client's. A prefill that fails before the
//!   decode's answer starts cancels the decode leg, which is sent again
//!   alone with the plain body.
//!
//! Both legs carry the request's `X-Request-Id`. The prefill leg of SGLang
//! lives in the request's record, so a client that goes away cancels both
//! legs. Nothing is generated twice: a decode leg is only ever sent again
//! before any of its answer was read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use config::KvProtocol;
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::Instrument;

use super::connections::{Connections, Error};
use super::{Outgoing, Response};
use crate::flow::Admitted;
use crate::generation::pool::Pool;
use crate::generation::prefills::{PrefillTask, Prefills};
use crate::inbound::server::WorkerId;
use crate::record::{Legs, Record};
use crate::telemetry::stage_span;

/// What the disaggregated legs need of the request the forward stage
/// sends.
pub struct Job<'a> {
    pub pool: &'a Arc<Pool>,
    pub worker: WorkerId,
    pub outgoing: &'a Outgoing<'a>,
    /// Estimated prompt tokens, for a pick that did not match prefixes.
    pub prompt_tokens: u64,
}

/// Largest prefill answer read (a one-token completion and its
/// `kv_transfer_params` with a block id per 16 prompt tokens).
const PREFILL_ANSWER_LIMIT: usize = 8 * 1024 * 1024;

/// How the decode leg is sent.
pub struct Split {
    /// The decode leg's body: the client's with the hand-off's fields.
    body: Bytes,
    sglang: Option<SglangLeg>,
}

/// SGLang's concurrent prefill leg: `Some(true)` once it answered,
/// `Some(false)` once it failed.
struct SglangLeg {
    outcome: watch::Receiver<Option<bool>>,
    /// The room was used by a decode leg; a retry goes alone.
    room_spent: AtomicBool,
    abort: tokio::task::AbortHandle,
}

/// Before the decode leg: whether a prefill replica computes the prompt,
/// and the body the decode leg is sent with. `None` for a pool that is not
/// disaggregated, and for a prompt the decider leaves to the decode
/// replica or whose prefill failed on every prefill replica (vLLM).
pub async fn split(job: &Job<'_>, admitted: &Admitted, record: &mut Record) -> Option<Split> {
    let prefills = job.pool.disaggregation()?;
    // Only generations are split (the engines' protocols are theirs);
    // embeddings and the rest go to the decode replica as they are.
    super::continuation::Api::of_path(job.outgoing.uri.path())?;
    let metrics = job.pool.metrics();
    let protocol = prefills.protocol().as_str();
    // What the decode replica must compute itself: the prompt less the
    // prefix the picker believes it holds.
    let uncached = admitted
        .decision
        .latency
        .as_ref()
        .map_or(job.prompt_tokens, |(features, _)| {
            features.new_prompt_tokens.max(0.0) as u64
        });
    if uncached < prefills.min_uncached_tokens() {
        metrics.count_leg("prefill", "skipped");
        metrics.count_leg("decode", "local");
        record.disaggregated(Legs::new(protocol, "skipped", uncached));
        return None;
    }
    let mut legs = Legs::new(protocol, "remote", uncached);
    let split = match prefills.protocol() {
        KvProtocol::Vllm => vllm_prefill(job, prefills, uncached, &mut legs).await,
        KvProtocol::Sglang => sglang_prefill(job, prefills, uncached, &mut legs),
    };
    if split.is_none() {
        legs.outcome = "fallback";
    }
    metrics.count_leg("decode", if split.is_some() { "remote" } else { "local" });
    record.disaggregated(legs);
    split
}

/// vLLM: the prefill leg, on each prefill replica in turn (within the
/// pool's retries) until one answers with its `kv_transfer_params`.
async fn vllm_prefill(
    job: &Job<'_>,
    prefills: &Arc<Prefills>,
    uncached: u64,
    legs: &mut Legs,
) -> Option<Split> {
    let plain = job.outgoing.body.clone();
    let prefill_body = vllm_prefill_body(&plain)?;
    let connections = job.pool.runtime().connections(job.worker);
    let metrics = job.pool.metrics();
    let mut tried = Vec::new();
    while tried.len() <= job.pool.max_retries() {
        let replica = prefills.pick(&tried)?;
        tried.push(Arc::clone(&replica.addr));
        let _load = replica.load(uncached);
        let started = Instant::now();
        let outgoing = job.outgoing.with_body(&prefill_body);
        let answer = tokio::time::timeout(
            prefills.timeout(),
            read_prefill(connections, &replica.addr, &outgoing),
        )
        .instrument(stage_span!("prefill", endpoint = %replica.addr, otel.kind = "client"))
        .await;
        let took = started.elapsed();
        let failure = match answer {
            Ok(Ok(answer)) => match answer.get("kv_transfer_params") {
                Some(params @ Value::Object(_)) => {
                    metrics.count_leg("prefill", "sent");
                    metrics.observe_leg("prefill", took);
                    legs.prefilled(Arc::clone(&replica.addr), took);
                    let body = with_fields(&plain, [("kv_transfer_params", params.clone())])?;
                    return Some(Split { body, sglang: None });
                }
                _ => "its answer carries no kv_transfer_params".to_owned(),
            },
            Ok(Err(failure)) => failure,
            Err(_elapsed) => format!("no answer within {:?}", prefills.timeout()),
        };
        metrics.count_leg("prefill", "failed");
        legs.failed_prefills += 1;
        tracing::warn!(pool = %job.pool.name(), prefill = %replica.addr, error = %failure,
            "prefill leg failed");
    }
    None
}

/// A prefill leg's whole answer, as JSON, or why there is none.
async fn read_prefill(
    connections: &Connections,
    addr: &str,
    outgoing: &Outgoing<'_>,
) -> Result<Value, String> {
    let answer = connections
        .send(addr, outgoing)
        .await
        .map_err(|e| e.to_string())?;
    let status = answer.status;
    let body = http_body_util::Limited::new(answer.body, PREFILL_ANSWER_LIMIT)
        .collect()
        .await
        .map_err(|e| format!("its answer broke: {e}"))?
        .to_bytes();
    if !status.is_success() {
        return Err(format!(
            "it answered {status}: {}",
            String::from_utf8_lossy(&body[..body.len().min(200)])
        ));
    }
    serde_json::from_slice(&body).map_err(|e| format!("its answer is not JSON: {e}"))
}

/// SGLang: the prefill leg starts now, beside the decode leg the forward
/// stage sends; both carry the prefill's bootstrap address and the room.
fn sglang_prefill(
    job: &Job<'_>,
    prefills: &Arc<Prefills>,
    uncached: u64,
    legs: &mut Legs,
) -> Option<Split> {
    let replica = prefills.pick(&[])?;
    let plain = job.outgoing.body.clone();
    // SGLang's rooms are 0..2^63-1.
    let room = rand::random::<u64>() >> 1;
    let body = with_fields(
        &plain,
        [
            ("bootstrap_host", json!(replica.host)),
            ("bootstrap_port", json!(prefills.bootstrap_port())),
            ("bootstrap_room", json!(room)),
        ],
    )?;
    let (sender, outcome) = watch::channel(None);
    let load = replica.load(uncached);
    let pool = Arc::clone(job.pool);
    let worker = job.worker;
    let addr = Arc::clone(&replica.addr);
    let kept = job.outgoing.keep();
    let prefill_body = body.clone();
    let timeout = prefills.timeout();
    let prefill_time = legs.prefill_time.clone();
    let span = stage_span!("prefill", endpoint = %addr, otel.kind = "client");
    let task = tokio::spawn(
        async move {
            let _load = load;
            let started = Instant::now();
            let request = kept.with_body(prefill_body);
            let leg = async {
                let answer = pool
                    .runtime()
                    .connections(worker)
                    .send(&addr, &request)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = answer.status;
                // Read to the end: the prefill is done when its answer is.
                answer
                    .body
                    .collect()
                    .await
                    .map_err(|e| format!("its answer broke: {e}"))?;
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!("it answered {status}"))
                }
            };
            let outcome = match tokio::time::timeout(timeout, leg).await {
                Ok(outcome) => outcome,
                Err(_elapsed) => Err(format!("no answer within {timeout:?}")),
            };
            let metrics = pool.metrics();
            match &outcome {
                Ok(()) => {
                    let took = started.elapsed();
                    prefill_time.set(took);
                    metrics.count_leg("prefill", "sent");
                    metrics.observe_leg("prefill", took);
                }
                Err(error) => {
                    metrics.count_leg("prefill", "failed");
                    tracing::warn!(pool = %pool.name(), prefill = %addr, %error,
                        "prefill leg failed");
                }
            }
            let _ = sender.send(Some(outcome.is_ok()));
        }
        .instrument(span),
    );
    let abort = task.abort_handle();
    legs.prefill = Some(Arc::clone(&replica.addr));
    legs.task = Some(PrefillTask::new(task.abort_handle()));
    Some(Split {
        body,
        sglang: Some(SglangLeg {
            outcome,
            room_spent: AtomicBool::new(false),
            abort,
        }),
    })
}

/// Sends the decode leg: with the hand-off's fields when the request was
/// split, else as the client sent it. For SGLang, a prefill that fails
/// before the decode's answer starts cancels it (nothing of it was read),
/// and the decode replica gets the client's request alone; a decode sent
/// again after a failure goes alone too, its room being spent.
pub async fn send_decode(
    connections: &Connections,
    addr: &str,
    outgoing: &Outgoing<'_>,
    split: Option<&Split>,
    record: &mut Record,
) -> Result<Response, Error> {
    let Some(split) = split else {
        return connections.send(addr, outgoing).await;
    };
    let handed = outgoing.with_body(&split.body);
    let Some(leg) = &split.sglang else {
        return connections.send(addr, &handed).await;
    };
    if leg.room_spent.swap(true, Ordering::Relaxed) {
        return connections.send(addr, outgoing).await;
    }
    let mut outcome = leg.outcome.clone();
    let prefill_failed = async move {
        let _ = outcome.wait_for(|o| *o == Some(false)).await;
        // A prefill that succeeded (or whose task is gone) never fails it.
        if *outcome.borrow() != Some(false) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        answer = connections.send(addr, &handed) => answer,
        () = prefill_failed => {
            leg.abort.abort();
            record.prefill_fell_back();
            connections.send(addr, outgoing).await
        }
    }
}

/// The vLLM prefill leg's body: the client's, asking the prefill replica to
/// hold the prompt's KV for a remote decode and answer with one token,
/// whole.
fn vllm_prefill_body(body: &Bytes) -> Option<Bytes> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    let fields = value.as_object_mut()?;
    fields.insert(
        "kv_transfer_params".into(),
        json!({
            "do_remote_decode": true,
            "do_remote_prefill": false,
            "remote_engine_id": null,
            "remote_block_ids": null,
            "remote_host": null,
            "remote_port": null,
        }),
    );
    fields.insert("max_tokens".into(), json!(1));
    if fields.contains_key("max_completion_tokens") {
        fields.insert("max_completion_tokens".into(), json!(1));
    }
    fields.insert("stream".into(), json!(false));
    fields.remove("stream_options");
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

/// `body` (a JSON object, as the parse stage found it) with `fields` set.
fn with_fields<const N: usize>(body: &Bytes, fields: [(&str, Value); N]) -> Option<Bytes> {
    let mut value: Map<String, Value> = serde_json::from_slice(body).ok()?;
    for (name, field) in fields {
        value.insert(name.to_owned(), field);
    }
    serde_json::to_vec(&value).ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vllm_prefill_leg_asks_for_one_token_whole_and_a_remote_decode() {
        let body = Bytes::from_static(
            br#"{"model":"m","messages":[],"stream":true,"stream_options":{"include_usage":true},"max_completion_tokens":300}"#,
        );
        let prefill: Value = serde_json::from_slice(&vllm_prefill_body(&body).unwrap()).unwrap();
        assert_eq!(prefill["max_tokens"], 1);
        assert_eq!(prefill["max_completion_tokens"], 1);
        assert_eq!(prefill["stream"], false);
        assert!(prefill.get("stream_options").is_none());
        assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(prefill["kv_transfer_params"]["do_remote_prefill"], false);
        assert!(prefill["kv_transfer_params"]["remote_block_ids"].is_null());
        assert_eq!(prefill["model"], "m");
    }
}
