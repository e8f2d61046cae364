//! The benchmark harness behind `infergate bench`: routing policies
//! compared side by side on identical traffic and identical simulated
//! fleets, at several loads.
//!
//! - [`scenario`]: the fleets and workloads (mixed-fleet, bursty,
//!   shared-prefix, lora, uniform, fleet-scale).
//! - [`workload`]: seeded arrivals and request contents.
//! - [`capacity`]: what 100 % load means for a fleet.
//! - [`allocation`]: the best static split of the traffic, from the engine
//!   profiles.
//! - [`policy`]: the policies compared and the gateway config of each.
//! - [`flow`]: the gateway's admission queue in a run, on or off.
//! - [`virtual_fleet`]: the fleet in virtual time (engine model + picker).
//! - [`live`]: the real gateway over HTTP with a load generator.
//! - [`routers`]: infergate and the peer routers `--routers` compares.
//! - [`comparison`]: which router is best in a scenario, by how much.
//! - [`failover`]: the global tier losing a member under load.
//! - [`disaggregation`]: aggregated against prefill/decode disaggregated
//!   fleets at equal GPUs, in virtual time.
//! - [`stats`]: per-request outcomes and their summary.
//! - [`report`]: JSON, markdown and SVG output.
//! - [`suite`]: one scenario, every policy, every load.
//! - [`agreement`]: live and virtual runs of one scenario compared.
//! - [`cli`]: the command line.

pub mod agreement;
pub mod allocation;
pub mod capacity;
pub mod cli;
pub mod cold_start;
pub mod comparison;
pub mod disaggregation;
pub mod failover;
pub mod flow;
pub mod live;
pub mod policy;
pub mod report;
pub mod routers;
pub mod scenario;
pub mod stats;
pub mod suite;
pub mod virtual_fleet;
pub mod workload;
