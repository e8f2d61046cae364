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
    /// The client's side: sent, complete, errors, in flight.
    pub(crate) client: [u64; 4],
}

impl Sample {
    pub(crate) async fn take(t: f64, probe: &Probe, shared: Option<&Shared>) -> Self {
        let (rss_mib, fds) = process_usage(probe.pid);
        let client = shared.map_or([0; 4], |shared| {
            let stats = shared.stats.lock().unwrap();
            [
                stats.sent,
                stats.count(|c| c == Class::Complete),
                stats.count(Class::is_error),
                shared.in_flight.load(Ordering::Relaxed),
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Plain,
    Stream,
    /// Streams, and leaves after the first event.
    StreamThenLeave,
}

/// How one request ended, from the client's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Class {
    /// A whole answer: a completion, or a stream to `[DONE]`.
    Complete,
    /// The client left after the first event, on purpose.
    Left,
    /// An error status (the gateway's or a replica's).
    Status(u16),
    /// 200, but an error event, no `[DONE]`, or a body that is no completion.
    Incomplete,
    /// The connection broke after the response head.
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

    pub(crate) fn name(self) -> String {
        match self {
            Class::Complete => "complete".into(),
            Class::Left => "left mid-stream".into(),
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

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) sent: u64,
    /// Not sent: [`MAX_IN_FLIGHT`] were already in flight.
    pub(crate) skipped: u64,
    pub(crate) outcomes: BTreeMap<Class, u64>,
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
}

/// State the tasks share.
pub(crate) struct Shared {
    /// When traffic started.
    pub(crate) start: Instant,
    pub(crate) stats: Mutex<Stats>,
    pub(crate) slow: Mutex<[SlowKind; 2]>,
    pub(crate) faults: Mutex<FaultLog>,
    pub(crate) in_flight: AtomicU64,
    pub(crate) gateway_died: AtomicBool,
}

/// The vocabulary of prompts (the simulator's tokenizer counts words).
pub(crate) const WORDS: &str = "the gateway routes each request to a replica with room in its cache and \
    queue model server token stream prefix shared document answer question about latency \
    throughput memory scheduler batch decode prefill adapter fleet metric window of for on \
    is how why when what does long short fast slow many";

/// The seeded request mix: 60 % streamed (5 % of those left after the
/// first event), half the prompts behind one of a few shared documents so
/// prefix affinity has something to find, answers of 8–96 tokens.
pub(crate) struct Workload {
    pub(crate) rng: SmallRng,
    pub(crate) documents: Vec<String>,
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
        Workload { rng, documents }
    }

    pub(crate) fn next(&mut self) -> (Kind, Bytes) {
        let rng = &mut self.rng;
        let stream = rng.gen_bool(0.6);
        let kind = match (stream, rng.gen_bool(0.05)) {
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
            "max_tokens": rng.gen_range(8..=96),
            "stream": stream,
        });
        if stream {
            body["stream_options"] = json!({"include_usage": rng.gen_bool(0.5)});
        }
        (kind, Bytes::from(body.to_string()))
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
        let (kind, body) = workload.next();
        if shared.in_flight.load(Ordering::Relaxed) >= MAX_IN_FLIGHT {
            shared.stats.lock().unwrap().skipped += 1;
        } else {
            shared.stats.lock().unwrap().sent += 1;
            shared.in_flight.fetch_add(1, Ordering::Relaxed);
            let (shared, client, url) = (shared.clone(), client.clone(), url.clone());
            tokio::spawn(async move {
                let started = Instant::now();
                let mut head = false;
                let ended = tokio::time::timeout(
                    REQUEST_TIMEOUT,
                    exchange(&client, &url, kind, body, &mut head),
                )
                .await;
                let class = ended.unwrap_or(Class::TimedOut { head });
                let ms = started.elapsed().as_secs_f64() * 1e3;
                {
                    let mut stats = shared.stats.lock().unwrap();
                    *stats.outcomes.entry(class).or_default() += 1;
                    if class == Class::Complete {
                        stats.minute.push(ms);
                        stats.all.push(ms);
                    }
                }
                shared.in_flight.fetch_sub(1, Ordering::Relaxed);
            });
        }
        let u: f64 = arrivals.gen_range(f64::EPSILON..1.0);
        next += Duration::from_secs_f64(-u.ln() / args.rate);
    }
    Ok(())
}

/// One request to its end; `head` is set once the response head arrived.
pub(crate) async fn exchange(
    client: &reqwest::Client,
    url: &str,
    kind: Kind,
    body: Bytes,
    head: &mut bool,
) -> Class {
    let sent = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let mut response = match sent {
        Ok(response) => response,
        Err(e) if e.is_connect() => return Class::ConnectFailed,
        Err(_) => return Class::ResetBeforeHead,
    };
    *head = true;
    let status = response.status().as_u16();
    if status != 200 {
        // Read the error to its end: the exchange is over only then.
        return match response.bytes().await {
            Ok(_) => Class::Status(status),
            Err(_) => Class::BrokenBody,
        };
    }
    if kind == Kind::Plain {
        return match response.bytes().await {
            Ok(body) if is_completion(&body) => Class::Complete,
            Ok(_) => Class::Incomplete,
            Err(_) => Class::BrokenBody,
        };
    }
    let mut buffer = BytesMut::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => buffer.extend_from_slice(&chunk),
            Ok(None) => return Class::Incomplete,
            Err(_) => return Class::BrokenBody,
        }
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event = buffer.split_to(end + 2);
            let Some(data) = event[..]
                .split(|&b| b == b'\n')
                .find_map(|line| line.strip_prefix(b"data:"))
                .map(<[u8]>::trim_ascii)
            else {
                continue;
            };
            if data == b"[DONE]" {
                return Class::Complete;
            }
            if data.starts_with(b"{\"error\"") {
                return Class::Incomplete;
            }
            if kind == Kind::StreamThenLeave {
                // Dropping the response closes the connection mid-stream.
                return Class::Left;
            }
        }
    }
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
