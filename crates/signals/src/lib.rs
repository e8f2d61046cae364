//! What replicas tell the gateway: a Prometheus text parser, the metric
//! dialects of the common engines, the scrape loop and the health rule.
//!
//! The gateway starts one [`spawn_scraper`] per replica; each scrape stores
//! a fresh [`picker::Observation`] in the replica's [`picker::Endpoint`],
//! and the picker judges it with [`health()`].

pub mod address;
pub mod dialect;
pub mod prom;
pub mod scrape;

pub use address::{Scheme, endpoint_scheme};
pub use dialect::{Dialect, UnknownDialect};
// The health rule lives in `picker`, next to the `Observation` it judges
// (the picker filters on it and cannot depend on this crate); re-exported
// so users of the scraper find it beside the code that fills observations.
pub use picker::{Health, health};
pub use prom::ParseError;
pub use scrape::{
    ScrapeClient, ScrapeConfig, ScrapeError, ScrapeReport, ScrapeTls, Scraper,
    spawn_reporting_scraper, spawn_scraper,
};
