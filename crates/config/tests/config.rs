//! Parsing and validation of whole documents, as `infergate check` sees them.

use config::{ConfigError, Policy, defaults, from_yaml};

const EXAMPLES: &[&str] = &[
    include_str!("../../../examples/static.yaml"),
    include_str!("../../../examples/demo.yaml"),
];

fn problems(yaml: &str) -> Vec<String> {
    match from_yaml(yaml) {
        Ok(_) => panic!("expected the config to be refused"),
        Err(e) => e.problems().iter().map(ToString::to_string).collect(),
    }
}

fn minimal(pools: &str) -> String {
    format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners:\n    - {{name: public, address: \"127.0.0.1:8080\"}}\n  pools:\n{pools}"
    )
}

#[test]
fn shipped_examples_are_valid() {
    for example in EXAMPLES {
        from_yaml(example).unwrap_or_else(|e| panic!("example refused:\n{e}"));
    }
}

#[test]
fn example_fields_are_read() {
    let c = from_yaml(EXAMPLES[0]).unwrap();
    let pool = &c.spec.pools[0];
    assert_eq!(pool.base_model(), "meta-llama/Llama-3.1-8B-Instruct");
    assert_eq!(pool.adapters, ["sql-lora", "support-lora"]);
    assert_eq!(pool.policy(), Policy::Scored);
    assert_eq!(pool.scheduling.weights.as_ref().unwrap().prefix, Some(3.0));
    assert_eq!(
        pool.scheduling.metrics.stale_after,
        Some(std::time::Duration::from_secs(1))
    );
    assert_eq!(c.spec.pools[1].policy(), Policy::LeastRequest);
    assert_eq!(c.spec.limits.max_body_bytes(), 33554432);
    assert_eq!(c.spec.limits.max_connections(), 4096);
}

#[test]
fn limits_must_be_positive() {
    let yaml = minimal("    - {name: a, models: [m], endpoints: [\"127.0.0.1:1\"]}\n").replace(
        "spec:\n",
        "spec:\n  limits: {maxBodyBytes: 0, maxConnections: 0}\n",
    );
    let p = problems(&yaml);
    assert_eq!(
        p,
        [
            "spec.limits.maxBodyBytes: must be greater than 0",
            "spec.limits.maxConnections: must be greater than 0",
        ]
    );
}

#[test]
fn bad_endpoint_is_reported_with_its_path() {
    let yaml = minimal(
        "    - {name: a, models: [m1], endpoints: [\"127.0.0.1:1\"]}\n    - {name: b, models: [m2], endpoints: [\"not a host\"]}\n",
    );
    assert_eq!(
        problems(&yaml),
        [r#"spec.pools[1].endpoints[0]: "not a host" is not host:port or https://host:port"#]
    );
}

#[test]
fn unknown_field_is_an_error_with_its_path() {
    let yaml = minimal("    - {name: a, models: [m], endpoints: [\"127.0.0.1:1\"], weight: 3}\n");
    let p = problems(&yaml);
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with("spec.pools[0].weight: unknown field `weight`, expected one of"),
        "{p:?}"
    );
    assert!(p[0].ends_with("at line 7 column 58"), "{p:?}");
}

#[test]
fn every_semantic_problem_is_reported() {
    let yaml = minimal(concat!(
        "    - {name: a, models: [m], adapters: [x], endpoints: [\"127.0.0.1:1\", \"127.0.0.1:1\"],\n",
        "       scheduling: {preset: fastest, saturation: {kvCache: 1.5}, metrics: {interval: 100ms, staleAfter: 50ms}}}\n",
        "    - {name: a, models: [x], endpoints: []}\n",
        "    - {name: c, engine: none, models: [n], endpoints: [\"h:2\"], scheduling: {policy: scored}}\n",
    ));
    let p = problems(&yaml);
    let expect = [
        "spec.pools[0].endpoints[1]: \"127.0.0.1:1\" is listed twice",
        "spec.pools[0].scheduling.preset: \"fastest\" is not one of",
        "spec.pools[0].scheduling.saturation.kvCache: must be in (0, 1]",
        "spec.pools[0].scheduling.metrics.staleAfter: 50ms is not longer",
        "spec.pools[1].name: \"a\" is already the name of spec.pools[0]",
        "spec.pools[1].models[0]: \"x\" is already served by spec.pools[0].adapters[0]",
        "spec.pools[1].endpoints: at least one endpoint is required",
        "spec.pools[2].scheduling.policy: scored needs engine metrics",
    ];
    for e in expect {
        assert!(
            p.iter().any(|line| line.starts_with(e)),
            "missing {e:?} in {p:#?}"
        );
    }
    assert_eq!(p.len(), expect.len(), "{p:#?}");
}

#[test]
fn wrong_kind_and_version_are_refused() {
    let yaml = minimal("    - {name: a, models: [m], endpoints: [\"127.0.0.1:1\"]}\n")
        .replace("infergate.dev/v1alpha1", "v1")
        .replace("kind: InferenceGatewayConfig", "kind: Gateway");
    let p = problems(&yaml);
    assert!(p.iter().any(|l| l.starts_with("apiVersion:")), "{p:?}");
    assert!(p.iter().any(|l| l.starts_with("kind:")), "{p:?}");
}

#[test]
fn type_errors_name_the_field() {
    let yaml = minimal(
        "    - {name: a, models: [m], endpoints: [\"127.0.0.1:1\"], scheduling: {metrics: {interval: soon}}}\n",
    );
    let p = problems(&yaml);
    assert!(
        p[0].starts_with("spec.pools[0].scheduling.metrics.interval:"),
        "{p:?}"
    );
}

#[test]
fn not_yaml_is_refused() {
    assert!(matches!(from_yaml("{{{"), Err(ConfigError::Invalid(_))));
}

fn with_telemetry(telemetry: &str) -> String {
    format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners:\n    - {{name: public, address: \"127.0.0.1:8080\"}}\n  telemetry: {telemetry}\n  pools:\n    - {{name: a, models: [m], endpoints: [\"127.0.0.1:1\"]}}\n"
    )
}

#[test]
fn telemetry_fields_and_defaults() {
    let c = from_yaml(&with_telemetry(
        "{accessLog: {format: json}, otlp: {endpoint: \"http://127.0.0.1:4318\"}}",
    ))
    .unwrap();
    let t = &c.spec.telemetry;
    assert_eq!(t.access_log.format, Some(config::LogFormat::Json));
    let otlp = t.otlp.as_ref().unwrap();
    assert_eq!(otlp.traces_url(), "http://127.0.0.1:4318/v1/traces");
    assert_eq!(otlp.service_name(), defaults::OTLP_SERVICE_NAME);
    assert_eq!(otlp.sample_ratio(), defaults::OTLP_SAMPLE_RATIO);
    assert_eq!(otlp.timeout(), defaults::OTLP_TIMEOUT);

    let plain = from_yaml(&with_telemetry("{}")).unwrap();
    assert_eq!(plain.spec.telemetry, config::Telemetry::default());
}

#[test]
fn bad_telemetry_is_reported_with_paths() {
    let err = from_yaml(&with_telemetry(
        "{otlp: {endpoint: \"collector:4318\", serviceName: \"\", sampleRatio: 1.5, timeout: 0s}}",
    ))
    .unwrap_err();
    let paths: Vec<&str> = err.problems().iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.telemetry.otlp.endpoint",
            "spec.telemetry.otlp.serviceName",
            "spec.telemetry.otlp.sampleRatio",
            "spec.telemetry.otlp.timeout",
        ]
    );
}

fn document(metadata: &str) -> String {
    format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nmetadata:\n{metadata}spec:\n  listeners:\n    - {{name: public, address: \"127.0.0.1:8080\"}}\n  pools:\n    - {{name: a, models: [m], endpoints: [\"127.0.0.1:1\"]}}\n"
    )
}

/// The document as a custom resource, read back from a cluster.
#[test]
fn kubernetes_object_metadata_is_accepted() {
    let yaml = document(concat!(
        "  name: gateway\n",
        "  namespace: inference\n",
        "  labels: {app.kubernetes.io/name: infergate, tier: \"1\"}\n",
        "  annotations:\n",
        "    kubectl.kubernetes.io/last-applied-configuration: '{\"kind\": \"InferenceGatewayConfig\"}'\n",
        "  uid: 3b0f9c52-5d3a-4c55-9a7e-0b7c6a0e4f11\n",
        "  resourceVersion: \"48213\"\n",
        "  generation: 3\n",
        "  creationTimestamp: \"2025-01-07T10:00:00Z\"\n",
        "  managedFields:\n",
        "    - {manager: kubectl-client-side-apply, operation: Update, apiVersion: infergate.dev/v1alpha1}\n",
        "  finalizers: [example.com/cleanup]\n",
    ));
    let c = from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.metadata.name, "gateway");
    assert_eq!(c.metadata.namespace, "inference");
    assert_eq!(c.metadata.labels["app.kubernetes.io/name"], "infergate");
    assert_eq!(c.metadata.labels["tier"], "1");
    assert!(
        c.metadata.annotations["kubectl.kubernetes.io/last-applied-configuration"]
            .contains("InferenceGatewayConfig")
    );
    // What the server set is not kept: written out, the document is the
    // author's again, and reads back the same.
    let written = serde_yaml_ng::to_string(&c).unwrap();
    for server_set in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
        "finalizers",
    ] {
        assert!(!written.contains(server_set), "{server_set} in\n{written}");
    }
    assert_eq!(from_yaml(&written).unwrap(), c);
}

#[test]
fn metadata_keeps_refusing_what_is_not_object_metadata() {
    let p = problems(&document(
        "  name: gateway\n  lables: {app: infergate}\n  annotations: {note: [not, a, string]}\n",
    ));
    assert_eq!(p.len(), 2, "{p:#?}");
    assert!(
        p[0].starts_with("metadata.lables: unknown field `lables`")
            && p[0].contains("did you mean `labels`?"),
        "{p:#?}"
    );
    assert!(
        p[1].starts_with(
            r#"metadata.annotations["note"]: invalid type: sequence, expected a string"#
        ),
        "{p:#?}"
    );
}

/// Every unknown field, wrong type and missing field in one run, each at
/// its path with its line, and the whole-document checks too.
#[test]
fn every_structural_problem_is_reported_in_one_run() {
    let yaml = concat!(
        "apiVersion: infergate.dev/v1alpha1\n",
        "kind: InferenceGatewayConfig\n",
        "spec:\n",
        "  listeners: [{name: public, address: \"127.0.0.1:8080\", tsl: true}]\n",
        "  limits: {maxBodyBytes: lots}\n",
        "  pools:\n",
        "    - {name: a, models: [m1], endpoint: [\"127.0.0.1:1\"]}\n",
        "    - {models: [m2], endpoints: [\"not a host\"], scheduling: {polcy: scored, metrics: {interval: soon}}}\n",
    );
    let p = problems(yaml);
    let expect = [
        "spec.listeners[0].tsl: unknown field `tsl`",
        "spec.limits.maxBodyBytes: invalid type: string \"lots\", expected u64 at line 5 column 26",
        "spec.pools[0].endpoint: unknown field `endpoint`",
        "spec.pools[1].scheduling.polcy: unknown field `polcy`",
        "spec.pools[1].scheduling.metrics.interval: invalid value: string \"soon\"",
        "spec.pools[1].name: required field is missing at line 8 column 7",
        // Whole-document checks, on what could be read.
        "spec.pools[0].endpoints: at least one endpoint is required",
        "spec.pools[1].endpoints[0]: \"not a host\" is not host:port",
    ];
    assert_eq!(p.len(), expect.len(), "{p:#?}");
    for (line, expected) in p.iter().zip(expect) {
        assert!(line.starts_with(expected), "{line:?} is not {expected:?}");
    }
    assert!(p[0].ends_with("at line 4 column 57"), "{p:?}");
}

#[test]
fn required_fields_missing_together_are_all_reported() {
    let p =
        problems("apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec: {}\n");
    assert_eq!(
        p,
        [
            "spec.listeners: required field is missing at line 3 column 7",
            // Pools may be left out when global members serve instead.
            "spec.pools: at least one pool is required (or global members to route to)",
        ]
    );
    assert_eq!(problems(""), ["the document is empty"]);
}

/// A value that cannot be read is reported once: checks that compare with
/// it (here: which pool serves `m2`) wait until it can be.
#[test]
fn checks_leave_alone_what_depends_on_an_unreadable_value() {
    let yaml = minimal(
        "    - {name: a, models: m2, endpoints: [\"127.0.0.1:1\"]}\n    - {name: b, models: [m3], endpoints: [\"127.0.0.1:2\"]}\n",
    )
    .replace("spec:\n", "spec:\n  objectives: {m2: critical, m4: critical}\n");
    let p = problems(&yaml);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with("spec.pools[0].models: invalid type: string \"m2\", expected a sequence"),
        "{p:#?}"
    );
    // Once it can be read, the objective that no pool serves is reported.
    let p = problems(&yaml.replace("models: m2", "models: [m2]"));
    assert_eq!(
        p,
        [r#"spec.objectives["m4"]: no pool serves this model or adapter"#]
    );
}

#[test]
fn scalars_are_read_as_written() {
    // A name that YAML would read as a number stays as written, and a plain
    // number that YAML reads as a string is still a number where a number
    // is wanted.
    let yaml = minimal(
        "    - {name: 1.50, models: [007, 2024], endpoints: [\"127.0.0.1:1\"], scheduling: {weights: {prefix: 03}}}\n",
    );
    let c = from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
    let pool = &c.spec.pools[0];
    assert_eq!(pool.name, "1.50");
    assert_eq!(pool.models, ["007", "2024"]);
    assert_eq!(pool.scheduling.weights.as_ref().unwrap().prefix, Some(3.0));
    // A quoted number is a string, and refused where a number is wanted.
    let p = problems(&yaml.replace("prefix: 03", "prefix: \"3\""));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("spec.pools[0].scheduling.weights.prefix: invalid type: string \"3\""),
        "{p:?}"
    );
}

#[test]
fn more_checks_run_on_what_was_read() {
    let yaml = minimal(
        "    - {name: a, models: [m], endpoints: [\"127.0.0.1:1\"], retry: {maxRetries: many}}\n",
    );
    let err = config::from_yaml_with(&yaml, |config, unreadable| {
        assert_eq!(config.spec.pools[0].name, "a");
        assert!(!unreadable.was_read("spec.pools[0].retry.maxRetries"));
        assert!(unreadable.was_read("spec.pools[0].endpoints"));
        vec![
            config::Problem {
                path: "spec.pools[0].endpoints[0]".into(),
                message: "nothing listens there".into(),
            },
            config::Problem {
                path: "spec.pools[0].retry.maxRetries".into(),
                message: "about the placeholder".into(),
            },
        ]
    })
    .unwrap_err();
    let p: Vec<String> = err.problems().iter().map(ToString::to_string).collect();
    assert_eq!(p.len(), 2, "{p:#?}");
    assert!(
        p[0].starts_with("spec.pools[0].retry.maxRetries: invalid type"),
        "{p:#?}"
    );
    assert_eq!(p[1], "spec.pools[0].endpoints[0]: nothing listens there");
}

#[test]
fn tls_sections_are_checked_as_a_whole() {
    let yaml = minimal(
        "    - {name: a, models: [m], endpoints: [\"127.0.0.1:1\"], tls: {caFile: ca.pem, insecureSkipVerify: true, certFile: c.pem}}\n    - {name: b, models: [n], endpoints: [\"https://127.0.0.1:2\"], tls: {serverName: \"\", keyFile: k.pem}}\n",
    )
    .replace(
        "address: \"127.0.0.1:8080\"}",
        "address: \"127.0.0.1:8080\", tls: {certFile: \"\", keyFile: k.pem, clientAuth: optional}}",
    );
    assert_eq!(
        problems(&yaml),
        [
            "spec.listeners[0].tls.certFile: must not be empty",
            "spec.listeners[0].tls.clientAuth: optional needs clientCaFile, the CAs client certificates are checked against",
            "spec.pools[0].tls: no endpoint is https://host:port, so these settings would never be used",
            "spec.pools[0].tls.keyFile: certFile needs its keyFile",
            "spec.pools[0].tls.caFile: is not used with insecureSkipVerify: true, which checks no certificate; remove one of them",
            "spec.pools[1].tls.serverName: must not be empty",
            "spec.pools[1].tls.certFile: keyFile needs its certFile",
        ]
    );
}

#[test]
fn https_endpoints_with_tls_settings_are_valid() {
    let yaml = minimal(
        "    - {name: a, models: [m], protocol: h2c, endpoints: [\"https://vllm-0.svc:8443\", \"127.0.0.1:1\"], tls: {caFile: ca.pem, serverName: vllm.internal, certFile: c.pem, keyFile: k.pem}}\n",
    )
    .replace(
        "address: \"127.0.0.1:8080\"}",
        "address: \"127.0.0.1:8080\", tls: {certFile: c.pem, keyFile: k.pem, clientCaFile: ca.pem, clientAuth: optional}}",
    );
    let c = from_yaml(&yaml).unwrap_or_else(|e| panic!("refused: {e}"));
    let tls = c.spec.listeners[0].tls.as_ref().unwrap();
    assert_eq!(tls.client_auth, config::ClientAuth::Optional);
    assert_eq!(
        config::endpoint_scheme(&c.spec.pools[0].endpoints[0]),
        (config::Scheme::Https, "vllm-0.svc:8443")
    );
}

const SHA_A: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const SHA_B: &str = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";

fn with_auth(auth_and_tenants: &str) -> String {
    minimal("    - {name: p, models: [m], endpoints: [\"127.0.0.1:9001\"]}\n")
        .replace("  pools:\n", &format!("{auth_and_tenants}  pools:\n"))
}

#[test]
fn keys_and_tenants_are_checked_together() {
    let found = problems(&with_auth(&format!(
        "  auth:\n    apiKeys:\n      keys:\n        - {{tenant: a, sha256: {SHA_A}}}\n        - {{tenant: b, sha256: {}}}\n        - {{tenant: \"a\\tb\", sha256: {SHA_B}}}\n  tenants:\n    - {{name: other}}\n    - {{name: \"\"}}\n",
        SHA_A.to_uppercase()
    )));
    for expected in [
        "spec.auth.apiKeys.keys[1]: the same key as [0]",
        "spec.auth.apiKeys.keys[2].tenant: must not contain control characters",
        "spec.tenants[0].name: \"other\" is reserved: it is the metrics label of every tenant not listed here",
        "spec.tenants[1].name: must not be empty",
    ] {
        assert!(
            found.iter().any(|p| p == expected),
            "{expected:?} not in {found:#?}"
        );
    }
    assert_eq!(found.len(), 4, "{found:#?}");
}

#[test]
fn a_keys_file_is_a_list_of_keys_checked_like_the_configs() {
    let keys = config::api_keys_from_yaml(&format!(
        "- {{tenant: a, sha256: {SHA_A}, name: ci}}\n- {{tenant: b, argon2id: \"$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\"}}\n"
    ))
    .unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].name.as_deref(), Some("ci"));
    assert!(config::api_keys_from_yaml("").unwrap().is_empty());
    assert!(config::api_keys_from_yaml("[]\n").unwrap().is_empty());
    let e = config::api_keys_from_yaml(&format!(
        "- {{tenant: a, sha256: nothex}}\n- {{tenant: b, sha256: {SHA_A}, sha: x}}\n- {{tenant: c, sha256: {SHA_A}}}\n"
    ))
    .unwrap_err();
    let found: Vec<String> = e.problems().iter().map(ToString::to_string).collect();
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("[0].sha256: must be 64 hex digits")),
        "{found:#?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("[1].sha: unknown field")),
        "{found:#?}"
    );
    assert!(
        found.iter().any(|p| p == "[2]: the same key as [1]"),
        "{found:#?}"
    );
    assert!(
        config::api_keys_from_yaml("{tenant: a}").is_err(),
        "not a list"
    );
}

#[test]
fn redis_urls_and_tls_are_checked() {
    let with = |redis: &str| {
        minimal("    - {name: p, models: [m], endpoints: [\"127.0.0.1:9000\"]}\n")
            + &format!("  rateLimits: {{backend: redis, redis: {redis}}}\n")
    };
    for fine in [
        "{url: \"redis://r:6379/0\"}",
        "{url: \"rediss://r:6380/0\"}",
        "{url: \"rediss://r:6380\", tls: {caFile: ca.pem, certFile: c.pem, keyFile: k.pem}}",
    ] {
        if let Err(e) = from_yaml(&with(fine)) {
            panic!("{fine}: {e}");
        }
    }
    let found = problems(&with("{url: \"http://r:6379\"}"));
    assert!(
        found[0].contains("spec.rateLimits.redis.url") && found[0].contains("rediss://"),
        "{found:?}"
    );
    let found = problems(&with("{url: \"redis://r:6379\", tls: {caFile: ca.pem}}"));
    assert!(
        found[0].contains("spec.rateLimits.redis.tls") && found[0].contains("rediss://"),
        "{found:?}"
    );
    let found = problems(&with("{url: \"rediss://r\", tls: {certFile: c.pem}}"));
    assert!(
        found[0].contains("spec.rateLimits.redis.tls.keyFile"),
        "{found:?}"
    );
}

#[test]
fn discovered_pools_are_read_and_checked_without_a_cluster() {
    let yaml = minimal(concat!(
        "    - {name: a, models: [m1], endpointSelector: {namespace: ml, matchLabels: {app: vllm}, portName: http, relistInterval: 30s}}\n",
        "    - {name: b, models: [m2], inferencePool: {name: llama, namespace: ml}}\n",
    ));
    let c = from_yaml(&yaml).unwrap();
    let a = c.spec.pools[0].endpoint_selector.as_ref().unwrap();
    assert_eq!(a.port_name.as_deref(), Some("http"));
    assert_eq!(a.relist_interval(), std::time::Duration::from_secs(30));
    assert!(matches!(
        c.spec.pools[1].discovery(),
        Some(config::Discovery::InferencePool(r)) if r.name == "llama"
            && r.relist_interval() == defaults::DISCOVERY_RELIST_INTERVAL
    ));
    assert_eq!(c.spec.pools[0].endpoints, Vec::<String>::new());
}

#[test]
fn discovery_problems_are_named() {
    let yaml = minimal(concat!(
        "    - {name: a, models: [m1], endpoints: [\"127.0.0.1:1\"], endpointSelector: {namespace: ml, matchLabels: {app: x}, port: 8000}}\n",
        "    - {name: b, models: [m2], endpointSelector: {namespace: ml, matchLabels: {app: x}, port: 8000, portName: http}}\n",
        "    - {name: c, models: [m3], endpointSelector: {namespace: ML, matchLabels: {}}}\n",
        "    - {name: d, models: [m4], endpointSelector: {namespace: ml, matchLabels: {\"bad key!\": x}, port: 1}, inferencePool: {name: p, namespace: ml}, simulated: {replicas: 1, hardware: [h100], model: llama-3.1-8b}}\n",
        "    - {name: e, models: [m5], inferencePool: {name: \"\", namespace: ml, relistInterval: 0s}}\n",
    ));
    let p = problems(&yaml);
    let expect = [
        "spec.pools[0]: give one of endpoints, simulated, endpointSelector and inferencePool, not both endpoints and endpointSelector",
        "spec.pools[1].endpointSelector: give either port or portName, not both",
        "spec.pools[2].endpointSelector.namespace: \"ML\" is not a namespace name",
        "spec.pools[2].endpointSelector.matchLabels: at least one label is required",
        "spec.pools[2].endpointSelector: give the replicas' port",
        "spec.pools[3]: give one of endpoints, simulated, endpointSelector and inferencePool, not simulated, endpointSelector, inferencePool",
        "spec.pools[3].endpointSelector.matchLabels.bad key!: \"bad key!\" is not a label key",
        "spec.pools[4].inferencePool.name: \"\" is not an object name",
        "spec.pools[4].inferencePool.relistInterval: must be greater than 0",
    ];
    for e in expect {
        assert!(
            p.iter().any(|line| line.starts_with(e)),
            "missing {e:?} in {p:#?}"
        );
    }
}

#[test]
fn engine_priority_is_off_by_default_and_for_vllm_only() {
    let c = from_yaml(&minimal(
        "    - {name: p, models: [m], endpoints: [\"a:1\"]}\n",
    ))
    .unwrap();
    assert!(!c.spec.pools[0].engine_priority());
    let c = from_yaml(&minimal(
        "    - {name: p, engine: vllm, models: [m], endpoints: [\"a:1\"], enginePriority: true}\n",
    ))
    .unwrap();
    assert!(c.spec.pools[0].engine_priority());

    let refused = problems(&minimal(
        "    - {name: p, engine: sglang, models: [m], endpoints: [\"a:1\"], enginePriority: true}\n    - {name: q, engine: none, models: [n], endpoints: [\"a:2\"], enginePriority: true}\n",
    ));
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert!(
        refused[0].starts_with("spec.pools[0].enginePriority: only vllm replicas")
            && refused[0].contains("engine is sglang"),
        "{refused:?}"
    );
    assert!(refused[1].contains("engine is none"), "{refused:?}");
}

#[test]
fn simulated_replicas_schedule_by_priority_when_the_gateway_sends_it() {
    use config::EngineScheduling;

    let pool = |pool_fields: &str, simulated_fields: &str| {
        minimal(&format!(
            "    - {{name: p, engine: vllm, models: [m]{pool_fields}, simulated: {{replicas: 1, hardware: [a10g], model: llama-3.1-8b{simulated_fields}}}}}\n"
        ))
    };
    let scheduling = |yaml: &str| from_yaml(yaml).unwrap().spec.pools[0].simulated_scheduling();
    let on = ", enginePriority: true";
    assert_eq!(scheduling(&pool("", "")), Some(EngineScheduling::Fcfs));
    assert_eq!(scheduling(&pool(on, "")), Some(EngineScheduling::Priority));
    assert_eq!(
        scheduling(&pool("", ", schedulingPolicy: priority")),
        Some(EngineScheduling::Priority)
    );
    assert_eq!(
        problems(&pool(on, ", schedulingPolicy: fcfs")),
        [
            "spec.pools[0].simulated.schedulingPolicy: fcfs replicas refuse (400) the priority enginePriority sends; use priority, or leave it out"
        ]
    );
    // Pools of real replicas have nothing to simulate.
    let real =
        minimal("    - {name: p, models: [m], endpoints: [\"a:1\"], enginePriority: true}\n");
    assert_eq!(scheduling(&real), None);
}

/// A simulated pool's load time is a duration or `calibrated`; one that
/// starts at zero is woken by its own fleet and needs its requests to wait.
#[test]
fn a_simulated_pool_loads_and_starts_at_zero_consistently() {
    let pool = |simulated: &str, pool: &str| {
        minimal(&format!(
            "    - {{name: p, models: [m], simulated: {{replicas: 1, hardware: [h100], model: llama-3.1-8b{simulated}}}{pool}}}\n"
        ))
    };
    from_yaml(&pool(", loadTime: calibrated, startAtZero: true", "")).unwrap();
    from_yaml(&pool(", loadTime: 45s", "")).unwrap();
    let found = problems(&pool(", loadTime: soon", "")).join("\n");
    assert!(found.contains("simulated.loadTime"), "{found}");
    let found = problems(&pool(
        ", startAtZero: true",
        ", coldStart: {timeout: 0s, wake: {webhook: \"http://a/\"}}",
    ))
    .join("\n");
    assert!(
        found.contains("coldStart.wake: a simulated pool that starts at zero"),
        "{found}"
    );
    assert!(found.contains("coldStart.timeout"), "{found}");
}
