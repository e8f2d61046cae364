//! The link a prompt's KV cache crosses from a prefill replica to a decode
//! replica in a disaggregated deployment, and how long a transfer takes.
//!
//! Transfer time = latency + tokens × KV bytes per token ÷ bandwidth. The
//! presets are one NIC per GPU at line rate; the sources are in
//! `docs/simulator.md` (section "Prefill/decode disaggregation").

/// A prefill-to-decode link.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvLink {
    /// Bytes per second one transfer gets.
    pub bandwidth_bytes: f64,
    /// Fixed cost per transfer (handshake, notification, first byte).
    pub latency_seconds: f64,
}

/// 400 Gb/s InfiniBand NDR or RoCE (ConnectX-7) read by NIXL/UCX or
/// Mooncake: 50 GB/s at line rate.
pub const RDMA_400G: KvLink = KvLink {
    bandwidth_bytes: 50e9,
    latency_seconds: 100e-6,
};

/// Plain TCP over 100 Gb Ethernet: 12.5 GB/s at line rate, and a
/// millisecond of kernel-stack round trips per transfer.
pub const TCP_100G: KvLink = KvLink {
    bandwidth_bytes: 12.5e9,
    latency_seconds: 1e-3,
};

/// The presets by name, for configuration: `rdma`, `tcp`.
pub const LINK_PRESETS: [(&str, KvLink); 2] = [("rdma", RDMA_400G), ("tcp", TCP_100G)];

/// The preset called `name`.
pub fn link_preset(name: &str) -> Option<KvLink> {
    LINK_PRESETS
        .iter()
        .find(|(preset, _)| preset.eq_ignore_ascii_case(name))
        .map(|&(_, link)| link)
}

impl Default for KvLink {
    fn default() -> Self {
        RDMA_400G
    }
}

impl KvLink {
    /// Seconds to move the KV of `tokens` tokens of `bytes_per_token` each.
    pub fn transfer_seconds(&self, tokens: u32, bytes_per_token: f64) -> f64 {
        self.latency_seconds + f64::from(tokens) * bytes_per_token / self.bandwidth_bytes
    }

    /// A clear error for a link no transfer could cross.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.bandwidth_bytes.is_finite() && self.bandwidth_bytes > 0.0) {
            return Err(format!(
                "KV link bandwidth must be a positive number of bytes per second, got {}",
                self.bandwidth_bytes
            ));
        }
        if !(self.latency_seconds.is_finite() && self.latency_seconds >= 0.0) {
            return Err(format!(
                "KV link latency must be zero or more seconds, got {}",
                self.latency_seconds
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_prompt_of_llama_8b_crosses_rdma_in_about_ten_milliseconds() {
        // 4,096 tokens × 128 KiB = 512 MiB; at 50 GB/s that is 10.7 ms.
        let seconds = RDMA_400G.transfer_seconds(4096, 131_072.0);
        assert!((seconds - (100e-6 + 536_870_912.0 / 50e9)).abs() < 1e-12);
        assert!(TCP_100G.transfer_seconds(4096, 131_072.0) > 4.0 * seconds);
        assert_eq!(link_preset("RDMA"), Some(RDMA_400G));
        assert_eq!(link_preset("infiniband"), None);
        assert!(
            KvLink {
                bandwidth_bytes: 0.0,
                latency_seconds: 0.0
            }
            .validate()
            .is_err()
        );
    }
}
