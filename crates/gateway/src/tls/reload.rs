//! Certificates that change under a running listener: the resolver rustls
//! asks for the certificate at every handshake, and the task that reads a
//! listener's files again every [`config::defaults::TLS_RELOAD_INTERVAL`]
//! to see whether they changed.
//!
//! Files are compared by content, not by modification time: cert-manager
//! and Kubernetes Secret volumes replace files through a symlink swap,
//! and a file rewritten in place within one clock tick keeps its time.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The certificate served now. Swapping it touches no open connection;
/// the next handshake gets the new one.
#[derive(Debug)]
pub struct Resolver(ArcSwap<CertifiedKey>);

impl Resolver {
    pub fn new(key: CertifiedKey) -> Self {
        Self(ArcSwap::from_pointee(key))
    }

    pub fn set(&self, key: CertifiedKey) {
        self.0.store(Arc::new(key));
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// One read of a set of files: each one's bytes, or why it could not be
/// read.
pub type Contents = Vec<Result<Vec<u8>, String>>;

/// Read `paths`, in order, off the runtime's threads.
pub async fn read(paths: &[String]) -> Contents {
    let owned = paths.to_vec();
    tokio::task::spawn_blocking(move || read_blocking(&owned))
        .await
        .unwrap_or_else(|e| {
            let failed = format!("reading failed: {e}");
            paths.iter().map(|_| Err(failed.clone())).collect()
        })
}

/// Read `paths`, in order, on this thread (at start, and for `check`).
pub fn read_blocking(paths: &[String]) -> Contents {
    paths
        .iter()
        .map(|path| std::fs::read(path).map_err(|e| format!("cannot read {path:?}: {e}")))
        .collect()
}

/// Read `paths` every `interval` and call `changed` with the new contents
/// whenever any file differs from the last read (`seen` is the read the
/// files were loaded from). Each content is handed over once: a file that
/// was refused is not retried, and not reported again, until it changes.
/// The task ends when `changed` returns `false` (its listener is gone).
pub fn watch(
    paths: Vec<String>,
    mut seen: Contents,
    interval: Duration,
    mut changed: impl FnMut(&Contents) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is at once; the files were just read.
        tick.tick().await;
        loop {
            tick.tick().await;
            let now = read(&paths).await;
            if now == seen {
                continue;
            }
            let keep_watching = changed(&now);
            seen = now;
            if !keep_watching {
                return;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_change_is_handed_over_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cert.pem");
        std::fs::write(&path, "one").unwrap();
        let paths = vec![path.display().to_string()];
        let seen = read(&paths).await;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = watch(paths, seen, Duration::from_secs(2), move |new| {
            tx.send(new.clone()).is_ok()
        });
        std::fs::write(&path, "two").unwrap();
        let new = rx.recv().await.unwrap();
        assert_eq!(new, vec![Ok(b"two".to_vec())]);

        std::fs::remove_file(&path).unwrap();
        let gone = rx.recv().await.unwrap();
        assert!(
            gone[0].as_ref().unwrap_err().contains("cannot read"),
            "{gone:?}"
        );

        // Unchanged files are read again and again, and handed over never.
        std::fs::write(&path, "two").unwrap();
        let back = rx.recv().await.unwrap();
        assert_eq!(back, vec![Ok(b"two".to_vec())]);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(rx.try_recv().is_err(), "nothing changed since");
        task.abort();
    }
}
