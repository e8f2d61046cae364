//! Reading a document: YAML → typed config → validated config.

use std::fmt;
use std::path::Path;

use crate::schema::InferenceGatewayConfig;

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

pub fn load_file(path: &Path) -> Result<InferenceGatewayConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    from_yaml(&text)
}

/// Parse and validate. A document that does not fit the schema stops at the
/// first structural error (nothing after it can be trusted); a document that
/// fits is checked as a whole and every problem is reported.
pub fn from_yaml(text: &str) -> Result<InferenceGatewayConfig, ConfigError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let config: InferenceGatewayConfig = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." { String::new() } else { path };
        ConfigError::Invalid(vec![Problem {
            path,
            message: without_path_prefix(&e.into_inner().to_string()).to_owned(),
        }])
    })?;
    validated(config)
}

/// Check a config built or changed in code.
pub fn validated(config: InferenceGatewayConfig) -> Result<InferenceGatewayConfig, ConfigError> {
    let problems = crate::validate::validate(&config);
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// The YAML library puts its own (shorter) path in front of its messages;
/// we report the full path separately.
fn without_path_prefix(message: &str) -> &str {
    match message.split_once(": ") {
        Some((head, rest)) if !head.contains(char::is_whitespace) => rest,
        _ => message,
    }
}
