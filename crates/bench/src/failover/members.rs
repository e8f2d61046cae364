//! The global tier under test, in this process: member gateways on
//! 127.0.0.1, each in front of its own simulated replicas, and a global
//! router in front of them. A member can be killed (its gateway shut
//! down, so its ports refuse connections) and started again on the same
//! ports.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use gateway::Gateway;
use tracing::instrument::WithSubscriber;
use tracing::subscriber::NoSubscriber;

/// The model every member serves (the simulated replicas' default name).
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Replicas behind each member gateway.
pub const REPLICAS_PER_MEMBER: usize = 2;

/// How the tier is set up.
#[derive(Debug, Clone)]
pub struct TierOptions {
    pub members: usize,
    /// The router's `failover.unhealthyAfter`.
    pub unhealthy_after: Duration,
    /// The router's `failover.rampUp`.
    pub ramp_up: Duration,
    /// Seeds the replicas' answers.
    pub seed: u64,
}

/// One member: its replicas stay up for the whole run; its gateway comes
/// and goes.
struct Member {
    name: String,
    public: SocketAddr,
    admin: SocketAddr,
    replicas: Vec<sim::ReplicaHandle>,
    gateway: Option<Gateway>,
}

/// The running tier.
pub struct Tier {
    members: Vec<Member>,
    router: Gateway,
}

impl Tier {
    /// Start the replicas, the member gateways and the router.
    pub async fn start(options: &TierOptions) -> anyhow::Result<Tier> {
        let mut members = Vec::with_capacity(options.members);
        for index in 0..options.members {
            let mut replicas = Vec::with_capacity(REPLICAS_PER_MEMBER);
            for r in 0..REPLICAS_PER_MEMBER {
                let spec = sim::ReplicaSpec {
                    seed: options
                        .seed
                        .wrapping_mul(31)
                        .wrapping_add((index * 8 + r) as u64),
                    ..sim::ReplicaSpec::new("h100", "llama-3.1-8b")
                };
                let replica = sim::start_replica("127.0.0.1:0".parse()?, spec)
                    .with_subscriber(NoSubscriber::default())
                    .await
                    .context("starting a simulated replica")?;
                replicas.push(replica);
            }
            let endpoints: Vec<SocketAddr> = replicas.iter().map(|r| r.local_addr()).collect();
            let gateway = Gateway::start(&member_config("127.0.0.1:0", "127.0.0.1:0", &endpoints)?)
                .await
                .context("starting a member gateway")?;
            members.push(Member {
                name: format!("m{index}"),
                public: gateway.addr(),
                admin: gateway.admin_addr().context("member admin listener")?,
                replicas,
                gateway: Some(gateway),
            });
        }
        let router = Gateway::start(&router_config(&members, options)?)
            .await
            .context("starting the global router")?;
        Ok(Tier { members, router })
    }

    pub fn member_names(&self) -> Vec<String> {
        self.members.iter().map(|m| m.name.clone()).collect()
    }

    pub fn router_addr(&self) -> SocketAddr {
        self.router.addr()
    }

    pub fn router_admin(&self) -> anyhow::Result<SocketAddr> {
        self.router.admin_addr().context("router admin listener")
    }

    /// Wait until the router reports every member healthy, or fail after
    /// `timeout`. The admin page offers no notification, so it is polled.
    pub async fn wait_all_healthy(&self, timeout: Duration) -> anyhow::Result<()> {
        let url = format!("http://{}/debug/members", self.router_admin()?);
        let client = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let page: Option<serde_json::Value> = match client.get(&url).send().await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
            if let Some(page) = &page
                && healthy_members(page) == self.members.len()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                anyhow::bail!(
                    "the router did not report {} healthy members within {timeout:?}: {}",
                    self.members.len(),
                    page.map(|p| p.to_string()).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Shut the gateway of member `index` down: it stops accepting at once
    /// (connections to it are refused) and finishes what it has. Returns
    /// once it has drained.
    pub async fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        let gateway = self.members[index]
            .gateway
            .take()
            .context("the member is already down")?;
        gateway.shutdown().await;
        Ok(())
    }

    /// Start member `index`'s gateway again on its old ports.
    pub async fn restart(&mut self, index: usize) -> anyhow::Result<()> {
        let member = &mut self.members[index];
        let endpoints: Vec<SocketAddr> = member.replicas.iter().map(|r| r.local_addr()).collect();
        let config = member_config(
            &member.public.to_string(),
            &member.admin.to_string(),
            &endpoints,
        )?;
        let gateway = Gateway::start(&config)
            .await
            .with_context(|| format!("restarting {} on {}", member.name, member.public))?;
        member.gateway = Some(gateway);
        Ok(())
    }

    /// Stop everything.
    pub async fn shutdown(self) {
        self.router.shutdown().await;
        for member in self.members {
            if let Some(gateway) = member.gateway {
                gateway.shutdown().await;
            }
            for replica in member.replicas {
                replica.shutdown().await;
            }
        }
    }
}

fn healthy_members(page: &serde_json::Value) -> usize {
    page["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["state"] == "healthy")
        .count()
}

fn parse(yaml: &str) -> anyhow::Result<config::InferenceGatewayConfig> {
    config::from_yaml(yaml).map_err(|e| anyhow::anyhow!("bench config refused: {e}\n{yaml}"))
}

/// A member gateway: one pool serving [`MODEL`] from `replicas`.
fn member_config(
    public: &str,
    admin: &str,
    replicas: &[SocketAddr],
) -> anyhow::Result<config::InferenceGatewayConfig> {
    let endpoints: Vec<String> = replicas.iter().map(|r| format!("\"{r}\"")).collect();
    parse(&format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"{public}\"}}]
  admin: {{address: \"{admin}\"}}
  shutdown: {{drainTimeout: 10s}}
  pools:
    - {{name: p, engine: vllm, models: [\"{MODEL}\"], endpoints: [{}]}}
",
        endpoints.join(", ")
    ))
}

/// The global router: no local pools, every member in one region, the
/// member in the decision headers.
fn router_config(
    members: &[Member],
    options: &TierOptions,
) -> anyhow::Result<config::InferenceGatewayConfig> {
    let listed: String = members
        .iter()
        .map(|m| {
            format!(
                "      - {{name: {}, url: \"http://{}\", adminUrl: \"http://{}\", region: local}}\n",
                m.name, m.public, m.admin
            )
        })
        .collect();
    parse(&format!(
        "apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: \"127.0.0.1:0\"}}]
  admin: {{address: \"127.0.0.1:0\"}}
  debug: {{decisionHeaders: true}}
  pools: []
  global:
    region: local
    failover: {{unhealthyAfter: {}ms, rampUp: {}ms}}
    members:
{listed}",
        options.unhealthy_after.as_millis(),
        options.ramp_up.as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_healthy_members_only() {
        let page = serde_json::json!({"members": [
            {"state": "healthy"}, {"state": "ramping"}, {"state": "unhealthy"}, {"state": "healthy"}
        ]});
        assert_eq!(healthy_members(&page), 2);
        assert_eq!(healthy_members(&serde_json::json!({})), 0);
    }

    #[test]
    fn the_configs_are_accepted() {
        let replicas = ["127.0.0.1:1".parse().unwrap()];
        member_config("127.0.0.1:0", "127.0.0.1:0", &replicas).unwrap();
    }
}
