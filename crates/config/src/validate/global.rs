//! Checks of `spec.global`: members that can be reached and told apart,
//! models a member can be known to serve, weights and failover settings
//! that can act.

use std::collections::HashMap;
use std::time::Duration;

use crate::global::{Global, MemberKind, Tier};
use crate::problem::Problems;

pub(super) fn check(p: &mut Problems, global: &Global) {
    let path = "spec.global";
    if global.region.trim().is_empty() {
        p.add(format!("{path}.region"), "must not be empty");
    }
    if global.members.is_empty() {
        p.add(format!("{path}.members"), "at least one member is required");
    } else if global.members.iter().all(|m| m.tier == Tier::Fallback) {
        p.add(
            format!("{path}.members"),
            "every member is tier: fallback; fallbacks take only what primaries cannot, so at least one must be primary",
        );
    }
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, member) in global.members.iter().enumerate() {
        let mp = format!("{path}.members[{i}]");
        super::names::check_name(p, &mut names, "spec.global.members", i, &member.name);
        if let Err(why) = check_member_url(&member.url) {
            p.add(format!("{mp}.url"), why);
        }
        if let Some(admin) = &member.admin_url {
            if member.kind == MemberKind::Openai {
                p.add(
                    format!("{mp}.adminUrl"),
                    "an openai member publishes no load summary; adminUrl is for infergate members",
                );
            } else if let Err(why) = check_member_url(admin) {
                p.add(format!("{mp}.adminUrl"), why);
            }
        }
        if member
            .region
            .as_deref()
            .is_some_and(|r| r.trim().is_empty())
        {
            p.add(format!("{mp}.region"), "must not be empty");
        }
        if let Some(cost) = member.cost_per_million_tokens
            && !(cost.is_finite() && cost >= 0.0)
        {
            p.add(
                format!("{mp}.costPerMillionTokens"),
                "must be a number >= 0",
            );
        }
        for (j, tag) in member.residency.iter().enumerate() {
            if tag.trim().is_empty() {
                p.add(format!("{mp}.residency[{j}]"), "must not be empty");
            }
        }
        if member.api_key_file.as_deref() == Some("") {
            p.add(format!("{mp}.apiKeyFile"), "must not be empty");
        }
        let knows_models = member.kind == MemberKind::Infergate && member.admin_url.is_some();
        if member.models.is_empty() && !knows_models {
            p.add(
                format!("{mp}.models"),
                match member.kind {
                    MemberKind::Openai => {
                        "an openai member must list the models it serves (client name: member's name)"
                    }
                    MemberKind::Infergate => {
                        "list the models it serves, or give adminUrl so they are read from its summary"
                    }
                },
            );
        }
        for (client, theirs) in &member.models {
            if client.is_empty() || theirs.is_empty() {
                p.add(
                    format!("{mp}.models[{client:?}]"),
                    "model names must not be empty",
                );
            }
        }
    }

    let w = &global.weights;
    let weights = [
        ("kvHeadroom", w.kv_headroom),
        ("queueDepth", w.queue_depth),
        ("regionProximity", w.region_proximity),
        ("errorRate", w.error_rate),
        ("cost", w.cost),
    ];
    for (field, value) in weights {
        if let Some(v) = value
            && !(v.is_finite() && v >= 0.0)
        {
            p.add(format!("{path}.weights.{field}"), "must be a number >= 0");
        }
    }
    let total =
        w.kv_headroom() + w.queue_depth() + w.region_proximity() + w.error_rate() + w.cost();
    if total == 0.0 {
        p.add(
            format!("{path}.weights"),
            "every weight is 0: members could not be told apart",
        );
    }

    let f = &global.failover;
    if f.unhealthy_after == Some(Duration::ZERO) {
        p.add(
            format!("{path}.failover.unhealthyAfter"),
            "must be greater than 0",
        );
    }
    if let Some(rate) = f.max_error_rate
        && !(rate > 0.0 && rate <= 1.0)
    {
        p.add(format!("{path}.failover.maxErrorRate"), "must be in (0, 1]");
    }

    for (from, row) in &global.region_distances {
        for (to, d) in row {
            if !(d.is_finite() && *d >= 0.0) {
                p.add(
                    format!("{path}.regionDistances[{from:?}][{to:?}]"),
                    "must be a number >= 0",
                );
            }
        }
    }
}

/// `http://host[:port][/path]` or `https://...`; no query or fragment.
fn check_member_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("{url:?} is not an http:// or https:// URL"))?;
    if url.contains(['?', '#']) || url.chars().any(char::is_whitespace) {
        return Err(format!("{url:?} must not have a query, fragment or spaces"));
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if !is_authority(authority) {
        return Err(format!("{url:?} has no valid host[:port]"));
    }
    Ok(())
}

/// `host`, `host:port`, or an IP address with a port (`[::1]:8080`).
fn is_authority(authority: &str) -> bool {
    if authority.parse::<std::net::SocketAddr>().is_ok() {
        return true;
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (authority, None),
    };
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
        && port.is_none_or(|p| p.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use crate::ConfigError;

    fn problems(pools: &str, global: &str) -> Vec<String> {
        let yaml = format!(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: p, address: \"127.0.0.1:0\"}}]\n{pools}{global}"
        );
        match crate::from_yaml(&yaml) {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid(problems)) => problems
                .iter()
                .map(|p| format!("{}: {}", p.path, p.message))
                .collect(),
            Err(e) => panic!("{e}"),
        }
    }

    const ISSUE_SKETCH: &str = r#"  global:
    region: us-east-1
    members:
      - {name: use1, url: "http://10.0.0.5:8080", adminUrl: "http://10.0.0.5:9464", region: us-east-1, costPerMillionTokens: 0.20}
      - {name: euw1, url: "http://10.1.0.5:8080", adminUrl: "http://10.1.0.5:9464", region: eu-west-1, costPerMillionTokens: 0.15, residency: [eu]}
      - {name: hosted, url: "https://api.example.com", kind: openai, apiKeyFile: /secrets/k, models: {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b"}, tier: fallback}
    weights: {kvHeadroom: 0.4, queueDepth: 0.3, regionProximity: 0.2, errorRate: 0.1, cost: 0}
    failover: {unhealthyAfter: 2s, rampUp: 60s}
    regionDistances: {us-east-1: {eu-west-1: 80}}
"#;

    #[test]
    fn member_urls() {
        for ok in [
            "http://10.0.0.5:8080",
            "https://api.example.com",
            "https://api.example.com/openai",
            "http://[::1]:8080",
            "http://gw_1:80",
        ] {
            assert_eq!(super::check_member_url(ok), Ok(()), "{ok}");
        }
        for bad in [
            "10.0.0.5:8080",
            "http://",
            "http://h:port",
            "http://h:99999",
            "http://a b",
            "https://h/v1?x",
        ] {
            assert!(super::check_member_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn members_alone_are_a_valid_config() {
        assert_eq!(problems("", ISSUE_SKETCH), Vec::<String>::new());
    }

    #[test]
    fn the_sketch_reads_as_written_and_defaults_fill_the_rest() {
        let yaml = format!(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: p, address: \"127.0.0.1:0\"}}]\n{ISSUE_SKETCH}"
        );
        let config = crate::from_yaml(&yaml).unwrap();
        let global = config.spec.global.unwrap();
        assert_eq!(global.members.len(), 3);
        let hosted = &global.members[2];
        assert_eq!(hosted.kind, crate::MemberKind::Openai);
        assert_eq!(hosted.tier, crate::Tier::Fallback);
        assert_eq!(
            hosted.models["meta-llama/Llama-3.1-8B-Instruct"],
            "llama-3.1-8b"
        );
        assert_eq!(hosted.region(&global), "us-east-1");
        assert_eq!(global.members[1].residency, ["eu"]);
        assert_eq!(global.failover.unhealthy_after(), Duration::from_secs(2));
        assert_eq!(
            global.failover.max_error_rate(),
            crate::defaults::GLOBAL_MAX_ERROR_RATE
        );
        assert_eq!(global.distance_to("eu-west-1"), Some(80.0));
        assert_eq!(global.distance_to("us-east-1"), Some(0.0));
        assert_eq!(global.distance_to("ap-south-1"), None);
        assert_eq!(global.farthest(), 80.0);
    }

    use std::time::Duration;

    #[test]
    fn without_pools_or_members_there_is_nothing_to_serve() {
        let got = problems("", "");
        assert!(
            got.iter()
                .any(|p| p.starts_with("spec.pools: at least one pool")),
            "{got:#?}"
        );
    }

    #[test]
    fn every_mistake_is_reported_where_it_is() {
        let got = problems(
            "",
            r#"  global:
    region: ""
    members:
      - {name: a, url: "10.0.0.5:8080", tier: fallback}
      - {name: a, url: "http://h:1", adminUrl: "ftp://x", costPerMillionTokens: -1, residency: [""]}
      - {name: o, url: "https://api.example.com/v1?x=1", kind: openai, adminUrl: "http://h:2", tier: fallback}
    weights: {kvHeadroom: -1, queueDepth: 0, regionProximity: 0, errorRate: 0, cost: 0}
    failover: {unhealthyAfter: 0s, maxErrorRate: 0}
    regionDistances: {a: {b: -3}}
"#,
        );
        for expected in [
            "spec.global.region: must not be empty",
            "spec.global.members[0].url: \"10.0.0.5:8080\" is not an http:// or https:// URL",
            "spec.global.members[0].models: list the models it serves, or give adminUrl",
            "spec.global.members[1].name: \"a\" is already the name of spec.global.members[0]",
            "spec.global.members[1].adminUrl: \"ftp://x\" is not an http",
            "spec.global.members[1].costPerMillionTokens: must be a number >= 0",
            "spec.global.members[1].residency[0]: must not be empty",
            "spec.global.members[2].url: \"https://api.example.com/v1?x=1\" must not have a query",
            "spec.global.members[2].adminUrl: an openai member publishes no load summary",
            "spec.global.members[2].models: an openai member must list the models",
            "spec.global.weights.kvHeadroom: must be a number >= 0",
            "spec.global.failover.unhealthyAfter: must be greater than 0",
            "spec.global.failover.maxErrorRate: must be in (0, 1]",
            "spec.global.regionDistances[\"a\"][\"b\"]: must be a number >= 0",
        ] {
            assert!(
                got.iter().any(|p| p.starts_with(expected)),
                "missing {expected:?} in {got:#?}"
            );
        }
    }

    #[test]
    fn all_zero_weights_and_all_fallback_members_are_refused() {
        let got = problems(
            "",
            r#"  global:
    region: r
    members:
      - {name: a, url: "http://h:1", models: {m: m}, tier: fallback}
    weights: {kvHeadroom: 0, queueDepth: 0, regionProximity: 0, errorRate: 0}
"#,
        );
        assert!(
            got.iter()
                .any(|p| p.starts_with("spec.global.members: every member is tier: fallback")),
            "{got:#?}"
        );
        assert!(
            got.iter()
                .any(|p| p.starts_with("spec.global.weights: every weight is 0")),
            "{got:#?}"
        );
    }

    #[test]
    fn tenants_residency_tags_must_be_named() {
        let got = problems(
            "  tenants: [{name: t, residency: [\"\"], residencyHeader: true}]\n",
            "  global: {region: r, members: [{name: a, url: \"http://h:1\", models: {m: m}}]}\n",
        );
        assert!(
            got.iter()
                .any(|p| p.starts_with("spec.tenants[0].residency[0]: must not be empty")),
            "{got:#?}"
        );
    }
}
