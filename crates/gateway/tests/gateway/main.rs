//! The gateway end to end, in one test binary: real listeners on
//! 127.0.0.1, the gateway started in-process in front of fake replicas
//! whose behaviour each test controls.
//!
//! - [`proxy`]: routing, streaming, errors, upstream connections, the
//!   connection limit;
//! - [`picking`]: metric-aware picking, where requests actually went;
//! - [`flow`]: flow control, a pool driven into saturation;
//! - [`observability`]: exact metrics, the access log, `/debug/pools`,
//!   trace context, the dashboard;
//! - [`fleet_page`]: the fleet page's files and the JSON it polls;
//! - [`attack`]: raw bytes against the gateway, checked on both sides;
//! - [`auth`]: API keys, tokens and their attacks, tenants' rules;
//! - [`reload`]: a new config applied while requests run;
//! - [`drain`]: replicas drained by hand or removed, cutting nobody;
//! - [`limits`]: rate limits, locally and shared through a real Redis;
//! - [`tls`]: TLS listeners, client certificates, certificate reloads and
//!   `https://` replicas;
//! - [`traffic`]: rewrites and canaries, sticky sessions, mirrors;
//! - [`load_summary`]: what the admin listener tells global routers;
//! - [`endpoint_picker`]: infergate as another proxy's endpoint picker,
//!   driven by an Envoy stand-in.
//! - [`disaggregation`]: prefill/decode disaggregation in both engines'
//!   protocols, its faults and cancellation.
//!
//! [`support`] (`tests/support/`, which other test binaries here use too)
//! holds what they share: fake replicas, configs, clients, and the bounded
//! waits. Tests that change the whole process (its limit on open file
//! descriptors) are in a binary of their own, `descriptors.rs`.

mod attack;
mod auth;
mod continuation;
mod disaggregation;
mod drain;
mod endpoint_picker;
mod fleet_page;
mod flow;
mod limits;
mod load_summary;
mod mixed_fleet;
mod observability;
mod picking;
mod predicted;
mod prefix_events;
mod proxy;
mod reload;
#[path = "../support/mod.rs"]
mod support;
mod tls;
mod traffic;
