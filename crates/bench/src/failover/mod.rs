//! `infergate bench --scenario global-failover`: the global tier losing a
//! member under steady streaming load, live on 127.0.0.1.
//!
//! Three member gateways, each in front of its own simulated replicas, and
//! a global router in front of them, all in this process. Seeded Poisson
//! streaming traffic goes through the router for the run's length; one
//! member's gateway is shut down a third of the way in (its ports refuse
//! connections) and started again on the same ports at two thirds.
//!
//! - [`members`]: the tier, and killing and restarting a member.
//! - [`traffic`]: the seeded load and what each request saw.
//! - [`sampler`]: the router's own attempt counts, read from `/metrics`.
//! - [`analysis`]: share over time, TTFT per phase, failover and recovery.
//! - [`options`]: the run's size and the router's failover settings.
//! - [`report`]: markdown, JSON and the share plot.

pub mod analysis;
pub mod members;
mod options;
mod report;
pub mod sampler;
mod svg;
pub mod traffic;

use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use tokio::time::Instant;

pub use options::FailoverOptions;
pub use report::FailoverReport;

use analysis::Timeline;
use members::{Tier, TierOptions};

/// The scenario's name on the command line.
pub const NAME: &str = "global-failover";

/// Which member is killed.
const VICTIM: usize = 1;
/// Bound on the tier coming up before the traffic starts.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Run the scenario once.
pub async fn run(options: &FailoverOptions) -> anyhow::Result<FailoverReport> {
    anyhow::ensure!(
        options.members > VICTIM,
        "global-failover needs at least two members"
    );
    let mut tier = Tier::start(&TierOptions {
        members: options.members,
        unhealthy_after: options.unhealthy_after,
        ramp_up: options.ramp_up,
        seed: options.seed,
    })
    .await?;
    let measured = drive(&mut tier, options).await;
    tier.shutdown().await;
    measured
}

async fn drive(tier: &mut Tier, options: &FailoverOptions) -> anyhow::Result<FailoverReport> {
    tier.wait_all_healthy(READY_TIMEOUT).await?;
    let names = tier.member_names();
    let planned = traffic::plan(options.seed, options.rate, options.length);
    let url = format!("http://{}/v1/chat/completions", tier.router_addr());
    let metrics = format!("http://{}/metrics", tier.router_admin()?);
    let start = Instant::now();
    let (stop, stopped) = watch::channel(false);
    let sampling = tokio::spawn(sampler::sample(metrics, start, stopped));
    let load = tokio::spawn(traffic::run(url, start, planned, options.client_timeout));

    tokio::time::sleep_until(start + options.length / 3).await;
    let killed_at = start.elapsed();
    eprintln!(
        "[{NAME}] {:.1} s: killing {}",
        killed_at.as_secs_f64(),
        names[VICTIM]
    );
    tier.kill(VICTIM).await?;
    tokio::time::sleep_until(start + options.length * 2 / 3).await;
    tier.restart(VICTIM).await?;
    let restarted_at = start.elapsed();
    eprintln!(
        "[{NAME}] {:.1} s: {} restarted",
        restarted_at.as_secs_f64(),
        names[VICTIM]
    );

    let answers = load.await.context("the load generator")??;
    // One more reading after the last answer, so the samples cover them.
    let _ = stop.send(true);
    let samples = sampling.await.context("the metrics sampler")?;
    let timeline = Timeline {
        members: names.clone(),
        victim: names[VICTIM].clone(),
        killed_at,
        restarted_at,
        length: options.length,
        unhealthy_after: options.unhealthy_after,
    };
    let measured = analysis::measure(&timeline, &answers, &samples);
    Ok(FailoverReport {
        scenario: NAME,
        options: options.clone(),
        replicas_per_member: members::REPLICAS_PER_MEMBER,
        timeline,
        measured,
    })
}
