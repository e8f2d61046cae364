//! Stage 10, record: what happened to one request. The stages set its
//! facts, each through the method named for what it decided (a field is
//! never assigned from outside); [`settle`] owns every side effect of the
//! request's end, in one place.
//!
//! A [`Record`] travels with the request. When the answer is a gateway error
//! it is dropped at the end of the pipeline; when the answer is streamed
//! from a replica it moves into the response body and is dropped when the
//! stream ends, so TTFT, inter-token times and duration cover what the
//! client actually saw. The request's span lives in the record too, so a
//! trace covers the whole response.

use std::sync::Arc;
use std::time::Duration;

use config::Priority;
use http::StatusCode;
use picker::{Decision, TopScores};
use tokio::time::Instant;

use crate::error::ApiError;
use crate::rate_limits::{Outcome, RateHeaders, Refused, Reservation};
use crate::route::rewrite::Served;
use crate::telemetry::decisions::Pending;
use crate::telemetry::response::{EventClock, ResponseMeter, Usage};
use crate::telemetry::rollout::MirrorMetrics;
use crate::telemetry::{RouteMetrics, refusal_reason};

mod settle;

/// Who a request came from, as the access log shows it.
#[derive(Debug)]
pub struct Caller {
    pub tenant: Arc<str>,
    /// Its `tenant` label on metrics.
    pub label: crate::telemetry::TenantLabel,
    /// The API key's `name`, when an API key with a name authenticated it.
    pub key: Option<Arc<str>>,
    /// The token's issuer, when a token authenticated it.
    pub issuer: Option<Arc<str>>,
}

#[derive(Debug)]
pub struct Record {
    /// Shares the bytes of the header it came from (or was sent back in).
    request_id: http::HeaderValue,
    /// The authenticated caller (tenant `anonymous` when authentication
    /// is off), once known.
    caller: Option<Caller>,
    model: Option<String>,
    pool: Option<Arc<str>>,
    endpoint: Option<Arc<str>>,
    /// The global member that answered (or was tried last).
    member: Option<Arc<str>>,
    status: u16,
    stream: bool,
    retries: u32,
    /// Winner's and runner-up's scores, when the pool scores replicas.
    decision: Option<TopScores>,
    /// What the picker knew of the chosen replica, and what it predicted,
    /// for the replica's latency model to learn from the answer.
    latency: Option<(picker::LatencyFeatures, Option<picker::LatencyPrediction>)>,
    /// Which index scored the chosen replica's prefix affinity.
    prefix_source: Option<picker::PrefixSource>,
    /// Flow-control band of the request, once admission has judged it.
    priority: Option<Priority>,
    /// Time spent waiting in flow control (zero when admitted at once).
    queue_wait: Option<Duration>,
    /// Trace id of the context sent to the replica.
    trace_id: Option<u128>,
    /// Held on the rate limits until the request ends, then settled.
    reservation: Option<Reservation>,
    /// Some of the request reached a replica, which may have worked on it.
    sent: bool,
    /// Set when the fleet page's decision feed samples the request.
    feed: Option<Pending>,
    /// The rewrite that chose the model served, which hears how the
    /// answer went (its guard's figures).
    rewrite: Option<Served>,
    /// Set when a copy of the request went to a mirror: the client's
    /// answer is measured beside the copy's.
    mirror: Option<MirrorMetrics>,
    /// The route's metric handles; set once the request reached routing.
    metrics: Option<Arc<RouteMetrics>>,
    span: tracing::Span,
    start: Instant,
    /// Set for a successful response from a replica.
    meter: Option<ResponseMeter>,
    clock: EventClock,
    ttft: Option<Duration>,
    usage: Option<Usage>,
    refusal: Option<&'static str>,
    /// The response body reached its end.
    finished: bool,
    error: Option<String>,
    /// The replica answering, and when the request went to it: its speed
    /// per generated token is measured on the answer.
    answering: Option<(Arc<picker::Endpoint>, Instant)>,
    /// Stream events (tokens) passed on.
    events: u64,
    /// The request's latency objectives, whose attainment is counted.
    slo: Option<picker::Slo>,
    /// The replicas the answer moved off, each with why and the tokens
    /// the client had by then.
    moves: Vec<Move>,
    /// The prefill leg of a request to a disaggregated pool.
    legs: Option<Legs>,
}

pub use crate::telemetry::decisions::Move;

/// What became of a request to a disaggregated pool: its prefill leg (the
/// decode leg is the replica the record names as `endpoint`).
#[derive(Debug)]
pub struct Legs {
    /// `vllm` or `sglang`.
    pub protocol: &'static str,
    /// `remote` (a prefill replica computed the prompt), `skipped` (the
    /// decider left a short uncached prompt to the decode replica) or
    /// `fallback` (the prefill failed: the decode replica did it all).
    pub outcome: &'static str,
    /// Prompt tokens the decode replica was not believed to hold.
    pub uncached_tokens: u64,
    pub prefill: Option<Arc<str>>,
    /// How long the prefill leg took, and when it ended; set by SGLang's
    /// concurrent leg once it answers.
    pub prefill_time: PrefillTime,
    /// Prefill replicas that failed before one answered.
    pub failed_prefills: u32,
    /// SGLang's concurrent prefill leg, cancelled when the request ends.
    pub task: Option<crate::generation::prefills::PrefillTask>,
}

/// A prefill leg's duration and end, once known: written by whichever
/// task runs the leg, read when the request ends.
#[derive(Debug, Clone, Default)]
pub struct PrefillTime(Arc<std::sync::OnceLock<(Duration, Instant)>>);

impl PrefillTime {
    /// The leg took `took`, ending now.
    pub fn set(&self, took: Duration) {
        let _ = self.0.set((took, Instant::now()));
    }

    pub fn get(&self) -> Option<(Duration, Instant)> {
        self.0.get().copied()
    }
}

impl Legs {
    pub fn new(protocol: &'static str, outcome: &'static str, uncached_tokens: u64) -> Self {
        Self {
            protocol,
            outcome,
            uncached_tokens,
            prefill: None,
            prefill_time: PrefillTime::default(),
            failed_prefills: 0,
            task: None,
        }
    }

    /// `prefill` computed the prompt in `took`, ending now.
    pub fn prefilled(&mut self, prefill: Arc<str>, took: Duration) {
        self.prefill = Some(prefill);
        self.prefill_time.set(took);
    }
}

impl Record {
    /// A request that arrived at `start`; `trace_id` is the context it
    /// carries to its replica, `feed` is set when the fleet page's decision
    /// feed samples it.
    pub fn new(
        request_id: http::HeaderValue,
        start: Instant,
        span: tracing::Span,
        trace_id: Option<u128>,
        feed: Option<Pending>,
    ) -> Self {
        Self {
            request_id,
            caller: None,
            model: None,
            pool: None,
            endpoint: None,
            member: None,
            status: 0,
            stream: false,
            retries: 0,
            decision: None,
            prefix_source: None,
            priority: None,
            queue_wait: None,
            trace_id,
            reservation: None,
            sent: false,
            feed,
            rewrite: None,
            mirror: None,
            metrics: None,
            span,
            start,
            meter: None,
            clock: EventClock::default(),
            ttft: None,
            usage: None,
            refusal: None,
            finished: false,
            error: None,
            answering: None,
            events: 0,
            slo: None,
            moves: Vec::new(),
            latency: None,
            legs: None,
        }
    }

    /// The request went to a disaggregated pool: its prefill leg.
    pub fn disaggregated(&mut self, legs: Legs) {
        self.legs = Some(legs);
    }

    /// The prefill leg failed after the decode leg was sent with its
    /// hand-off: the decode replica does it all.
    pub fn prefill_fell_back(&mut self) {
        if let Some(legs) = &mut self.legs {
            legs.outcome = "fallback";
            legs.task = None;
        }
    }

    /// Of the time to first token: the prefill leg's, and the decode leg's
    /// after it (the KV transfer and the first decode step).
    fn ttft_split(&self) -> Option<(Duration, Duration)> {
        let (took, ended) = self.legs.as_ref()?.prefill_time.get()?;
        let decode = self
            .ttft?
            .checked_sub(ended.saturating_duration_since(self.start))?;
        Some((took, decode))
    }

    /// Authentication found who the caller is.
    pub fn identified(&mut self, caller: Caller) {
        self.caller = Some(caller);
    }

    /// The caller's tenant, once authentication has found it.
    pub fn tenant(&self) -> Option<&str> {
        self.caller.as_ref().map(|c| &*c.tenant)
    }

    /// The body named `model`, asked for as a stream or not.
    pub fn parsed(&mut self, model: &str, stream: bool) {
        self.model = Some(model.to_owned());
        self.stream = stream;
    }

    /// A rewrite chose the model served (a canary, a session's target).
    pub fn rewritten(&mut self, served: Option<Served>) {
        self.rewrite = served;
    }

    /// The rewrite that chose the model served, if any.
    pub fn served(&self) -> Option<&Served> {
        self.rewrite.as_ref()
    }

    /// The model as the client asked for it.
    pub fn requested_model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// No pool serves the model: counted on the unrouted handles.
    pub fn unrouted(&mut self, metrics: Arc<RouteMetrics>) {
        self.metrics = Some(metrics);
    }

    /// The request goes to `pool` (a local pool, or the global tier);
    /// `metrics` are its route's handles, where the pool keeps them.
    pub fn routed(&mut self, pool: Arc<str>, metrics: Option<Arc<RouteMetrics>>) {
        self.pool = Some(pool);
        if metrics.is_some() {
            self.metrics = metrics;
        }
    }

    /// The rate limits hold `reservation` (none apply when `None`) until
    /// the request ends. From here on, how the request ends is the
    /// rewrite target's doing.
    pub fn reserved(&mut self, reservation: Option<Reservation>) {
        self.reservation = reservation;
        if let Some(served) = &mut self.rewrite {
            served.judged = true;
        }
    }

    /// A rate limit charges the request's tokens: a stream must then
    /// report its usage.
    pub fn charges_tokens(&self) -> bool {
        self.reservation
            .as_ref()
            .is_some_and(|r| r.charges_tokens())
    }

    /// The fleet page's decision feed sampled the request: its decision
    /// must be explained.
    pub fn is_sampled(&self) -> bool {
        self.feed.is_some()
    }

    /// The picker chose `decision`'s replica.
    pub fn picked(&mut self, decision: &Decision) {
        self.endpoint = Some(decision.endpoint.addr.clone());
        self.decision = decision.top;
        self.latency = decision.latency;
        self.prefix_source = decision.top.map(|_| decision.prefix_source);
        if let Some(feed) = &mut self.feed {
            feed.picked(decision);
        }
    }

    /// The proxy in front sent the request to `replica` rather than the
    /// one picked: the answer is that replica's, and the picker's latency
    /// features (of the one picked) teach nothing.
    pub fn served_by(&mut self, replica: &picker::Endpoint) {
        self.endpoint = Some(replica.addr.clone());
        self.latency = None;
    }

    /// The request goes to the global member `name`.
    pub fn sent_to_member(&mut self, name: &str) {
        self.member = Some(Arc::from(name));
    }

    /// Whether some of the request reached its replica (or member), which
    /// may then have worked on it: it is charged, and never sent again.
    pub fn reached_replica(&mut self, sent: bool) {
        self.sent = sent;
    }

    /// The answer moves off the replica answering it, for `cause`, after
    /// `tokens` reached the client.
    pub fn moved(&mut self, cause: &'static str, tokens: u64) {
        let from = self.endpoint.clone().unwrap_or_else(|| Arc::from("-"));
        self.moves.push(Move {
            from,
            cause,
            tokens,
        });
    }

    /// The request is tried again elsewhere, none of it having been sent.
    pub fn retried(&mut self) {
        self.retries += 1;
    }

    /// A copy went to a mirror: the client's answer is measured beside it.
    pub fn mirrored(&mut self, metrics: MirrorMetrics) {
        self.mirror = Some(metrics);
    }

    /// Flow control let the request through after `waited`, or refused it
    /// when its wait expired (the longest waits belong in the histogram).
    pub fn waited(&mut self, band: Priority, waited: Duration) {
        self.priority = Some(band);
        self.queue_wait = Some(waited);
        if let Some(m) = &self.metrics {
            m.observe_queue_wait(band, waited);
        }
    }

    /// Time spent waiting in flow control, once admitted.
    pub fn queue_wait(&self) -> Option<Duration> {
        self.queue_wait
    }

    /// The gateway answers the request itself with `error`
    /// ([`crate::respond::refuse`] renders it).
    pub fn refused(&mut self, error: &ApiError) {
        self.status = error.status.as_u16();
        self.refusal = Some(refusal_reason(error));
        self.on_error(&error.message);
    }

    /// The `x-ratelimit-*` headers of the request's reservation, if any.
    pub fn rate_headers(&self, headers: &mut http::HeaderMap) {
        if let Some(reservation) = &self.reservation {
            reservation.headers().apply(headers);
        }
    }

    /// What the request's tokens cost: what the replica reported; nothing
    /// when it never ran or answered with an error; what was reserved when
    /// it ran but its usage is unknown (a stream without usage, a client
    /// that left).
    fn outcome(&self) -> Outcome {
        let usage = self
            .usage
            .filter(|u| u.prompt_tokens.is_some() || u.completion_tokens.is_some());
        match (self.sent, usage) {
            (false, _) => Outcome::NotRun,
            (true, Some(u)) => Outcome::Used(
                u.prompt_tokens
                    .unwrap_or_default()
                    .saturating_add(u.completion_tokens.unwrap_or_default()),
            ),
            (true, None) if self.status >= 400 && self.meter.is_none() => Outcome::Used(0),
            (true, None) => Outcome::Unknown,
        }
    }

    /// A replica's response head arrived and is passed on.
    pub fn on_response(&mut self, status: StatusCode, headers: &http::HeaderMap) {
        self.status = status.as_u16();
        if status.is_success() {
            let sse = crate::headers::is_event_stream(headers);
            self.meter = Some(ResponseMeter::new(sse));
        }
    }

    /// `replica` answers the request, sent to it at `sent`.
    pub fn answering(&mut self, replica: Arc<picker::Endpoint>, sent: Instant) {
        self.answering = Some((replica, sent));
    }

    pub fn on_data(&mut self, data: &[u8]) {
        let Some(meter) = &mut self.meter else {
            return;
        };
        let events = meter.on_frame(data).count;
        if events == 0 {
            return;
        }
        self.events += u64::from(events);
        let now = Instant::now();
        let metrics = self.metrics.as_deref();
        self.clock.tick(events, now, |gap| {
            if let Some(m) = metrics {
                m.observe_inter_token(gap);
            }
        });
        if self.ttft.is_none() {
            let ttft = now.saturating_duration_since(self.start);
            self.ttft = Some(ttft);
            if let Some(m) = metrics {
                m.observe_ttft(ttft);
            }
        }
    }

    pub fn on_error(&mut self, error: &str) {
        self.error.get_or_insert_with(|| error.to_owned());
    }

    /// The body is complete; may be called more than once.
    pub fn on_end(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let Some(meter) = &self.meter else {
            return;
        };
        // A whole body is the first token of a non-streamed answer.
        if !meter.is_sse() && self.ttft.is_none() {
            let ttft = self.start.elapsed();
            self.ttft = Some(ttft);
            if let Some(m) = &self.metrics {
                m.observe_ttft(ttft);
            }
        }
        self.usage = meter.usage();
        let streamed = meter.is_sse();
        self.measure_speed(streamed);
    }

    /// The request's band and latency objectives, known once it has its
    /// flow-control ticket (before admission, which may refuse it).
    pub fn objectives(&mut self, band: Priority, slo: Option<picker::Slo>) {
        self.priority = Some(band);
        self.slo = slo;
    }

    /// Whether the answer met each of its objectives, as the client saw
    /// it: time to first token, and the mean time between its first and
    /// last streamed events. `None` for an objective not set, or that the
    /// answer cannot be judged on (no first token; fewer than two events).
    fn slo_met(&self) -> (Option<bool>, Option<bool>) {
        let Some(slo) = self.slo else {
            return (None, None);
        };
        let ttft = slo.ttft.zip(self.ttft).map(|(want, got)| got <= want);
        let itl = slo.itl.and_then(|want| {
            let (first, last) = (self.clock.first()?, self.clock.last()?);
            let gaps = u32::try_from(self.events.checked_sub(1)?).ok()?;
            (gaps > 0).then(|| last.saturating_duration_since(first) / gaps <= want)
        });
        (ttft, itl)
    }

    /// Tell the picker how fast the replica answered: its speed, and, for
    /// a stream that stayed on the replica it was picked for, the TTFT
    /// and time per output token its latency model learns from.
    fn measure_speed(&self, streamed: bool) {
        let Some((replica, sent)) = &self.answering else {
            return;
        };
        let tokens = self
            .usage
            .and_then(|u| u.completion_tokens)
            .unwrap_or(self.events);
        replica.observe_answer(sent.elapsed().as_secs_f64(), tokens);
        let (Some((features, _)), Some(ttft)) = (&self.latency, self.ttft) else {
            return;
        };
        if !streamed || !self.moves.is_empty() || tokens < 2 {
            return;
        }
        let first_token = self.start + ttft;
        let ttft = first_token.saturating_duration_since(*sent).as_secs_f64();
        let itl = first_token.elapsed().as_secs_f64() / (tokens - 1) as f64;
        replica.latency().observe(features, Some(ttft), Some(itl));
    }
}

/// Why a stage answers the client itself: the error, and the headers of
/// the rate limit that refused it, when one did.
#[derive(Debug)]
pub struct Refusal {
    pub error: ApiError,
    pub headers: Option<RateHeaders>,
}

impl From<ApiError> for Refusal {
    fn from(error: ApiError) -> Self {
        Self {
            error,
            headers: None,
        }
    }
}

impl From<Refused> for Refusal {
    fn from(refused: Refused) -> Self {
        Self {
            error: refused.error,
            headers: Some(refused.headers),
        }
    }
}
