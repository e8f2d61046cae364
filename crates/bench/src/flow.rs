//! The gateway's admission queue as a run sets it up: on or off, and the
//! bounds virtual mode keeps. A leaf: the policies, the virtual fleet and
//! the statistics all name these, and none of them names the others for it.

use serde::Serialize;

/// The gateway's admission queue during a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowMode {
    /// The gateway's defaults: a saturated pool holds requests for up to
    /// their band's `maxWait`.
    #[default]
    On,
    /// The defaults, except that every band fills a replica's queue to
    /// the same bound (`queueShare: 1`): no places left for critical.
    Flat,
    /// Every band `maxWait: 0s`: refused at once while the pool is
    /// saturated, as a gateway without a queue does.
    Off,
    /// The defaults, and the pool's `enginePriority`: each request tells
    /// its replica its band, and the replicas schedule by it (vLLM's
    /// `--scheduling-policy priority`).
    Priority,
}

impl FlowMode {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowMode::On => "on",
            FlowMode::Flat => "flat",
            FlowMode::Off => "off",
            FlowMode::Priority => "priority",
        }
    }

    /// Every mode, in the order the flow-control scenario runs them.
    pub const ALL: [FlowMode; 4] = [
        FlowMode::On,
        FlowMode::Flat,
        FlowMode::Off,
        FlowMode::Priority,
    ];

    /// Whether requests carry their band to replicas that schedule by it.
    pub fn engine_priority(self) -> bool {
        self == FlowMode::Priority
    }
}

/// The admission queue's bounds for the requests' band, in simulated
/// seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowLimits {
    pub max_wait: f64,
    pub max_queued: usize,
    pub max_queued_bytes: u64,
}
