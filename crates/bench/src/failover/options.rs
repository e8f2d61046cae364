//! How a global-failover run is set up: its size, its traffic and the
//! router's failover settings.

use std::time::Duration;

use serde::{Serialize, Serializer};

use crate::scenario::Size;

/// How a run is set up.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverOptions {
    pub members: usize,
    /// Requests per second through the router.
    pub rate: f64,
    /// Length of the traffic; the kill comes at a third, the restart at
    /// two thirds.
    #[serde(serialize_with = "seconds")]
    pub length: Duration,
    #[serde(serialize_with = "seconds")]
    pub unhealthy_after: Duration,
    #[serde(serialize_with = "seconds")]
    pub ramp_up: Duration,
    pub seed: u64,
    /// How long a client waits for a whole answer.
    #[serde(serialize_with = "seconds")]
    pub client_timeout: Duration,
}

impl FailoverOptions {
    /// The default run: 30 s (12 s with `--quick`), the router's default
    /// `unhealthyAfter`, a ramp short enough to end well before the run.
    pub fn new(size: Size, seed: u64) -> Self {
        let (length, ramp_up) = match size {
            Size::Full => (Duration::from_secs(30), Duration::from_secs(5)),
            Size::Quick => (Duration::from_secs(12), Duration::from_secs(2)),
        };
        FailoverOptions {
            members: 3,
            rate: 40.0,
            length,
            unhealthy_after: config::defaults::GLOBAL_UNHEALTHY_AFTER,
            ramp_up,
            seed,
            client_timeout: Duration::from_secs(30),
        }
    }
}

/// A duration as seconds in JSON.
pub fn seconds<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}
