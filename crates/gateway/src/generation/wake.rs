//! Waking a cold pool, once per cold start, retried a bounded number of
//! times: its Kubernetes workload scaled up through a [`Scaler`] (the
//! `kube` crate's), or its webhook POSTed `{"pool": NAME}`.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::future::BoxFuture;

/// How long one webhook call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The wait before the first retry; it doubles each time.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// How a pool is woken (config `coldStart.wake`).
#[derive(Debug, Clone, PartialEq)]
pub enum Wake {
    Webhook(Arc<str>),
    Workload(Workload),
}

impl Wake {
    pub fn new(spec: &config::Wake) -> Option<Self> {
        if let Some(url) = &spec.webhook {
            return Some(Wake::Webhook(Arc::from(url.as_str())));
        }
        spec.workload().map(|w| {
            Wake::Workload(Workload {
                kind: w.kind,
                name: w.name.to_owned(),
                namespace: w.namespace.map(str::to_owned),
                replicas: w.replicas,
            })
        })
    }
}

/// A Kubernetes workload to scale up to at least `replicas`.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub kind: config::WorkloadKind,
    pub name: String,
    /// `None`: the gateway's own namespace.
    pub namespace: Option<String>,
    pub replicas: u32,
}

/// What a scale-up found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaledUp {
    /// The workload asked for `from` replicas; now it asks for `to`.
    Raised { from: u32, to: u32 },
    /// It already asked for this many (another gateway replica, or an
    /// autoscaler, woke it first).
    Already(u32),
}

/// Scales a workload up through the Kubernetes API; set on the gateway by
/// whoever holds a Kubernetes client ([`crate::Gateway::set_scaler`]).
/// One attempt per call: the caller retries.
pub trait Scaler: Send + Sync + 'static {
    fn scale_up(&self, workload: Workload) -> BoxFuture<'static, Result<ScaledUp, String>>;
}

/// The gateway's scaler, shared by every pool's flow control; empty
/// without a Kubernetes client.
pub type ScalerSlot = Arc<ArcSwapOption<Box<dyn Scaler>>>;

/// Wake `pool` as `wake` says, retrying with backoff; logs the outcome.
pub async fn wake(pool: Arc<str>, wake: Wake, scaler: ScalerSlot) {
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1..=config::defaults::WAKE_ATTEMPTS {
        let tried = match &wake {
            Wake::Webhook(url) => call_webhook(&pool, url).await,
            Wake::Workload(workload) => scale_up(&pool, workload, &scaler).await,
        };
        match tried {
            Ok(()) => return,
            Err(e) => tracing::warn!(pool = %pool, error = %e, attempt, "waking the pool failed"),
        }
        if attempt < config::defaults::WAKE_ATTEMPTS {
            tokio::time::sleep(backoff).await;
            backoff *= 2;
        }
    }
    tracing::error!(pool = %pool, "could not wake the pool: requests wait for an autoscaler, or their timeout");
}

async fn call_webhook(pool: &str, url: &str) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(CALL_TIMEOUT)
        .build()
        .unwrap_or_default();
    let body = serde_json::json!({ "pool": pool });
    match client.post(url).json(&body).send().await {
        Ok(resp) if resp.status().is_success() => {
            tracing::info!(pool, url, "asked the pool's wake webhook for a replica");
            Ok(())
        }
        Ok(resp) => Err(format!("the webhook {url} answered {}", resp.status())),
        Err(e) => Err(format!("the webhook {url} failed: {e}")),
    }
}

async fn scale_up(pool: &str, workload: &Workload, scaler: &ScalerSlot) -> Result<(), String> {
    let Some(scaler) = scaler.load_full() else {
        return Err(format!(
            "no Kubernetes API to scale {:?} {} with (in a pod: its service account; elsewhere: KUBECONFIG)",
            workload.kind, workload.name
        ));
    };
    match scaler.scale_up(workload.clone()).await? {
        ScaledUp::Raised { from, to } => tracing::info!(
            pool, kind = ?workload.kind, workload = %workload.name, from, to,
            "scaled the pool's workload up"
        ),
        ScaledUp::Already(n) => tracing::info!(
            pool, kind = ?workload.kind, workload = %workload.name, replicas = n,
            "the pool's workload already asks for replicas"
        ),
    }
    Ok(())
}
