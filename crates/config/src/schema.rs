//! The `InferenceGatewayConfig` document, field for field as users write it.
//!
//! Kubernetes style (camelCase, `apiVersion`/`kind`/`metadata`/`spec`) so the
//! same document can be a custom resource. Unknown fields are errors. Fields a
//! user may leave out are `Option`s here; their defaults live in
//! [`crate::defaults`] and the accessors below, nowhere else.

use std::collections::BTreeMap;
use std::time::Duration;

use picker::Scorer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// Defined by the crates that act on them, with the same YAML names.
pub use picker::flow::Priority;
pub use picker::{Fallback, Policy};
use signals::Dialect;

use crate::defaults;
use crate::global::Global;
use crate::security::{Auth, ListenerTls, RateLimits, Tenant, UpstreamTls};
use crate::traffic::{Mirror, Rewrite, Sessions};

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InferenceGatewayConfig {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub metadata: Metadata,
    pub spec: Spec,
    /// What a gateway wrote back about the object, in a document read from
    /// a cluster: accepted and ignored, like the server-set metadata.
    #[serde(default, skip_serializing)]
    pub status: ServerSet,
}

/// Kubernetes object metadata, so the document can be applied as a custom
/// resource (and read back from a cluster). Only `name` is used, in logs.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metadata {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    // Set by the API server or by controllers, never by the author.
    #[serde(default, skip_serializing)]
    pub uid: ServerSet,
    #[serde(default, skip_serializing)]
    pub resource_version: ServerSet,
    #[serde(default, skip_serializing)]
    pub generation: ServerSet,
    #[serde(default, skip_serializing)]
    pub creation_timestamp: ServerSet,
    #[serde(default, skip_serializing)]
    pub deletion_timestamp: ServerSet,
    #[serde(default, skip_serializing)]
    pub deletion_grace_period_seconds: ServerSet,
    #[serde(default, skip_serializing)]
    pub managed_fields: ServerSet,
    #[serde(default, skip_serializing)]
    pub self_link: ServerSet,
    #[serde(default, skip_serializing)]
    pub owner_references: ServerSet,
    #[serde(default, skip_serializing)]
    pub finalizers: ServerSet,
}

/// An object-metadata field a Kubernetes API server or controller sets
/// (`uid`, `resourceVersion`, `managedFields`, ...): any value is accepted
/// and ignored, so a document read back from a cluster checks as written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerSet;

impl<'de> Deserialize<'de> for ServerSet {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| ServerSet)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub listeners: Vec<Listener>,
    #[serde(default)]
    pub admin: Option<Admin>,
    /// Serve the endpoint-picker protocol (Envoy's external processing
    /// over gRPC) for a Gateway API implementation's InferencePool; off
    /// when absent. See docs/kubernetes.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_picker: Option<EndpointPicker>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub shutdown: Shutdown,
    #[serde(default)]
    pub debug: Debug,
    /// Priority band of each model's requests (model or adapter name →
    /// band); models not listed are `standard`.
    #[serde(default)]
    #[schemars(schema_with = "crate::json_schema::priority_map")]
    pub objectives: BTreeMap<String, Priority>,
    #[serde(default)]
    pub flow_control: FlowControl,
    #[serde(default)]
    pub telemetry: Telemetry,
    #[serde(default)]
    pub forwarding: Forwarding,
    /// What `/readyz` answers 200 for.
    #[serde(default)]
    pub ready_when: ReadyWhen,
    /// How callers authenticate; see docs/security.md.
    #[serde(default)]
    pub auth: Option<Auth>,
    #[serde(default)]
    pub tenants: Vec<Tenant>,
    #[serde(default)]
    pub rate_limits: RateLimits,
    /// Local pools; may be empty when `global` has members.
    #[serde(default)]
    pub pools: Vec<Pool>,
    /// Model rewrites and canaries; see docs/traffic.md.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rewrites: Vec<Rewrite>,
    /// Where a request's session key comes from (session affinity and
    /// sticky rewrite targets); no sessions when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions: Option<Sessions>,
    /// Shadow traffic: copies of requests sent to another pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<Mirror>,
    /// Other gateways and endpoints this one routes to; see docs/global.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<Global>,
}

/// When the gateway calls itself ready (`/readyz`, a Kubernetes readiness
/// probe): a pool is ready when a request to it could be sent now.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ReadyWhen {
    /// Some pool is ready: the gateway can serve some models.
    #[default]
    AnyPool,
    /// Every pool is ready: one model without replicas takes the gateway
    /// out of its Service.
    AllPools,
}

/// Queueing in the gateway when a pool is saturated.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlowControl {
    /// Let the `x-infergate-priority` header raise a request above its
    /// model's band (it may always lower it).
    #[serde(default)]
    pub header_may_raise: bool,
    #[serde(default)]
    pub critical: BandLimits,
    #[serde(default)]
    pub standard: BandLimits,
    #[serde(default)]
    pub sheddable: BandLimits,
}

impl FlowControl {
    pub fn band(&self, priority: Priority) -> &BandLimits {
        match priority {
            Priority::Critical => &self.critical,
            Priority::Standard => &self.standard,
            Priority::Sheddable => &self.sheddable,
        }
    }
}

/// Bounds of one band's queue, per pool.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BandLimits {
    pub max_queued: Option<usize>,
    pub max_queued_bytes: Option<u64>,
    /// `0s`: never wait, refuse at once when saturated.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub max_wait: Option<Duration>,
    /// Share (0–1] of a replica's saturation queue depth this band may
    /// fill; the rest is left to the bands above it.
    pub queue_share: Option<f64>,
}

impl BandLimits {
    pub fn max_queued(&self) -> usize {
        self.max_queued.unwrap_or(defaults::FLOW_MAX_QUEUED)
    }
    pub fn max_queued_bytes(&self) -> u64 {
        self.max_queued_bytes
            .unwrap_or(defaults::FLOW_MAX_QUEUED_BYTES)
    }
    pub fn max_wait(&self, priority: Priority) -> Duration {
        self.max_wait.unwrap_or(match priority {
            Priority::Critical => defaults::FLOW_CRITICAL_MAX_WAIT,
            Priority::Standard => defaults::FLOW_STANDARD_MAX_WAIT,
            Priority::Sheddable => defaults::FLOW_SHEDDABLE_MAX_WAIT,
        })
    }
    pub fn queue_share(&self, priority: Priority) -> f64 {
        self.queue_share.unwrap_or(match priority {
            Priority::Critical => defaults::FLOW_CRITICAL_QUEUE_SHARE,
            Priority::Standard => defaults::FLOW_STANDARD_QUEUE_SHARE,
            Priority::Sheddable => defaults::FLOW_SHEDDABLE_QUEUE_SHARE,
        })
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    /// `host:port`; port 0 asks the OS for a free port.
    pub address: String,
    /// Serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN) instead of plain HTTP.
    #[serde(default)]
    pub tls: Option<ListenerTls>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Admin {
    pub address: String,
    #[serde(default)]
    pub tls: Option<ListenerTls>,
}

/// The endpoint-picker listener: a data plane (Envoy Gateway, kgateway,
/// Istio, ...) asks it which replica serves each request.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPicker {
    /// `host:port` of the gRPC listener (HTTP/2 without TLS, as the
    /// data planes dial it), `0.0.0.0:9002` by default; port 0 asks the
    /// OS for a free port.
    pub address: Option<String>,
    /// How the data plane sends bodies when its messages do not say
    /// (Envoy names its processing mode in `protocol_config`).
    #[serde(default)]
    pub body_mode: BodyMode,
    /// Replicas listed after the chosen one, in the picker's order, for
    /// the data plane to fall back to (2 by default, at most 64).
    pub fallbacks: Option<usize>,
}

impl EndpointPicker {
    pub fn address(&self) -> &str {
        self.address
            .as_deref()
            .unwrap_or(defaults::ENDPOINT_PICKER_ADDRESS)
    }
    pub fn fallbacks(&self) -> usize {
        self.fallbacks
            .unwrap_or(defaults::ENDPOINT_PICKER_FALLBACKS)
    }
}

/// Envoy's `processing_mode` body modes an endpoint picker is used with.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum BodyMode {
    /// `FULL_DUPLEX_STREAMED`: bodies arrive in chunks and go back as
    /// streamed mutations (what Envoy-based gateways configure).
    #[default]
    FullDuplexStreamed,
    /// `BUFFERED`: the whole body in one message, after the headers were
    /// answered.
    Buffered,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Limits {
    pub max_body_bytes: Option<u64>,
    /// Request body bytes held in memory at once, across every connection.
    pub max_buffered_body_bytes: Option<u64>,
    pub max_connections: Option<u32>,
    /// Client connections open at once from one IP address; unlimited when
    /// absent.
    pub max_connections_per_client: Option<u32>,
    /// How long a new connection has to deliver its first request head.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub header_timeout: Option<Duration>,
}

impl Limits {
    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes.unwrap_or(defaults::MAX_BODY_BYTES)
    }

    pub fn max_buffered_body_bytes(&self) -> u64 {
        self.max_buffered_body_bytes
            .unwrap_or(defaults::MAX_BUFFERED_BODY_BYTES)
    }

    pub fn max_connections(&self) -> u32 {
        self.max_connections.unwrap_or(defaults::MAX_CONNECTIONS)
    }

    pub fn header_timeout(&self) -> Duration {
        self.header_timeout.unwrap_or(defaults::HEADER_TIMEOUT)
    }
}

/// What the public listeners pass on to replicas, and whom they believe.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Forwarding {
    /// `POST` paths forwarded besides the inference endpoints (for example
    /// an engine's `/v1/load_lora_adapter`). Exact paths, no patterns.
    #[serde(default)]
    pub extra_paths: Vec<String>,
    /// Peers (IP addresses or CIDR blocks) whose `X-Forwarded-For` and
    /// `Forwarded` values are kept and extended; from any other peer they
    /// are replaced by the peer's own address.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Whose `traceparent` sampled flag may force a trace to be recorded.
    #[serde(default)]
    pub client_sampling: ClientSampling,
}

impl Forwarding {
    /// `trustedProxies`, parsed (validation has refused any invalid one).
    pub fn trusted_proxies(&self) -> Vec<ipnet::IpNet> {
        self.trusted_proxies
            .iter()
            .filter_map(|p| parse_ip_net(p).ok())
            .collect()
    }
}

/// An IP address (a one-address block) or a CIDR block.
pub fn parse_ip_net(s: &str) -> Result<ipnet::IpNet, String> {
    let s = s.trim();
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{s:?} is neither an IP address nor a CIDR block"))
}

/// A path an operator may add to the forwarded ones: absolute, without
/// dot segments, encoded characters or a query.
pub fn check_forward_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("{path:?} must start with /"));
    }
    if path.contains(['%', '?', '#', '\\']) || !path.is_ascii() {
        return Err(format!(
            "{path:?} must be a plain path: no %-encoding, query, fragment or backslash"
        ));
    }
    if path.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(format!("{path:?} must not contain . or .. segments"));
    }
    Ok(())
}

/// Whether a caller's `traceparent` may force sampling. A caller's trace
/// id is always joined; this decides only whether its sampled flag is
/// obeyed or the gateway's own `sampleRatio` decides.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ClientSampling {
    /// Any caller's flag is obeyed.
    Always,
    /// Only the flag of a peer in `trustedProxies`.
    #[default]
    TrustedProxies,
    /// No caller's flag is obeyed.
    Never,
}

/// Upstream timeouts. The defaults never cut a long generation that is
/// still producing: `firstByte` covers a non-streaming answer that only
/// arrives when generation ends, `idle` only fires when a stream goes quiet.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timeouts {
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub connect: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub first_byte: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub idle: Option<Duration>,
}

impl Timeouts {
    pub fn connect(&self) -> Duration {
        self.connect.unwrap_or(defaults::CONNECT_TIMEOUT)
    }
    pub fn first_byte(&self) -> Duration {
        self.first_byte.unwrap_or(defaults::FIRST_BYTE_TIMEOUT)
    }
    pub fn idle(&self) -> Duration {
        self.idle.unwrap_or(defaults::IDLE_TIMEOUT)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Shutdown {
    /// How long in-flight requests may run after SIGTERM/SIGINT.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub drain_timeout: Option<Duration>,
}

impl Shutdown {
    pub fn drain_timeout(&self) -> Duration {
        self.drain_timeout.unwrap_or(defaults::DRAIN_TIMEOUT)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Debug {
    /// Add `x-infergate-pool`, `x-infergate-endpoint`, `x-infergate-scores`
    /// and `x-infergate-queue-wait-ms` to responses.
    #[serde(default)]
    pub decision_headers: bool,
}

/// Access log and trace export. Metrics need no settings: they are served
/// on the admin listener.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Telemetry {
    #[serde(default)]
    pub access_log: AccessLog,
    /// Export traces over OTLP/HTTP; no export when absent.
    #[serde(default)]
    pub otlp: Option<Otlp>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessLog {
    /// `text` or `json`; when absent, the format of the process's other
    /// logs (`--log-format`).
    #[serde(default)]
    pub format: Option<LogFormat>,
}

/// The format of the access log here, and of the process's logs on the
/// command line (`--log-format`).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    pub const ALL: [LogFormat; 2] = [LogFormat::Text, LogFormat::Json];

    /// The name in the config and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| format!("unknown log format {s:?} (expected text or json)"))
    }
}

/// An OpenTelemetry collector reached over OTLP/HTTP with protobuf bodies.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Otlp {
    /// `http://host:port` of the collector; spans go to `/v1/traces` under
    /// it unless the URL already ends with that path.
    pub endpoint: String,
    #[serde(default)]
    pub service_name: Option<String>,
    /// Fraction of new traces recorded, 0..=1. A request that arrives with
    /// a `traceparent` follows the caller's sampling decision instead.
    #[serde(default)]
    pub sample_ratio: Option<f64>,
    /// Longest time one export may take.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub timeout: Option<Duration>,
}

impl Otlp {
    pub fn service_name(&self) -> &str {
        self.service_name
            .as_deref()
            .unwrap_or(defaults::OTLP_SERVICE_NAME)
    }
    pub fn sample_ratio(&self) -> f64 {
        self.sample_ratio.unwrap_or(defaults::OTLP_SAMPLE_RATIO)
    }
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(defaults::OTLP_TIMEOUT)
    }
    /// The URL spans are posted to.
    pub fn traces_url(&self) -> String {
        let base = self.endpoint.trim_end_matches('/');
        if base.ends_with("/v1/traces") {
            base.to_owned()
        } else {
            format!("{base}/v1/traces")
        }
    }
}

/// HTTP version spoken to a pool's replicas.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    #[default]
    Http1,
    /// HTTP/2 over cleartext (prior knowledge).
    H2c,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pool {
    pub name: String,
    /// The metrics dialect the pool's replicas speak.
    #[serde(default)]
    #[schemars(schema_with = "crate::json_schema::dialect")]
    pub engine: Dialect,
    /// Model names clients may put in `model`; the first is the base model.
    pub models: Vec<String>,
    /// LoRA adapters served by this pool's replicas.
    #[serde(default)]
    pub adapters: Vec<String>,
    /// Static replica addresses (`host:port`, or `https://host:port` for
    /// TLS). Exactly one of `endpoints`, `simulated`, `endpointSelector`
    /// and `inferencePool` is given.
    #[serde(default)]
    pub endpoints: Vec<String>,
    #[serde(default)]
    pub simulated: Option<Simulated>,
    /// Replicas found in Kubernetes: every Ready pod the labels select.
    #[serde(default)]
    pub endpoint_selector: Option<EndpointSelector>,
    /// Replicas of a Gateway API Inference Extension `InferencePool`,
    /// followed as it changes.
    #[serde(default)]
    pub inference_pool: Option<InferencePoolRef>,
    #[serde(default)]
    pub protocol: Protocol,
    /// TLS settings for `https://` endpoints.
    #[serde(default)]
    pub tls: Option<UpstreamTls>,
    #[serde(default)]
    pub retry: Retry,
    #[serde(default)]
    pub scheduling: Scheduling,
    /// Tell the replicas each request's priority band, for an engine that
    /// schedules by it: the body sent to a replica carries `priority`
    /// (critical 0, standard 1, sheddable 2; lower is served first),
    /// replacing any the client sent. vLLM only, started with
    /// `--scheduling-policy priority`.
    #[serde(default)]
    pub engine_priority: Option<bool>,
    /// The replicas' context length (prompt and completion, in tokens),
    /// for engines that do not list it in `/v1/models` as vLLM and SGLang
    /// do; what a replica lists, or says when it refuses a prompt as too
    /// long, takes precedence.
    #[serde(default)]
    pub max_model_len: Option<u64>,
    /// Where the picker learns what each replica's prefix cache holds: the
    /// gateway's own guess (the default), or the engines' KV-cache events.
    #[serde(default)]
    pub prefix_cache: PrefixCache,
    /// What happens to a generation whose replica breaks or stalls after
    /// it started answering: it goes on from another replica.
    #[serde(default)]
    pub continuation: Continuation,
    /// How a replica leaves the pool without cutting its streams.
    #[serde(default)]
    pub drain: ReplicaDrain,
    /// What requests do while the pool has no ready replica.
    #[serde(default)]
    pub cold_start: ColdStart,
    /// Prefill/decode disaggregation: the pool's replicas decode, these
    /// prefill replicas compute long prompts for them.
    #[serde(default)]
    pub disaggregation: Option<Disaggregation>,
}

/// A pool with no ready replica (none yet, all scaled away, all starting)
/// is cold: requests wait in flow control for its first ready replica, and
/// the gateway may wake it.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ColdStart {
    /// How long a request waits for a cold pool; past it, 503 with
    /// `Retry-After`. `0s` refuses at once.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub timeout: Option<Duration>,
    /// What to call when a request finds the pool cold.
    #[serde(default)]
    pub wake: Option<Wake>,
    /// A streaming request that has waited this long for the cold pool
    /// gets its response's head (200, server-sent events) and then an SSE
    /// comment line this often, so proxies with idle timeouts in front do
    /// not cut it; the answer follows, or an error event. Off when absent.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub heartbeat: Option<Duration>,
}

impl ColdStart {
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(defaults::COLD_START_TIMEOUT)
    }
}

/// How a cold pool is woken, once per cold start: either a Kubernetes
/// workload scaled up to `replicas` through its scale subresource, or a
/// URL the gateway POSTs `{"pool": NAME}` to (a VM group, a cloud
/// autoscaler), with a bounded retry. Without `wake`, an external
/// autoscaler brings the replicas, reading the gateway's metrics.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Wake {
    /// `http://` or `https://` URL.
    #[serde(default)]
    pub webhook: Option<String>,
    /// The workload that runs the pool's replicas.
    #[serde(default)]
    pub kind: Option<WorkloadKind>,
    /// The workload's name.
    #[serde(default)]
    pub name: Option<String>,
    /// The workload's namespace (default: the gateway's own).
    #[serde(default)]
    pub namespace: Option<String>,
    /// The replicas the workload is scaled up to, at least (default 1);
    /// a workload that already asks for as many is left alone.
    #[serde(default)]
    pub replicas: Option<u32>,
}

impl Wake {
    /// The workload to scale, when the wake names one.
    pub fn workload(&self) -> Option<Workload<'_>> {
        Some(Workload {
            kind: self.kind?,
            name: self.name.as_deref()?,
            namespace: self.namespace.as_deref(),
            replicas: self.replicas.unwrap_or(defaults::WAKE_REPLICAS),
        })
    }
}

/// A Kubernetes workload a cold pool wakes by scaling it up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload<'a> {
    pub kind: WorkloadKind,
    pub name: &'a str,
    pub namespace: Option<&'a str>,
    pub replicas: u32,
}

/// The kinds of workload with a scale subresource that model servers run
/// as.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq, Hash)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    /// `leaderworkerset.x-k8s.io/v1`: multi-host model servers.
    LeaderWorkerSet,
}

/// Mid-stream continuation: a broken generation is sent on to another
/// replica with the text generated so far, and the client's one response
/// goes on.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Continuation {
    /// Continue broken generations (default: on).
    pub enabled: Option<bool>,
    /// Continuations one request may make, each on another replica.
    pub max_attempts: Option<u32>,
    /// A replica that sends nothing for this long mid-answer is abandoned
    /// and the answer continued elsewhere.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub idle_timeout: Option<Duration>,
    /// The most generated text kept per answer to continue from; an answer
    /// longer than this is not continued.
    pub max_text_bytes: Option<u64>,
}

impl Continuation {
    pub fn enabled(&self) -> bool {
        self.enabled.unwrap_or(defaults::CONTINUATION_ENABLED)
    }
    pub fn max_attempts(&self) -> u32 {
        self.max_attempts
            .unwrap_or(defaults::CONTINUATION_MAX_ATTEMPTS)
    }
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
            .unwrap_or(defaults::CONTINUATION_IDLE_TIMEOUT)
    }
    pub fn max_text_bytes(&self) -> u64 {
        self.max_text_bytes
            .unwrap_or(defaults::CONTINUATION_MAX_TEXT_BYTES)
    }
}

/// A replica leaving the pool (removed, terminating, or drained by hand)
/// gets no new requests; its answers finish where they are until the
/// deadline, and are then continued on other replicas.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReplicaDrain {
    /// How long a leaving replica's answers may run where they are.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub deadline: Option<Duration>,
}

impl ReplicaDrain {
    pub fn deadline(&self) -> Duration {
        self.deadline.unwrap_or(defaults::REPLICA_DRAIN_DEADLINE)
    }
}

/// Which index scores prefix affinity, and how to follow the engines'
/// KV-cache events (vLLM and SGLang `--kv-events-config`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefixCache {
    #[serde(default)]
    pub source: PrefixSource,
    /// The port every replica's events publisher binds (vLLM's
    /// `"endpoint": "tcp://*:5557"`); data-parallel rank `r` publishes on
    /// this port + `r`.
    pub events_port: Option<u16>,
    /// The port of the replay socket (vLLM's `replay_endpoint`), which
    /// gives back batches a gateway missed; without it a lost batch makes
    /// that replica's index unsure until its engine clears its cache.
    pub replay_port: Option<u16>,
    /// Only events published under this topic are read; every topic when
    /// not given (vLLM's default topic is empty).
    pub topic: Option<String>,
    /// Data-parallel ranks per replica, each publishing on its own port.
    pub data_parallel_size: Option<u32>,
    /// Publishers of replicas that do not share one port (several on one
    /// host), by the replica's address.
    #[serde(default)]
    pub publishers: BTreeMap<String, Publisher>,
    /// Where a prompt's token ids come from: this path of a replica of the
    /// pool (vLLM's `POST /tokenize`), so they are the engine's own.
    pub tokenize_path: Option<String>,
    /// How long the gateway waits for a prompt's tokens before it scores
    /// the prefix by its guess instead.
    #[serde(default, with = "humantime_serde")]
    #[schemars(with = "Option<String>")]
    pub tokenize_timeout: Option<Duration>,
    /// A block in an offload tier (CPU memory) counts as this share of a
    /// block in GPU memory: loading it back costs part of a recompute.
    pub offload_weight: Option<f64>,
}

/// The index that scores prefix affinity.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum PrefixSource {
    /// The gateway's guess: where it sent earlier prompts, aged by an
    /// estimate of each replica's cache.
    #[default]
    Approximate,
    /// The engines' own KV-cache events, exact; the guess answers for a
    /// replica whose events are missing or unsure.
    Events,
}

/// One replica's events publisher.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Publisher {
    /// `tcp://host:port` of its PUB socket.
    pub endpoint: String,
    /// `tcp://host:port` of its replay socket, if it has one.
    pub replay_endpoint: Option<String>,
}

impl PrefixCache {
    pub fn events_port(&self) -> u16 {
        self.events_port.unwrap_or(defaults::KV_EVENTS_PORT)
    }

    pub fn data_parallel_size(&self) -> u32 {
        self.data_parallel_size.unwrap_or(1)
    }

    pub fn tokenize_path(&self) -> &str {
        self.tokenize_path
            .as_deref()
            .unwrap_or(defaults::TOKENIZE_PATH)
    }

    pub fn tokenize_timeout(&self) -> Duration {
        self.tokenize_timeout.unwrap_or(defaults::TOKENIZE_TIMEOUT)
    }

    pub fn offload_weight(&self) -> f64 {
        self.offload_weight.unwrap_or(defaults::OFFLOAD_WEIGHT)
    }

    /// Where `replica` (`host:port`, or `https://host:port`) publishes its
    /// events, and its replay socket: as listed in `publishers`, else on
    /// the replica's host at the pool's ports.
    pub fn publisher_of(&self, replica: &str) -> Publisher {
        if let Some(listed) = self.publishers.get(replica) {
            return listed.clone();
        }
        let host_port = replica
            .strip_prefix("https://")
            .or_else(|| replica.strip_prefix("http://"))
            .unwrap_or(replica);
        let host = host_port
            .rsplit_once(':')
            .map_or(host_port, |(host, _)| host);
        Publisher {
            endpoint: format!("tcp://{host}:{}", self.events_port()),
            replay_endpoint: self.replay_port.map(|p| format!("tcp://{host}:{p}")),
        }
    }
}

impl Pool {
    /// Where the pool's replicas are found in Kubernetes, if they are.
    pub fn discovery(&self) -> Option<Discovery<'_>> {
        match (&self.endpoint_selector, &self.inference_pool) {
            (Some(selector), _) => Some(Discovery::Selector(selector)),
            (None, Some(pool)) => Some(Discovery::InferencePool(pool)),
            (None, None) => None,
        }
    }

    pub fn policy(&self) -> Policy {
        match (self.scheduling.policy, self.engine) {
            (Some(policy), _) => policy,
            (None, Dialect::None) => Policy::LeastRequest,
            (None, _) => Policy::Scored,
        }
    }

    /// Whether request bodies carry their band's `priority` to the replicas.
    pub fn engine_priority(&self) -> bool {
        self.engine_priority.unwrap_or(defaults::ENGINE_PRIORITY)
    }

    /// How the pool's simulated replicas schedule: as given, else by
    /// priority exactly when the gateway sends one (a replica that does
    /// not schedule by priority refuses it).
    pub fn simulated_scheduling(&self) -> Option<EngineScheduling> {
        let simulated = self.simulated.as_ref()?;
        Some(
            simulated
                .scheduling_policy
                .unwrap_or(if self.engine_priority() {
                    EngineScheduling::Priority
                } else {
                    EngineScheduling::Fcfs
                }),
        )
    }

    /// The model adapters are applied to (`parent` in `/v1/models`).
    pub fn base_model(&self) -> &str {
        self.models.first().map(String::as_str).unwrap_or_default()
    }
}

// One definition, in the crate that dials replicas (the scraper); the
// config names it where endpoints are described.
pub use signals::{Scheme, endpoint_scheme};

/// Pods selected by label: each Ready, non-terminating pod with an IP is a
/// replica at `podIP:port`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointSelector {
    pub namespace: String,
    pub match_labels: BTreeMap<String, String>,
    /// The replicas' port number; exactly one of `port` and `portName`.
    #[serde(default)]
    pub port: Option<u16>,
    /// The name of a container port of the pod.
    #[serde(default)]
    pub port_name: Option<String>,
    /// A full list of the pods this often, besides the watch, in case a
    /// watch stops delivering without closing.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub relist_interval: Option<Duration>,
}

impl EndpointSelector {
    pub fn relist_interval(&self) -> Duration {
        self.relist_interval
            .unwrap_or(defaults::DISCOVERY_RELIST_INTERVAL)
    }
}

/// A Gateway API Inference Extension `InferencePool`
/// (`inference.networking.k8s.io/v1`): its `selector.matchLabels` pick the
/// pods, each of its `targetPorts` is a replica on each pod.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InferencePoolRef {
    pub name: String,
    pub namespace: String,
    /// As in `endpointSelector`.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub relist_interval: Option<Duration>,
}

impl InferencePoolRef {
    pub fn relist_interval(&self) -> Duration {
        self.relist_interval
            .unwrap_or(defaults::DISCOVERY_RELIST_INTERVAL)
    }
}

/// How a pool's replicas are found in Kubernetes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Discovery<'a> {
    Selector(&'a EndpointSelector),
    InferencePool(&'a InferencePoolRef),
}

impl Discovery<'_> {
    pub fn relist_interval(&self) -> Duration {
        match self {
            Discovery::Selector(s) => s.relist_interval(),
            Discovery::InferencePool(p) => p.relist_interval(),
        }
    }
}

/// Replicas the gateway starts in-process from the simulator.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Simulated {
    pub replicas: usize,
    /// Hardware profiles, cycled over the replicas.
    pub hardware: Vec<String>,
    /// Model profile (e.g. `llama-3.1-8b`).
    pub model: String,
    #[serde(default)]
    pub tensor_parallel: Option<u32>,
    #[serde(default)]
    pub max_loras: Option<u32>,
    /// Simulated time runs this many times faster than wall time.
    #[serde(default)]
    pub time_scale: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
    /// The replicas' vLLM `--scheduling-policy`; default `priority` when
    /// the pool's `enginePriority` is on, else `fcfs`.
    #[serde(default)]
    pub scheduling_policy: Option<EngineScheduling>,
    /// Simulated time each replica loads before it listens, as a model
    /// server loads its weights: a duration (`45s`), or `calibrated` (the
    /// model's weights at a network volume's speed, plus engine start-up;
    /// about 90 s for an 8B model). Default: it listens at once.
    #[serde(default)]
    pub load_time: Option<String>,
    /// Start scaled to zero: the replicas start (and load) only when a
    /// request finds the pool cold, woken through the fleet's own wake
    /// endpoint, which `infergate serve` makes the pool's
    /// `coldStart.wake.webhook`.
    #[serde(default)]
    pub start_at_zero: bool,
}

/// How an engine orders the requests it holds: vLLM's
/// `--scheduling-policy`, with its names.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EngineScheduling {
    /// First come, first served; a request's `priority` other than 0 is
    /// refused.
    Fcfs,
    /// By the request's `priority` (lower first), then arrival.
    Priority,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retry {
    /// Further replicas to try when a connection fails before any
    /// response byte.
    pub max_retries: Option<u32>,
}

impl Retry {
    pub fn max_retries(&self) -> u32 {
        self.max_retries.unwrap_or(defaults::MAX_RETRIES)
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scheduling {
    /// Default: `scored`, or `least-request` for `engine: none` (no
    /// metrics to score on).
    #[serde(default)]
    #[schemars(schema_with = "crate::json_schema::policy")]
    pub policy: Option<Policy>,
    /// A named weight set: `default`, `latency` or `throughput`.
    #[serde(default)]
    pub preset: Option<String>,
    /// Per-scorer weights; each given field overrides the preset's.
    #[serde(default)]
    pub weights: Option<Weights>,
    #[serde(default)]
    pub saturation: Option<Saturation>,
    #[serde(default)]
    pub metrics: Metrics,
    /// When every replica is stale or unhealthy but reachable:
    /// `least-request` (keep serving, the default) or `refuse`.
    #[serde(default)]
    #[schemars(schema_with = "crate::json_schema::fallback")]
    pub fallback: Fallback,
}

impl Scheduling {
    /// The picker's weights for the pool: the preset's (the default preset
    /// when none is named, or the name is unknown and refused by
    /// validation), then each weight given under `weights`.
    pub fn picker_weights(&self) -> picker::Weights {
        let mut weights = self
            .preset
            .as_deref()
            .and_then(picker::Weights::preset)
            .unwrap_or_default();
        if let Some(given) = &self.weights {
            for scorer in Scorer::ALL {
                if let Some(weight) = given.get(scorer) {
                    weights.set(scorer, weight);
                }
            }
        }
        weights
    }
}

// One field per scorer of the picker's table (`Scorer`), named as
// `Scorer::name` says. The fields stay written out, not a map, so serde and
// schemars keep the document's shape and the schema (and so the CRD) as
// they are; `Weights::get` ties them to the table. (Plain comments: a doc
// comment here would become the schema's description.)
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Weights {
    pub queue: Option<f64>,
    pub kv_cache: Option<f64>,
    pub inflight: Option<f64>,
    pub prefix: Option<f64>,
    pub lora: Option<f64>,
    pub speed: Option<f64>,
    /// Session affinity: a session's requests stay on its replica.
    pub session: Option<f64>,
}

impl Weights {
    /// The weight given for `scorer`, if any. The struct is taken apart
    /// whole, without `..`, so a field with no scorer or a scorer with no
    /// field does not compile.
    pub fn get(&self, scorer: Scorer) -> Option<f64> {
        let Weights {
            queue,
            kv_cache,
            inflight,
            prefix,
            lora,
            speed,
            session,
        } = *self;
        match scorer {
            Scorer::Queue => queue,
            Scorer::KvCache => kv_cache,
            Scorer::Inflight => inflight,
            Scorer::Prefix => prefix,
            Scorer::Lora => lora,
            Scorer::Speed => speed,
            Scorer::Session => session,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Saturation {
    pub queue_depth: Option<u64>,
    pub kv_cache: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Metrics {
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub stale_after: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub timeout: Option<Duration>,
}

impl Metrics {
    pub fn interval(&self) -> Duration {
        self.interval.unwrap_or(defaults::SCRAPE_INTERVAL)
    }
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(defaults::SCRAPE_TIMEOUT)
    }
}

// Prefill/decode disaggregation of a pool: its replicas decode, a group of
// prefill replicas computes long prompts for them, and the KV moves between
// the two by the engines' own protocol.

/// A disaggregated pool: the pool's own replicas (endpoints, simulated,
/// selector or InferencePool) are its decode replicas; `prefill` names the
/// prefill replicas.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disaggregation {
    /// The hand-off the engines speak: `vllm` (a KV connector such as
    /// NixlConnector: the prefill first, its `kv_transfer_params` into the
    /// decode) or `sglang` (both at once, paired by a bootstrap room).
    pub protocol: KvProtocol,
    pub prefill: PrefillGroup,
    /// When a request goes through a prefill replica at all.
    #[serde(default)]
    pub decider: Decider,
    /// Longest wait for a prefill leg's answer (vLLM) before another
    /// prefill replica, or the decode replica alone, takes the request.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub prefill_timeout: Option<Duration>,
}

/// Which engines' disaggregation protocol a pool speaks.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KvProtocol {
    Vllm,
    Sglang,
}

impl KvProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            KvProtocol::Vllm => "vllm",
            KvProtocol::Sglang => "sglang",
        }
    }
}

/// The prefill replicas: static addresses, or pods found by label.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefillGroup {
    /// Static prefill replica addresses (`host:port`). Exactly one of
    /// `endpoints` and `endpointSelector` is given.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Every Ready pod these labels select, as a pool's
    /// `endpointSelector` (llm-d labels its prefill pods
    /// `llm-d.ai/role: prefill`).
    #[serde(default)]
    pub endpoint_selector: Option<EndpointSelector>,
    /// SGLang: the prefill servers' `--disaggregation-bootstrap-port`.
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
}

/// The decider: a prompt whose part the decode replica has not cached is
/// shorter than `minUncachedTokens` is prefilled by the decode replica
/// itself (the hop and the transfer cost more than they save).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Decider {
    #[serde(default)]
    pub min_uncached_tokens: Option<u32>,
}

/// The name a pool's prefill group is discovered under: the pool's name
/// and a suffix no pool name can have (`/`).
pub fn prefill_group_name(pool: &str) -> String {
    format!("{pool}{PREFILL_GROUP_SUFFIX}")
}

/// The pool whose prefill group `name` is, if it is one.
pub fn prefill_group_of(name: &str) -> Option<&str> {
    name.strip_suffix(PREFILL_GROUP_SUFFIX)
}

const PREFILL_GROUP_SUFFIX: &str = "/prefill";

impl Disaggregation {
    /// Where the prefill replicas are found in Kubernetes, if they are.
    pub fn prefill_discovery(&self) -> Option<Discovery<'_>> {
        self.prefill
            .endpoint_selector
            .as_ref()
            .map(Discovery::Selector)
    }

    pub fn min_uncached_tokens(&self) -> u32 {
        self.decider
            .min_uncached_tokens
            .unwrap_or(defaults::DISAGGREGATION_MIN_UNCACHED_TOKENS)
    }

    pub fn prefill_timeout(&self) -> Duration {
        self.prefill_timeout
            .unwrap_or(defaults::DISAGGREGATION_PREFILL_TIMEOUT)
    }

    pub fn bootstrap_port(&self) -> u16 {
        self.prefill
            .bootstrap_port
            .unwrap_or(defaults::SGLANG_BOOTSTRAP_PORT)
    }
}
