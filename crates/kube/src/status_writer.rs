//! Writing the config object's status: while this replica holds the
//! status Lease ([`crate::lease`]), whenever what it would say changes
//! (a new verdict on the spec, readiness, a pool's ready replicas), and
//! never otherwise: replicas that do not hold the Lease never write, so
//! they do not fight over it.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use tokio::sync::watch;

use crate::crd::GatewayConfigObject;
use crate::status::{ConfigStatus, Observed, PoolStatus};

/// The verdict on one version of the spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The object's `metadata.generation`.
    pub generation: Option<i64>,
    /// `Ok` when in force; every problem otherwise.
    pub accepted: Result<(), String>,
}

/// What the gateway says about itself now: `/readyz`'s answer and each
/// pool's ready replicas.
#[derive(Debug, Clone, PartialEq)]
pub struct View {
    pub ready: Result<(), String>,
    pub pools: Vec<PoolStatus>,
}

/// A running status writer; dropping it stops it.
pub struct StatusWriter {
    verdicts: watch::Sender<Option<Verdict>>,
    views: watch::Sender<Option<View>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusWriter {
    /// Write the status of `namespace/name` while `holding` says so.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        name: &str,
        holding: watch::Receiver<bool>,
    ) -> StatusWriter {
        let resource = ApiResource::erase::<GatewayConfigObject>(&());
        let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &resource);
        let (verdicts, verdicts_rx) = watch::channel(None);
        let (views, views_rx) = watch::channel(None);
        let task = tokio::spawn(write(api, name.to_owned(), holding, verdicts_rx, views_rx));
        StatusWriter {
            verdicts,
            views,
            task,
        }
    }

    /// Report the verdict on the latest spec.
    pub fn report(&self, verdict: Verdict) {
        self.verdicts.send_replace(Some(verdict));
    }

    /// Report how the gateway is now; written only if it changed.
    pub fn observe(&self, view: View) {
        self.views.send_if_modified(|v| {
            let changed = v.as_ref() != Some(&view);
            *v = Some(view);
            changed
        });
    }
}

async fn write(
    api: Api<DynamicObject>,
    name: String,
    mut holding: watch::Receiver<bool>,
    mut verdicts: watch::Receiver<Option<Verdict>>,
    mut views: watch::Receiver<Option<View>>,
) {
    // What this replica last wrote while holding the Lease; forgotten when
    // it loses it, so a holder writes its own view once on taking over.
    let mut written: Option<Observed> = None;
    // After a failed write, try again this much later.
    let mut retry: Option<Duration> = None;
    loop {
        if *holding.borrow_and_update() {
            let verdict = verdicts.borrow_and_update().clone();
            let view = views.borrow_and_update().clone();
            if let (Some(verdict), Some(view)) = (verdict, view) {
                let observed = Observed {
                    generation: verdict.generation,
                    accepted: verdict.accepted,
                    ready: view.ready,
                    pools: view.pools,
                };
                if written.as_ref() != Some(&observed) {
                    match patch(&api, &name, &observed).await {
                        Ok(()) => {
                            written = Some(observed);
                            retry = None;
                        }
                        Err(e) => {
                            tracing::warn!(object = %name, error = %e, "cannot write the config's status");
                            retry = Some(RETRY);
                        }
                    }
                }
            }
        } else {
            written = None;
            retry = None;
        }
        let wait = async {
            match retry {
                Some(after) => tokio::time::sleep(after).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = wait => {}
            changed = holding.changed() => if changed.is_err() { return },
            changed = verdicts.changed() => if changed.is_err() { return },
            changed = views.changed() => if changed.is_err() { return },
        }
    }
}

/// How long after a failed status write the next try comes.
const RETRY: Duration = Duration::from_secs(1);

/// Read the status (for its conditions' transition times) and write the
/// next one.
async fn patch(api: &Api<DynamicObject>, name: &str, observed: &Observed) -> anyhow::Result<()> {
    let object = api.get_status(name).await?;
    let current: ConfigStatus = object
        .data
        .get("status")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .unwrap_or_default()
        .unwrap_or_default();
    let next = current.next(observed, Time(k8s_openapi::jiff::Timestamp::now()));
    if next == current {
        return Ok(());
    }
    // A merge patch replaces each list whole: the conditions and pools
    // are exactly this replica's.
    let body = serde_json::json!({ "status": next });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    tracing::info!(object = %name, generation = ?observed.generation, accepted = observed.accepted.is_ok(), "config status written");
    Ok(())
}
