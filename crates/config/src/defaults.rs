//! Every gateway default in one place. Picking defaults (weights,
//! saturation, staleness) belong to the picker and live in the `picker`
//! crate.

use std::time::Duration;

/// `limits.maxBodyBytes`: 16 MiB. A 128k-token prompt is about 0.5 MB
/// of text; the rest is room for a handful of base64 images in a
/// multimodal chat. Larger bodies belong in a file API, not a prompt.
pub const MAX_BODY_BYTES: u64 = 16 * 1024 * 1024;
/// `limits.maxBufferedBodyBytes`: 512 MiB of request bodies in memory at
/// once across all connections (32 bodies at the largest size, thousands
/// of ordinary ones). Beyond it a request waits up to
/// [`BODY_BUDGET_WAIT`], then gets 503 with `Retry-After`: never an
/// out-of-memory kill.
pub const MAX_BUFFERED_BODY_BYTES: u64 = 512 * 1024 * 1024;
/// How long a request body waits for room in the buffered-bytes budget.
pub const BODY_BUDGET_WAIT: Duration = Duration::from_secs(2);
/// `limits.headerTimeout`: a new connection's first request head must
/// arrive within this (nginx's `client_header_timeout` is 60 s; a client
/// that connects means to send at once). Later requests on a kept-alive
/// connection are bounded by the keep-alive idle timeout.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(15);
/// `limits.maxConnections`: client connections open at once on the public
/// listeners. Far more than clients need (each keeps a few, multiplexing
/// or reusing them), few enough that a connection flood cannot take every
/// file descriptor the gateway needs for its replicas.
pub const MAX_CONNECTIONS: u32 = 10_000;
/// `timeouts.connect`: a replica on the same network answers a SYN in
/// well under a second; longer means it is gone.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// `timeouts.firstByte`: a non-streaming completion answers only when the
/// whole generation is done, which can take many minutes.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// `timeouts.idle`: longest silence between two events of a stream.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// `endpointPicker.address`: the port the Gateway API Inference
/// Extension's examples give the endpoint picker.
pub const ENDPOINT_PICKER_ADDRESS: &str = "0.0.0.0:9002";
/// `endpointPicker.fallbacks`: replicas listed after the chosen one. A
/// data plane retries a failed connection down the list; a few cover a
/// replica that died since the last scrape without making a long header.
pub const ENDPOINT_PICKER_FALLBACKS: usize = 2;
/// `shutdown.drainTimeout`.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `retry.maxRetries`: other replicas tried after a failed connection.
pub const MAX_RETRIES: u32 = 2;
/// `continuation.enabled`.
pub const CONTINUATION_ENABLED: bool = true;
/// `continuation.maxAttempts`: continuations per request.
pub const CONTINUATION_MAX_ATTEMPTS: u32 = 2;
/// `continuation.idleTimeout`: a decode step rarely takes a second, and a
/// long prefill batched beside it a few more.
pub const CONTINUATION_IDLE_TIMEOUT: Duration = Duration::from_secs(20);
/// `continuation.maxTextBytes`: about 64k tokens of English.
pub const CONTINUATION_MAX_TEXT_BYTES: u64 = 256 * 1024;
/// `drain.deadline`: within Kubernetes' default grace of 30 s, so a
/// terminating replica's answers move before it is killed.
pub const REPLICA_DRAIN_DEADLINE: Duration = Duration::from_secs(20);
/// `coldStart.timeout`: of the order of a large model's load time (weights
/// read from a network volume, CUDA graphs captured).
pub const COLD_START_TIMEOUT: Duration = Duration::from_secs(300);
/// Attempts at waking a cold pool (`coldStart.wake`) per cold start.
pub const WAKE_ATTEMPTS: u32 = 3;
/// `coldStart.wake.replicas`: one replica answers the waiting requests;
/// the autoscaler adds more as the load asks.
pub const WAKE_REPLICAS: u32 = 1;
/// `scheduling.metrics.interval`.
pub const SCRAPE_INTERVAL: Duration = Duration::from_millis(50);
/// `scheduling.metrics.timeout`: a scrape slower than this counts as failed.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_millis(500);
/// `endpointSelector.relistInterval` and `inferencePool.relistInterval`:
/// a full list of the selected pods this often, besides the watch. A watch
/// that stops delivering events without closing (reported against other
/// routers) is then stale for at most this long; one list per pool every
/// five minutes costs the API server nothing.
pub const DISCOVERY_RELIST_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// The pod label that names a replica's metrics dialect when it differs
/// from its pool's `engine` (pools that mix engines).
pub const ENGINE_LABEL: &str = "infergate.dev/engine";
/// `simulated.timeScale`: simulated replicas run in real time by default.
pub const SIM_TIME_SCALE: f64 = 1.0;
/// `pools[].enginePriority`: off, since a vLLM started without
/// `--scheduling-policy priority` refuses (400) every request that carries
/// a non-zero `priority`.
pub const ENGINE_PRIORITY: bool = false;

/// `flowControl.<band>.maxQueued`: requests waiting per pool and band.
pub const FLOW_MAX_QUEUED: usize = 10_000;
/// `flowControl.<band>.maxQueuedBytes`: request bodies held per pool and
/// band (256 MiB).
pub const FLOW_MAX_QUEUED_BYTES: u64 = 256 * 1024 * 1024;
/// `flowControl.critical.maxWait`.
pub const FLOW_CRITICAL_MAX_WAIT: Duration = Duration::from_secs(30);
/// `flowControl.standard.maxWait`.
pub const FLOW_STANDARD_MAX_WAIT: Duration = Duration::from_secs(10);
/// `flowControl.sheddable.maxWait`: sheddable requests never wait.
pub const FLOW_SHEDDABLE_MAX_WAIT: Duration = Duration::ZERO;
/// `flowControl.<band>.queueShare`: the share of a replica's saturation
/// queue depth (`saturation.queueDepth`) that requests of the band may
/// fill. The lower bands stop short of the bound, so a burst of them
/// leaves the last places of every engine queue to critical requests,
/// which then go straight to a replica, behind a short queue, instead of
/// waiting for room behind the bulk. With the default depth of 5:
/// critical fills to 5 waiting, standard to 3, sheddable to 2.
///
/// The shares apply only while requests of a higher band arrive at the
/// pool (one within [`BAND_ACTIVITY_WINDOW`]): a pool that serves one band
/// fills its replicas to the full depth.
pub const FLOW_CRITICAL_QUEUE_SHARE: f64 = 1.0;
pub const FLOW_STANDARD_QUEUE_SHARE: f64 = 0.6;
pub const FLOW_SHEDDABLE_QUEUE_SHARE: f64 = 0.4;
pub const BAND_ACTIVITY_WINDOW: Duration = Duration::from_secs(10);

/// `telemetry.otlp.serviceName`.
pub const OTLP_SERVICE_NAME: &str = "infergate";
/// `telemetry.otlp.sampleRatio`: every trace; lower it for busy gateways.
pub const OTLP_SAMPLE_RATIO: f64 = 1.0;
/// `telemetry.otlp.timeout`: one export; a slow collector must not hold
/// spans in memory for long.
pub const OTLP_TIMEOUT: Duration = Duration::from_secs(10);

/// `auth.jwt.leeway`: clock skew allowed on `exp` and `nbf`.
pub const JWT_LEEWAY: Duration = Duration::from_secs(30);
/// `auth.jwt.issuers[].refreshInterval`.
pub const JWKS_REFRESH_INTERVAL: Duration = Duration::from_secs(5 * 60);
/// `auth.jwt.issuers[].tenantClaim`.
pub const JWT_TENANT_CLAIM: &str = "sub";
/// Shortest time between two fetches of one JWKS for tokens naming a key
/// it does not hold: a flood of tokens with made-up `kid`s costs the
/// issuer one fetch per this interval.
pub const JWKS_MIN_REFETCH: Duration = Duration::from_secs(5);
/// Longest wait for one JWKS fetch.
pub const JWKS_FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// A verified token is remembered for at most this long (and never past
/// its `exp`), so a client reusing its token costs one hash per request,
/// not a signature check.
pub const JWT_CACHE_TTL: Duration = Duration::from_secs(60);
/// The tenant of every caller when `auth.mode` is `none` (or `auth` is
/// absent); a `tenants[]` entry of this name sets what they may do.
pub const ANONYMOUS_TENANT: &str = "anonymous";
/// The `tenant` label of requests from tenants not listed in `tenants[]`;
/// no tenant may be named so.
pub const OTHER_TENANTS_LABEL: &str = "other";
/// `tenants[].maxPriority`: a tenant's requests may not claim `critical`
/// unless the operator says so.
pub const TENANT_MAX_PRIORITY: picker::flow::Priority = picker::flow::Priority::Standard;
/// `rateLimits.defaultMaxTokens`: completion tokens reserved for a request
/// that names no `max_tokens`, settled to what it used when it ends.
pub const DEFAULT_MAX_TOKENS: u64 = 1024;
/// `rateLimits.redis.timeout`: a Redis on the same network answers in well
/// under a millisecond; a few milliseconds is a backend in trouble.
pub const REDIS_TIMEOUT: Duration = Duration::from_millis(5);
/// `rateLimits.redis.keyPrefix`.
pub const REDIS_KEY_PREFIX: &str = "infergate:";

/// How often every watched file is read again to see whether it changed:
/// a config file given with `--config` (also reloaded on SIGHUP),
/// `auth.apiKeys.file`, and TLS listeners' certificate, key and client CA
/// files. Files are compared by content, so a rewrite in place and a
/// swapped symlink (a Kubernetes ConfigMap or Secret volume, cert-manager)
/// are both seen; a Secret's update reaches the pod within a minute or so,
/// and the gateway sees it at most this much later. Reading a few small
/// files this often costs nothing measurable.
pub const FILE_WATCH_INTERVAL: Duration = Duration::from_secs(2);

/// How long the Lease that picks the replica writing an
/// `InferenceGatewayConfig`'s status stays with a holder that stopped
/// renewing it (client-go's leader election uses the same 15 s): status
/// goes unwritten at most this long after its writer dies without
/// releasing it.
pub const STATUS_LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the status Lease's holder renews it, and the others look at
/// it: three renewals per duration, so one lost request loses nothing.
pub const STATUS_LEASE_RENEW: Duration = Duration::from_secs(5);
/// How often the status writer looks at the gateway's readiness and its
/// pools' ready replicas: often, so the custom resource's status follows
/// `/readyz` and the metrics closely. Looking is local and cheap; it
/// writes only when they changed.
pub const STATUS_REFRESH: Duration = Duration::from_millis(250);
/// The `InferenceGatewayConfig` that `serve --kubernetes` reads when no
/// `--name` is given.
pub const KUBERNETES_CONFIG_NAME: &str = "infergate";

pub const API_VERSION: &str = "infergate.dev/v1alpha1";
pub const KIND: &str = "InferenceGatewayConfig";

/// `rewrites[].targets[].guard.minRequests`: answers the canary must have
/// in its window before its guard judges it. 200 requests put a p95 on
/// ten samples above it, and an error rate of 2 % on four errors: fewer
/// and one slow request could roll back a healthy canary.
pub const GUARD_MIN_REQUESTS: u64 = 200;
/// `rewrites[].targets[].guard.window`: the figures a guard compares are
/// those of the last five minutes (the canary's and the stable target's
/// over the same span, so load changes hit both alike).
pub const GUARD_WINDOW: Duration = Duration::from_secs(5 * 60);
/// `sessions.idleTimeout`: a session that sent nothing for this long is
/// forgotten by the rewrites (its next request is a new session's). Half
/// an hour outlasts a person's pause between chat turns and an agent's
/// wait on a slow tool.
pub const SESSION_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// `sessions.maxSessions`: sessions each rewrite remembers; beyond it the
/// least recently seen are forgotten first. A session costs about 40
/// bytes, so 100,000 sessions are a few MiB per rewrite.
pub const MAX_SESSIONS: usize = 100_000;
/// `mirrors[].maxInFlight`: shadow requests of one mirror in flight at
/// once; a copy that would exceed it is dropped (and counted), so a slow
/// shadow pool never holds more than this many connections and bodies.
pub const MIRROR_MAX_IN_FLIGHT: usize = 64;

/// `global.weights`: what a member's score is made of. KV headroom and
/// queue depth say most about how soon a member will answer; proximity
/// breaks ties between members with room, and recent errors mark one in
/// trouble before it is declared unhealthy. Cost is off unless asked for:
/// spending less at the price of latency is the operator's call.
pub const GLOBAL_WEIGHT_KV_HEADROOM: f64 = 0.4;
pub const GLOBAL_WEIGHT_QUEUE_DEPTH: f64 = 0.3;
pub const GLOBAL_WEIGHT_REGION_PROXIMITY: f64 = 0.2;
pub const GLOBAL_WEIGHT_ERROR_RATE: f64 = 0.1;
pub const GLOBAL_WEIGHT_COST: f64 = 0.0;
/// `global.failover.unhealthyAfter`: a member is dropped after this long
/// of failures or summary silence. Summaries arrive at least every
/// [`SUMMARY_HEARTBEAT`], so 2 s is four missed heartbeats: a member that
/// is merely slow for a moment is not dropped, a dead one is within 2 s
/// (AWS's global tier promises 35 s).
pub const GLOBAL_UNHEALTHY_AFTER: Duration = Duration::from_secs(2);
/// `global.failover.rampUp`: a recovered member's share rises over a
/// minute, long enough for its caches to warm without a herd.
pub const GLOBAL_RAMP_UP: Duration = Duration::from_secs(60);
/// `global.failover.maxErrorRate`: a member refusing or failing more than
/// half of its recent requests is treated as refusing.
pub const GLOBAL_MAX_ERROR_RATE: f64 = 0.5;
/// A member's queue depth (requests waiting per ready replica) that
/// scores 0 on `queueDepth`; deeper queues score 0 too.
pub const GLOBAL_QUEUE_DEPTH_SCALE: f64 = 8.0;

/// The load summary stream (`/global/summary/stream`) sends a summary at
/// most this often however fast the load changes: ten a second tell a
/// router of a change within 100 ms, at a cost of a few hundred bytes.
pub const SUMMARY_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// ... and at least this often when nothing changes, so a router can tell
/// a quiet member from a dead one (see [`GLOBAL_UNHEALTHY_AFTER`]).
pub const SUMMARY_HEARTBEAT: Duration = Duration::from_millis(500);
/// Error and 429 rates in a summary cover about this much recent time.
pub const SUMMARY_RATE_WINDOW: Duration = Duration::from_secs(10);

/// A global router gives up connecting to a member after this long and
/// tries the next: a member that does not accept a connection within a
/// second is in no state to answer soon.
pub const GLOBAL_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Reconnecting to a member's summary stream waits this long after a
/// failure, doubling up to [`GLOBAL_RECONNECT_MAX`]: short enough that a
/// member coming back is heard within about a second.
pub const GLOBAL_RECONNECT_MIN: Duration = Duration::from_millis(100);
pub const GLOBAL_RECONNECT_MAX: Duration = Duration::from_secs(1);
/// A member down for its failures is probed (`GET /v1/models`) this
/// often: only a probe's success brings it back, since it gets no
/// requests.
pub const GLOBAL_PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Without a `regionDistances` table, proximity is the round-trip time
/// the router measures (`GET /v1/models`, timed) every this often; the
/// lowest of the last [`GLOBAL_RTT_SAMPLES`] is kept, so a moment of
/// queueing at the member does not move it.
pub const GLOBAL_RTT_INTERVAL: Duration = Duration::from_secs(5);
pub const GLOBAL_RTT_SAMPLES: usize = 4;
/// A measured round trip this long or longer scores 0 on
/// `regionProximity` (about the longest between two cloud regions); 0 ms
/// scores 1, linearly between.
pub const GLOBAL_RTT_FAR: Duration = Duration::from_millis(200);
/// How often a global router looks at its members' health (to take a
/// silent one down, log the change and update `infergate_member_up`)
/// when no request makes it look.
pub const GLOBAL_HEALTH_TICK: Duration = Duration::from_millis(100);
/// The router's own view of a member's error and 429 rates covers about
/// this much recent time, as a member's summary does.
pub const GLOBAL_ERROR_WINDOW: Duration = SUMMARY_RATE_WINDOW;

/// vLLM's default port for its KV-events publisher (`tcp://*:5557`).
pub const KV_EVENTS_PORT: u16 = 5557;
/// vLLM's tokenizer endpoint: a prompt's token ids as the engine sees
/// them (its chat template applied).
pub const TOKENIZE_PATH: &str = "/tokenize";
/// Tokenizing a prompt takes the engine's API server milliseconds (tens
/// for 32k tokens); past this the prefix is scored by the guess.
pub const TOKENIZE_TIMEOUT: Duration = Duration::from_millis(250);
/// An offloaded block saves about half of what a block in GPU memory
/// does: it must be copied back before the prefill can use it.
pub const OFFLOAD_WEIGHT: f64 = 0.5;
/// `disaggregation.decider.minUncachedTokens`: below about 512 uncached
/// tokens a decode replica prefills the prompt in one chunk of a step it
/// runs anyway, for less than the extra hop and the KV transfer cost.
pub const DISAGGREGATION_MIN_UNCACHED_TOKENS: u32 = 512;
/// `disaggregation.prefillTimeout`: a long prompt queued behind others on
/// a busy prefill replica takes seconds; a minute means it is stuck.
pub const DISAGGREGATION_PREFILL_TIMEOUT: Duration = Duration::from_secs(60);
/// `disaggregation.prefill.bootstrapPort`: SGLang's
/// `--disaggregation-bootstrap-port` default.
pub const SGLANG_BOOTSTRAP_PORT: u16 = 8998;
