//! One holder at a time, through a `coordination.k8s.io/v1` Lease: the
//! gateway replica that holds it writes the config object's status, the
//! others wait and take over when it is released or expires.
//!
//! kube-rs has no leader election, so this is the usual protocol by hand
//! (as client-go's `leaderelection` does it): the holder renews
//! `renewTime` every `renew_every`; a candidate takes the Lease when it has
//! no holder, or when its record has not changed for `duration` as timed
//! on the candidate's own clock (so clocks need not agree); every write is
//! an update on the read `resourceVersion`, so of two candidates racing,
//! the API server lets one win and refuses the other with 409.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

/// Who competes for which Lease, and how fast.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This candidate's name in `holderIdentity` (the pod's name).
    pub identity: String,
    /// How long a record may stay unrenewed before others take over.
    pub duration: Duration,
    /// How often the holder renews, and candidates look.
    pub renew_every: Duration,
}

/// A running candidate. [`Candidate::release`] gives the Lease up at once
/// (on shutdown); dropping it stops competing without releasing, and the
/// Lease expires after its duration.
pub struct Candidate {
    holding: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    /// `None` once [`Candidate::release`] took it to wait for it.
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Candidate {
    /// Start competing for the Lease.
    pub fn start(client: kube::Client, settings: LeaseSettings) -> Candidate {
        let (holding_tx, holding) = watch::channel(false);
        let (stop, stop_rx) = watch::channel(false);
        let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
        let task = tokio::spawn(compete(api, settings, holding_tx, stop_rx));
        Candidate {
            holding,
            stop,
            task: Some(task),
        }
    }

    /// Whether this candidate holds the Lease now, and changes to it.
    pub fn holding(&self) -> watch::Receiver<bool> {
        self.holding.clone()
    }

    /// Stop competing, and release the Lease if held so that another
    /// candidate takes it without waiting for it to expire.
    pub async fn release(mut self) {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// The holder and renew time last read, and when (on our clock) that
/// record was first seen: a record that does not change for the Lease's
/// duration has expired.
struct Seen {
    record: (Option<String>, Option<MicroTime>),
    since: Instant,
}

async fn compete(
    api: Api<Lease>,
    settings: LeaseSettings,
    holding: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut seen: Option<Seen> = None;
    loop {
        let held = match round(&api, &settings, &mut seen).await {
            Ok(held) => held,
            Err(e) => {
                // Unsure whether we still hold it: act as if not, so two
                // replicas never both write.
                tracing::warn!(lease = %settings.name, error = %e, "cannot read or renew the status lease");
                false
            }
        };
        if *holding.borrow() != held {
            tracing::info!(lease = %settings.name, identity = %settings.identity, held, "status lease");
            holding.send_replace(held);
        }
        tokio::select! {
            () = tokio::time::sleep(settings.renew_every) => {}
            _ = stop.changed() => break,
        }
    }
    if *holding.borrow() {
        holding.send_replace(false);
        if let Err(e) = release(&api, &settings).await {
            tracing::warn!(lease = %settings.name, error = %e, "cannot release the status lease; it expires on its own");
        }
    }
}

/// One look at the Lease: create, renew or take it when we may. Returns
/// whether we hold it afterwards.
async fn round(
    api: &Api<Lease>,
    settings: &LeaseSettings,
    seen: &mut Option<Seen>,
) -> kube::Result<bool> {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let Some(lease) = api.get_opt(&settings.name).await? else {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(settings.name.clone()),
                namespace: Some(settings.namespace.clone()),
                ..Default::default()
            },
            spec: Some(held_by(settings, now.clone(), now, 0)),
        };
        return won(api.create(&PostParams::default(), &lease).await);
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
    let record = (holder.clone(), spec.renew_time.clone());
    let since = match seen.take() {
        Some(s) if s.record == record => s.since,
        _ => Instant::now(),
    };
    *seen = Some(Seen { record, since });
    let mine = holder.as_deref() == Some(&*settings.identity);
    let duration = spec
        .lease_duration_seconds
        .map_or(settings.duration, |s| Duration::from_secs(s.max(0) as u64));
    let expired = holder.is_none() || since.elapsed() >= duration;
    if !mine && !expired {
        return Ok(false);
    }
    let (acquired, transitions) = if mine {
        (
            spec.acquire_time.clone().unwrap_or(now.clone()),
            spec.lease_transitions.unwrap_or(0),
        )
    } else {
        (now.clone(), spec.lease_transitions.unwrap_or(0) + 1)
    };
    let mut update = lease;
    update.spec = Some(held_by(settings, acquired, now, transitions));
    // `update` carries the resourceVersion read: a write in between makes
    // this one fail with 409 instead of overwriting it.
    won(api
        .replace(&settings.name, &PostParams::default(), &update)
        .await)
}

fn held_by(
    settings: &LeaseSettings,
    acquired: MicroTime,
    renewed: MicroTime,
    transitions: i32,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(settings.identity.clone()),
        lease_duration_seconds: Some(settings.duration.as_secs().max(1) as i32),
        acquire_time: Some(acquired),
        renew_time: Some(renewed),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

/// A create or update that 409s lost a race: not an error, just not ours.
fn won(result: kube::Result<Lease>) -> kube::Result<bool> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Clear the holder so that another candidate takes the Lease on its next
/// look, if we still hold it.
async fn release(api: &Api<Lease>, settings: &LeaseSettings) -> kube::Result<()> {
    let Some(mut lease) = api.get_opt(&settings.name).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(&*settings.identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    spec.renew_time = Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    won(api
        .replace(&settings.name, &PostParams::default(), &lease)
        .await)
    .map(|_| ())
}
