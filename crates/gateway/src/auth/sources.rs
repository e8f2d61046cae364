//! What authentication keeps from one generation to the next, as pool
//! runtimes are kept by `generation::Runtimes`: keys files and their
//! watchers, JWKS and their refresh tasks (by file or URL), and what
//! argon2id checks found. Everything else — key tables from the config,
//! the tenants, remembered tokens — is rebuilt with each generation: it
//! costs a few allocations, and a remembered token must not outlive a
//! change of its issuer's settings.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use config::defaults::{FILE_WATCH_INTERVAL, JWKS_FETCH_TIMEOUT};

use super::api_keys::{ApiKeys, Argon2Checks, KeyFile, KeyTable};
use super::authenticator::Authenticator;
use super::jwks::{Jwks, Source};
use super::jwt::JwtVerifier;

#[derive(Default)]
pub struct Sources {
    key_files: HashMap<PathBuf, Arc<KeyFile>>,
    /// By `url:…` or `file:…`.
    jwks: HashMap<String, Arc<Jwks>>,
    argon2: Arc<Argon2Checks>,
    client: Option<reqwest::Client>,
}

impl Sources {
    /// The authenticator `spec` describes, reusing the keys files and JWKS
    /// it names again (a keys file is read again at once). A keys file or
    /// JWKS file that cannot be read now is an error, and changes nothing.
    /// Needs a Tokio runtime (watchers and fetches are tasks).
    pub fn build(&mut self, spec: &config::Spec) -> anyhow::Result<Authenticator> {
        let mut key_files = HashMap::new();
        let mut jwks_by_source = HashMap::new();
        let auth = spec.auth.as_ref();
        let api_keys = match auth.and_then(|a| a.api_keys.as_ref()) {
            None => None,
            Some(keys) => {
                let table = KeyTable::new(&keys.keys)
                    .map_err(|e| anyhow::anyhow!("spec.auth.apiKeys.keys{e}"))?;
                let file = match &keys.file {
                    None => None,
                    Some(path) => {
                        let path = PathBuf::from(path);
                        let file = match self.key_files.get(&path) {
                            Some(file) => {
                                file.reread();
                                Arc::clone(file)
                            }
                            None => KeyFile::open(&path, FILE_WATCH_INTERVAL)
                                .map_err(anyhow::Error::msg)
                                .context("spec.auth.apiKeys.file")?,
                        };
                        key_files.insert(path, Arc::clone(&file));
                        Some(file)
                    }
                };
                Some(ApiKeys::new(table, file, Arc::clone(&self.argon2)))
            }
        };
        let jwt = match auth.and_then(|a| a.jwt.as_ref()) {
            None => None,
            Some(jwt) => {
                let mut sets = Vec::with_capacity(jwt.issuers.len());
                for (i, issuer) in jwt.issuers.iter().enumerate() {
                    let interval = issuer.refresh_interval();
                    let (id, source) = match (&issuer.jwks_url, &issuer.jwks_file) {
                        (Some(url), _) => (
                            format!("url:{url}"),
                            Source::Url {
                                url: url.clone(),
                                client: self.client()?,
                            },
                        ),
                        (None, Some(path)) => {
                            (format!("file:{path}"), Source::File(PathBuf::from(path)))
                        }
                        (None, None) => anyhow::bail!("spec.auth.jwt.issuers[{i}] has no JWKS"),
                    };
                    let set = match jwks_by_source
                        .get(&id)
                        .or_else(|| self.jwks.get(&id))
                        .cloned()
                    {
                        Some(set) => {
                            set.set_interval(interval);
                            set
                        }
                        None => Jwks::start(source, interval)
                            .map_err(anyhow::Error::msg)
                            .with_context(|| format!("spec.auth.jwt.issuers[{i}].jwksFile"))?,
                    };
                    jwks_by_source.insert(id, Arc::clone(&set));
                    sets.push(set);
                }
                Some(JwtVerifier::new(jwt, sets))
            }
        };
        let authenticator = Authenticator::new(spec, api_keys, jwt);
        // Sources no longer named stop once the generations holding them
        // (and their requests) are gone.
        self.key_files = key_files;
        self.jwks = jwks_by_source;
        Ok(authenticator)
    }

    /// The HTTP client for JWKS URLs: rustls on ring, with the bundled
    /// Mozilla roots; no redirects (a JWKS URL names the document itself,
    /// and a redirect could lead to plain HTTP).
    fn client(&mut self) -> anyhow::Result<reqwest::Client> {
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(JWKS_FETCH_TIMEOUT)
            .user_agent(concat!("infergate/", env!("CARGO_PKG_VERSION")))
            .build()
            .context("cannot build the HTTP client for JWKS URLs")?;
        self.client = Some(client.clone());
        Ok(client)
    }
}
