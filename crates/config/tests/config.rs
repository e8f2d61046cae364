//! Parsing and validation of whole documents, as `infergate check` sees them.

use config::{ConfigError, Policy, from_yaml};

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
        [r#"spec.pools[1].endpoints[0]: "not a host" is not host:port"#]
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
