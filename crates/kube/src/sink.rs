//! Where discovered replicas are reported, and the tasks that report them.

use crate::replicas::Replica;

/// Where a pool's discovered replicas go.
pub trait Sink: Send + Sync + 'static {
    /// The pool's replicas now, sorted; called after the first full list
    /// and on every change.
    fn replicas(&self, pool: &str, replicas: Vec<Replica>);
    /// Whether the pool's watches reach the API server (on change).
    fn reachable(&self, pool: &str, up: bool);
    /// A watch or list failed (it is retried with backoff).
    fn error(&self, pool: &str);
}

/// A background task, stopped when dropped.
pub struct Task(tokio::task::JoinHandle<()>);

impl Task {
    pub(crate) fn spawn(future: impl Future<Output = ()> + Send + 'static) -> Self {
        Task(tokio::spawn(future))
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}
