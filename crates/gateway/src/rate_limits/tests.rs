use super::*;

fn limiter(yaml_spec: &str) -> Limiter {
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: l, address: \"127.0.0.1:0\"}}]\n{yaml_spec}  pools: [{{name: p, engine: none, models: [m, m-lora], endpoints: [\"127.0.0.1:1\"]}}]\n"
    );
    let config = config::from_yaml(&yaml).unwrap();
    let store = Store::for_config(&config.spec.rate_limits, None).unwrap();
    Limiter::new(&config.spec, store, Default::default())
}

const TENANTS: &str = "  tenants:\n    - name: a\n      limits: {requestsPerMinute: 3, tokensPerMinute: 1000}\n      modelLimits: {\"*-lora\": {tokensPerMinute: 300}}\n    - name: b\n";

#[tokio::test]
async fn a_tenant_is_held_to_its_request_limit_and_others_are_not() {
    let l = limiter(TENANTS);
    for _ in 0..3 {
        let r = l.reserve(Some("a"), "m", 10).await.ok().unwrap().unwrap();
        r.settle(Outcome::Used(10));
    }
    let refused = l.reserve(Some("a"), "m", 10).await.err().unwrap();
    assert_eq!(refused.error.status, 429);
    assert_eq!(refused.error.kind, "requests");
    assert_eq!(refused.error.code, Some("rate_limit_exceeded"));
    assert!(
        refused
            .error
            .message
            .contains("requests per min (RPM) for tenant a: Limit 3, Used 3, Requested 1"),
        "{}",
        refused.error.message
    );
    // A third of a minute until one request fits again.
    let retry = refused.error.retry_after.unwrap();
    assert!(
        retry > Duration::from_secs(19) && retry <= Duration::from_secs(20),
        "{retry:?}"
    );
    // Tenant b has no limits; nor does a caller with no tenant.
    assert!(l.reserve(Some("b"), "m", 10).await.ok().unwrap().is_none());
    assert!(l.reserve(None, "m", 10).await.ok().unwrap().is_none());
}

#[tokio::test]
async fn tokens_are_reserved_then_settled_to_what_was_used() {
    let l = limiter(TENANTS);
    let r = l.reserve(Some("a"), "m", 900).await.ok().unwrap().unwrap();
    // 900 of 1000 held: a second 900 does not fit while the first runs.
    let refused = l.reserve(Some("a"), "m", 900).await.err().unwrap();
    assert_eq!(refused.error.kind, "tokens");
    // It used 100: 800 come back, and the second fits.
    r.settle(Outcome::Used(100));
    let second = l.reserve(Some("a"), "m", 800).await.ok().unwrap().unwrap();
    let mut headers = http::HeaderMap::new();
    second.headers().apply(&mut headers);
    assert_eq!(headers["x-ratelimit-limit-tokens"], "1000");
    let remaining: u64 = headers["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((99..=101).contains(&remaining), "{remaining}");
    assert_eq!(headers["x-ratelimit-limit-requests"], "3");
    assert_eq!(headers["x-ratelimit-remaining-requests"], "1");
    second.settle(Outcome::Unknown);
}

#[tokio::test]
async fn a_request_that_never_ran_gives_everything_back() {
    let l = limiter(TENANTS);
    for _ in 0..10 {
        // Dropped unsettled: refused or dropped before any replica.
        drop(l.reserve(Some("a"), "m", 1000).await.ok().unwrap().unwrap());
    }
    let r = l.reserve(Some("a"), "m", 1000).await.ok().unwrap().unwrap();
    let mut headers = http::HeaderMap::new();
    r.headers().apply(&mut headers);
    assert_eq!(headers["x-ratelimit-remaining-requests"], "2");
}

#[tokio::test]
async fn model_limits_add_to_the_tenants_own() {
    let l = limiter(TENANTS);
    let refused = l.reserve(Some("a"), "m-lora", 301).await.err().unwrap();
    assert!(
        refused.error.never_retry,
        "301 tokens never fit a 300 limit"
    );
    assert!(
        refused.error.message.starts_with("Request too large for m-lora on tokens per min (TPM) for tenant a on *-lora: Limit 300, Requested 301."),
        "{}",
        refused.error.message
    );
    // The base model is not under the adapter's limit.
    assert!(l.reserve(Some("a"), "m", 301).await.is_ok());
}

#[tokio::test]
async fn global_limits_hold_every_caller() {
    let l = limiter("  rateLimits: {global: {requestsPerSecond: 2}}\n");
    let _a = l.reserve(None, "m", 1).await.ok().unwrap().unwrap();
    let _b = l.reserve(Some("x"), "m", 1).await.ok().unwrap().unwrap();
    let refused = l.reserve(Some("y"), "m", 1).await.err().unwrap();
    assert!(
        refused.error.message.contains("for all callers"),
        "{}",
        refused.error.message
    );
}

#[test]
fn globs() {
    for (glob, name, yes) in [
        ("*", "anything", true),
        ("llama-*", "llama-3", true),
        ("llama-*", "qwen", false),
        ("*-lora", "sql-lora", true),
        ("*-lora", "sql-lora2", false),
        ("a*b*c", "a-b-c", true),
        ("a*b*c", "a-c-b", false),
        ("exact", "exact", true),
        ("exact", "exact2", false),
    ] {
        assert_eq!(glob_matches(glob, name), yes, "{glob} {name}");
    }
}
