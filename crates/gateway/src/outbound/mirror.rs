//! Shadow traffic: a copy of a sampled share of a model's requests goes
//! to a shadow pool, off the request's task. The copy's answer is read to
//! its end and thrown away; the client never waits for it and never sees
//! it. A mirror holds at most `maxInFlight` copies at once: a copy that
//! finds no room, or no replica with room in the shadow pool, is dropped
//! and counted, never queued, so a slow or failing shadow pool cannot
//! hold memory, connections or time of the primary path.
//!
//! Both sides of a mirrored request are measured into the same metrics
//! (`infergate_mirror_*{role="primary"|"shadow"}`): TTFT, duration,
//! tokens per second and errors, for a side-by-side comparison.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Uri};
use http_body::Body as _;
use http_body_util::BodyExt;
use rand::Rng;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::generation::pool::Pool;
use crate::inbound::server::WorkerId;
use crate::outbound::{self, Forwarded};
use crate::rate_limits::glob_matches;
use crate::route::table::ModelTable;
use crate::telemetry::Metrics;
use crate::telemetry::response::ResponseMeter;
use crate::telemetry::rollout::MirrorMetrics;

/// One generation's mirrors; the first that matches a request's model
/// applies.
#[derive(Default)]
pub struct Mirrors {
    rules: Vec<Arc<Mirror>>,
}

pub struct Mirror {
    model: String,
    fraction: f64,
    pool: Arc<Pool>,
    /// The model the copy asks for, when it is rewritten.
    target_model: Option<String>,
    /// The adapter the copy asks for, when the target is one.
    adapter: Option<String>,
    /// Room for copies in flight; shared by the generations that keep the
    /// mirror, so a reload cannot double it.
    room: Arc<Semaphore>,
    pub metrics: MirrorMetrics,
}

/// Every mirror's room by name and size: what one generation hands the
/// next.
#[derive(Default)]
pub struct MirrorRoom {
    by_label: HashMap<String, (usize, Arc<Semaphore>)>,
}

impl MirrorRoom {
    /// The mirrors of `spec` over this generation's routes and pools.
    pub fn build(
        &mut self,
        spec: &config::Spec,
        routes: &ModelTable,
        pools: &[Arc<Pool>],
        metrics: &Metrics,
    ) -> Mirrors {
        let mut kept = HashMap::new();
        let mut rules = Vec::with_capacity(spec.mirrors.len());
        for m in &spec.mirrors {
            // Validation checked that the target resolves.
            let (pool, adapter) = match (&m.target_model, &m.pool) {
                (Some(model), _) => match routes.resolve(model) {
                    Ok(route) => (Arc::clone(&route.pool), route.adapter.clone()),
                    Err(_) => continue,
                },
                (None, Some(name)) => match pools.iter().find(|p| &**p.name() == name) {
                    Some(pool) => (Arc::clone(pool), None),
                    None => continue,
                },
                (None, None) => continue,
            };
            let label = m.label();
            let size = m.max_in_flight();
            let room = match self.by_label.remove(&label) {
                Some((s, room)) if s == size => room,
                _ => Arc::new(Semaphore::new(size)),
            };
            kept.insert(label.clone(), (size, Arc::clone(&room)));
            rules.push(Arc::new(Mirror {
                model: m.model.clone(),
                fraction: m.fraction,
                pool,
                target_model: m.target_model.clone(),
                adapter,
                room,
                metrics: metrics.rollout.mirror(&label),
            }));
        }
        self.by_label = kept;
        Mirrors { rules }
    }
}

impl Mirrors {
    /// The mirror that copies this request for `model`, if the request is
    /// sampled.
    pub fn sample(&self, model: &str) -> Option<&Arc<Mirror>> {
        let mirror = self.rules.iter().find(|m| glob_matches(&m.model, model))?;
        (mirror.fraction >= 1.0 || rand::thread_rng().gen_bool(mirror.fraction.max(0.0)))
            .then_some(mirror)
    }
}

/// What a copy is sent with: the request as the replica would get it,
/// owned, since the copy outlives the request's stages.
pub struct ShadowRequest {
    pub method: Method,
    pub uri: Uri,
    /// The client's fields, less the credential the gateway consumed, plus
    /// the tenant field the gateway sets.
    pub headers: HeaderMap,
    pub body: Bytes,
    pub request_id: HeaderValue,
    pub traceparent: HeaderValue,
    pub forwarded: Forwarded,
    pub estimated_tokens: u64,
    pub first_byte: Duration,
    pub idle: Duration,
}

impl ShadowRequest {
    /// The client's header fields as a replica gets them: without the
    /// credential the gateway consumed, with the tenant field it sets.
    pub fn headers(client: &HeaderMap, caller: outbound::CallerFields<'_>) -> HeaderMap {
        let mut headers = client.clone();
        for name in caller.removed.into_iter().flatten() {
            headers.remove(name);
        }
        if let Some((name, value)) = caller.tenant {
            headers.insert(name.clone(), value.clone());
        }
        headers
    }
}

impl Mirror {
    /// Whether copies go with the client's body as it came (a mirror to a
    /// pool), rather than asking for another model.
    pub fn keeps_model(&self) -> bool {
        self.target_model.is_none()
    }

    /// Send `copy` on a task of its own, on this worker, if there is room;
    /// count it either way. Never waits.
    pub fn send(self: &Arc<Self>, worker: WorkerId, mut copy: ShadowRequest) {
        let Ok(permit) = Arc::clone(&self.room).try_acquire_owned() else {
            self.metrics.dropped_saturated.inc();
            return;
        };
        if let Some(model) = &self.target_model {
            match crate::route::rewrite::model_field::with_model(&copy.body, model) {
                Some(body) => copy.body = body,
                None => return,
            }
        }
        let pick = picker::PickRequest {
            adapter: self.adapter.as_deref(),
            estimated_tokens: copy.estimated_tokens,
            ..picker::PickRequest::default()
        };
        let admitted = match self.pool.runtime().admission().pick_now(&pick, &[]) {
            Ok(admitted) => admitted,
            Err(_) => {
                self.metrics.dropped_no_replica.inc();
                return;
            }
        };
        self.metrics.sent.inc();
        self.metrics.in_flight.inc();
        let mirror = Arc::clone(self);
        tokio::spawn(async move {
            let started = Instant::now();
            let addr = admitted.decision.endpoint.addr.clone();
            let outgoing = outbound::Outgoing {
                method: &copy.method,
                uri: &copy.uri,
                headers: &copy.headers,
                body: &copy.body,
                request_id: &copy.request_id,
                traceparent: &copy.traceparent,
                forwarded: &copy.forwarded,
                caller: outbound::CallerFields::default(),
            };
            let deadline = started + copy.first_byte;
            let sent = tokio::time::timeout_at(
                deadline,
                mirror
                    .pool
                    .runtime()
                    .connections(worker)
                    .send(&addr, &outgoing),
            )
            .await;
            let (status, ttft, tokens) = match sent {
                Ok(Ok(answer)) => read_to_end(answer, started, copy.idle).await,
                _ => (502, None, None),
            };
            let failed = status == 429 || status >= 500;
            if failed {
                mirror.metrics.failed.inc();
            }
            mirror
                .metrics
                .shadow
                .observe(status, ttft, started.elapsed(), tokens);
            mirror.metrics.in_flight.dec();
            // The replica's load and the mirror's room, released together.
            drop(admitted);
            drop(permit);
        });
    }
}

/// Read a copy's answer to its end (an idle stream counts as failed):
/// its status, TTFT and completion tokens.
async fn read_to_end(
    mut answer: outbound::Response,
    started: Instant,
    idle: Duration,
) -> (u16, Option<Duration>, Option<u64>) {
    let mut status = answer.status.as_u16();
    let mut meter = ResponseMeter::new(crate::headers::is_event_stream(&answer.headers));
    let mut ttft = None;
    while !answer.body.is_end_stream() {
        match tokio::time::timeout(idle, answer.body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let events = meter.on_frame(data).count;
                    if ttft.is_none() && (events > 0 || !meter.is_sse()) {
                        ttft = Some(started.elapsed());
                    }
                }
            }
            Ok(None) => break,
            Ok(Some(Err(_))) | Err(_) => {
                status = 502;
                break;
            }
        }
    }
    // A whole body is the first token of a non-streamed answer.
    if !meter.is_sse() {
        ttft = Some(started.elapsed());
    }
    let tokens = meter.usage().and_then(|u| u.completion_tokens);
    (status, ttft, tokens)
}
