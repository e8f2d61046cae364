//! API keys, stored as hashes: in the config (`auth.apiKeys.keys`) and in a
//! keys file (`auth.apiKeys.file`, a mounted Kubernetes Secret) read again
//! whenever it changes.
//!
//! A SHA-256 key is found by the SHA-256 of the presented key: a table
//! lookup by its first bytes, then a constant-time comparison of the whole
//! digest. An argon2id key cannot be looked up (each hash has its own
//! salt): the presented key is checked against every argon2id entry, on a
//! blocking thread, a few at a time, and a success is remembered by the
//! presented key's SHA-256 so the next request costs a lookup. Keys made
//! by `infergate keys new` carry 256 random bits, for which SHA-256 is as
//! strong as any password hash; argon2id is for keys people chose.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use argon2::{Argon2, PasswordHash, PasswordVerifier};
use base64::Engine as _;
use parking_lot::Mutex;
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

use super::cache::{Bounded, Digest};
use super::refusal::AUTH_TARGET;
use crate::file_watch::FileWatch;

/// Prefix of generated keys: tells a leaked key for what it is (secret
/// scanners match on such prefixes) and never occurs in a JWT.
pub const KEY_PREFIX: &str = "ig-";
/// Presented keys remembered after an argon2id check, either way.
const ARGON2_REMEMBERED: usize = 10_000;
/// Longest wait for a turn at argon2id checking before the request is
/// answered 503: a flood of made-up keys must not queue without end.
const ARGON2_WAIT: Duration = Duration::from_secs(2);

/// A new key: `ig-` and 32 bytes from the OS's random source, base64url.
/// Returns the key and the lowercase hex SHA-256 to configure.
pub fn generate() -> (String, String) {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let key = format!(
        "{KEY_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let hex = sha256_hex(&key);
    (key, hex)
}

/// Lowercase hex SHA-256 of `key`, as `apiKeys.keys[].sha256` holds it.
pub fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Whose a key is.
#[derive(Debug, Clone)]
pub struct Owner {
    pub tenant: Arc<str>,
    /// The key's `name`, for logs.
    pub name: Option<Arc<str>>,
}

/// Keys from one source: the config's list, or one reading of the file.
pub struct KeyTable {
    /// SHA-256 keys by their digest's first 8 bytes.
    sha256: HashMap<[u8; 8], Vec<(Digest, Owner)>>,
    argon2: Arc<[Argon2Key]>,
    /// Changes whenever a table is built, so remembered refusals are
    /// forgotten when keys may have been added.
    epoch: u64,
    len: usize,
}

struct Argon2Key {
    /// The PHC string, by which a remembered success finds its key.
    phc: Arc<str>,
    hash: PasswordHash,
    owner: Owner,
}

static EPOCH: AtomicU64 = AtomicU64::new(0);

impl KeyTable {
    /// The keys must have been validated (`config` checks them).
    pub fn new(keys: &[config::ApiKey]) -> Result<Self, String> {
        let mut sha256: HashMap<[u8; 8], Vec<(Digest, Owner)>> = HashMap::new();
        let mut argon2 = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let owner = Owner {
                tenant: Arc::from(key.tenant.as_str()),
                name: key.name.as_deref().map(Arc::from),
            };
            match (&key.sha256, &key.argon2id) {
                (Some(hex), _) => {
                    let digest =
                        parse_hex(hex).ok_or_else(|| format!("[{i}].sha256 is not hex"))?;
                    sha256
                        .entry(prefix(&digest))
                        .or_default()
                        .push((digest, owner));
                }
                (None, Some(phc)) => {
                    let hash = PasswordHash::new(phc)
                        .map_err(|e| format!("[{i}].argon2id cannot be read: {e}"))?;
                    argon2::Params::try_from(&hash)
                        .map_err(|e| format!("[{i}].argon2id has unusable parameters: {e}"))?;
                    argon2.push(Argon2Key {
                        phc: Arc::from(phc.as_str()),
                        hash,
                        owner,
                    });
                }
                (None, None) => return Err(format!("[{i}] has neither sha256 nor argon2id")),
            }
        }
        Ok(Self {
            sha256,
            argon2: argon2.into(),
            epoch: EPOCH.fetch_add(1, Ordering::Relaxed),
            len: keys.len(),
        })
    }

    pub fn count(&self) -> usize {
        self.len
    }

    fn find_sha256(&self, digest: &Digest) -> Option<&Owner> {
        self.sha256
            .get(&prefix(digest))?
            .iter()
            .find(|(d, _)| bool::from(d.ct_eq(digest)))
            .map(|(_, owner)| owner)
    }

    fn find_argon2(&self, phc: &str) -> Option<&Owner> {
        self.argon2
            .iter()
            .find(|k| &*k.phc == phc)
            .map(|k| &k.owner)
    }
}

fn prefix(digest: &Digest) -> [u8; 8] {
    let mut p = [0; 8];
    p.copy_from_slice(&digest[..8]);
    p
}

fn parse_hex(hex: &str) -> Option<Digest> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// What outlives generations for argon2id keys: what checks found, and
/// the turns at checking.
pub struct Argon2Checks {
    /// Presented key's SHA-256 → the PHC string it matched. Valid only
    /// while a key with that PHC string is configured: a revoked key finds
    /// nothing and is checked (and refused) again.
    matched: Bounded<Arc<str>>,
    /// Presented key's SHA-256 → the epochs of the tables it matched none
    /// of. Valid only while those tables are in force.
    refused: Bounded<(u64, Option<u64>)>,
    turns: Semaphore,
}

impl Default for Argon2Checks {
    fn default() -> Self {
        // Half the cores: a flood of made-up keys leaves the rest to the
        // requests that carry good ones.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self {
            matched: Bounded::new(ARGON2_REMEMBERED),
            refused: Bounded::new(ARGON2_REMEMBERED),
            turns: Semaphore::new((cores / 2).max(1)),
        }
    }
}

/// The keys of one generation: the config's, and the keys file's as it is
/// now.
pub struct ApiKeys {
    config: KeyTable,
    file: Option<Arc<KeyFile>>,
    argon2: Arc<Argon2Checks>,
}

impl ApiKeys {
    pub fn new(config: KeyTable, file: Option<Arc<KeyFile>>, argon2: Arc<Argon2Checks>) -> Self {
        Self {
            config,
            file,
            argon2,
        }
    }

    /// Whose `presented` is.
    pub async fn check(&self, presented: &str) -> Result<Owner, KeyRefused> {
        let digest: Digest = Sha256::digest(presented.as_bytes()).into();
        let file = self.file.as_ref().map(|f| f.table.load_full());
        let tables = || std::iter::once(&self.config).chain(file.as_deref());
        if let Some(owner) = tables().find_map(|t| t.find_sha256(&digest)) {
            return Ok(owner.clone());
        }
        if tables().all(|t| t.argon2.is_empty()) {
            return Err(KeyRefused::Unknown);
        }
        if let Some(phc) = self.argon2.matched.get(&digest) {
            match tables().find_map(|t| t.find_argon2(&phc)) {
                Some(owner) => return Ok(owner.clone()),
                None => self.argon2.matched.remove(&digest),
            }
        }
        let epochs = (self.config.epoch, file.as_ref().map(|t| t.epoch));
        if self.argon2.refused.get(&digest) == Some(epochs) {
            return Err(KeyRefused::Unknown);
        }
        let turn = tokio::time::timeout(ARGON2_WAIT, self.argon2.turns.acquire())
            .await
            .map_err(|_| KeyRefused::Busy)?
            .map_err(|_| KeyRefused::Busy)?;
        let candidates: Vec<Arc<[Argon2Key]>> = tables().map(|t| Arc::clone(&t.argon2)).collect();
        let key = presented.as_bytes().to_vec();
        let found = tokio::task::spawn_blocking(move || {
            let argon2 = Argon2::default();
            candidates
                .iter()
                .flat_map(|keys| keys.iter())
                .find(|k| argon2.verify_password(&key, &k.hash).is_ok())
                .map(|k| Arc::clone(&k.phc))
        })
        .await
        .map_err(|_| KeyRefused::Busy)?;
        drop(turn);
        match found.and_then(|phc| Some((tables().find_map(|t| t.find_argon2(&phc))?, phc))) {
            Some((owner, phc)) => {
                self.argon2.matched.insert(digest, phc);
                Ok(owner.clone())
            }
            None => {
                self.argon2.refused.insert(digest, epochs);
                Err(KeyRefused::Unknown)
            }
        }
    }
}

/// Why a presented key was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyRefused {
    /// No configured key is this one.
    Unknown,
    /// It could not be checked in time (argon2id checks are all busy).
    Busy,
}

/// An `apiKeys.file`, read at start and watched for changes. Outlives
/// generations: a reload that names the same file keeps it (and reads it
/// again at once).
pub struct KeyFile {
    path: PathBuf,
    table: ArcSwap<KeyTable>,
    /// The bytes the table was read from: the watch and a reload's reread
    /// may both hand over the same bytes, and only what changed is parsed.
    read: Mutex<Vec<u8>>,
}

impl KeyFile {
    /// Read `path` (it must be readable and valid now) and watch it every
    /// `poll` from a task on the current runtime, until dropped.
    pub fn open(path: &Path, poll: Duration) -> Result<Arc<Self>, String> {
        let (watch, read) = FileWatch::start([path]);
        let bytes = read
            .into_iter()
            .next()
            .expect("one look per file")
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let table = parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        let file = Arc::new(Self {
            path: path.to_owned(),
            table: ArcSwap::from_pointee(table),
            read: Mutex::new(bytes),
        });
        watch.with_interval(poll).spawn(&file, |file, read| {
            match read.into_iter().next().expect("one look per file") {
                Ok(bytes) => file.take(bytes),
                // A Secret's files are swapped through a symlink; a read
                // that falls between sees the file again at a later look.
                Err(e) => {
                    tracing::debug!(target: AUTH_TARGET, path = %file.path.display(), error = %e,
                    "cannot read the API keys file; keeping its keys")
                }
            }
        });
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keys in force from this file.
    pub fn count(&self) -> usize {
        self.table.load().count()
    }

    /// Read the file again now; a file that cannot be read or is invalid
    /// is logged and the keys in force stay.
    pub fn reread(&self) {
        match std::fs::read(&self.path) {
            Ok(bytes) => self.take(bytes),
            Err(e) => tracing::warn!(target: AUTH_TARGET, path = %self.path.display(), error = %e,
                "cannot read the API keys file; the keys read before stay in force"),
        }
    }

    fn take(&self, bytes: Vec<u8>) {
        let mut read = self.read.lock();
        if *read == bytes {
            return;
        }
        match parse(&bytes) {
            Ok(table) => {
                tracing::info!(target: AUTH_TARGET, path = %self.path.display(), keys = table.count(),
                    "API keys file reloaded");
                self.table.store(Arc::new(table));
            }
            Err(e) => tracing::warn!(target: AUTH_TARGET, path = %self.path.display(), error = %e,
                "the API keys file is invalid; the keys read before stay in force"),
        }
        // Not read again until it changes once more: one warning per change.
        *read = bytes;
    }
}

fn parse(bytes: &[u8]) -> Result<KeyTable, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    let keys = config::api_keys_from_yaml(text).map_err(|e| e.to_string().replace('\n', "; "))?;
    KeyTable::new(&keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tenant: &str, sha256: Option<String>, argon2id: Option<String>) -> config::ApiKey {
        config::ApiKey {
            tenant: tenant.to_owned(),
            sha256,
            argon2id,
            name: None,
        }
    }

    fn argon2id(key: &str) -> String {
        use argon2::PasswordHasher as _;
        // Small parameters: the tests check the path, not the cost.
        let params = argon2::Params::new(1024, 1, 1, None).unwrap();
        Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
            .hash_password(key.as_bytes())
            .unwrap()
            .to_string()
    }

    fn keys(table: KeyTable, argon2: &Arc<Argon2Checks>) -> ApiKeys {
        ApiKeys::new(table, None, Arc::clone(argon2))
    }

    #[test]
    fn generated_keys_are_random_and_hash_as_configured() {
        let (k1, h1) = generate();
        let (k2, _) = generate();
        assert_ne!(k1, k2);
        assert!(k1.starts_with("ig-") && k1.len() == 3 + 43, "{k1}");
        assert!(!k1.contains('.'));
        assert_eq!(h1, sha256_hex(&k1));
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[tokio::test]
    async fn sha256_keys_by_lookup() {
        let checks = Arc::new(Argon2Checks::default());
        let table = KeyTable::new(&[
            key("a", Some(sha256_hex("key-a")), None),
            key("b", Some(sha256_hex("key-b").to_uppercase()), None),
        ])
        .unwrap();
        let keys = keys(table, &checks);
        assert_eq!(&*keys.check("key-a").await.unwrap().tenant, "a");
        assert_eq!(&*keys.check("key-b").await.unwrap().tenant, "b");
        assert_eq!(keys.check("key-c").await.unwrap_err(), KeyRefused::Unknown);
        assert_eq!(keys.check("").await.unwrap_err(), KeyRefused::Unknown);
    }

    #[tokio::test]
    async fn argon2id_keys_are_checked_once_then_remembered_until_revoked() {
        let checks = Arc::new(Argon2Checks::default());
        let phc = argon2id("chosen by a person");
        let table = KeyTable::new(&[key("a", None, Some(phc.clone()))]).unwrap();
        let first = keys(table, &checks);
        assert_eq!(
            &*first.check("chosen by a person").await.unwrap().tenant,
            "a"
        );
        let digest: Digest = Sha256::digest(b"chosen by a person").into();
        assert_eq!(checks.matched.get(&digest).as_deref(), Some(phc.as_str()));
        assert_eq!(first.check("guess").await.unwrap_err(), KeyRefused::Unknown);
        let guess: Digest = Sha256::digest(b"guess").into();
        assert!(checks.refused.get(&guess).is_some());

        // The next generation has the same key under another tenant: the
        // remembered match finds it there.
        let moved = KeyTable::new(&[key("b", None, Some(phc))]).unwrap();
        assert_eq!(
            &*keys(moved, &checks)
                .check("chosen by a person")
                .await
                .unwrap()
                .tenant,
            "b"
        );
        // Revoked: the remembered match finds nothing and is forgotten.
        let other = KeyTable::new(&[key("c", None, Some(argon2id("other")))]).unwrap();
        let revoked = keys(other, &checks);
        assert_eq!(
            revoked.check("chosen by a person").await.unwrap_err(),
            KeyRefused::Unknown
        );
        assert!(checks.matched.get(&digest).is_none());
    }

    #[test]
    fn bad_hashes_are_refused_when_read() {
        assert!(KeyTable::new(&[key("a", Some("zz".repeat(32)), None)]).is_err());
        assert!(KeyTable::new(&[key("a", None, Some("$argon2id$nonsense".into()))]).is_err());
    }

    #[tokio::test]
    async fn the_file_is_read_again_when_it_changes_and_a_bad_one_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        let line = |tenant: &str, key: &str| {
            format!("- {{tenant: {tenant}, sha256: {}}}\n", sha256_hex(key))
        };
        std::fs::write(&path, line("a", "k1")).unwrap();
        let file = KeyFile::open(&path, Duration::from_secs(3600)).unwrap();
        let keys = ApiKeys::new(
            KeyTable::new(&[]).unwrap(),
            Some(Arc::clone(&file)),
            Arc::new(Argon2Checks::default()),
        );
        assert_eq!(&*keys.check("k1").await.unwrap().tenant, "a");

        std::fs::write(&path, line("b", "k2")).unwrap();
        file.reread();
        assert_eq!(keys.check("k1").await.unwrap_err(), KeyRefused::Unknown);
        assert_eq!(&*keys.check("k2").await.unwrap().tenant, "b");

        std::fs::write(&path, "- {tenant: b, sha256: nothex}\n").unwrap();
        file.reread();
        assert_eq!(&*keys.check("k2").await.unwrap().tenant, "b", "kept");
        std::fs::remove_file(&path).unwrap();
        file.reread();
        assert_eq!(&*keys.check("k2").await.unwrap().tenant, "b", "kept");
        std::fs::write(&path, "").unwrap();
        file.reread();
        assert_eq!(file.count(), 0, "an empty file revokes every key");

        assert!(KeyFile::open(&dir.path().join("missing"), Duration::from_secs(1)).is_err());
    }
}
