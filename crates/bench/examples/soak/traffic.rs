//! The traffic: seeded chat completions, streaming and not, clients that
//! leave mid-stream, slowloris connections; each request's one outcome.

use super::*;

/// Where the gateway is observed from.
pub(crate) struct Probe {
    pub(crate) pid: u32,
    /// The public listener's port.
    pub(crate) port: u16,
    pub(crate) admin: SocketAddr,
    pub(crate) http: reqwest::Client,
}

#[derive(Debug, Clone)]
pub(crate) struct Sample {
    /// Seconds since traffic started.
    pub(crate) t: f64,
    pub(crate) rss_mib: Option<f64>,
    pub(crate) fds: Option<f64>,
    pub(crate) cpu_seconds: Option<f64>,
    /// Client connections open as the kernel sees them.
    pub(crate) sockets: Option<f64>,
    pub(crate) gateway: Option<GatewayMetrics>,
    /// The client's side: sent, complete, errors, in flight, streams cut
    /// or not whole, requests lost.
    pub(crate) client: [u64; 6],
}

impl Sample {
    pub(crate) async fn take(t: f64, probe: &Probe, shared: Option<&Shared>) -> Self {
        let (rss_mib, fds) = process_usage(probe.pid);
        let client = shared.map_or([0; 6], |shared| {
            let stats = shared.stats.lock().unwrap();
            [
                stats.sent,
                stats.count(|c| c == Class::Complete),
                stats.count(Class::is_error),
                shared.in_flight.load(Ordering::Relaxed),
                stats.count(|c| c.is_cut() || c.is_not_whole()),
                stats.count(Class::is_lost),
            ]
        });
        Sample {
            t,
            rss_mib,
            fds,
            cpu_seconds: cpu_seconds(probe.pid),
            sockets: kernel_connections(probe.port),
            gateway: scrape(&probe.http, probe.admin).await,
            client,
        }
    }

    pub(crate) fn connections(&self) -> Option<f64> {
        self.gateway.as_ref()?.connections
    }

    pub(crate) fn tasks(&self) -> Option<f64> {
        self.gateway.as_ref()?.tasks
    }

    pub(crate) fn requests(&self) -> Option<f64> {
        self.gateway.as_ref()?.requests
    }

    /// `infergate_migrations_total` by reason and outcome.
    pub(crate) fn migrations(&self) -> Option<&BTreeMap<(String, String), f64>> {
        Some(&self.gateway.as_ref()?.migrations)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Plain,
    Stream,
    /// Streams, and leaves after the first event.
    StreamThenLeave,
}

/// One request of the mix.
pub(crate) struct Request {
    /// Its `x-request-id`, which the gateway keeps: `soak-<n>`.
    pub(crate) id: String,
    pub(crate) kind: Kind,
    /// A stream that asked for `stream_options.include_usage`.
    pub(crate) usage: bool,
    pub(crate) body: Bytes,
}

/// How a stream that began (a 200 with its head) failed to end whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cut {
    /// An error event (`data: {"error": …}`), whatever followed it.
    ErrorEvent,
    /// The body ended without `data: [DONE]`.
    NoDone,
    /// `[DONE]`, but no event had a `finish_reason`.
    NoFinish,
    /// The connection broke mid-stream.
    Broken,
    /// Still open after [`REQUEST_TIMEOUT`].
    TimedOut,
}

/// A stream that ended with a `finish_reason` and `[DONE]` and no error,
/// yet is not one answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Defect {
    /// More than one `id`.
    Ids,
    /// More than one `finish_reason`.
    Finishes,
    /// Not exactly one usage event where `include_usage` asked for it,
    /// or one where it did not.
    Usage,
    /// The usage's `completion_tokens` is not the tokens received (the
    /// simulator sends one token per event).
    UsageCount,
}

/// How one request ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    /// A whole answer: a completion, or a stream that is whole.
    Complete,
    /// The client left after the first event, on purpose.
    Left,
    /// A stream that began and did not end whole.
    Cut(Cut),
    /// A stream that ended but is not one answer.
    NotWhole(Defect),
    /// An error status (the gateway's or a replica's).
    Status(u16),
    /// 200, but a body that is no completion (not streamed).
    Incomplete,
    /// The connection broke after the response head (not streamed).
    BrokenBody,
    /// The connection broke after connecting, before any response head.
    ResetBeforeHead,
    /// No connection: the request never reached the gateway.
    ConnectFailed,
    /// No outcome within [`REQUEST_TIMEOUT`]: unanswered.
    TimedOut { head: bool },
}

/// Whether the gateway saw a request (and so counted it).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    Yes,
    Maybe,
    No,
}

impl Class {
    pub(crate) fn reach(self) -> Reach {
        match self {
            Class::Complete
            | Class::Left
            | Class::Cut(_)
            | Class::NotWhole(_)
            | Class::Status(_)
            | Class::Incomplete
            | Class::BrokenBody
            | Class::TimedOut { head: true } => Reach::Yes,
            Class::ResetBeforeHead | Class::TimedOut { head: false } => Reach::Maybe,
            Class::ConnectFailed => Reach::No,
        }
    }

    pub(crate) fn is_error(self) -> bool {
        !matches!(self, Class::Complete | Class::Left)
    }

    /// A stream that began but did not end whole.
    pub(crate) fn is_cut(self) -> bool {
        matches!(self, Class::Cut(_))
    }

    pub(crate) fn is_not_whole(self) -> bool {
        matches!(self, Class::NotWhole(_))
    }

    /// A request that got no answer at all: an error status, no
    /// connection, a broken or empty completion, or nothing in time.
    pub(crate) fn is_lost(self) -> bool {
        self.is_error() && !self.is_cut() && !self.is_not_whole()
    }

    pub(crate) fn name(self) -> String {
        match self {
            Class::Complete => "complete".into(),
            Class::Left => "left mid-stream".into(),
            Class::Cut(Cut::ErrorEvent) => "cut: error event".into(),
            Class::Cut(Cut::NoDone) => "cut: no [DONE]".into(),
            Class::Cut(Cut::NoFinish) => "cut: no finish_reason".into(),
            Class::Cut(Cut::Broken) => "cut: connection broke".into(),
            Class::Cut(Cut::TimedOut) => "cut: timed out".into(),
            Class::NotWhole(Defect::Ids) => "not whole: several ids".into(),
            Class::NotWhole(Defect::Finishes) => "not whole: several finish_reasons".into(),
            Class::NotWhole(Defect::Usage) => "not whole: usage events".into(),
            Class::NotWhole(Defect::UsageCount) => "not whole: usage count".into(),
            Class::Status(code) => code.to_string(),
            Class::Incomplete => "incomplete".into(),
            Class::BrokenBody => "broken".into(),
            Class::ResetBeforeHead => "reset".into(),
            Class::ConnectFailed => "connect".into(),
            Class::TimedOut { head: true } => "timeout-after-head".into(),
            Class::TimedOut { head: false } => "timeout".into(),
        }
    }
}

/// Error messages kept, at most: beyond, they count as one "other".
const MESSAGES_KEPT: usize = 40;
/// The longest message kept, in characters.
const MESSAGE_CHARS: usize = 300;

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) sent: u64,
    /// Streamed requests sent (those the client leaves on purpose too).
    pub(crate) streams_sent: u64,
    /// Streams sent that asked for `include_usage`.
    pub(crate) streams_usage: u64,
    /// Streams that ended whole.
    pub(crate) streams_whole: u64,
    /// Not sent: [`MAX_IN_FLIGHT`] were already in flight.
    pub(crate) skipped: u64,
    pub(crate) outcomes: BTreeMap<Class, u64>,
    /// The messages of error events in streams, each with its count.
    pub(crate) error_events: BTreeMap<String, u64>,
    /// The status and message of each error answer, with its count.
    pub(crate) error_statuses: BTreeMap<String, u64>,
    /// End-to-end latency (ms) of complete answers this minute, and overall.
    pub(crate) minute: Vec<f64>,
    pub(crate) all: Vec<f64>,
}

impl Stats {
    pub(crate) fn count(&self, pick: impl Fn(Class) -> bool) -> u64 {
        self.outcomes
            .iter()
            .filter(|(c, _)| pick(**c))
            .map(|(_, n)| n)
            .sum()
    }

    pub(crate) fn errors_line(&self) -> String {
        let errors: Vec<String> = self
            .outcomes
            .iter()
            .filter(|(c, _)| c.is_error())
            .map(|(c, n)| format!("{}×{n}", c.name()))
            .collect();
        let total = self.count(Class::is_error);
        if errors.is_empty() {
            "err 0".into()
        } else {
            format!("err {total} [{}]", errors.join(" "))
        }
    }

    /// Counts `message` in `map`, keeping the map bounded.
    pub(crate) fn note(map: &mut BTreeMap<String, u64>, message: &str) {
        let mut message: String = message.chars().take(MESSAGE_CHARS).collect();
        if !map.contains_key(&message) && map.len() >= MESSAGES_KEPT {
            message = "(other messages)".into();
        }
        *map.entry(message).or_default() += 1;
    }
}

/// State the tasks share.
pub(crate) struct Shared {
    /// When traffic started.
    pub(crate) start: Instant,
    pub(crate) stats: Mutex<Stats>,
    pub(crate) slow: Mutex<[SlowKind; 2]>,
    pub(crate) faults: Mutex<FaultLog>,
    /// A JSON line for each request that was not answered whole (cut,
    /// not whole, or lost): what was sent and what the client saw.
    pub(crate) failures: Mutex<Vec<String>>,
    pub(crate) in_flight: AtomicU64,
    pub(crate) gateway_died: AtomicBool,
}

/// The vocabulary of prompts (the simulator's tokenizer counts words).
pub(crate) const WORDS: &str = "the gateway routes each request to a replica with room in its cache and \
    queue model server token stream prefix shared document answer question about latency \
    throughput memory scheduler batch decode prefill adapter fleet metric window of for on \
    is how why when what does long short fast slow many";

/// Share of requests streamed.
pub(crate) const STREAMED: f64 = 0.8;
/// Share of streams whose client leaves after the first event.
pub(crate) const LEFT: f64 = 0.05;
/// Share of streams that ask for `stream_options.include_usage`.
pub(crate) const WITH_USAGE: f64 = 0.75;

/// The seeded request mix: 80 % streamed (5 % of those left after the
/// first event, three in four of the rest asking for the usage), half the
/// prompts behind one of a few shared documents so prefix affinity has
/// something to find, answers of up to 8–192 tokens.
pub(crate) struct Workload {
    pub(crate) rng: SmallRng,
    pub(crate) documents: Vec<String>,
    pub(crate) sent: u64,
}

impl Workload {
    pub(crate) fn new(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let documents = (0..6)
            .map(|_| {
                let n = rng.gen_range(150..400);
                words(&mut rng, n)
            })
            .collect();
        Workload {
            rng,
            documents,
            sent: 0,
        }
    }

    pub(crate) fn next(&mut self) -> Request {
        let rng = &mut self.rng;
        let stream = rng.gen_bool(STREAMED);
        let kind = match (stream, rng.gen_bool(LEFT)) {
            (false, _) => Kind::Plain,
            (true, false) => Kind::Stream,
            (true, true) => Kind::StreamThenLeave,
        };
        let n = rng.gen_range(8..40);
        let question = words(rng, n);
        let messages = if rng.gen_bool(0.5) {
            let document = &self.documents[rng.gen_range(0..self.documents.len())];
            json!([
                {"role": "system", "content": document},
                {"role": "user", "content": question},
            ])
        } else {
            json!([{"role": "user", "content": question}])
        };
        let mut body = json!({
            "model": MODEL,
            "messages": messages,
            "max_tokens": rng.gen_range(8..=192),
            "stream": stream,
        });
        let usage = stream && rng.gen_bool(WITH_USAGE);
        if stream {
            body["stream_options"] = json!({"include_usage": usage});
        }
        self.sent += 1;
        Request {
            id: format!("soak-{}", self.sent),
            kind,
            usage,
            body: Bytes::from(body.to_string()),
        }
    }
}

pub(crate) fn words(rng: &mut SmallRng, n: usize) -> String {
    let vocabulary: Vec<&str> = WORDS.split_whitespace().collect();
    let picked: Vec<&str> = (0..n)
        .map(|_| vocabulary[rng.gen_range(0..vocabulary.len())])
        .collect();
    picked.join(" ")
}

/// Sends the mix at `rate` (Poisson arrivals) until `traffic` has passed
/// or the soak stops. Each request runs in its own task.
pub(crate) async fn run_traffic(
    shared: Arc<Shared>,
    url: Arc<str>,
    args: Args,
    traffic: Duration,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        // Shorter than the gateway's 75 s keep-alive timeout, so a pooled
        // connection is never reused just as the gateway closes it: that
        // race is a transport error that is nobody's fault.
        .pool_idle_timeout(Duration::from_secs(20))
        .build()?;
    let mut workload = Workload::new(args.seed);
    let mut arrivals = SmallRng::seed_from_u64(args.seed.wrapping_add(0x5eed));
    let end = shared.start + traffic;
    // A Poisson count exceeds its mean by 50 % practically never; this
    // bounds the request count whatever the clock does.
    let limit = (args.rate * traffic.as_secs_f64() * 1.5).ceil() as u64 + 10;
    let mut next = shared.start;
    for _ in 0..limit {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => break,
        }
        if next >= end || *stop.borrow() {
            break;
        }
        let request = workload.next();
        if shared.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            shared.stats.lock().unwrap().skipped += 1;
        } else {
            {
                let mut stats = shared.stats.lock().unwrap();
                stats.sent += 1;
                if request.kind != Kind::Plain {
                    stats.streams_sent += 1;
                }
                if request.usage {
                    stats.streams_usage += 1;
                }
            }
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            let (shared, client, url) = (shared.clone(), client.clone(), url.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let mut seen = Seen::default();
                let ended = tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    exchange(&client, &url, &request, &mut seen),
                )
                .await;
                let class = match ended {
                    Ok(class) => class,
                    Err(_) if seen.head && request.kind != Kind::Plain && seen.status == 200 => {
                        Class::Cut(Cut::TimedOut)
                    }
                    Err(_) => Class::TimedOut { head: seen.head },
                };
                let at = started.duration_since(shared.start).as_secs_f64();
                let ms = started.elapsed().as_secs_f64() * 1e3;
                {
                    let mut stats = shared.stats.lock().unwrap();
                    *stats.outcomes.entry(class).or_default() += 1;
                    if class == Class::Complete {
                        stats.minute.push(ms);
                        stats.all.push(ms);
                        if request.kind != Kind::Plain {
                            stats.streams_whole += 1;
                        }
                    }
                    for message in &seen.errors {
                        Stats::note(&mut stats.error_events, message);
                    }
                    if let Class::Status(code) = class {
                        let message = seen.error_body.as_deref().unwrap_or("");
                        Stats::note(&mut stats.error_statuses, &format!("{code}: {message}"));
                    }
                }
                if class.is_error() {
                    report_failure(&shared, &request, class, &seen, at, ms);
                }
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            });
        }
        let u: f64 = arrivals.gen_range(f64::EPSILON..1.0);
        next += Duration::from_secs_f64(-u.ln() / args.rate);
    }
    Ok(())
}

/// Failures printed as they happen, at most (all are kept in the run's
/// `failures.jsonl`).
const FAILURES_PRINTED: usize = 25;

/// Keeps what the client saw of a request not answered whole, and prints
/// the first few.
fn report_failure(shared: &Shared, request: &Request, class: Class, seen: &Seen, at: f64, ms: f64) {
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap_or_default();
    let line = json!({
        "sent_at_s": (at * 1000.0).round() / 1000.0,
        "took_ms": ms.round(),
        "request_id": request.id,
        "class": class.name(),
        "streamed": request.kind != Kind::Plain,
        "include_usage": request.usage,
        "max_tokens": body["max_tokens"],
        "status": seen.status,
        "answer_request_id": seen.request_id,
        "events": seen.events,
        "tokens": seen.tokens,
        "text_bytes": seen.text_bytes,
        "ids": seen.ids,
        "finish_reasons": seen.finishes,
        "usage": seen.usages,
        "errors": seen.errors,
        "error_body": seen.error_body,
        "done": seen.done,
        "transport_error": seen.transport_error,
        "last_events": seen.last,
        "request": body,
    });
    let printed = {
        let mut failures = shared.failures.lock().unwrap();
        failures.push(line.to_string());
        failures.len()
    };
    if printed <= FAILURES_PRINTED {
        let what = seen
            .errors
            .first()
            .or(seen.transport_error.as_ref())
            .or(seen.error_body.as_ref())
            .map(|m| format!(": {}", m.chars().take(160).collect::<String>()))
            .unwrap_or_default();
        println!(
            "  {}  {} {}: {} after {} events, {} tokens, {:.0} ms{what}",
            clock(Duration::from_secs_f64(at)),
            if request.kind == Kind::Plain {
                "request"
            } else {
                "stream"
            },
            request.id,
            class.name(),
            seen.events,
            seen.tokens,
            ms,
        );
        if printed == FAILURES_PRINTED {
            println!("  (further failures only in failures.jsonl)");
        }
    }
}

/// Events of a failed stream kept to show, the last ones.
const LAST_EVENTS: usize = 4;

/// What the client saw of one request, so far.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The response head arrived.
    pub(crate) head: bool,
    pub(crate) status: u16,
    /// The answer's `x-request-id`.
    pub(crate) request_id: Option<String>,
    /// Data events (stream), `[DONE]` included.
    pub(crate) events: u32,
    /// The distinct `id`s of the stream's events, in order.
    pub(crate) ids: Vec<String>,
    pub(crate) finishes: Vec<String>,
    /// `(prompt_tokens, completion_tokens)` of each usage event.
    pub(crate) usages: Vec<(u64, u64)>,
    /// Events with text (one token each, from the simulator).
    pub(crate) tokens: u64,
    pub(crate) text_bytes: usize,
    /// The messages of error events.
    pub(crate) errors: Vec<String>,
    /// The body of an error answer.
    pub(crate) error_body: Option<String>,
    pub(crate) transport_error: Option<String>,
    pub(crate) done: bool,
    pub(crate) last: VecDeque<String>,
}

impl Seen {
    /// Reads one data event of a stream.
    pub(crate) fn event(&mut self, data: &[u8]) {
        self.events += 1;
        if self.last.len() == LAST_EVENTS {
            self.last.pop_front();
        }
        self.last
            .push_back(String::from_utf8_lossy(&data[..data.len().min(400)]).into_owned());
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        let Ok(event) = serde_json::from_slice::<serde_json::Value>(data) else {
            self.errors.push(format!(
                "(not JSON) {}",
                String::from_utf8_lossy(&data[..data.len().min(200)])
            ));
            return;
        };
        if let Some(error) = event.get("error") {
            let message = error["message"]
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned);
            self.errors.push(message);
            return;
        }
        if let Some(id) = event["id"].as_str()
            && !self.ids.iter().any(|seen| seen == id)
        {
            self.ids.push(id.to_owned());
        }
        if let Some(usage) = event.get("usage").filter(|u| u.is_object()) {
            self.usages.push((
                usage["prompt_tokens"].as_u64().unwrap_or(0),
                usage["completion_tokens"].as_u64().unwrap_or(0),
            ));
        }
        for choice in event["choices"].as_array().into_iter().flatten() {
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finishes.push(reason.to_owned());
            }
            if let Some(text) = choice["delta"]["content"].as_str()
                && !text.is_empty()
            {
                self.tokens += 1;
                self.text_bytes += text.len();
            }
        }
    }

    /// Whether a stream that ended (`[DONE]` or the body's end) is whole.
    pub(crate) fn judge(&self, usage_asked: bool) -> Class {
        if !self.errors.is_empty() {
            Class::Cut(Cut::ErrorEvent)
        } else if !self.done {
            Class::Cut(Cut::NoDone)
        } else if self.finishes.is_empty() {
            Class::Cut(Cut::NoFinish)
        } else if self.ids.len() > 1 {
            Class::NotWhole(Defect::Ids)
        } else if self.finishes.len() > 1 {
            Class::NotWhole(Defect::Finishes)
        } else if self.usages.len() != usize::from(usage_asked) {
            Class::NotWhole(Defect::Usage)
        } else if self.usages.first().is_some_and(|u| u.1 != self.tokens) {
            Class::NotWhole(Defect::UsageCount)
        } else {
            Class::Complete
        }
    }
}

/// One request to its end, what the client saw of it in `seen`.
pub(crate) async fn exchange(
    client: &reqwest::Client,
    url: &str,
    request: &Request,
    seen: &mut Seen,
) -> Class {
    let sent = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header("x-request-id", &request.id)
        .body(request.body.clone())
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(e) if e.is_connect() => {
            seen.transport_error = Some(format!("{e:#}"));
            return Class::ConnectFailed;
        }
        Err(e) => {
            seen.transport_error = Some(format!("{e:#}"));
            return Class::ResetBeforeHead;
        }
    };
    seen.head = true;
    let status = response.status().as_u16();
    seen.status = status;
    seen.request_id = response
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if status != 200 {
        // Read the error to its end: the exchange is over only then.
        return match response.bytes().await {
            Ok(body) => {
                let text = String::from_utf8_lossy(&body);
                seen.error_body = Some(
                    serde_json::from_slice::<serde_json::Value>(&body)
                        .ok()
                        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                        .unwrap_or_else(|| text.chars().take(200).collect()),
                );
                Class::Status(status)
            }
            Err(e) => {
                seen.transport_error = Some(format!("{e:#}"));
                Class::BrokenBody
            }
        };
    }
    if request.kind == Kind::Plain {
        return match response.bytes().await {
            Ok(body) if is_completion(&body) => Class::Complete,
            Ok(body) => {
                seen.error_body = Some(String::from_utf8_lossy(&body).chars().take(300).collect());
                Class::Incomplete
            }
            Err(e) => {
                seen.transport_error = Some(format!("{e:#}"));
                Class::BrokenBody
            }
        };
    }
    let mut buffer = BytesMut::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => buffer.extend_from_slice(&chunk),
            // The body's end; a last event without its blank line counts.
            Ok(None) => {
                if let Some(data) = data_of(&buffer) {
                    seen.event(data);
                }
                return seen.judge(request.usage);
            }
            Err(e) => {
                seen.transport_error = Some(format!("{e:#}"));
                return Class::Cut(Cut::Broken);
            }
        }
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event = buffer.split_to(end + 2);
            let Some(data) = data_of(&event) else {
                continue;
            };
            seen.event(data);
            if seen.done {
                // Anything after [DONE] is no part of the answer.
                return seen.judge(request.usage);
            }
            if request.kind == Kind::StreamThenLeave && seen.errors.is_empty() {
                // Dropping the response closes the connection mid-stream.
                return Class::Left;
            }
        }
    }
}

/// The data of an event (its `data:` line), if it has one.
fn data_of(event: &[u8]) -> Option<&[u8]> {
    event
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"data:"))
        .map(<[u8]>::trim_ascii)
}

pub(crate) fn is_completion(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["choices"].as_array().map(|c| !c.is_empty()))
        .unwrap_or(false)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slow {
    /// Sends a request head one byte every [`TRICKLE_EVERY`], never ending it.
    Trickle = 0,
    /// Connects and sends nothing.
    Silent = 1,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct SlowKind {
    pub(crate) opened: u64,
    pub(crate) open: u64,
    /// Seconds each connection the gateway closed was open.
    pub(crate) closed_after: Vec<f64>,
    /// Status of what the gateway answered before closing (e.g. 408).
    pub(crate) statuses: BTreeMap<u16, u64>,
    /// Seconds each connection still open when the soak stopped had been.
    pub(crate) open_at_stop: Vec<f64>,
}

impl SlowKind {
    pub(crate) fn longest(&self) -> f64 {
        self.closed_after
            .iter()
            .chain(&self.open_at_stop)
            .fold(0.0, |a: f64, &b| a.max(b))
    }
}

pub(crate) enum SlowEnd {
    /// By the gateway, with the status it answered if any.
    Closed(Option<u16>),
    Stopped,
}

/// One slowloris slot: holds a connection of `kind` until the gateway
/// closes it, then opens another, until the soak stops.
pub(crate) async fn slowloris(
    addr: SocketAddr,
    kind: Slow,
    budget: u64,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let pause = Duration::from_secs(1);
    for _ in 0..budget {
        if *stop.borrow() {
            return;
        }
        let Ok(mut stream) = TcpStream::connect(addr).await else {
            tokio::select! {
                () = tokio::time::sleep(pause) => continue,
                _ = stop.changed() => return,
            }
        };
        {
            let mut slow = shared.slow.lock().unwrap();
            slow[kind as usize].opened += 1;
            slow[kind as usize].open += 1;
        }
        let since = Instant::now();
        let end = hold(&mut stream, kind, &mut stop).await;
        let held = since.elapsed().as_secs_f64();
        drop(stream);
        {
            let mut slow = shared.slow.lock().unwrap();
            let k = &mut slow[kind as usize];
            k.open -= 1;
            match end {
                SlowEnd::Closed(status) => {
                    k.closed_after.push(held);
                    if let Some(status) = status {
                        *k.statuses.entry(status).or_default() += 1;
                    }
                }
                SlowEnd::Stopped => {
                    k.open_at_stop.push(held);
                    return;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stop.changed() => return,
        }
    }
}

pub(crate) async fn hold(
    stream: &mut TcpStream,
    kind: Slow,
    stop: &mut watch::Receiver<bool>,
) -> SlowEnd {
    // Never finished: the header value goes on for as long as it is sent.
    const HEAD: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n\
        Content-Type: application/json\r\nX-Slowloris: ";
    let mut sent = 0;
    let mut tick = tokio::time::interval(TRICKLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut buf = [0u8; 1024];
    let mut answer = Vec::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return SlowEnd::Stopped,
            read = stream.read(&mut buf) => match read {
                Ok(0) | Err(_) => return SlowEnd::Closed(status_of(&answer)),
                // An answer (a 408); the close follows.
                Ok(n) if answer.len() < 4096 => answer.extend_from_slice(&buf[..n]),
                Ok(_) => {}
            },
            _ = tick.tick(), if kind == Slow::Trickle => {
                let byte = HEAD.get(sent).copied().unwrap_or(b'a');
                if stream.write_all(&[byte]).await.is_err() {
                    return SlowEnd::Closed(status_of(&answer));
                }
                sent += 1;
            }
        }
    }
}

pub(crate) fn status_of(answer: &[u8]) -> Option<u16> {
    let rest = answer.strip_prefix(b"HTTP/1.1 ")?;
    std::str::from_utf8(rest.get(..3)?).ok()?.parse().ok()
}
