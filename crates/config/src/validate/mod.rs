//! Whole-document checks that the schema alone cannot express. Every
//! problem is collected, each with the path a user would look for. A check
//! that compares a value with another one that could not be read (and was
//! reported as such) is left out: it would compare with a placeholder.

use std::collections::HashMap;
use std::time::Duration;

use picker::{Scorer, Weights};
use signals::Dialect;

mod address;
mod continuation;
mod disaggregation;
mod global;
mod names;
mod prefix_cache;
mod security;
mod tls;
mod traffic;

pub(crate) use security::check_api_keys;
pub use security::tenant_name;

use crate::defaults;
use crate::problem::{Problem, Problems, Unreadable};
use crate::schema::{EngineScheduling, InferenceGatewayConfig, Policy, Pool, Telemetry};
pub use address::is_host_port;
use names::check_name;

pub fn validate(config: &InferenceGatewayConfig, unreadable: &Unreadable) -> Vec<Problem> {
    let mut p = Problems(Vec::new());
    if config.api_version != defaults::API_VERSION {
        p.add(
            "apiVersion",
            format!(
                "{:?} is not supported; use {:?}",
                config.api_version,
                defaults::API_VERSION
            ),
        );
    }
    if config.kind != defaults::KIND {
        p.add(
            "kind",
            format!("{:?} is not {:?}", config.kind, defaults::KIND),
        );
    }
    let spec = &config.spec;

    if spec.listeners.is_empty() && spec.endpoint_picker.is_none() {
        p.add(
            "spec.listeners",
            "at least one listener (or an endpointPicker) is required",
        );
    }
    let mut addresses: HashMap<String, String> = HashMap::new();
    let mut listener_names: HashMap<&str, usize> = HashMap::new();
    for (i, l) in spec.listeners.iter().enumerate() {
        check_name(&mut p, &mut listener_names, "spec.listeners", i, &l.name);
        check_bind_address(
            &mut p,
            &mut addresses,
            &format!("spec.listeners[{i}].address"),
            &l.address,
        );
    }
    if let Some(admin) = &spec.admin {
        check_bind_address(&mut p, &mut addresses, "spec.admin.address", &admin.address);
    }
    if let Some(picker) = &spec.endpoint_picker {
        check_bind_address(
            &mut p,
            &mut addresses,
            "spec.endpointPicker.address",
            picker.address(),
        );
        if picker.fallbacks.is_some_and(|n| n > 64) {
            p.add("spec.endpointPicker.fallbacks", "must be at most 64");
        }
    }
    if spec.limits.max_body_bytes == Some(0) {
        p.add("spec.limits.maxBodyBytes", "must be greater than 0");
    }
    if spec.limits.max_connections == Some(0) {
        p.add("spec.limits.maxConnections", "must be greater than 0");
    }
    if spec.limits.max_connections_per_client == Some(0) {
        p.add(
            "spec.limits.maxConnectionsPerClient",
            "must be greater than 0",
        );
    }
    if spec
        .limits
        .max_buffered_body_bytes
        .is_some_and(|b| b < spec.limits.max_body_bytes())
        && unreadable.was_read("spec.limits.maxBodyBytes")
    {
        p.add(
            "spec.limits.maxBufferedBodyBytes",
            "must be at least limits.maxBodyBytes, or no body of the largest size could ever be read",
        );
    }
    if spec.limits.header_timeout == Some(Duration::ZERO) {
        p.add("spec.limits.headerTimeout", "must be greater than 0");
    }
    for (i, path) in spec.forwarding.extra_paths.iter().enumerate() {
        if let Err(why) = crate::schema::check_forward_path(path) {
            p.add(format!("spec.forwarding.extraPaths[{i}]"), why);
        }
    }
    for (i, cidr) in spec.forwarding.trusted_proxies.iter().enumerate() {
        if let Err(why) = crate::schema::parse_ip_net(cidr) {
            p.add(format!("spec.forwarding.trustedProxies[{i}]"), why);
        }
    }
    for (field, value) in [
        ("connect", spec.timeouts.connect),
        ("firstByte", spec.timeouts.first_byte),
        ("idle", spec.timeouts.idle),
    ] {
        if value == Some(Duration::ZERO) {
            p.add(format!("spec.timeouts.{field}"), "must be greater than 0");
        }
    }

    for priority in crate::schema::Priority::ALL {
        let band = spec.flow_control.band(priority);
        let path = format!("spec.flowControl.{}", priority.as_str());
        if band.max_queued == Some(0) {
            p.add(
                format!("{path}.maxQueued"),
                "must be at least 1 (use maxWait: 0s to never queue)",
            );
        }
        if band.max_queued_bytes == Some(0) {
            p.add(format!("{path}.maxQueuedBytes"), "must be at least 1");
        }
        if let Some(share) = band.queue_share
            && !(share > 0.0 && share <= 1.0)
        {
            p.add(
                format!("{path}.queueShare"),
                format!("must be more than 0 and at most 1, got {share}"),
            );
        }
    }

    check_telemetry(&mut p, &spec.telemetry);
    security::check(&mut p, spec);
    tls::check(&mut p, spec, unreadable);

    let has_members = spec.global.as_ref().is_some_and(|g| !g.members.is_empty());
    if spec.pools.is_empty() && !has_members && unreadable.was_read("spec.global") {
        p.add(
            "spec.pools",
            "at least one pool is required (or global members to route to)",
        );
    }
    if let Some(global) = &spec.global {
        global::check(&mut p, global);
    }
    let mut pool_names: HashMap<&str, usize> = HashMap::new();
    let mut served: HashMap<&str, String> = HashMap::new();
    for (i, pool) in spec.pools.iter().enumerate() {
        let path = format!("spec.pools[{i}]");
        check_name(&mut p, &mut pool_names, "spec.pools", i, &pool.name);
        if pool.models.is_empty() {
            p.add(format!("{path}.models"), "at least one model is required");
        }
        let names = pool
            .models
            .iter()
            .enumerate()
            .map(|(j, m)| (format!("{path}.models[{j}]"), m))
            .chain(
                pool.adapters
                    .iter()
                    .enumerate()
                    .map(|(j, a)| (format!("{path}.adapters[{j}]"), a)),
            );
        for (name_path, name) in names {
            if name.is_empty() {
                p.add(name_path, "must not be empty");
            } else if let Some(first) = served.get(name.as_str()) {
                p.add(
                    name_path,
                    format!(
                        "{name:?} is already served by {first}; a model name routes to one pool"
                    ),
                );
            } else {
                served.insert(name, name_path);
            }
        }
        check_replicas(&mut p, &path, pool, unreadable);
        check_scheduling(&mut p, &path, pool, unreadable);
        prefix_cache::check(&mut p, &format!("{path}.prefixCache"), &pool.prefix_cache);
        continuation::check(&mut p, &path, pool);
        disaggregation::check(&mut p, &path, pool);
    }
    let every_name_read = !unreadable.covers("spec.pools")
        && (0..spec.pools.len()).all(|i| {
            unreadable.was_read(&format!("spec.pools[{i}].models"))
                && unreadable.was_read(&format!("spec.pools[{i}].adapters"))
        });
    if every_name_read {
        traffic::check(&mut p, spec, &served);
    }
    for model in spec.objectives.keys() {
        if every_name_read && !served.contains_key(model.as_str()) {
            p.add(
                format!("spec.objectives[{model:?}]"),
                "no pool serves this model or adapter",
            );
        }
    }
    p.0
}

fn check_telemetry(p: &mut Problems, telemetry: &Telemetry) {
    let Some(otlp) = &telemetry.otlp else {
        return;
    };
    let path = "spec.telemetry.otlp";
    if let Err(why) = check_collector_url(&otlp.endpoint) {
        p.add(format!("{path}.endpoint"), why);
    }
    if otlp.service_name.as_deref().is_some_and(str::is_empty) {
        p.add(format!("{path}.serviceName"), "must not be empty");
    }
    if let Some(ratio) = otlp.sample_ratio
        && !(0.0..=1.0).contains(&ratio)
    {
        p.add(
            format!("{path}.sampleRatio"),
            format!("{ratio} is not between 0 and 1"),
        );
    }
    if otlp.timeout == Some(Duration::ZERO) {
        p.add(format!("{path}.timeout"), "must be greater than 0");
    }
}

/// `http://host[:port][/path]`. HTTPS is refused rather than silently
/// sent in clear: the exporter speaks plain HTTP to a nearby collector.
fn check_collector_url(url: &str) -> Result<(), String> {
    if url.starts_with("https://") {
        return Err(format!(
            "{url:?}: https is not supported; export to a collector over http (for example an OpenTelemetry Collector on the same host)"
        ));
    }
    let Some(rest) = url.strip_prefix("http://") else {
        return Err(format!("{url:?} is not an http:// URL"));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.is_empty() || url.chars().any(char::is_whitespace) {
        return Err(format!("{url:?} has no valid host"));
    }
    Ok(())
}

fn check_bind_address(
    p: &mut Problems,
    seen: &mut HashMap<String, String>,
    path: &str,
    address: &str,
) {
    if !is_host_port(address) {
        p.add(path, format!("{address:?} is not host:port"));
        return;
    }
    // Port 0 (any free port) may repeat; a fixed port may not.
    if address.ends_with(":0") {
        return;
    }
    if let Some(first) = seen.get(address) {
        p.add(path, format!("{address:?} is already used by {first}"));
    } else {
        seen.insert(address.to_owned(), path.to_owned());
    }
}

fn check_replicas(p: &mut Problems, path: &str, pool: &Pool, unreadable: &Unreadable) {
    let given: Vec<&str> = [
        ("endpoints", !pool.endpoints.is_empty()),
        ("simulated", pool.simulated.is_some()),
        ("endpointSelector", pool.endpoint_selector.is_some()),
        ("inferencePool", pool.inference_pool.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, present)| present.then_some(field))
    .collect();
    match given.as_slice() {
        [] if ["simulated", "endpointSelector", "inferencePool"]
            .iter()
            .all(|f| unreadable.was_read(&format!("{path}.{f}"))) =>
        {
            p.add(
                format!("{path}.endpoints"),
                "at least one endpoint is required (or use simulated, endpointSelector or inferencePool)",
            )
        }
        [_] | [] => {}
        [first, second] => p.add(
            path,
            format!("give one of endpoints, simulated, endpointSelector and inferencePool, not both {first} and {second}"),
        ),
        many => p.add(
            path,
            format!(
                "give one of endpoints, simulated, endpointSelector and inferencePool, not {}",
                many.join(", ")
            ),
        ),
    }
    check_discovery(p, path, pool);
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (j, e) in pool.endpoints.iter().enumerate() {
        let ep = format!("{path}.endpoints[{j}]");
        let (_, host_port) = crate::schema::endpoint_scheme(e);
        if !is_host_port(host_port) {
            p.add(ep, format!("{e:?} is not host:port or https://host:port"));
        } else if let Some(first) = seen.insert(e, j) {
            p.add(
                ep,
                format!("{e:?} is listed twice (also endpoints[{first}])"),
            );
        }
    }
    if let Some(sim) = &pool.simulated {
        let sp = format!("{path}.simulated");
        if sim.replicas == 0 {
            p.add(format!("{sp}.replicas"), "must be at least 1");
        }
        if sim.hardware.is_empty() {
            p.add(
                format!("{sp}.hardware"),
                "at least one hardware profile is required",
            );
        }
        if let Some(scale) = sim.time_scale
            && !(scale.is_finite() && scale > 0.0)
        {
            p.add(format!("{sp}.timeScale"), "must be a positive number");
        }
        if sim.start_at_zero && pool.cold_start.wake.is_some() {
            p.add(
                format!("{path}.coldStart.wake"),
                "a simulated pool that starts at zero is woken by its own fleet; leave wake out",
            );
        }
        if sim.start_at_zero && pool.cold_start.timeout.is_some_and(|t| t.is_zero()) {
            p.add(
                format!("{path}.coldStart.timeout"),
                "a pool that starts at zero needs requests to wait for it: more than 0",
            );
        }
        if let Some(load) = &sim.load_time
            && load != "calibrated"
            && humantime::parse_duration(load).is_err()
        {
            p.add(
                format!("{sp}.loadTime"),
                "must be a duration (45s, 2m) or `calibrated`",
            );
        }
        if pool.models.len() > 1 {
            p.add(
                format!("{path}.models"),
                "simulated replicas serve one model name; list only one",
            );
        }
        if pool.engine != Dialect::Vllm {
            p.add(
                format!("{path}.engine"),
                "simulated replicas speak the vllm metrics dialect",
            );
        }
        if pool.engine_priority() && sim.scheduling_policy == Some(EngineScheduling::Fcfs) {
            p.add(
                format!("{sp}.schedulingPolicy"),
                "fcfs replicas refuse (400) the priority enginePriority sends; use priority, or leave it out",
            );
        }
    }
    check_engine_priority(p, path, pool);
}

/// `enginePriority` only for engines known to read the band as the gateway
/// writes it (`priority`, lower first).
fn check_engine_priority(p: &mut Problems, path: &str, pool: &Pool) {
    if pool.engine_priority() && pool.engine != Dialect::Vllm {
        p.add(
            format!("{path}.enginePriority"),
            format!(
                "only vllm replicas (started with --scheduling-policy priority) read a request's priority; this pool's engine is {}",
                pool.engine
            ),
        );
    }
}

/// Checks of `endpointSelector` and `inferencePool` that need no cluster.
fn check_discovery(p: &mut Problems, path: &str, pool: &Pool) {
    if let Some(s) = &pool.endpoint_selector {
        check_selector(p, &format!("{path}.endpointSelector"), s);
    }
    let prefill_selector = pool
        .disaggregation
        .as_ref()
        .and_then(|d| d.prefill.endpoint_selector.as_ref());
    if let Some(s) = prefill_selector {
        check_selector(
            p,
            &format!("{path}.disaggregation.prefill.endpointSelector"),
            s,
        );
    }
    if let Some(r) = &pool.inference_pool {
        let rp = format!("{path}.inferencePool");
        check_namespace(p, &format!("{rp}.namespace"), &r.namespace);
        if !is_dns_label(&r.name, 253) {
            p.add(
                format!("{rp}.name"),
                format!("{:?} is not an object name", r.name),
            );
        }
        if r.relist_interval == Some(Duration::ZERO) {
            p.add(format!("{rp}.relistInterval"), "must be greater than 0");
        }
    }
    if pool.discovery().is_some() && pool.tls.is_some() {
        p.add(
            format!("{path}.tls"),
            "discovered replicas are reached over plain HTTP; TLS to them is not supported yet",
        );
    }
}

/// An `endpointSelector` at `sp`: a pool's, or its prefill group's.
fn check_selector(p: &mut Problems, sp: &str, s: &crate::schema::EndpointSelector) {
    check_namespace(p, &format!("{sp}.namespace"), &s.namespace);
    if s.match_labels.is_empty() {
        p.add(
            format!("{sp}.matchLabels"),
            "at least one label is required (an empty selector would take every pod in the namespace)",
        );
    }
    for (key, value) in &s.match_labels {
        if let Err(e) = check_label(key, value) {
            p.add(format!("{sp}.matchLabels.{key}"), e);
        }
    }
    match (s.port, &s.port_name) {
        (Some(_), Some(_)) => p.add(sp, "give either port or portName, not both"),
        (None, None) => p.add(sp, "give the replicas' port: port (a number) or portName"),
        (Some(0), None) => p.add(format!("{sp}.port"), "must be 1 to 65535"),
        (None, Some(name)) if name.is_empty() || name.len() > 15 => p.add(
            format!("{sp}.portName"),
            format!("{name:?} is not a container port name (1 to 15 characters)"),
        ),
        _ => {}
    }
    if s.relist_interval == Some(Duration::ZERO) {
        p.add(format!("{sp}.relistInterval"), "must be greater than 0");
    }
}

fn check_namespace(p: &mut Problems, path: &str, namespace: &str) {
    if !is_dns_label(namespace, 63) || namespace.contains('.') {
        p.add(path, format!("{namespace:?} is not a namespace name"));
    }
}

/// Lowercase letters, digits, `-` and `.`, starting and ending with a
/// letter or digit (RFC 1123), at most `max` characters.
fn is_dns_label(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A label key (optional DNS prefix and `/`, then a name) and value, as
/// Kubernetes accepts them.
fn check_label(key: &str, value: &str) -> Result<(), String> {
    let name_ok = |n: &str| {
        n.len() <= 63
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && n.starts_with(|c: char| c.is_ascii_alphanumeric())
            && n.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    let (prefix, name) = key
        .rsplit_once('/')
        .map_or((None, key), |(p, n)| (Some(p), n));
    if !name_ok(name) || prefix.is_some_and(|p| !is_dns_label(p, 253)) {
        return Err(format!("{key:?} is not a label key"));
    }
    if !value.is_empty() && !name_ok(value) {
        return Err(format!("{value:?} is not a label value"));
    }
    Ok(())
}

fn check_scheduling(p: &mut Problems, path: &str, pool: &Pool, unreadable: &Unreadable) {
    let s = &pool.scheduling;
    let sp = format!("{path}.scheduling");
    if pool.engine == Dialect::None && s.policy == Some(Policy::Scored) {
        p.add(
            format!("{sp}.policy"),
            "scored needs engine metrics; with engine: none use least-request, round-robin or random",
        );
    }
    if let Some(preset) = &s.preset
        && Weights::preset(preset).is_none()
    {
        p.add(
            format!("{sp}.preset"),
            format!("{preset:?} is not one of {}", Weights::PRESETS.join(", ")),
        );
    }
    if let Some(w) = &s.weights {
        for scorer in Scorer::ALL {
            if let Some(v) = w.get(scorer)
                && !(v.is_finite() && v >= 0.0)
            {
                p.add(
                    format!("{sp}.weights.{}", scorer.name()),
                    "must be a number >= 0",
                );
            }
        }
    }
    if let Some(sat) = &s.saturation {
        if sat.queue_depth == Some(0) {
            p.add(format!("{sp}.saturation.queueDepth"), "must be at least 1");
        }
        if let Some(kv) = sat.kv_cache
            && !(kv > 0.0 && kv <= 1.0)
        {
            p.add(format!("{sp}.saturation.kvCache"), "must be in (0, 1]");
        }
    }
    let m = &s.metrics;
    if m.interval == Some(Duration::ZERO) {
        p.add(format!("{sp}.metrics.interval"), "must be greater than 0");
    }
    if m.timeout == Some(Duration::ZERO) {
        p.add(format!("{sp}.metrics.timeout"), "must be greater than 0");
    }
    if let Some(stale) = m.stale_after
        && stale <= m.interval()
        && unreadable.was_read(&format!("{sp}.metrics.interval"))
    {
        p.add(
            format!("{sp}.metrics.staleAfter"),
            format!(
                "{} is not longer than the scrape interval ({}); every replica would look stale",
                humantime::format_duration(stale),
                humantime::format_duration(m.interval())
            ),
        );
    }
}

#[cfg(test)]
mod telemetry_tests {
    use super::*;

    #[test]
    fn collector_urls() {
        for ok in [
            "http://127.0.0.1:4318",
            "http://otel-collector:4318/",
            "http://c/v1/traces",
        ] {
            assert_eq!(check_collector_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "127.0.0.1:4318",
            "https://c:4318",
            "http://",
            "http:///v1",
            "http://a b",
        ] {
            assert!(check_collector_url(bad).is_err(), "{bad}");
        }
    }
}
