//! What a tenant may do: which models, how urgent its requests may be, its
//! share under saturation. Built once per generation from `spec.tenants`;
//! a tenant not listed there gets [`Tenants::unlisted`].

use std::collections::HashMap;
use std::sync::Arc;

use config::Priority;
use config::defaults::{ANONYMOUS_TENANT, OTHER_TENANTS_LABEL};

use crate::telemetry::TenantLabel;

/// One tenant's rules.
#[derive(Debug)]
pub struct TenantRules {
    /// Models and adapters it may use; every one when `None`.
    pub models: Option<Globs>,
    /// The most urgent band its requests may have.
    pub max_priority: Priority,
    /// Its share of a saturated pool against other tenants in a band.
    pub weight: u32,
    /// Its `tenant` label on metrics: its name when listed, else `other`.
    pub label: TenantLabel,
}

pub struct Tenants {
    listed: HashMap<String, Arc<TenantRules>>,
    unlisted: Arc<TenantRules>,
    anonymous: Arc<TenantRules>,
}

impl Tenants {
    pub fn new(tenants: &[config::Tenant]) -> Self {
        let listed: HashMap<String, Arc<TenantRules>> = tenants
            .iter()
            .map(|t| {
                let policy = TenantRules {
                    models: t.models.as_deref().map(Globs::new),
                    max_priority: t.max_priority(),
                    weight: t.weight(),
                    label: TenantLabel::new(&t.name),
                };
                (t.name.clone(), Arc::new(policy))
            })
            .collect();
        // Anonymous callers exist only when the operator turned
        // authentication off: nobody is kept apart from anybody, so unless
        // an `anonymous` tenant says otherwise they keep what every caller
        // had before tenants existed.
        let anonymous = listed.get(ANONYMOUS_TENANT).cloned().unwrap_or_else(|| {
            Arc::new(TenantRules {
                models: None,
                max_priority: Priority::Critical,
                weight: 1,
                label: TenantLabel::new(ANONYMOUS_TENANT),
            })
        });
        Self {
            listed,
            unlisted: Arc::new(TenantRules {
                models: None,
                max_priority: config::defaults::TENANT_MAX_PRIORITY,
                weight: 1,
                label: TenantLabel::new(OTHER_TENANTS_LABEL),
            }),
            anonymous,
        }
    }

    /// The rules of tenant `name`.
    pub fn policy(&self, name: &str) -> &Arc<TenantRules> {
        self.listed.get(name).unwrap_or(&self.unlisted)
    }

    /// The rules of a tenant not in `spec.tenants`: every model, at most
    /// `standard`, weight 1.
    pub fn unlisted(&self) -> &Arc<TenantRules> {
        &self.unlisted
    }

    /// The rules of anonymous callers (authentication off).
    pub fn anonymous(&self) -> &Arc<TenantRules> {
        &self.anonymous
    }
}

/// Model-name patterns. `*` matches any run of characters, `/` included
/// (`meta-llama/*`); every other character is itself. That is all: model
/// names carry `.`, `[`, `?` often enough that fuller glob syntax would
/// surprise more than it would help.
#[derive(Debug, Clone)]
pub struct Globs(Vec<Glob>);

#[derive(Debug, Clone)]
struct Glob {
    /// The pattern split at each `*`: the first piece must start the name,
    /// the last end it, the others appear in order between.
    pieces: Vec<String>,
}

impl Globs {
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Self {
        Self(
            patterns
                .iter()
                .map(|p| Glob {
                    pieces: p.as_ref().split('*').map(str::to_owned).collect(),
                })
                .collect(),
        )
    }

    pub fn matches(&self, name: &str) -> bool {
        self.0.iter().any(|g| g.matches(name))
    }
}

impl Glob {
    fn matches(&self, name: &str) -> bool {
        let (first, rest) = match self.pieces.split_first() {
            Some(split) => split,
            None => return name.is_empty(),
        };
        let Some(mut tail) = name.strip_prefix(first.as_str()) else {
            return false;
        };
        let Some((last, middle)) = rest.split_last() else {
            // No `*`: the whole name.
            return tail.is_empty();
        };
        // Each middle piece at its first place after the previous: leftmost
        // matches leave the most room for what follows.
        for piece in middle {
            match tail.find(piece.as_str()) {
                Some(at) => tail = &tail[at + piece.len()..],
                None => return false,
            }
        }
        tail.len() >= last.len() && tail.ends_with(last.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, name: &str) -> bool {
        Globs::new(&[pattern]).matches(name)
    }

    #[test]
    fn stars_match_any_run_and_the_rest_is_literal() {
        assert!(m("llama-*", "llama-3.1-8b"));
        assert!(m("meta-llama/*", "meta-llama/Llama-3.1-8B-Instruct"));
        assert!(m("*", "anything/at all"));
        assert!(m("*", ""));
        assert!(m("*-lora", "sql-lora"));
        assert!(m("a*b*c", "abc"));
        assert!(m("a*b*c", "a-b-b-c"));
        assert!(m("exact", "exact"));
        assert!(!m("exact", "exact-not"));
        assert!(!m("exact", "not-exact"));
        assert!(!m("llama-*", "qwen"));
        assert!(!m("a*b*c", "acb"));
        assert!(!m("ab*ba", "aba"), "the pieces may not overlap");
        assert!(!m("*-lora", "sql-lora2"));
        // `?`, `[` and `.` are themselves.
        assert!(m("model?[1].x", "model?[1].x"));
        assert!(!m("model?", "models"));
        assert!(!m("m.del", "model"));
    }

    #[test]
    fn any_pattern_of_the_list_may_match() {
        let globs = Globs::new(&["llama-*", "qwen"]);
        assert!(globs.matches("qwen"));
        assert!(globs.matches("llama-70b"));
        assert!(!globs.matches("qwen-2"));
        assert!(!Globs::new::<&str>(&[]).matches("m"));
    }

    #[test]
    fn unlisted_and_anonymous_tenants() {
        let tenants = Tenants::new(&[]);
        let other = tenants.policy("nobody");
        assert!(other.models.is_none());
        assert_eq!(other.max_priority, Priority::Standard);
        assert_eq!(other.label.as_str(), "other");
        assert_eq!(tenants.anonymous().max_priority, Priority::Critical);
        assert_eq!(tenants.anonymous().label.as_str(), "anonymous");

        let listed: Vec<config::Tenant> = serde_json::from_value(serde_json::json!([
            {"name": "a", "models": ["m*"], "maxPriority": "sheddable", "weight": 3},
            {"name": "anonymous", "maxPriority": "standard"},
        ]))
        .unwrap();
        let tenants = Tenants::new(&listed);
        let a = tenants.policy("a");
        assert!(a.models.as_ref().unwrap().matches("m1"));
        assert!(!a.models.as_ref().unwrap().matches("x"));
        assert_eq!((a.max_priority, a.weight), (Priority::Sheddable, 3));
        assert_eq!(a.label.as_str(), "a");
        assert_eq!(tenants.anonymous().max_priority, Priority::Standard);
    }
}
