//! The routing policies a benchmark compares, and the gateway config each
//! one runs under.
//!
//! Both modes start from the same `InferenceGatewayConfig` document: live
//! mode hands it to the gateway, virtual mode derives its picker from it
//! with the gateway's own mapping ([`gateway::picker_config`]), so the two
//! cannot drift apart.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;

use crate::flow::{FlowLimits, FlowMode};

/// A policy as named on the command line: `round-robin`, `least-request`,
/// `random`, `scored` (default weights), `predicted` (the scored
/// candidates ranked by each replica's learned latency), or a weight
/// preset such as
/// `latency` (also spelt `scored:latency`), any of them with `+sessions`
/// for session affinity (the gateway keys sessions by the body's `user`,
/// which the clients set to their session, and keeps a session on its
/// replica); `scored-events` (or `scored-events:PRESET`) is the scored
/// policy with the replicas' own word on their prefix caches, as if every
/// engine published its KV events and none were lost (in virtual time), or
/// the gateway following the simulated engines' real KV events (live); any
/// of them with `@N` for N gateway replicas in front of the same fleet
/// (live), the clients splitting their requests between them round-robin
/// as a Kubernetes Service would; and whether the gateway's admission
/// queue is on for the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyUnderTest {
    /// Config name of the policy.
    policy: &'static str,
    /// Weight preset of the scored policy.
    preset: Option<String>,
    flow: FlowMode,
    /// The gateway reads session keys (`spec.sessions`).
    sessions: bool,
    /// Prefix affinity from the engines' caches (their KV events) rather
    /// than the gateway's approximate index.
    events: bool,
    /// Independent gateway replicas in front of the fleet (live mode).
    gateways: usize,
}

impl PolicyUnderTest {
    pub const ROUND_ROBIN: &'static str = "round-robin";
    /// The scored policy's name with prefix affinity from KV events.
    pub const SCORED_EVENTS: &'static str = "scored-events";

    /// The baseline every change is measured against.
    pub fn round_robin() -> Self {
        Self {
            policy: Self::ROUND_ROBIN,
            preset: None,
            flow: FlowMode::On,
            sessions: false,
            events: false,
            gateways: 1,
        }
    }

    /// The same policy with session affinity on.
    pub fn with_sessions(self) -> Self {
        Self {
            sessions: true,
            ..self
        }
    }

    /// Whether requests carry their session key to the picker.
    pub fn sessions(&self) -> bool {
        self.sessions
    }

    /// The same policy with the admission queue `flow`.
    pub fn with_flow(self, flow: FlowMode) -> Self {
        Self { flow, ..self }
    }

    pub fn flow(&self) -> FlowMode {
        self.flow
    }

    /// How the replicas behind the gateway schedule their requests: by
    /// the priority the gateway sends them, when it sends one.
    pub fn engine_scheduling(&self) -> sim::SchedulingPolicy {
        if self.flow.engine_priority() {
            sim::SchedulingPolicy::Priority
        } else {
            sim::SchedulingPolicy::Fcfs
        }
    }

    /// The default comparison: round-robin, least-request, scored.
    pub fn defaults() -> Vec<Self> {
        ["round-robin", "least-request", "scored"]
            .into_iter()
            .map(|name| name.parse().expect("built-in names parse"))
            .collect()
    }

    pub fn is_round_robin(&self) -> bool {
        self.policy == Self::ROUND_ROBIN
    }

    /// Whether the policy reads scraped replica signals: the scored policy,
    /// and the predicted one, which ranks the scored candidates.
    pub fn uses_signals(&self) -> bool {
        matches!(self.policy, "scored" | "predicted")
    }

    /// Whether prefix affinity comes from the engines' KV events (in
    /// virtual time: from each engine's prefix cache, read at the pick).
    pub fn exact_prefix(&self) -> bool {
        self.events
    }

    /// How many gateway replicas serve the run (`@N`; 1 without).
    pub fn gateways(&self) -> usize {
        self.gateways
    }
}

/// The most gateway replicas `@N` starts: enough to show replicas agreeing
/// without the gateways' own CPU crowding the replicas on a small machine.
pub const MAX_GATEWAYS: usize = 4;

/// The gateway's policies by config name.
const POLICIES: [&str; 5] = [
    "round-robin",
    "least-request",
    "random",
    "scored",
    "predicted",
];

impl std::str::FromStr for PolicyUnderTest {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> anyhow::Result<Self> {
        let name = name.trim();
        if let Some((base, count)) = name.rsplit_once('@') {
            let gateways = match count.parse::<usize>() {
                Ok(n) if (1..=MAX_GATEWAYS).contains(&n) => n,
                _ => bail!("{name:?}: @N takes 1 to {MAX_GATEWAYS} gateway replicas"),
            };
            return Ok(Self {
                gateways,
                ..base.parse()?
            });
        }
        if let Some(base) = name.strip_suffix("+sessions") {
            return Ok(base.parse::<Self>()?.with_sessions());
        }
        if let Some(rest) = name.strip_prefix(Self::SCORED_EVENTS) {
            let scored = match rest {
                "" => "scored".to_owned(),
                preset if preset.starts_with(':') => format!("scored{preset}"),
                _ => bail!("unknown policy {name:?}"),
            };
            return Ok(Self {
                events: true,
                ..scored.parse()?
            });
        }
        let (policy, preset) = match name.split_once(':') {
            Some(("scored", preset)) => ("scored", Some(preset)),
            Some(_) => bail!("only the scored policy takes a preset: {name:?}"),
            None => match name {
                "round-robin" | "least-request" | "random" | "scored" | "predicted" => (name, None),
                preset => ("scored", Some(preset)),
            },
        };
        let policy = POLICIES
            .into_iter()
            .find(|p| *p == policy)
            .expect("names above are known");
        let preset = match preset {
            None | Some("default") => None,
            Some(preset) if picker::Weights::preset(preset).is_some() => Some(preset.to_owned()),
            Some(other) => bail!(
                "unknown policy or preset {other:?} (policies: {}; presets: {})",
                POLICIES.join(", "),
                picker::Weights::PRESETS.join(", ")
            ),
        };
        Ok(Self {
            policy,
            preset,
            flow: FlowMode::On,
            sessions: false,
            events: false,
            gateways: 1,
        })
    }
}

impl fmt::Display for PolicyUnderTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let policy = match self.events {
            true => Self::SCORED_EVENTS,
            false => self.policy,
        };
        match &self.preset {
            Some(preset) => write!(f, "{policy}:{preset}")?,
            None => f.write_str(policy)?,
        }
        if self.sessions {
            f.write_str("+sessions")?;
        }
        if self.gateways != 1 {
            write!(f, "@{}", self.gateways)?;
        }
        Ok(())
    }
}

/// Parse a comma-separated policy list, putting round-robin first (every
/// change is reported against it) and dropping repeats.
pub fn parse_list(list: &str) -> anyhow::Result<Vec<PolicyUnderTest>> {
    let mut policies = vec![PolicyUnderTest::round_robin()];
    for name in list.split(',').filter(|n| !n.trim().is_empty()) {
        let policy: PolicyUnderTest = name.parse()?;
        if !policies.contains(&policy) {
            policies.push(policy);
        }
    }
    Ok(policies)
}

/// The pool the benchmark puts behind the gateway.
#[derive(Debug, Clone)]
pub struct PoolDocument<'a> {
    pub model: &'a str,
    pub adapters: &'a [String],
    /// Replica addresses, `host:port`.
    pub endpoints: &'a [String],
    /// Engine seconds per wall second of the replicas. The gateway's
    /// time-based defaults (scrape interval, staleness, how long a request
    /// may wait for room) are divided by it, so the gateway behaves in
    /// engine time as it would in front of real-time replicas.
    pub time_scale: f64,
    /// Fields merged into the `scheduling` section of scored policies
    /// (weights, saturation, ...), for tuning experiments.
    pub scored_overrides: Option<&'a serde_json::Value>,
    /// Clients mark their band with `x-infergate-priority`: the gateway
    /// lets the header raise a band, and reports each request's queue wait
    /// (decision headers).
    pub priorities: bool,
    /// Each replica's KV-events publisher, by the replica's address, when
    /// the fleet publishes them (live runs of `scored-events`): the pool
    /// follows them (`prefixCache: {source: events, publishers}`).
    /// Without them (virtual mode) the policy's config is the scored one,
    /// and virtual time supplies the exact prefixes itself.
    pub kv_events: Option<&'a BTreeMap<String, config::Publisher>>,
}

impl PoolDocument<'_> {
    fn scaled(&self, d: Duration) -> String {
        format_duration(d.div_f64(self.time_scale))
    }
}

/// The gateway config for `policy` in front of `pool`: one listener and an
/// admin listener on the given addresses, everything else at its defaults
/// (time-based ones scaled, see [`PoolDocument::time_scale`]).
pub fn gateway_config(
    policy: &PolicyUnderTest,
    pool: &PoolDocument<'_>,
    listen: &str,
    admin: &str,
) -> anyhow::Result<(String, config::InferenceGatewayConfig)> {
    let picker_defaults = picker::PickerConfig::default();
    let defaults = config::FlowControl::default();
    let band = |band: config::Priority| {
        let wait = match policy.flow {
            FlowMode::On | FlowMode::Flat | FlowMode::Priority => {
                defaults.band(band).max_wait(band)
            }
            FlowMode::Off => Duration::ZERO,
        };
        let share = match policy.flow {
            FlowMode::Flat => 1.0,
            FlowMode::On | FlowMode::Off | FlowMode::Priority => {
                defaults.band(band).queue_share(band)
            }
        };
        json!({"maxWait": pool.scaled(wait), "queueShare": share})
    };
    let mut scheduling = json!({
        "policy": policy.policy,
        "metrics": {
            "interval": pool.scaled(config::defaults::SCRAPE_INTERVAL),
            "staleAfter": pool.scaled(picker_defaults.stale_after),
        },
    });
    if let Some(preset) = &policy.preset {
        scheduling["preset"] = json!(preset);
    }
    if let (true, Some(overrides)) = (policy.uses_signals(), pool.scored_overrides) {
        merge(&mut scheduling, overrides);
    }
    let mut document = json!({
        "apiVersion": config::defaults::API_VERSION,
        "kind": config::defaults::KIND,
        "metadata": {"name": format!("bench-{policy}")},
        "spec": {
            "listeners": [{"name": "bench", "address": listen}],
            "admin": {"address": admin},
            "flowControl": {
                "critical": band(config::Priority::Critical),
                "standard": band(config::Priority::Standard),
                "sheddable": band(config::Priority::Sheddable),
            },
            "pools": [{
                "name": "bench",
                "engine": "vllm",
                "models": [pool.model],
                "adapters": pool.adapters,
                "endpoints": pool.endpoints,
                "scheduling": scheduling,
                "enginePriority": policy.flow.engine_priority(),
            }],
        },
    });
    if let (true, Some(publishers)) = (policy.events, pool.kv_events) {
        // Every simulated replica listens on 127.0.0.1, so one pool-wide
        // `eventsPort` cannot reach them all: each is listed with its own
        // publisher, as several engines on one host would be.
        document["spec"]["pools"][0]["prefixCache"] = json!({
            "source": "events",
            "publishers": publishers,
        });
    }
    if policy.sessions {
        document["spec"]["sessions"] = json!({"user": true});
    }
    if pool.priorities {
        document["spec"]["flowControl"]["headerMayRaise"] = json!(true);
        document["spec"]["debug"] = json!({"decisionHeaders": true});
    }
    // JSON is YAML: the gateway reads this text as it is.
    let text = serde_json::to_string_pretty(&document).expect("JSON values serialize");
    let parsed = config::from_yaml(&text)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("the benchmark's gateway config for {policy} is invalid"))?;
    Ok((text, parsed))
}

/// What virtual mode needs of the gateway config for `policy`: the picker
/// configuration the gateway derives from it, and the bounds of the
/// admission queue (for requests of the default band), in engine seconds.
pub fn virtual_gateway(
    policy: &PolicyUnderTest,
    pool: &PoolDocument<'_>,
) -> anyhow::Result<(picker::PickerConfig, Option<FlowLimits>)> {
    let (_, config) = gateway_config(policy, pool, "127.0.0.1:0", "127.0.0.1:0")?;
    let band = config::Priority::Standard;
    let limits = config.spec.flow_control.band(band);
    let max_wait = limits.max_wait(band).as_secs_f64() * pool.time_scale;
    let flow = (max_wait > 0.0).then(|| FlowLimits {
        max_wait,
        max_queued: limits.max_queued(),
        max_queued_bytes: limits.max_queued_bytes(),
    });
    Ok((gateway::picker_config(&config.spec.pools[0]), flow))
}

/// Merge `overrides` into `base`, object by object; anything else replaces.
fn merge(base: &mut serde_json::Value, overrides: &serde_json::Value) {
    match (base, overrides) {
        (serde_json::Value::Object(base), serde_json::Value::Object(overrides)) => {
            for (key, value) in overrides {
                merge(
                    base.entry(key.clone()).or_insert(serde_json::Value::Null),
                    value,
                );
            }
        }
        (base, value) => *base = value.clone(),
    }
}

/// `humantime` spelling for config durations, to the microsecond.
fn format_duration(d: Duration) -> String {
    if d.is_zero() {
        "0s".to_owned()
    } else {
        format!("{}us", d.as_micros().max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(endpoints: &[String], time_scale: f64) -> PoolDocument<'_> {
        PoolDocument {
            model: "meta-llama/Llama-3.1-8B-Instruct",
            adapters: &[],
            endpoints,
            time_scale,
            scored_overrides: None,
            priorities: false,
            kv_events: None,
        }
    }

    #[test]
    fn names_parse_and_print() {
        for name in POLICIES {
            assert_eq!(name.parse::<PolicyUnderTest>().unwrap().to_string(), name);
        }
        let latency: PolicyUnderTest = "latency".parse().unwrap();
        assert_eq!(latency.to_string(), "scored:latency");
        assert_eq!(
            "scored:latency".parse::<PolicyUnderTest>().unwrap(),
            latency
        );
        assert_eq!(
            "scored:default"
                .parse::<PolicyUnderTest>()
                .unwrap()
                .to_string(),
            "scored"
        );
        assert!("fastest".parse::<PolicyUnderTest>().is_err());
        assert!("round-robin:latency".parse::<PolicyUnderTest>().is_err());
    }

    #[test]
    fn predicted_reads_signals_and_reaches_the_picker() {
        let predicted: PolicyUnderTest = "predicted".parse().unwrap();
        assert!(predicted.uses_signals());
        let endpoints = vec!["127.0.0.1:1".to_owned()];
        let (config, _) = virtual_gateway(&predicted, &pool(&endpoints, 1.0)).unwrap();
        assert_eq!(config.policy, picker::Policy::Predicted);
        assert!("predicted:latency".parse::<PolicyUnderTest>().is_err());
    }

    #[test]
    fn scored_events_is_scored_with_the_engines_word_on_prefixes() {
        let events: PolicyUnderTest = "scored-events".parse().unwrap();
        let scored: PolicyUnderTest = "scored".parse().unwrap();
        assert!(events.exact_prefix() && !scored.exact_prefix());
        assert!(events.uses_signals());
        assert_ne!(events, scored);
        for name in [
            "scored-events",
            "scored-events:latency",
            "scored-events+sessions",
        ] {
            let policy: PolicyUnderTest = name.parse().unwrap();
            assert!(policy.exact_prefix(), "{name}");
            assert_eq!(policy.to_string(), name);
        }
        assert!("scored-eventsx".parse::<PolicyUnderTest>().is_err());
        assert!("scored-events:fastest".parse::<PolicyUnderTest>().is_err());
        // The same gateway config and picker as scored: only the source of
        // prefix matches differs, and virtual mode supplies it.
        let endpoints = vec!["127.0.0.1:1".to_owned()];
        let (a, _) = virtual_gateway(&events, &pool(&endpoints, 1.0)).unwrap();
        let (b, _) = virtual_gateway(&scored, &pool(&endpoints, 1.0)).unwrap();
        assert_eq!(a, b);
        let list = parse_list("scored,scored-events").unwrap();
        let names: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["round-robin", "scored", "scored-events"]);
    }

    #[test]
    fn at_n_names_gateway_replicas() {
        for name in [
            "scored@2",
            "scored-events@2",
            "scored-events:latency+sessions@3",
        ] {
            let policy: PolicyUnderTest = name.parse().unwrap();
            assert_eq!(policy.to_string(), name);
        }
        let two: PolicyUnderTest = "scored-events@2".parse().unwrap();
        assert_eq!(two.gateways(), 2);
        assert!(two.exact_prefix());
        let one: PolicyUnderTest = "scored-events@1".parse().unwrap();
        assert_eq!(one, "scored-events".parse().unwrap());
        assert_eq!(one.gateways(), 1);
        assert_ne!(two, one);
        for bad in ["scored@0", "scored@", "scored@x", "scored@99"] {
            assert!(bad.parse::<PolicyUnderTest>().is_err(), "{bad}");
        }
    }

    #[test]
    fn live_events_follow_each_replicas_own_publisher() {
        let endpoints = vec!["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let publishers: BTreeMap<String, config::Publisher> = endpoints
            .iter()
            .enumerate()
            .map(|(i, e)| {
                (
                    e.clone(),
                    config::Publisher {
                        endpoint: format!("tcp://127.0.0.1:{}", 7000 + i),
                        replay_endpoint: Some(format!("tcp://127.0.0.1:{}", 8000 + i)),
                    },
                )
            })
            .collect();
        let doc = PoolDocument {
            kv_events: Some(&publishers),
            ..pool(&endpoints, 1.0)
        };
        let events: PolicyUnderTest = "scored-events".parse().unwrap();
        let (_, config) = gateway_config(&events, &doc, "127.0.0.1:0", "127.0.0.1:0").unwrap();
        let cache = &config.spec.pools[0].prefix_cache;
        assert_eq!(cache.source, config::PrefixSource::Events);
        assert_eq!(
            cache.publisher_of("127.0.0.1:2").endpoint,
            "tcp://127.0.0.1:7001"
        );
        assert_eq!(
            cache.publisher_of("127.0.0.1:1").replay_endpoint.as_deref(),
            Some("tcp://127.0.0.1:8000")
        );
        // The approximate policy ignores them.
        let (_, scored) = gateway_config(
            &"scored".parse().unwrap(),
            &doc,
            "127.0.0.1:0",
            "127.0.0.1:0",
        )
        .unwrap();
        assert_eq!(
            scored.spec.pools[0].prefix_cache.source,
            config::PrefixSource::Approximate
        );
    }

    #[test]
    fn lists_start_with_round_robin_once() {
        let list = parse_list("scored,least-request,round-robin,scored").unwrap();
        let names: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(names, ["round-robin", "scored", "least-request"]);
    }

    #[test]
    fn virtual_mode_uses_the_gateway_mapping_and_defaults() {
        let endpoints = vec!["127.0.0.1:1".to_owned(), "127.0.0.1:2".to_owned()];
        let (latency, flow) =
            virtual_gateway(&"latency".parse().unwrap(), &pool(&endpoints, 1.0)).unwrap();
        assert_eq!(latency.policy, picker::Policy::Scored);
        assert_eq!(latency.weights, picker::Weights::LATENCY);
        let flow = flow.expect("standard requests wait by default");
        let standard = config::FlowControl::default();
        let expected = standard
            .band(config::Priority::Standard)
            .max_wait(config::Priority::Standard);
        assert_eq!(flow.max_wait, expected.as_secs_f64());
        let (rr, _) =
            virtual_gateway(&PolicyUnderTest::round_robin(), &pool(&endpoints, 1.0)).unwrap();
        assert_eq!(rr.policy, picker::Policy::RoundRobin);
    }

    #[test]
    fn overrides_reach_scored_policies_only() {
        let endpoints = vec!["127.0.0.1:1".to_owned()];
        let overrides = json!({"weights": {"lora": 8}, "saturation": {"queueDepth": 50}});
        let doc = PoolDocument {
            scored_overrides: Some(&overrides),
            ..pool(&endpoints, 1.0)
        };
        let (latency, _) = virtual_gateway(&"latency".parse().unwrap(), &doc).unwrap();
        assert_eq!(latency.weights.lora, 8.0);
        assert_eq!(
            latency.weights.queue,
            picker::Weights::LATENCY.queue,
            "the preset fills in the rest"
        );
        assert_eq!(latency.saturation.queue_depth, 50);
        let (rr, _) = virtual_gateway(&PolicyUnderTest::round_robin(), &doc).unwrap();
        assert_eq!(rr.saturation, picker::Saturation::default());
        // The config is validated like any other.
        let bad = json!({"weights": {"lora": -1}});
        let doc = PoolDocument {
            scored_overrides: Some(&bad),
            ..pool(&endpoints, 1.0)
        };
        assert!(virtual_gateway(&"scored".parse().unwrap(), &doc).is_err());
    }

    #[test]
    fn flow_control_off_refuses_every_band_at_once() {
        let endpoints = vec!["127.0.0.1:1".to_owned()];
        let doc = PoolDocument {
            priorities: true,
            ..pool(&endpoints, 2.0)
        };
        let scored: PolicyUnderTest = "scored".parse().unwrap();
        let (_, on) = gateway_config(&scored, &doc, "127.0.0.1:0", "127.0.0.1:0").unwrap();
        let off = scored.clone().with_flow(FlowMode::Off);
        assert_ne!(off, scored);
        assert_eq!(off.to_string(), "scored");
        let (_, off) = gateway_config(&off, &doc, "127.0.0.1:0", "127.0.0.1:0").unwrap();
        let flat = scored.clone().with_flow(FlowMode::Flat);
        let (_, flat) = gateway_config(&flat, &doc, "127.0.0.1:0", "127.0.0.1:0").unwrap();
        let defaults = config::FlowControl::default();
        for band in config::Priority::ALL {
            let default = defaults.band(band).max_wait(band);
            assert_eq!(on.spec.flow_control.band(band).max_wait(band), default / 2);
            assert_eq!(
                flat.spec.flow_control.band(band).max_wait(band),
                default / 2
            );
            assert_eq!(
                on.spec.flow_control.band(band).queue_share(band),
                defaults.band(band).queue_share(band)
            );
            assert_eq!(flat.spec.flow_control.band(band).queue_share(band), 1.0);
            assert_eq!(
                off.spec.flow_control.band(band).max_wait(band),
                Duration::ZERO
            );
        }
        // Bands come from the clients' header, and waits are reported.
        assert!(on.spec.flow_control.header_may_raise);
        assert!(on.spec.debug.decision_headers);
        let (_, plain) = gateway_config(
            &scored,
            &pool(&endpoints, 2.0),
            "127.0.0.1:0",
            "127.0.0.1:0",
        )
        .unwrap();
        assert!(!plain.spec.flow_control.header_may_raise);
        assert!(!plain.spec.debug.decision_headers);
    }

    #[test]
    fn engine_priority_mode_is_flow_control_on_with_the_band_sent_to_the_replicas() {
        let endpoints = vec!["127.0.0.1:1".to_owned()];
        let doc = PoolDocument {
            priorities: true,
            ..pool(&endpoints, 2.0)
        };
        let scored: PolicyUnderTest = "scored".parse().unwrap();
        let priority = scored.clone().with_flow(FlowMode::Priority);
        let (_, on) = gateway_config(&scored, &doc, "127.0.0.1:0", "127.0.0.1:0").unwrap();
        let (_, with) = gateway_config(&priority, &doc, "127.0.0.1:0", "127.0.0.1:0").unwrap();
        assert!(with.spec.pools[0].engine_priority());
        assert!(!on.spec.pools[0].engine_priority());
        assert_eq!(with.spec.flow_control, on.spec.flow_control);
        assert_eq!(
            priority.engine_scheduling(),
            sim::SchedulingPolicy::Priority
        );
        assert_eq!(scored.engine_scheduling(), sim::SchedulingPolicy::Fcfs);
        for flow in [FlowMode::On, FlowMode::Flat, FlowMode::Off] {
            assert!(!flow.engine_priority(), "{flow:?}");
        }
    }

    #[test]
    fn time_scale_divides_the_gateway_timings() {
        let endpoints = vec!["127.0.0.1:1".to_owned()];
        let (text, config) = gateway_config(
            &"scored".parse().unwrap(),
            &pool(&endpoints, 10.0),
            "127.0.0.1:0",
            "127.0.0.1:0",
        )
        .unwrap();
        let metrics = &config.spec.pools[0].scheduling.metrics;
        assert_eq!(metrics.interval, Some(Duration::from_millis(5)), "{text}");
        assert_eq!(metrics.stale_after, Some(Duration::from_millis(100)));
        // Waiting for room is the same in engine seconds either way.
        let (_, scaled) =
            virtual_gateway(&"scored".parse().unwrap(), &pool(&endpoints, 10.0)).unwrap();
        let (_, unscaled) =
            virtual_gateway(&"scored".parse().unwrap(), &pool(&endpoints, 1.0)).unwrap();
        assert!((scaled.unwrap().max_wait - unscaled.unwrap().max_wait).abs() < 1e-9);
    }

    #[test]
    fn sessions_key_requests_by_their_user() {
        let with: PolicyUnderTest = "latency+sessions".parse().unwrap();
        assert!(with.sessions());
        assert_eq!(with.to_string(), "scored:latency+sessions");
        assert_eq!(with.to_string().parse::<PolicyUnderTest>().unwrap(), with);
        let endpoints = vec!["127.0.0.1:1".to_owned()];
        let (_, config) =
            gateway_config(&with, &pool(&endpoints, 1.0), "127.0.0.1:0", "127.0.0.1:0").unwrap();
        assert!(config.spec.sessions.as_ref().is_some_and(|s| s.user));
        let (_, plain) = gateway_config(
            &"scored".parse().unwrap(),
            &pool(&endpoints, 1.0),
            "127.0.0.1:0",
            "127.0.0.1:0",
        )
        .unwrap();
        assert_eq!(plain.spec.sessions, None);
    }
}
