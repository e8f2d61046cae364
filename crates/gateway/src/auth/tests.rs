use std::sync::Arc;

use config::Priority;
use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderName, HeaderValue};

use super::*;

fn spec(extra: &str) -> config::Spec {
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: p, address: \"127.0.0.1:0\"}}]\n{extra}  pools: [{{name: p, models: [m], endpoints: [\"127.0.0.1:1\"]}}]\n"
    );
    config::from_yaml(&yaml)
        .unwrap_or_else(|e| panic!("{e}\n{yaml}"))
        .spec
}

fn authenticator(extra: &str) -> Authenticator {
    Sources::default().build(&spec(extra)).unwrap()
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (n, v) in pairs {
        map.append(HeaderName::from_static(n), v.parse().unwrap());
    }
    map
}

fn keys_spec(tenant_header: &str) -> String {
    format!(
        "  auth:\n    apiKeys:\n      keys:\n        - {{tenant: a, sha256: {}, name: laptop}}\n        - {{tenant: stranger, sha256: {}}}\n{tenant_header}  tenants:\n    - {{name: a, models: [\"m*\"], maxPriority: critical, weight: 2}}\n",
        api_keys::sha256_hex("key-a"),
        api_keys::sha256_hex("key-s"),
    )
}

#[tokio::test]
async fn without_auth_every_caller_is_anonymous_and_may_do_everything() {
    for auth in ["", "  auth: {mode: none}\n"] {
        let a = authenticator(auth);
        let caller = a
            .authenticate(&headers(&[("authorization", "Bearer whatever")]), None)
            .await
            .unwrap();
        assert_eq!(&*caller.tenant, "anonymous");
        assert!(caller.may_use_all());
        assert_eq!(caller.max_priority(), Priority::Critical);
        assert_eq!(caller.label().as_str(), "anonymous");
        // The client's credential is not the gateway's: it passes on.
        assert_eq!(a.caller_fields(&caller).removed, [None, None]);
    }
}

#[tokio::test]
async fn an_api_key_names_its_tenant_and_the_tenant_its_rules() {
    let a = authenticator(&keys_spec(""));
    for h in [
        headers(&[("authorization", "Bearer key-a")]),
        headers(&[("x-api-key", "key-a")]),
    ] {
        let caller = a.authenticate(&h, None).await.unwrap();
        assert_eq!(&*caller.tenant, "a");
        assert!(matches!(&caller.via, Via::ApiKey(Some(n)) if &**n == "laptop"));
        assert!(caller.may_use("m1") && !caller.may_use("x"));
        assert_eq!(caller.max_priority(), Priority::Critical);
        assert_eq!(caller.flow_key(Arc::from("k")).weight, 2);
        assert!(a.authorize(&caller, "m1").is_ok());
        let refused = a.authorize(&caller, "x").unwrap_err();
        assert_eq!(
            (refused.status.as_u16(), refused.code),
            (403, Some("model_not_allowed"))
        );
    }
    // Not listed in `tenants`: every model, at most standard, `other`.
    let stranger = a
        .authenticate(&headers(&[("x-api-key", "key-s")]), None)
        .await
        .unwrap();
    assert!(stranger.may_use_all());
    assert_eq!(stranger.max_priority(), Priority::Standard);
    assert_eq!(stranger.label().as_str(), "other");
}

#[tokio::test]
async fn refusals_say_why_in_one_word() {
    let a = authenticator(&keys_spec(""));
    let refused = |h: HeaderMap| {
        let a = &a;
        async move { a.authenticate(&h, None).await.unwrap_err() }
    };
    let e = refused(headers(&[])).await;
    assert_eq!((e.kind, e.reason), (Kind::ApiKey, Reason::Missing));
    let api = e.into_api();
    assert_eq!(
        (api.status.as_u16(), api.code),
        (401, Some("invalid_api_key"))
    );
    assert_eq!(api.challenge.as_deref(), Some("Bearer realm=\"infergate\""));

    let e = refused(headers(&[("authorization", "Bearer key-b")])).await;
    assert_eq!(e.reason, Reason::UnknownKey);
    let api = e.into_api();
    assert_eq!(
        api.challenge.as_deref(),
        Some(
            "Bearer realm=\"infergate\", error=\"invalid_token\", error_description=\"unknown_key\""
        )
    );
    assert!(api.message.contains("unknown_key"), "{}", api.message);

    let e = refused(headers(&[("authorization", "Basic a2V5LWE6")])).await;
    assert_eq!(e.reason, Reason::Malformed);
    let e = refused(headers(&[
        ("authorization", "Bearer key-a"),
        ("x-api-key", "key-s"),
    ]))
    .await;
    assert_eq!(e.reason, Reason::Conflicting);
}

#[tokio::test]
async fn the_replica_gets_the_tenant_not_the_key() {
    let a = authenticator(&keys_spec("    tenantHeader: x-tenant\n"));
    let caller = a
        .authenticate(&headers(&[("authorization", "Bearer key-a")]), None)
        .await
        .unwrap();
    let fields = a.caller_fields(&caller);
    let tenant = HeaderName::from_static("x-tenant");
    assert_eq!(fields.removed, [Some(&AUTHORIZATION), Some(&tenant)]);
    assert_eq!(
        fields.tenant,
        Some((&tenant, &HeaderValue::from_static("a")))
    );

    // Authentication off: the client's copy of the header is still
    // replaced, by `anonymous`.
    let a = authenticator("  auth: {mode: none, tenantHeader: x-tenant}\n");
    let caller = a.authenticate(&HeaderMap::new(), None).await.unwrap();
    let fields = a.caller_fields(&caller);
    assert_eq!(fields.removed, [None, Some(&tenant)]);
    assert_eq!(
        fields.tenant,
        Some((&tenant, &HeaderValue::from_static("anonymous")))
    );
}

#[tokio::test]
async fn a_verified_client_certificate_names_a_tenant_when_no_header_does() {
    // The listener's TLS is another stage's; here only the hand-over.
    let mut spec = spec(&keys_spec(""));
    spec.auth.as_mut().unwrap().client_certificates = Some(config::ClientCertificates::default());
    let a = Sources::default().build(&spec).unwrap();
    let caller = a.authenticate(&HeaderMap::new(), Some("a")).await.unwrap();
    assert_eq!(&*caller.tenant, "a");
    assert!(matches!(caller.via, Via::Certificate));
    let by_key = a
        .authenticate(&headers(&[("x-api-key", "key-s")]), Some("a"))
        .await
        .unwrap();
    assert_eq!(
        &*by_key.tenant, "stranger",
        "the header's credential counts"
    );
    let e = a.authenticate(&HeaderMap::new(), None).await.unwrap_err();
    assert_eq!(e.reason, Reason::Missing);
}
