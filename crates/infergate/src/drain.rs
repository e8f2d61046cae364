//! `infergate drain`: take a replica out of service for maintenance, or
//! put it back, through a running gateway's admin listener
//! (`/admin/…/drain`, docs/operations.md).

use std::time::{Duration, Instant};

use clap::Args;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

#[derive(Args)]
pub struct DrainArgs {
    /// The replica's address as the pool lists it (`/debug/pools`), e.g.
    /// 10.0.0.7:8000.
    pub addr: String,
    /// Only in this pool (default: every pool that has the replica).
    #[arg(long)]
    pub pool: Option<String>,
    /// Move the replica's streams to other replicas now rather than at
    /// the pool's drain deadline.
    #[arg(long, conflicts_with = "undo")]
    pub evacuate: bool,
    /// Put the replica back in service.
    #[arg(long)]
    pub undo: bool,
    /// Wait until the replica has no request of this gateway in flight
    /// (it can then be stopped without cutting anyone).
    #[arg(long, conflicts_with = "undo")]
    pub wait: bool,
    /// The gateway's admin listener.
    #[arg(
        long,
        value_name = "URL",
        env = "INFERGATE_ADMIN",
        default_value = "http://127.0.0.1:9464"
    )]
    pub admin: String,
    /// Print the gateway's JSON answer instead of a summary.
    #[arg(long)]
    pub json: bool,
}

/// What a path segment must have encoded: everything but unreserved
/// characters (`[`, `]`, `:` and `/` of an address included).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// How often `--wait` asks: the admin listener has no way to tell when
/// a replica's last request ends, so the command asks again.
const WAIT_POLL: Duration = Duration::from_millis(500);

pub async fn run(args: DrainArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let url = drain_url(&args.admin, args.pool.as_deref(), &args.addr);
    let request = if args.undo {
        client.delete(&url)
    } else {
        client
            .post(&url)
            .header("content-type", "application/json")
            .body(serde_json::json!({"evacuate": args.evacuate}).to_string())
    };
    let mut answer = send(request).await?;
    if args.wait {
        let started = Instant::now();
        while inflight(&answer) > 0 {
            tokio::time::sleep(WAIT_POLL).await;
            answer = send(client.get(&url)).await?;
        }
        if !args.json {
            eprintln!(
                "nothing in flight on {} after {:.1} s",
                args.addr,
                started.elapsed().as_secs_f64()
            );
        }
    }
    if args.json {
        println!("{answer:#}");
    } else {
        for replica in replicas(&answer) {
            println!("{}", summary(replica));
        }
    }
    Ok(())
}

/// The admin path for `addr`, in one pool or in every pool.
fn drain_url(admin: &str, pool: Option<&str>, addr: &str) -> String {
    let admin = admin.trim_end_matches('/');
    let addr = utf8_percent_encode(addr, SEGMENT);
    match pool {
        Some(pool) => format!(
            "{admin}/admin/pools/{}/replicas/{addr}/drain",
            utf8_percent_encode(pool, SEGMENT)
        ),
        None => format!("{admin}/admin/replicas/{addr}/drain"),
    }
}

async fn send(request: reqwest::RequestBuilder) -> anyhow::Result<Value> {
    let response = request
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the admin listener: {e}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| anyhow::anyhow!("the admin listener answered {status}, not JSON: {e}"))?;
    if !status.is_success() {
        let message = body["error"]["message"].as_str().unwrap_or("no message");
        anyhow::bail!("{status}: {message}");
    }
    Ok(body)
}

/// The replicas of an answer: one (a pool was named) or a list.
fn replicas(answer: &Value) -> Vec<&Value> {
    match answer["replicas"].as_array() {
        Some(list) => list.iter().collect(),
        None => vec![answer],
    }
}

fn inflight(answer: &Value) -> u64 {
    replicas(answer)
        .iter()
        .map(|r| r["inflightRequests"].as_u64().unwrap_or(0))
        .sum()
}

/// One line per replica: where it is, what it does, what it still runs.
fn summary(replica: &Value) -> String {
    let state = match (
        replica["evacuating"].as_bool(),
        replica["draining"].as_bool(),
    ) {
        (Some(true), _) => "evacuating (its streams move to other replicas)".to_owned(),
        (_, Some(true)) => match replica["drain"]["evacuateInMs"].as_u64() {
            Some(ms) => format!(
                "draining (evacuated in {:.1} s if still busy)",
                ms as f64 / 1e3
            ),
            None => "draining".to_owned(),
        },
        _ => "serving".to_owned(),
    };
    let member = if replica["member"].as_bool() == Some(false) {
        ", leaving the pool"
    } else {
        ""
    };
    format!(
        "pool {}: {} {state}{member}, {} requests in flight",
        replica["pool"].as_str().unwrap_or("?"),
        replica["address"].as_str().unwrap_or("?"),
        replica["inflightRequests"].as_u64().unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_pools_are_one_path_segment_each() {
        assert_eq!(
            drain_url("http://127.0.0.1:9464/", Some("llama 8b"), "10.0.0.7:8000"),
            "http://127.0.0.1:9464/admin/pools/llama%208b/replicas/10.0.0.7%3A8000/drain"
        );
        assert_eq!(
            drain_url("http://gw:9464", None, "[fd00::1]:8000"),
            "http://gw:9464/admin/replicas/%5Bfd00%3A%3A1%5D%3A8000/drain"
        );
        assert_eq!(
            drain_url("http://gw:9464", None, "https://a.example:8443"),
            "http://gw:9464/admin/replicas/https%3A%2F%2Fa.example%3A8443/drain"
        );
    }

    #[test]
    fn a_summary_says_what_the_replica_does() {
        let replica = serde_json::json!({
            "pool": "p", "address": "10.0.0.7:8000", "member": true,
            "draining": true, "evacuating": false, "inflightRequests": 3,
            "drain": {"reason": "by-hand", "evacuateInMs": 19_500},
        });
        assert_eq!(
            summary(&replica),
            "pool p: 10.0.0.7:8000 draining (evacuated in 19.5 s if still busy), 3 requests in flight"
        );
    }
}
