//! Waking a cold pool on Kubernetes: its workload (Deployment,
//! StatefulSet, LeaderWorkerSet) scaled up through the scale subresource.
//! The write carries the resourceVersion it read, so when several gateway
//! replicas find the pool cold at once, one raises the count and the
//! others, refused with a conflict, read again and find it raised.

use config::WorkloadKind;
use futures_util::future::BoxFuture;
use gateway::{ScaledUp, Scaler, Workload};
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};

/// Conflicts tolerated in one scale-up: each means another writer changed
/// the workload between our read and our write.
const CONFLICT_ATTEMPTS: u32 = 5;

/// Scales workloads in the cluster `client` talks to.
pub struct WorkloadScaler {
    client: kube::Client,
}

impl WorkloadScaler {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl Scaler for WorkloadScaler {
    fn scale_up(&self, workload: Workload) -> BoxFuture<'static, Result<ScaledUp, String>> {
        let namespace = workload
            .namespace
            .clone()
            .unwrap_or_else(|| self.client.default_namespace().to_owned());
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &resource(workload.kind));
        Box::pin(async move {
            scale_up(&api, &workload.name, workload.replicas)
                .await
                .map_err(|e| format!("{:?} {namespace}/{}: {e}", workload.kind, workload.name))
        })
    }
}

/// Raise `name`'s replicas to at least `want`.
async fn scale_up(api: &Api<DynamicObject>, name: &str, want: u32) -> kube::Result<ScaledUp> {
    let want = i32::try_from(want).unwrap_or(i32::MAX);
    let mut attempt = 1;
    loop {
        let mut scale: Scale = api.get_scale(name).await?;
        let asked = scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0);
        if asked >= want {
            return Ok(ScaledUp::Already(as_count(asked)));
        }
        // `metadata.resourceVersion` stays as read: the write fails with
        // 409 if anyone wrote since.
        scale.spec = Some(ScaleSpec {
            replicas: Some(want),
        });
        match api
            .replace_scale(name, &PostParams::default(), &scale)
            .await
        {
            Ok(_) => {
                return Ok(ScaledUp::Raised {
                    from: as_count(asked),
                    to: as_count(want),
                });
            }
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < CONFLICT_ATTEMPTS => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

fn as_count(n: i32) -> u32 {
    u32::try_from(n).unwrap_or(0)
}

/// The API resource of each kind of workload.
pub fn resource(kind: WorkloadKind) -> ApiResource {
    let (group, kind, plural) = match kind {
        WorkloadKind::Deployment => ("apps", "Deployment", "deployments"),
        WorkloadKind::StatefulSet => ("apps", "StatefulSet", "statefulsets"),
        WorkloadKind::LeaderWorkerSet => (
            "leaderworkerset.x-k8s.io",
            "LeaderWorkerSet",
            "leaderworkersets",
        ),
    };
    ApiResource {
        group: group.to_owned(),
        version: "v1".to_owned(),
        api_version: format!("{group}/v1"),
        kind: kind.to_owned(),
        plural: plural.to_owned(),
    }
}
