//! Checks of rewrites, sessions and mirrors: names that resolve, weights
//! that add up, guards and promotions that can act.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::problem::Problems;
use crate::schema::Spec;
use crate::traffic::{Mirror, Rewrite};

/// `served`: every model and adapter name a pool serves.
pub(super) fn check(p: &mut Problems, spec: &Spec, served: &HashMap<&str, String>) {
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, rewrite) in spec.rewrites.iter().enumerate() {
        let path = format!("spec.rewrites[{i}]");
        super::names::check_name(p, &mut names, "spec.rewrites", i, &rewrite.name);
        check_rewrite(p, &path, rewrite, served);
    }
    if let Some(sessions) = &spec.sessions {
        let path = "spec.sessions";
        if sessions.header.is_none() && sessions.jwt_claim.is_none() && !sessions.user {
            p.add(
                path,
                "name where the session key comes from: header, jwtClaim or user: true",
            );
        }
        if let Some(h) = &sessions.header
            && !is_header_name(h)
        {
            p.add(
                format!("{path}.header"),
                format!("{h:?} is not a header field name"),
            );
        }
        if sessions.jwt_claim.as_deref().is_some_and(str::is_empty) {
            p.add(format!("{path}.jwtClaim"), "must not be empty");
        }
        if sessions.idle_timeout == Some(Duration::ZERO) {
            p.add(format!("{path}.idleTimeout"), "must be greater than 0");
        }
        if sessions.max_sessions == Some(0) {
            p.add(format!("{path}.maxSessions"), "must be at least 1");
        }
    }
    let pools: HashSet<&str> = spec.pools.iter().map(|p| p.name.as_str()).collect();
    for (i, mirror) in spec.mirrors.iter().enumerate() {
        check_mirror(p, &format!("spec.mirrors[{i}]"), mirror, served, &pools);
    }
}

fn check_rewrite(p: &mut Problems, path: &str, rewrite: &Rewrite, served: &HashMap<&str, String>) {
    if rewrite.model.is_empty() {
        p.add(format!("{path}.model"), "must not be empty");
    }
    for name in rewrite.matches.headers.keys() {
        if !is_header_name(name) {
            p.add(
                format!("{path}.match.headers[{name:?}]"),
                "is not a header field name",
            );
        }
    }
    if rewrite.targets.is_empty() {
        p.add(format!("{path}.targets"), "at least one target is required");
        return;
    }
    let mut total = 0u64;
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (j, target) in rewrite.targets.iter().enumerate() {
        let tp = format!("{path}.targets[{j}]");
        if !served.contains_key(target.model.as_str()) {
            p.add(
                format!("{tp}.model"),
                format!("no pool serves {:?}", target.model),
            );
        }
        if let Some(first) = seen.insert(&target.model, j) {
            p.add(
                format!("{tp}.model"),
                format!("{:?} is already targets[{first}]", target.model),
            );
        }
        if target.weight > 100 {
            p.add(format!("{tp}.weight"), "is a percentage: 0 to 100");
        }
        total += u64::from(target.weight);
        if j == 0 && (target.guard.is_some() || target.promote.is_some()) {
            p.add(
                tp.clone(),
                "the first target is the stable one, which takes back what others lose: give guard and promote to the others",
            );
        }
        if let Some(guard) = &target.guard {
            let gp = format!("{tp}.guard");
            if guard.ttft_p95.is_none() && guard.error_rate.is_none() {
                p.add(gp.clone(), "give ttftP95, errorRate or both");
            }
            if let Some(rate) = guard.error_rate
                && !(0.0..=1.0).contains(&rate)
            {
                p.add(format!("{gp}.errorRate"), "must be between 0 and 1");
            }
            if guard.min_requests == Some(0) {
                p.add(format!("{gp}.minRequests"), "must be at least 1");
            }
            if guard.window == Some(Duration::ZERO) {
                p.add(format!("{gp}.window"), "must be greater than 0");
            }
        }
        if let Some(promote) = &target.promote {
            let pp = format!("{tp}.promote");
            if target.guard.is_none() {
                p.add(
                    pp.clone(),
                    "needs a guard: a target is promoted only while its guard holds",
                );
            }
            if promote.step == 0 || promote.step > 100 {
                p.add(format!("{pp}.step"), "must be 1 to 100 (percent)");
            }
            if promote.every == Duration::ZERO {
                p.add(format!("{pp}.every"), "must be greater than 0");
            }
        }
    }
    if total != 100 {
        p.add(
            format!("{path}.targets"),
            format!("weights add up to {total}; they are percentages and must add up to 100"),
        );
    }
}

fn check_mirror(
    p: &mut Problems,
    path: &str,
    mirror: &Mirror,
    served: &HashMap<&str, String>,
    pools: &HashSet<&str>,
) {
    if mirror.model.is_empty() {
        p.add(format!("{path}.model"), "must not be empty");
    }
    match (&mirror.target_model, &mirror.pool) {
        (Some(_), Some(_)) | (None, None) => {
            p.add(path, "give exactly one of targetModel and pool");
        }
        (Some(model), None) if !served.contains_key(model.as_str()) => {
            p.add(
                format!("{path}.targetModel"),
                format!("no pool serves {model:?}"),
            );
        }
        (None, Some(pool)) if !pools.contains(pool.as_str()) => {
            p.add(format!("{path}.pool"), format!("no pool is named {pool:?}"));
        }
        _ => {}
    }
    if !(mirror.fraction.is_finite() && (0.0..=1.0).contains(&mirror.fraction)) {
        p.add(format!("{path}.fraction"), "must be between 0 and 1");
    }
    if mirror.max_in_flight == Some(0) {
        p.add(format!("{path}.maxInFlight"), "must be at least 1");
    }
}

/// A header field name as HTTP allows it (an RFC 9110 token).
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use crate::ConfigError;

    fn problems(extra: &str) -> Vec<String> {
        let yaml = format!(
            "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: p, address: \"127.0.0.1:0\"}}]\n  pools:\n    - {{name: a, models: [m], endpoints: [\"10.0.0.1:8000\"]}}\n    - {{name: b, models: [m-v2], adapters: [sql], endpoints: [\"10.0.0.2:8000\"]}}\n{extra}"
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

    #[test]
    fn a_valid_canary_with_sessions_and_a_mirror() {
        let got = problems(
            "  sessions: {header: x-session-id, user: true}\n  rewrites:\n    - name: r\n      model: \"m*\"\n      match: {tenants: [t], headers: {x-canary: \"1\"}}\n      targets:\n        - {model: m, weight: 95}\n        - {model: sql, weight: 5, guard: {ttftP95: 2s, errorRate: 0.02, minRequests: 200, window: 5m}, promote: {step: 10, every: 10m}}\n  mirrors:\n    - {model: m, pool: b, fraction: 0.1}\n",
        );
        assert_eq!(got, Vec::<String>::new());
    }

    #[test]
    fn every_mistake_is_reported_where_it_is() {
        let got = problems(
            "  sessions: {}\n  rewrites:\n    - name: r\n      model: m\n      targets:\n        - {model: m, weight: 80, guard: {errorRate: 0.1}}\n        - {model: nope, weight: 10, promote: {step: 0, every: 0s}}\n    - name: r\n      model: m\n      targets: []\n  mirrors:\n    - {model: m, targetModel: m-v2, pool: b, fraction: 2}\n",
        );
        for expected in [
            "spec.sessions: name where the session key comes from",
            "spec.rewrites[0].targets[0]: the first target is the stable one",
            "spec.rewrites[0].targets[1].model: no pool serves \"nope\"",
            "spec.rewrites[0].targets[1].promote: needs a guard",
            "spec.rewrites[0].targets[1].promote.step: must be 1 to 100",
            "spec.rewrites[0].targets[1].promote.every: must be greater than 0",
            "spec.rewrites[0].targets: weights add up to 90",
            "spec.rewrites[1].name: \"r\" is already the name of spec.rewrites[0]",
            "spec.rewrites[1].targets: at least one target is required",
            "spec.mirrors[0]: give exactly one of targetModel and pool",
            "spec.mirrors[0].fraction: must be between 0 and 1",
        ] {
            assert!(
                got.iter().any(|p| p.starts_with(expected)),
                "missing {expected:?} in {got:#?}"
            );
        }
    }
}
