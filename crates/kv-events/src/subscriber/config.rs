//! Where a replica publishes and how to follow it: the settings the
//! subscription reads and each rank's feed is built from.

use std::time::Duration;

/// Where a replica publishes, and how patiently to follow it.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// Rank 0's PUB socket, `tcp://host:port` (vLLM's `endpoint`, with the
    /// replica's address for `*`).
    pub endpoint: String,
    /// Rank 0's ROUTER socket for replays (vLLM's `replay_endpoint`), if
    /// the engine has one.
    pub replay_endpoint: Option<String>,
    /// Only batches published under exactly this topic are read; empty
    /// reads every topic (vLLM's default topic is empty).
    pub topic: String,
    /// Ranks publish on consecutive ports: rank `r` on `port + r`, for both
    /// sockets (vLLM's data parallelism).
    pub data_parallel_size: u32,
    /// Longest wait for a connection (or a replay's next message).
    pub connect_timeout: Duration,
    /// Waits between reconnects, doubling from the first to the last.
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// After this long without a batch, ask the replay socket whether any
    /// were missed: a lost batch shows as a gap only when the next one
    /// arrives, and an idle engine may send none for a long time. `None`
    /// asks only on gaps.
    pub idle_replay: Option<Duration>,
}

impl SubscriberConfig {
    pub fn new(endpoint: impl Into<String>) -> Self {
        SubscriberConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            data_parallel_size: 1,
            connect_timeout: Duration::from_secs(2),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            idle_replay: Some(Duration::from_secs(5)),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0:?} is not a tcp://host:port endpoint")]
    Endpoint(String),
    #[error("port {port} + rank {rank} is out of range")]
    Port { port: u16, rank: u32 },
    #[error("data_parallel_size must be at least 1")]
    NoRanks,
}

/// The endpoint of data-parallel rank `rank`: the port moved up by it.
pub fn rank_endpoint(endpoint: &str, rank: u32) -> Result<String, ConfigError> {
    let bad = || ConfigError::Endpoint(endpoint.to_owned());
    let rest = endpoint.strip_prefix("tcp://").ok_or_else(bad)?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    let moved = u32::from(port)
        .checked_add(rank)
        .and_then(|p| u16::try_from(p).ok())
        .ok_or(ConfigError::Port { port, rank })?;
    Ok(format!("tcp://{host}:{moved}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_publish_on_consecutive_ports() {
        assert_eq!(
            rank_endpoint("tcp://10.0.0.5:5557", 0).unwrap(),
            "tcp://10.0.0.5:5557"
        );
        assert_eq!(
            rank_endpoint("tcp://pod-a.svc:5557", 3).unwrap(),
            "tcp://pod-a.svc:5560"
        );
        assert_eq!(
            rank_endpoint("tcp://[::1]:5557", 1).unwrap(),
            "tcp://[::1]:5558"
        );
        assert!(rank_endpoint("ipc:///tmp/kv", 0).is_err());
        assert!(rank_endpoint("tcp://host", 0).is_err());
        assert!(rank_endpoint("tcp://:5557", 0).is_err());
        assert_eq!(
            rank_endpoint("tcp://h:65535", 1),
            Err(ConfigError::Port {
                port: 65535,
                rank: 1
            })
        );
    }
}
