//! Noticing that a file changed, the one way for every watched file: the
//! config file, API keys files, listeners' certificates, keys and client
//! CAs.
//!
//! Kubernetes updates a mounted ConfigMap or Secret by swapping a symlink,
//! cert-manager rewrites files in place, editors write a new file and
//! rename it: every one of them changes the file's content, which is what
//! is compared (a hash of it). A modification time says less: a rewrite
//! within one clock tick keeps it, and a symlink swap leaves the file's
//! own in the past. Polling every [`FILE_WATCH_INTERVAL`] costs a read of
//! a few small files and works on every filesystem, where change
//! notifications miss symlink swaps.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use config::defaults::FILE_WATCH_INTERVAL;
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};

/// One look at a file: its bytes, or why it could not be read.
pub type Read = io::Result<Vec<u8>>;

/// What a file was the last time it was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Content(u64),
    Unreadable(io::ErrorKind),
}

impl Seen {
    fn of(read: &Read) -> Self {
        match read {
            Ok(bytes) => Self::Content(xxhash_rust::xxh3::xxh3_64(bytes)),
            Err(e) => Self::Unreadable(e.kind()),
        }
    }
}

/// A set of files looked at every interval. A change of any of them is
/// reported once, with what every one of them holds then; a file that
/// became unreadable is a change too (its reader says why, and keeps what
/// it has), and so is its coming back.
pub struct FileWatch {
    paths: Arc<[PathBuf]>,
    seen: Vec<Seen>,
    interval: Duration,
    /// Made at the first wait, on the runtime that waits.
    tick: Option<Interval>,
}

impl FileWatch {
    /// Watch `paths` from what they hold now, which is returned (in the
    /// same order): what the caller loads is exactly what later looks are
    /// compared with, so a change made meanwhile is not missed.
    pub fn start<P: Into<PathBuf>>(paths: impl IntoIterator<Item = P>) -> (Self, Vec<Read>) {
        let paths: Arc<[PathBuf]> = paths.into_iter().map(Into::into).collect();
        let read = read(&paths);
        let watch = Self {
            seen: read.iter().map(Seen::of).collect(),
            paths,
            interval: FILE_WATCH_INTERVAL,
            tick: None,
        };
        (watch, read)
    }

    /// Watch one file from what it holds now.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self::start([path]).0
    }

    /// Look every `interval` instead of every [`FILE_WATCH_INTERVAL`].
    pub fn with_interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self.tick = None;
        self
    }

    /// What every file holds, at the first look where any of them differs
    /// from the look before. Cancel-safe: a look cut short is made again
    /// at the next tick.
    pub async fn changed(&mut self) -> Vec<Read> {
        loop {
            self.tick().await;
            if let Some(read) = self.look().await {
                return read;
            }
        }
    }

    /// Call `changed` with `owner` and what the files hold at each change,
    /// from a task on the current runtime that ends once `owner` is gone.
    pub fn spawn<T: Send + Sync + 'static>(
        mut self,
        owner: &Arc<T>,
        mut changed: impl FnMut(&T, Vec<Read>) + Send + 'static,
    ) -> JoinHandle<()> {
        let owner = Arc::downgrade(owner);
        tokio::spawn(async move {
            loop {
                self.tick().await;
                if owner.strong_count() == 0 {
                    return;
                }
                let Some(read) = self.look().await else {
                    continue;
                };
                let Some(owner) = owner.upgrade() else {
                    return;
                };
                changed(&owner, read);
            }
        })
    }

    async fn tick(&mut self) {
        let interval = self.interval;
        self.tick
            .get_or_insert_with(|| {
                let first = tokio::time::Instant::now() + interval;
                let mut tick = tokio::time::interval_at(first, interval);
                tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
                tick
            })
            .tick()
            .await;
    }

    /// The files, read off the runtime's threads, when they changed.
    async fn look(&mut self) -> Option<Vec<Read>> {
        let paths = Arc::clone(&self.paths);
        // A read that could not run (the runtime is shutting down) is no
        // look at all.
        let read = tokio::task::spawn_blocking(move || read(&paths))
            .await
            .ok()?;
        let seen: Vec<Seen> = read.iter().map(Seen::of).collect();
        if seen == self.seen {
            return None;
        }
        self.seen = seen;
        Some(read)
    }
}

fn read(paths: &[PathBuf]) -> Vec<Read> {
    paths.iter().map(std::fs::read).collect()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    /// Longer than any wait for a look, in the paused clock.
    const WITHIN: Duration = Duration::from_secs(60);

    async fn next(watch: &mut FileWatch) -> Vec<Read> {
        tokio::time::timeout(WITHIN, watch.changed())
            .await
            .expect("the change is noticed")
    }

    async fn nothing_new(watch: &mut FileWatch) {
        let looked = tokio::time::timeout(WITHIN, watch.changed()).await;
        assert!(looked.is_err(), "no change: {looked:?}");
    }

    fn text(read: &Read) -> &str {
        std::str::from_utf8(read.as_ref().expect("readable")).unwrap()
    }

    /// Write `path` whole at once, as editors do: a new file renamed over
    /// the old one.
    fn replace(path: &Path, content: &str) {
        let next = path.with_extension("next");
        std::fs::write(&next, content).unwrap();
        std::fs::rename(&next, path).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_rewritten_is_a_change_and_the_same_content_again_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, "a").unwrap();
        let (mut watch, read) = FileWatch::start([&path]);
        assert_eq!(text(&read[0]), "a");

        std::fs::write(&path, "a").unwrap();
        nothing_new(&mut watch).await;
        std::fs::write(&path, "b").unwrap();
        assert_eq!(text(&next(&mut watch).await[0]), "b");
        replace(&path, "c");
        assert_eq!(text(&next(&mut watch).await[0]), "c");
        nothing_new(&mut watch).await;
    }

    /// As the kubelet updates a ConfigMap or Secret volume: each file is a
    /// symlink through `..data`, itself a symlink to a timestamped folder
    /// that a rename swaps for a new one.
    #[cfg(unix)]
    #[tokio::test(start_paused = true)]
    async fn a_file_replaced_through_a_symlink_swap_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let at = |name: &str| dir.path().join(name);
        let version = |name: &str, content: &str| {
            std::fs::create_dir(at(name)).unwrap();
            std::fs::write(at(name).join("cert.pem"), content).unwrap();
        };
        version("..v1", "one");
        std::os::unix::fs::symlink("..v1", at("..data")).unwrap();
        std::os::unix::fs::symlink("..data/cert.pem", at("cert.pem")).unwrap();
        let mut watch = FileWatch::new(at("cert.pem"));

        version("..v2", "two");
        std::os::unix::fs::symlink("..v2", at("..data_tmp")).unwrap();
        std::fs::rename(at("..data_tmp"), at("..data")).unwrap();
        std::fs::remove_dir_all(at("..v1")).unwrap();
        assert_eq!(text(&next(&mut watch).await[0]), "two");
        nothing_new(&mut watch).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_file_removed_then_restored_is_two_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.yaml");
        std::fs::write(&path, "same").unwrap();
        let mut watch = FileWatch::new(&path);

        std::fs::remove_file(&path).unwrap();
        let gone = next(&mut watch).await;
        assert_eq!(
            gone[0].as_ref().unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        // Reported once, however long it stays away.
        nothing_new(&mut watch).await;
        // Back with the content it had: a change from being gone.
        std::fs::write(&path, "same").unwrap();
        assert_eq!(text(&next(&mut watch).await[0]), "same");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_of_one_file_hands_over_all_of_them_and_ends_with_its_owner() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("cert"), dir.path().join("key"));
        std::fs::write(&cert, "c1").unwrap();
        std::fs::write(&key, "k1").unwrap();
        let (watch, _) = FileWatch::start([&cert, &key]);
        let owner = Arc::new(());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = watch.spawn(&owner, move |_: &(), read| {
            let _ = tx.send(read.iter().map(|r| text(r).to_owned()).collect::<Vec<_>>());
        });

        std::fs::write(&key, "k2").unwrap();
        let handed = tokio::time::timeout(WITHIN, rx.recv()).await.unwrap();
        assert_eq!(handed, Some(vec!["c1".to_owned(), "k2".to_owned()]));

        drop(owner);
        tokio::time::timeout(WITHIN, task)
            .await
            .expect("the task ends with its owner")
            .unwrap();
    }
}
