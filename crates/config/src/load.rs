//! Reading a document: YAML → typed config → validated config, with every
//! problem of every step reported at once.

use std::path::Path;

use crate::problem::{ConfigError, Problem, Unreadable};
use crate::schema::InferenceGatewayConfig;
use crate::security::ApiKey;

pub fn load_file(path: &Path) -> Result<InferenceGatewayConfig, ConfigError> {
    load_file_with(path, |_, _| Vec::new())
}

/// [`load_file`], with checks the config crate cannot make itself (for
/// example whether the simulator can start a pool's replicas) run on the
/// document as well.
pub fn load_file_with(
    path: &Path,
    more: impl FnOnce(&InferenceGatewayConfig, &Unreadable) -> Vec<Problem>,
) -> Result<InferenceGatewayConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    from_yaml_with(&text, more)
}

/// Parse and validate. Every problem is reported: every unknown field,
/// every value of the wrong type and every missing field, then the checks
/// of the document as a whole on everything that could be read.
pub fn from_yaml(text: &str) -> Result<InferenceGatewayConfig, ConfigError> {
    from_yaml_with(text, |_, _| Vec::new())
}

/// [`from_yaml`], with the checks of `more` too. A value that could not be
/// read is reported once: no check reports what is at or under its path,
/// and `more` is told which values those are, to leave alone what depends
/// on them.
pub fn from_yaml_with(
    text: &str,
    more: impl FnOnce(&InferenceGatewayConfig, &Unreadable) -> Vec<Problem>,
) -> Result<InferenceGatewayConfig, ConfigError> {
    let read = crate::read::read::<InferenceGatewayConfig>(text);
    let mut problems = read.problems;
    let Some(config) = read.value else {
        return Err(ConfigError::Invalid(problems));
    };
    let mut checked = crate::validate::validate(&config, &read.unreadable);
    checked.extend(more(&config, &read.unreadable));
    problems.extend(
        checked
            .into_iter()
            .filter(|p| !read.unreadable.covers(&p.path)),
    );
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// Check a config built or changed in code.
pub fn validated(config: InferenceGatewayConfig) -> Result<InferenceGatewayConfig, ConfigError> {
    let problems = crate::validate::validate(&config, &Unreadable::default());
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}

/// Read an `auth.apiKeys.file`: a YAML list of keys, each checked as the
/// config's own are. An empty file holds no keys.
pub fn api_keys_from_yaml(text: &str) -> Result<Vec<ApiKey>, ConfigError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let read = crate::read::read::<Vec<ApiKey>>(text);
    let mut problems = read.problems;
    let Some(keys) = read.value else {
        return Err(ConfigError::Invalid(problems));
    };
    problems.extend(
        crate::validate::check_api_keys(&keys)
            .into_iter()
            .map(|(path, message)| Problem { path, message })
            .filter(|p| !read.unreadable.covers(&p.path)),
    );
    if problems.is_empty() {
        Ok(keys)
    } else {
        Err(ConfigError::Invalid(problems))
    }
}
