//! A pool's `disaggregation`: prefill replicas to send to, and settings the
//! request path can use.

use crate::problem::Problems;
use crate::schema::Pool;

pub fn check(p: &mut Problems, path: &str, pool: &Pool) {
    let Some(d) = &pool.disaggregation else {
        return;
    };
    let path = format!("{path}.disaggregation");
    match (d.prefill.endpoints.is_empty(), &d.prefill.endpoint_selector) {
        (true, None) => p.add(
            format!("{path}.prefill.endpoints"),
            "at least one prefill replica (host:port) is required (or use endpointSelector)",
        ),
        (false, Some(_)) => p.add(
            format!("{path}.prefill"),
            "give one of endpoints and endpointSelector, not both",
        ),
        _ => {}
    }
    for (i, endpoint) in d.prefill.endpoints.iter().enumerate() {
        if !super::address::is_host_port(endpoint) {
            p.add(
                format!("{path}.prefill.endpoints[{i}]"),
                format!("{endpoint:?} is not host:port"),
            );
        } else if pool.endpoints.contains(endpoint) {
            p.add(
                format!("{path}.prefill.endpoints[{i}]"),
                format!("{endpoint} is also one of the pool's (decode) endpoints; a replica has one role"),
            );
        }
    }
    if d.prefill.bootstrap_port == Some(0) {
        p.add(
            format!("{path}.prefill.bootstrapPort"),
            "must be a port number (1-65535)",
        );
    }
    if d.prefill_timeout.is_some_and(|t| t.is_zero()) {
        p.add(format!("{path}.prefillTimeout"), "must be more than 0");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(disaggregation: serde_json::Value) -> Vec<String> {
        let pool = serde_json::json!({"name": "p", "models": ["m"], "endpoints": ["d:1"],
            "disaggregation": disaggregation});
        let pool: Pool = serde_json::from_value(pool).unwrap();
        let mut p = Problems(Vec::new());
        check(&mut p, "spec.pools[0]", &pool);
        p.0.into_iter().map(|problem| problem.to_string()).collect()
    }

    #[test]
    fn prefill_replicas_are_required_and_distinct_from_the_decode_replicas() {
        assert!(
            problems(serde_json::json!({"protocol": "vllm", "prefill": {"endpoints": ["p:1"]}}))
                .is_empty()
        );
        let missing = problems(serde_json::json!({"protocol": "sglang", "prefill": {}}));
        assert!(
            missing[0].contains("spec.pools[0].disaggregation.prefill.endpoints"),
            "{missing:?}"
        );
        let shared = problems(
            serde_json::json!({"protocol": "vllm", "prefill": {"endpoints": ["d:1", "nope"]}}),
        );
        assert_eq!(shared.len(), 2, "{shared:?}");
        assert!(shared[0].contains("one role"), "{shared:?}");
        assert!(shared[1].contains("not host:port"), "{shared:?}");
        let zero = problems(
            serde_json::json!({"protocol": "sglang", "prefillTimeout": "0s",
            "prefill": {"endpoints": ["p:1"], "bootstrapPort": 0}}),
        );
        assert_eq!(zero.len(), 2, "{zero:?}");
    }

    #[test]
    fn prefill_replicas_may_be_found_by_label_instead() {
        let selector = serde_json::json!({"namespace": "ml", "matchLabels": {"llm-d.ai/role": "prefill"}, "port": 8000});
        assert!(
            problems(
                serde_json::json!({"protocol": "vllm", "prefill": {"endpointSelector": selector}})
            )
            .is_empty()
        );
        let both = problems(serde_json::json!({"protocol": "vllm",
            "prefill": {"endpoints": ["p:1"], "endpointSelector": selector}}));
        assert_eq!(both.len(), 1, "{both:?}");
        assert!(both[0].contains("not both"), "{both:?}");
        assert_eq!(config_prefill_group(), ("p/prefill".to_owned(), Some("p")));
    }

    fn config_prefill_group() -> (String, Option<&'static str>) {
        (
            crate::prefill_group_name("p"),
            crate::prefill_group_of("p/prefill"),
        )
    }

    #[test]
    fn an_unknown_protocol_is_refused() {
        let pool = serde_json::json!({"name": "p", "models": ["m"], "endpoints": ["d:1"],
            "disaggregation": {"protocol": "trtllm", "prefill": {"endpoints": ["p:1"]}}});
        assert!(serde_json::from_value::<Pool>(pool).is_err());
    }
}
