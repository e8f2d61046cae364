//! The global tier: what a gateway tells a global router about its load,
//! and how the router chooses among its members.
//!
//! Pure and synchronous like the `picker` crate: no I/O, no clock reads
//! (time comes in as an argument), so the same code can run in a live
//! router and in a simulation.
//!
//! - [`summary`]: the load summary a gateway publishes on its admin
//!   listener, per model (the wire format both sides share).
//! - [`health`](mod@health): a member's health as the router judges it,
//!   and the share of traffic a recovering member may take.
//! - [`pick`](mod@pick): which member a request goes to.
//!
//! Modules depend one way: `summary` ← `health` ← `pick`.

pub mod health;
pub mod pick;
pub mod summary;

pub use health::{MemberHealth, Verdict};
pub use pick::{Candidate, MemberPick, NoMember, pick};
pub use summary::{LoadSummary, ModelLoad};
