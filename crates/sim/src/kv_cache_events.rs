//! KV-cache events from a simulated replica, on vLLM's wire format: what
//! `--kv-events-config` makes a vLLM server publish.
//!
//! The engine records what enters its prefix cache (a full block becomes
//! findable) and what leaves it (evicted when its memory is reused); the
//! replica's actor turns each step's records into one batch and hands it to
//! a [`Publisher`]: a PUB socket, and a replay socket keeping the last
//! batches. Off unless a replica's spec asks for it.
//!
//! The events carry the engine's token ids, from [`kv_events::tokenizer`]: a
//! gateway indexing a simulated pool must tokenize prompts with the same
//! functions (`encode_chat` for chat messages as role/content turns,
//! `encode_prompt` for completion prompts) to find the blocks.

use std::net::IpAddr;
use std::sync::Arc;

use kv_events::publisher::{DEFAULT_BUFFER_STEPS, Publisher, PublisherConfig};
use kv_events::wire::{BlockHash, BlockRemoved, BlockStored, Encoding, EventBatch, KvEvent};

use crate::engine::KvCacheEvent;

/// Where and how a replica publishes its KV events.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsSpec {
    /// Port of the PUB socket (vLLM's default is 5557); 0 picks a free one.
    pub port: u16,
    /// Port of the replay socket, if any; 0 picks a free one.
    pub replay_port: Option<u16>,
    pub topic: String,
    /// Batches kept for replay (vLLM's `buffer_steps`).
    pub buffer_steps: usize,
    /// Arrays (older vLLM) or maps (vLLM main).
    pub encoding: Encoding,
    /// Send block hashes as 8 bytes (like vLLM's default byte hashes)
    /// rather than as integers.
    pub bytes_hashes: bool,
    /// Fraction of batches not sent (still kept for replay), to exercise
    /// subscribers' gap handling. 0 by default.
    pub drop_fraction: f64,
}

impl Default for KvEventsSpec {
    fn default() -> Self {
        KvEventsSpec {
            port: 0,
            replay_port: Some(0),
            topic: String::new(),
            buffer_steps: DEFAULT_BUFFER_STEPS,
            encoding: Encoding::default(),
            bytes_hashes: false,
            drop_fraction: 0.0,
        }
    }
}

impl KvEventsSpec {
    /// Replica `index` of a fleet: fixed ports move up by the index, as
    /// replicas' HTTP ports do; 0 stays 0. ([`KvEventsSpec::validate`] with
    /// the fleet's size checks that they fit.)
    pub fn for_replica(&self, index: usize) -> Self {
        let shift = |port: u16| match port {
            0 => 0,
            port => u16::try_from(usize::from(port) + index).unwrap_or(u16::MAX),
        };
        KvEventsSpec {
            port: shift(self.port),
            replay_port: self.replay_port.map(shift),
            ..self.clone()
        }
    }

    /// Checks the settings for a fleet of `replicas`.
    pub fn validate(&self, replicas: usize) -> anyhow::Result<()> {
        if !(0.0..=1.0).contains(&self.drop_fraction) {
            anyhow::bail!(
                "KV events drop fraction must be between 0 and 1, got {}",
                self.drop_fraction
            );
        }
        for port in [Some(self.port), self.replay_port].into_iter().flatten() {
            if port != 0 && usize::from(port) + replicas.saturating_sub(1) > usize::from(u16::MAX) {
                anyhow::bail!("KV events port {port} + {replicas} replicas is out of range");
            }
        }
        if self.replay_port.is_some_and(|p| p != 0 && p == self.port) {
            anyhow::bail!("the KV events and replay sockets need different ports");
        }
        Ok(())
    }
}

/// Bind a replica's KV event sockets on `host`.
pub(crate) async fn bind(
    spec: &KvEventsSpec,
    host: IpAddr,
    seed: u64,
) -> anyhow::Result<Arc<Publisher>> {
    let endpoint = |port: u16| match host {
        IpAddr::V4(ip) => format!("tcp://{ip}:{port}"),
        IpAddr::V6(ip) => format!("tcp://[{ip}]:{port}"),
    };
    let config = PublisherConfig {
        replay_endpoint: spec.replay_port.map(endpoint),
        topic: spec.topic.clone(),
        buffer_steps: spec.buffer_steps,
        encoding: spec.encoding,
        drop_fraction: spec.drop_fraction,
        seed,
        ..PublisherConfig::new(endpoint(spec.port))
    };
    let publisher = Publisher::bind(config)
        .await
        .map_err(|e| anyhow::anyhow!("cannot bind the KV event sockets: {e}"))?;
    Ok(Arc::new(publisher))
}

/// What a replica's actor needs to publish its engine's records.
pub(crate) struct KvEventSink {
    pub publisher: Arc<Publisher>,
    pub block_size: u32,
    pub bytes_hashes: bool,
    /// Reused between steps.
    pub scratch: Vec<KvCacheEvent>,
}

impl KvEventSink {
    /// Publish what `scratch` holds as one batch (nothing when empty).
    pub fn publish(&mut self) {
        if self.scratch.is_empty() {
            return;
        }
        let events = to_wire(self.scratch.drain(..), self.block_size, self.bytes_hashes);
        self.publisher.publish(EventBatch {
            ts: unix_seconds(),
            events,
            data_parallel_rank: Some(0),
        });
    }
}

/// The engine's records as vLLM's events. The simulator's chained block
/// hash is the engine hash; `bytes_hashes` sends it as 8 bytes big-endian.
pub fn to_wire(
    records: impl IntoIterator<Item = KvCacheEvent>,
    block_size: u32,
    bytes_hashes: bool,
) -> Vec<KvEvent> {
    let hash = |h: u64| {
        if bytes_hashes {
            BlockHash::Bytes(h.to_be_bytes().to_vec())
        } else {
            BlockHash::Unsigned(h)
        }
    };
    records
        .into_iter()
        .map(|record| match record {
            KvCacheEvent::Stored {
                hashes,
                parent,
                tokens,
                adapter,
            } => KvEvent::BlockStored(BlockStored::new(
                hashes.into_iter().map(hash).collect(),
                parent.map(hash),
                tokens,
                block_size,
                adapter,
            )),
            KvCacheEvent::Removed { hashes } => {
                KvEvent::BlockRemoved(BlockRemoved::new(hashes.into_iter().map(hash).collect()))
            }
        })
        .collect()
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_ports_move_up_by_the_replica_and_must_fit() {
        let spec = KvEventsSpec {
            port: 5557,
            replay_port: Some(5600),
            ..KvEventsSpec::default()
        };
        let third = spec.for_replica(2);
        assert_eq!((third.port, third.replay_port), (5559, Some(5602)));
        let picked = KvEventsSpec::default().for_replica(5);
        assert_eq!((picked.port, picked.replay_port), (0, Some(0)));
        spec.validate(10).unwrap();
        let high = KvEventsSpec {
            port: 65_530,
            ..spec.clone()
        };
        assert!(high.validate(10).is_err());
        let same = KvEventsSpec {
            replay_port: Some(5557),
            ..spec.clone()
        };
        assert!(same.validate(1).is_err());
        let drops = KvEventsSpec {
            drop_fraction: 1.5,
            ..spec
        };
        assert!(drops.validate(1).is_err());
    }

    #[test]
    fn records_become_vllm_events() {
        let events = to_wire(
            [
                KvCacheEvent::Stored {
                    hashes: vec![7, 8],
                    parent: Some(6),
                    tokens: vec![1, 2, 3, 4],
                    adapter: Some("sql".into()),
                },
                KvCacheEvent::Removed { hashes: vec![7] },
            ],
            2,
            true,
        );
        let KvEvent::BlockStored(stored) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!(
            stored.block_hashes[0],
            BlockHash::Bytes(vec![0, 0, 0, 0, 0, 0, 0, 7])
        );
        assert_eq!(
            stored.parent_block_hash,
            Some(BlockHash::Bytes(6u64.to_be_bytes().to_vec()))
        );
        assert_eq!(stored.block_size, 2);
        assert_eq!(stored.lora_name.as_deref(), Some("sql"));
        assert_eq!(stored.medium.as_deref(), Some("GPU"));
        assert!(matches!(&events[1], KvEvent::BlockRemoved(r) if r.block_hashes.len() == 1));
    }
}
