//! What is wrong with a config: each problem with its path, and the error
//! that carries them. A leaf, so that loading and validation both report
//! in these terms without depending on each other.

use std::fmt;

/// One thing wrong with a config, at a path like `spec.pools[1].endpoints[0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Problems as checks collect them.
pub(crate) struct Problems(pub(crate) Vec<Problem>);

impl Problems {
    pub(crate) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Problem {
            path: path.into(),
            message: message.into(),
        });
    }
}

/// Values of a document that could not be read, by path. Each is reported
/// once, where it is; checks leave alone what depends on one, as they would
/// only be checking the empty value read in its place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unreadable(Vec<String>);

impl Unreadable {
    pub(crate) fn new(paths: Vec<String>) -> Self {
        Unreadable(paths)
    }

    /// Whether the value at `path` was read as written: it is not, nor is
    /// anything around it or in it, unreadable.
    pub fn was_read(&self, path: &str) -> bool {
        !self
            .0
            .iter()
            .any(|u| is_at_or_under(path, u) || is_at_or_under(u, path))
    }

    /// Whether a problem at `path` is about a value read in place of an
    /// unreadable one.
    pub(crate) fn covers(&self, path: &str) -> bool {
        self.0.iter().any(|u| is_at_or_under(path, u))
    }
}

/// `spec.pools[1].name` is under `spec.pools[1]` and `spec`, not under
/// `spec.pool`; everything is under the root (`""`).
fn is_at_or_under(path: &str, ancestor: &str) -> bool {
    match path.strip_prefix(ancestor) {
        Some(rest) => ancestor.is_empty() || rest.is_empty() || rest.starts_with(['.', '[']),
        None => false,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Invalid(Vec<Problem>),
}

impl ConfigError {
    pub fn problems(&self) -> &[Problem] {
        match self {
            ConfigError::Invalid(p) => p,
            ConfigError::Read { .. } => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_under_paths() {
        assert!(is_at_or_under("spec.pools[1].name", "spec.pools[1]"));
        assert!(is_at_or_under("spec.pools[1]", "spec.pools[1]"));
        assert!(is_at_or_under("spec.pools[1]", "spec.pools"));
        assert!(is_at_or_under("spec", ""));
        assert!(!is_at_or_under("spec.pools[10]", "spec.pools[1]"));
        assert!(!is_at_or_under("spec.poolsx", "spec.pools"));
        assert!(!is_at_or_under("spec", "spec.pools"));
    }

    #[test]
    fn a_value_was_read_unless_it_or_its_surroundings_were_not() {
        let unreadable = Unreadable::new(vec!["spec.pools[1].models".into()]);
        assert!(!unreadable.was_read("spec.pools[1].models"));
        assert!(!unreadable.was_read("spec.pools[1].models[0]"));
        assert!(!unreadable.was_read("spec.pools"));
        assert!(unreadable.was_read("spec.pools[1].adapters"));
        assert!(unreadable.was_read("spec.pools[0].models"));
        assert!(unreadable.covers("spec.pools[1].models[0]"));
        assert!(!unreadable.covers("spec.pools[1]"));
    }
}
