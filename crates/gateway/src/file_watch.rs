//! Noticing that a file changed: the config file, API keys, certificates.
//! Kubernetes updates a mounted ConfigMap or Secret by swapping a symlink,
//! cert-manager rewrites files in place, editors write a new file and
//! rename it: every one of them changes the file's content, which is what
//! is compared. Polling every few seconds costs a read of a small file and
//! works on every filesystem, where change notifications miss symlink
//! swaps.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// What a file was the last time it was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Content(u64),
    Unreadable,
}

pub struct FileWatch {
    path: PathBuf,
    interval: Duration,
    seen: Seen,
}

impl FileWatch {
    /// Watch `path` from its current content on.
    pub fn new(path: impl Into<PathBuf>, interval: Duration) -> Self {
        let path = path.into();
        let seen = look(&path);
        Self {
            path,
            interval,
            seen,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Resolves when the file's content differs from the last look (a file
    /// that became unreadable counts once; the reader says why).
    pub async fn changed(&mut self) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = look(&self.path);
            if now != self.seen {
                self.seen = now;
                return;
            }
        }
    }
}

fn look(path: &Path) -> Seen {
    match std::fs::read(path) {
        Ok(bytes) => Seen::Content(xxhash_rust::xxh3::xxh3_64(&bytes)),
        Err(_) => Seen::Unreadable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_change_of_content_is_noticed_and_a_rewrite_of_the_same_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "a").unwrap();
        let mut watch = FileWatch::new(&path, Duration::from_secs(2));
        // The same content written again is no change.
        std::fs::write(&path, "a").unwrap();
        let same = tokio::time::timeout(Duration::from_secs(10), watch.changed()).await;
        assert!(same.is_err());
        // New content through a rename, as Kubernetes and editors do it.
        let next = dir.path().join("f.new");
        std::fs::write(&next, "b").unwrap();
        std::fs::rename(&next, &path).unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch.changed())
            .await
            .expect("the new content is noticed");
        std::fs::remove_file(&path).unwrap();
        tokio::time::timeout(Duration::from_secs(10), watch.changed())
            .await
            .expect("a file that went away is a change");
    }
}
