//! Every Kubernetes API call the gateway makes, by resource and verb: the
//! one list the RBAC rules of `deploy/kubernetes/rbac.yaml` must grant,
//! no more and no less (a test compares them). A new call adds its line
//! here, and the manifest follows.

/// Calls on one resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// The API group (`""` for the core group).
    pub group: &'static str,
    /// The resource's plural name, `/status` for its status subresource.
    pub resource: &'static str,
    pub verbs: &'static [&'static str],
}

pub const API_ACCESS: &[Access] = &[
    // Discovery: the pods an `endpointSelector` or an InferencePool
    // selects, listed and watched.
    Access {
        group: "",
        resource: "pods",
        verbs: &["get", "list", "watch"],
    },
    Access {
        group: "inference.networking.k8s.io",
        resource: "inferencepools",
        verbs: &["get", "list", "watch"],
    },
    // `serve --kubernetes`: the config object, read and watched
    // (config_source.rs), and its status written (status_writer.rs).
    Access {
        group: crate::crd::GROUP,
        resource: crate::crd::PLURAL,
        verbs: &["get", "list", "watch"],
    },
    Access {
        group: crate::crd::GROUP,
        resource: "inferencegatewayconfigs/status",
        verbs: &["update", "patch"],
    },
    // One replica at a time writes status: the Lease (lease.rs).
    Access {
        group: "coordination.k8s.io",
        resource: "leases",
        verbs: &["get", "create", "update"],
    },
];

/// The calls that wake a cold pool whose `coldStart.wake` names a
/// workload (scale.rs): its scale subresource read and written. Granted
/// per workload, by name, in the workload's namespace
/// (deploy/kubernetes/autoscaling/wake-rbac.yaml shows how), so these are
/// not in [`API_ACCESS`].
pub const WAKE_ACCESS: &[Access] = &[
    Access {
        group: "apps",
        resource: "deployments/scale",
        verbs: &["get", "update"],
    },
    Access {
        group: "apps",
        resource: "statefulsets/scale",
        verbs: &["get", "update"],
    },
    Access {
        group: "leaderworkerset.x-k8s.io",
        resource: "leaderworkersets/scale",
        verbs: &["get", "update"],
    },
];
