//! The health rule: whether a replica's latest observation can be trusted.
//!
//! The rule itself lives in the `picker` crate, next to the `Observation`
//! it judges: the picker filters on it and cannot depend on this crate
//! (this crate depends on it). It is re-exported here so that users of the
//! scraper find it beside the code that fills observations. In short:
//! `Unhealthy` when the last scrape failed, `Stale` when the last good
//! scrape is older than `stale_after` or there has been none, otherwise
//! `Healthy`.

pub use picker::health::{Health, health};
