//! Hardware and model profiles: the data the roofline and memory models run on.
//!
//! Every number here is written down with its source in `docs/simulator.md`
//! (section "Numbers and sources"); most come from
//! `reference/gpu-calibration.md`. Tensor-core figures are dense BF16 (never
//! the 2:4-sparsity headline), memory sizes are datasheet sizes in 10^9 bytes.
//!
//! Besides the GPUs there are two CPU profiles, llama.cpp on one or two
//! threads of a server CPU: there a decode step is bound by the arithmetic,
//! not by the weights' bytes, so a batch of four costs nearly four times one
//! (the GPUs' batches are nearly free until they hold hundreds).

/// How the GPUs of one tensor-parallel group talk to each other.
#[derive(Clone, Debug, PartialEq)]
pub struct Interconnect {
    /// Human-readable link name ("NVLink 4", "PCIe Gen4 x16").
    pub name: &'static str,
    /// Bytes per second in one direction per GPU (half the bidirectional
    /// datasheet figure); used for the bandwidth term of a ring all-reduce.
    pub bandwidth_bytes: f64,
    /// Fixed cost of one all-reduce (kernel launch and synchronisation);
    /// dominates the small messages of decode steps.
    pub allreduce_latency_seconds: f64,
}

/// One GPU model. Figures are per GPU; a replica with tensor parallelism uses
/// `tensor_parallel` identical GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct HardwareProfile {
    /// Canonical short name, as accepted by [`hardware`] ("h100").
    pub name: &'static str,
    /// Full product name for logs and errors.
    pub display_name: &'static str,
    /// Dense BF16 tensor-core throughput, FLOP/s.
    pub peak_bf16_flops: f64,
    /// Peak memory bandwidth, bytes/s.
    pub mem_bandwidth_bytes: f64,
    /// Device memory, bytes.
    pub mem_bytes: f64,
    /// Fraction of `peak_bf16_flops` a serving forward pass achieves
    /// (model FLOPs utilisation of large prefill chunks).
    pub compute_efficiency: f64,
    /// Fraction of `mem_bandwidth_bytes` a decode step achieves
    /// (model bandwidth utilisation).
    pub bandwidth_efficiency: f64,
    /// GPU-to-GPU link used by tensor parallelism.
    pub interconnect: Interconnect,
    /// vLLM's OpenAI-server default `max_num_seqs` on this GPU.
    pub default_max_num_seqs: u32,
    /// vLLM's OpenAI-server default `max_num_batched_tokens` on this GPU
    /// (chunked prefill on).
    pub default_max_num_batched_tokens: u32,
    /// Largest tensor-parallel group of this device: eight GPUs of a node,
    /// one for a CPU.
    pub max_tensor_parallel: u32,
    /// Other spellings accepted by [`hardware`], compared after
    /// [`normalize_hardware`].
    pub aliases: &'static [&'static str],
}

/// One dense decoder-only transformer, served in BF16.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelProfile {
    /// Canonical short name, as accepted by [`model`] ("llama-3.1-8b").
    pub name: &'static str,
    /// Hugging Face repository id of the instruct variant.
    pub hf_id: &'static str,
    /// Total parameters, including input embedding and LM head.
    pub params: f64,
    pub layers: u32,
    pub hidden: u32,
    /// Query heads (attention FLOPs scale with `q_heads × head_dim`).
    pub q_heads: u32,
    /// Key/value heads (grouped-query attention; KV size scales with these).
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Dense MLP intermediate size.
    pub ffn: u32,
    pub vocab: u32,
    /// The LM head is the input embedding table (`tie_word_embeddings`):
    /// `params` counts it once, and every step reads it for the head.
    pub tied_embeddings: bool,
    /// Longest context the model accepts (`max_position_embeddings`).
    pub max_context: u32,
    /// Tensor-parallel size used when the caller does not choose one.
    pub default_tp: u32,
    /// Other spellings accepted by [`model`], compared after
    /// [`normalize_model`].
    pub aliases: &'static [&'static str],
}

/// BF16 is two bytes per weight and per KV element.
pub const BF16_BYTES: f64 = 2.0;

impl ModelProfile {
    /// Bytes of BF16 weights that must be resident (whole model, all GPUs).
    pub fn weight_bytes(&self) -> f64 {
        self.params * BF16_BYTES
    }

    /// Parameters of the input embedding table. A lookup reads only the rows
    /// it needs, so an untied table counts towards memory but not towards
    /// per-step FLOPs or weight reads.
    pub fn embedding_params(&self) -> f64 {
        f64::from(self.vocab) * f64::from(self.hidden)
    }

    /// Parameters read and multiplied on every forward pass: everything but
    /// an untied input embedding table (a tied one is the LM head, read on
    /// every step).
    pub fn matmul_params(&self) -> f64 {
        if self.tied_embeddings {
            self.params
        } else {
            self.params - self.embedding_params()
        }
    }

    /// Parameters of the LM head, applied only to positions that sample.
    pub fn lm_head_params(&self) -> f64 {
        self.embedding_params()
    }

    /// KV-cache bytes per token for the whole model (K and V, every layer,
    /// every KV head), before splitting across tensor-parallel GPUs.
    pub fn kv_bytes_per_token(&self) -> f64 {
        2.0 * f64::from(self.layers)
            * f64::from(self.kv_heads)
            * f64::from(self.head_dim)
            * BF16_BYTES
    }

    /// Attention-score FLOPs per (query token, context token) pair:
    /// 2 for QKᵀ and 2 for PV per element of `q_heads × head_dim`, per layer.
    pub fn attention_flops_per_pair(&self) -> f64 {
        4.0 * f64::from(self.layers) * f64::from(self.q_heads) * f64::from(self.head_dim)
    }

    /// Parameters of one LoRA adapter of `rank` on all seven projections
    /// (q, k, v, o, gate, up, down): `rank × (in + out)` per projection.
    pub fn lora_adapter_params(&self, rank: u32) -> f64 {
        let h = f64::from(self.hidden);
        let q = f64::from(self.q_heads * self.head_dim);
        let kv = f64::from(self.kv_heads * self.head_dim);
        let ffn = f64::from(self.ffn);
        let per_layer_in_out = (h + q) + 2.0 * (h + kv) + (q + h) + 3.0 * (h + ffn);
        f64::from(rank) * per_layer_in_out * f64::from(self.layers)
    }

    /// BF16 bytes of one LoRA adapter of `rank`.
    pub fn lora_adapter_bytes(&self, rank: u32) -> f64 {
        self.lora_adapter_params(rank) * BF16_BYTES
    }
}

const NVLINK4: Interconnect = Interconnect {
    name: "NVLink 4 (900 GB/s bidirectional)",
    bandwidth_bytes: 450e9,
    allreduce_latency_seconds: 10e-6,
};

const NVLINK3: Interconnect = Interconnect {
    name: "NVLink 3 (600 GB/s bidirectional)",
    bandwidth_bytes: 300e9,
    allreduce_latency_seconds: 10e-6,
};

const PCIE4: Interconnect = Interconnect {
    name: "PCIe Gen4 x16 (64 GB/s bidirectional)",
    bandwidth_bytes: 32e9,
    allreduce_latency_seconds: 30e-6,
};

/// A CPU has no GPU-to-GPU link; tensor parallelism is refused on it
/// (`max_tensor_parallel` 1), so these figures are never used.
const NO_LINK: Interconnect = Interconnect {
    name: "none (one CPU)",
    bandwidth_bytes: f64::INFINITY,
    allreduce_latency_seconds: 0.0,
};

/// Tensor-parallel groups of GPUs stay within one node of eight.
const GPUS_PER_NODE: u32 = 8;

/// One Zen 3 core's FP32 arithmetic: two 256-bit FMA pipes, 8 lanes each,
/// 2 FLOPs per FMA, at the Threadripper PRO 5975WX's 4.5 GHz boost clock.
/// Zen 3 has no BF16 arithmetic: ggml widens BF16 weights to FP32.
const ZEN3_THREAD_FLOPS: f64 = 2.0 * 8.0 * 2.0 * 4.5e9;
/// Threadripper PRO 5975WX: eight channels of DDR4-3200, 8 bytes a
/// transfer.
const TR_PRO_5975WX_BANDWIDTH: f64 = 8.0 * 3.2e9 * 8.0;
/// RAM given to one llama.cpp replica (an assumption: enough for the small
/// models a CPU serves, with room for their KV cache).
const CPU_REPLICA_MEMORY: f64 = 64e9;
/// llama-server slots (`-np`), as `scripts/e2e-llamacpp` runs its fast
/// replicas.
const LLAMA_CPP_SLOTS: u32 = 4;
/// llama.cpp's default logical batch (`-b`, `n_batch`): the most tokens one
/// server iteration decodes together.
const LLAMA_CPP_BATCH: u32 = 2048;

/// vLLM's server defaults on GPUs with at least 70 GiB that are not A100.
const LARGE_GPU_MAX_NUM_SEQS: u32 = 1024;
const LARGE_GPU_MAX_NUM_BATCHED_TOKENS: u32 = 8192;
/// vLLM's server defaults everywhere else (A100, 24/48 GB cards).
const OTHER_GPU_MAX_NUM_SEQS: u32 = 256;
const OTHER_GPU_MAX_NUM_BATCHED_TOKENS: u32 = 2048;

static HARDWARE: [HardwareProfile; 7] = [
    HardwareProfile {
        name: "h100",
        display_name: "NVIDIA H100 SXM 80GB",
        peak_bf16_flops: 989e12,
        mem_bandwidth_bytes: 3.35e12,
        mem_bytes: 80e9,
        compute_efficiency: 0.6,
        bandwidth_efficiency: 0.8,
        interconnect: NVLINK4,
        default_max_num_seqs: LARGE_GPU_MAX_NUM_SEQS,
        default_max_num_batched_tokens: LARGE_GPU_MAX_NUM_BATCHED_TOKENS,
        max_tensor_parallel: GPUS_PER_NODE,
        aliases: &[
            "h10080gb",
            "h100sxm",
            "h100sxm80gb",
            "h100sxm5",
            "h10080gbhbm3",
        ],
    },
    HardwareProfile {
        name: "a100",
        display_name: "NVIDIA A100 SXM 80GB",
        peak_bf16_flops: 312e12,
        mem_bandwidth_bytes: 2.039e12,
        mem_bytes: 80e9,
        compute_efficiency: 0.65,
        bandwidth_efficiency: 0.8,
        interconnect: NVLINK3,
        default_max_num_seqs: OTHER_GPU_MAX_NUM_SEQS,
        default_max_num_batched_tokens: OTHER_GPU_MAX_NUM_BATCHED_TOKENS,
        max_tensor_parallel: GPUS_PER_NODE,
        aliases: &[
            "a10080gb",
            "a100sxm",
            "a100sxm80gb",
            "a100sxm4",
            "a100sxm480gb",
        ],
    },
    HardwareProfile {
        name: "a100-40gb",
        display_name: "NVIDIA A100 SXM 40GB",
        peak_bf16_flops: 312e12,
        mem_bandwidth_bytes: 1.555e12,
        mem_bytes: 40e9,
        compute_efficiency: 0.65,
        bandwidth_efficiency: 0.8,
        interconnect: NVLINK3,
        default_max_num_seqs: OTHER_GPU_MAX_NUM_SEQS,
        default_max_num_batched_tokens: OTHER_GPU_MAX_NUM_BATCHED_TOKENS,
        max_tensor_parallel: GPUS_PER_NODE,
        aliases: &["a100sxm40gb", "a100sxm440gb"],
    },
    HardwareProfile {
        name: "l4",
        display_name: "NVIDIA L4 24GB",
        peak_bf16_flops: 121e12,
        mem_bandwidth_bytes: 300e9,
        mem_bytes: 24e9,
        compute_efficiency: 0.6,
        bandwidth_efficiency: 0.8,
        interconnect: PCIE4,
        default_max_num_seqs: OTHER_GPU_MAX_NUM_SEQS,
        default_max_num_batched_tokens: OTHER_GPU_MAX_NUM_BATCHED_TOKENS,
        max_tensor_parallel: GPUS_PER_NODE,
        aliases: &["l424gb"],
    },
    HardwareProfile {
        name: "a10g",
        display_name: "NVIDIA A10G 24GB (AWS g5)",
        peak_bf16_flops: 70e12,
        mem_bandwidth_bytes: 600e9,
        mem_bytes: 24e9,
        compute_efficiency: 0.6,
        bandwidth_efficiency: 0.8,
        interconnect: PCIE4,
        default_max_num_seqs: OTHER_GPU_MAX_NUM_SEQS,
        default_max_num_batched_tokens: OTHER_GPU_MAX_NUM_BATCHED_TOKENS,
        max_tensor_parallel: GPUS_PER_NODE,
        aliases: &["a10g24gb"],
    },
    // The CPU profiles are calibrated on one published measurement:
    // LLaMA-3.1-8B in BF16 on a Threadripper PRO 5975WX, llama-bench tg128
    // at 1 and 2 threads with ggml's BF16 path (1.37 and 2.53 tokens/s), and
    // with faster kernels (2.06 and 3.21 tokens/s), from
    // github.com/ikawrakow/ik_llama.cpp/pull/175. The first give the FLOP/s
    // a thread achieves (compute_efficiency), the second a lower bound on
    // the bytes/s it can read (bandwidth_efficiency). See docs/simulator.md.
    HardwareProfile {
        name: "cpu-1t",
        display_name: "AMD Threadripper PRO 5975WX, llama.cpp on 1 thread",
        peak_bf16_flops: ZEN3_THREAD_FLOPS,
        mem_bandwidth_bytes: TR_PRO_5975WX_BANDWIDTH,
        mem_bytes: CPU_REPLICA_MEMORY,
        compute_efficiency: 0.143,
        bandwidth_efficiency: 0.151,
        interconnect: NO_LINK,
        default_max_num_seqs: LLAMA_CPP_SLOTS,
        default_max_num_batched_tokens: LLAMA_CPP_BATCH,
        max_tensor_parallel: 1,
        aliases: &["5975wx1t", "threadripperpro5975wx1t"],
    },
    HardwareProfile {
        name: "cpu-2t",
        display_name: "AMD Threadripper PRO 5975WX, llama.cpp on 2 threads",
        peak_bf16_flops: 2.0 * ZEN3_THREAD_FLOPS,
        mem_bandwidth_bytes: TR_PRO_5975WX_BANDWIDTH,
        mem_bytes: CPU_REPLICA_MEMORY,
        compute_efficiency: 0.132,
        bandwidth_efficiency: 0.235,
        interconnect: NO_LINK,
        default_max_num_seqs: LLAMA_CPP_SLOTS,
        default_max_num_batched_tokens: LLAMA_CPP_BATCH,
        max_tensor_parallel: 1,
        aliases: &["5975wx2t", "threadripperpro5975wx2t"],
    },
];

static MODELS: [ModelProfile; 4] = [
    ModelProfile {
        name: "llama-3.1-8b",
        hf_id: "meta-llama/Llama-3.1-8B-Instruct",
        params: 8.03e9,
        layers: 32,
        hidden: 4096,
        q_heads: 32,
        kv_heads: 8,
        head_dim: 128,
        ffn: 14336,
        vocab: 128_256,
        tied_embeddings: false,
        max_context: 131_072,
        default_tp: 1,
        aliases: &["llama3.18b", "llama318b"],
    },
    ModelProfile {
        name: "qwen3-32b",
        hf_id: "Qwen/Qwen3-32B",
        params: 32.76e9,
        layers: 64,
        hidden: 5120,
        q_heads: 64,
        kv_heads: 8,
        head_dim: 128,
        ffn: 25600,
        vocab: 151_936,
        tied_embeddings: false,
        max_context: 40_960,
        default_tp: 2,
        aliases: &["qwen332b"],
    },
    ModelProfile {
        name: "llama-3.1-70b",
        hf_id: "meta-llama/Llama-3.1-70B-Instruct",
        params: 70.55e9,
        layers: 80,
        hidden: 8192,
        q_heads: 64,
        kv_heads: 8,
        head_dim: 128,
        ffn: 28672,
        vocab: 128_256,
        tied_embeddings: false,
        max_context: 131_072,
        default_tp: 4,
        aliases: &["llama3.170b", "llama3170b"],
    },
    ModelProfile {
        name: "qwen2.5-0.5b",
        hf_id: "Qwen/Qwen2.5-0.5B-Instruct",
        params: 0.494e9,
        layers: 24,
        hidden: 896,
        q_heads: 14,
        kv_heads: 2,
        head_dim: 64,
        ffn: 4864,
        vocab: 151_936,
        tied_embeddings: true,
        max_context: 32_768,
        default_tp: 1,
        aliases: &[],
    },
];

const HARDWARE_NAMES: [&str; 7] = [
    "h100",
    "a100",
    "a100-40gb",
    "l4",
    "a10g",
    "cpu-1t",
    "cpu-2t",
];
const MODEL_NAMES: [&str; 4] = ["llama-3.1-8b", "qwen3-32b", "llama-3.1-70b", "qwen2.5-0.5b"];

/// Canonical names of the hardware profiles.
pub fn hardware_names() -> &'static [&'static str] {
    &HARDWARE_NAMES
}

/// Canonical names of the model profiles.
pub fn model_names() -> &'static [&'static str] {
    &MODEL_NAMES
}

/// Lowercase, keep only letters and digits, drop a leading "nvidia":
/// "NVIDIA H100-80GB" and "h100_80gb" both become "h10080gb".
pub fn normalize_hardware(name: &str) -> String {
    let flat: String = name
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    match flat.strip_prefix("nvidia") {
        Some(rest) => rest.to_owned(),
        None => flat,
    }
}

/// Lowercase, drop a Hugging Face organisation ("meta-llama/"), a "meta-"
/// prefix and an "-instruct" suffix, then keep letters, digits and dots:
/// "meta-llama/Meta-Llama-3.1-8B-Instruct" becomes "llama3.18b".
pub fn normalize_model(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    let base = lower.rsplit('/').next().unwrap_or(&lower);
    let base = base.strip_prefix("meta-").unwrap_or(base);
    let base = base.strip_suffix("-instruct").unwrap_or(base);
    base.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect()
}

/// Look a GPU up by name or alias ("h100", "H100-80GB", "nvidia-a10g").
pub fn hardware(name: &str) -> Option<&'static HardwareProfile> {
    let wanted = normalize_hardware(name);
    HARDWARE
        .iter()
        .find(|hw| normalize_hardware(hw.name) == wanted || hw.aliases.iter().any(|a| *a == wanted))
}

/// Look a model up by name, alias or Hugging Face id, case-insensitively
/// ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B").
pub fn model(name: &str) -> Option<&'static ModelProfile> {
    let wanted = normalize_model(name);
    MODELS.iter().find(|m| {
        normalize_model(m.name) == wanted
            || normalize_model(m.hf_id) == wanted
            || m.aliases.iter().any(|a| *a == wanted)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardware_lookup_accepts_aliases_and_case() {
        assert_eq!(hardware("h100").unwrap().name, "h100");
        assert_eq!(hardware("H100-80GB").unwrap().name, "h100");
        assert_eq!(hardware("nvidia-h100-sxm").unwrap().name, "h100");
        assert_eq!(hardware("A100").unwrap().name, "a100");
        assert_eq!(hardware("a100-80gb").unwrap().name, "a100");
        assert_eq!(hardware("a100-40gb").unwrap().name, "a100-40gb");
        assert_eq!(hardware("L4").unwrap().name, "l4");
        assert_eq!(hardware("a10g").unwrap().name, "a10g");
        assert!(
            hardware("a10").is_none(),
            "A10 is a different card from A10G"
        );
        assert!(hardware("tpu-v5").is_none());
    }

    #[test]
    fn every_listed_name_resolves() {
        for name in hardware_names() {
            assert_eq!(hardware(name).unwrap().name, *name);
        }
        for name in model_names() {
            assert_eq!(model(name).unwrap().name, *name);
        }
    }

    #[test]
    fn model_lookup_accepts_hf_ids() {
        assert_eq!(
            model("meta-llama/Llama-3.1-8B-Instruct").unwrap().name,
            "llama-3.1-8b"
        );
        assert_eq!(
            model("meta-llama/Meta-Llama-3.1-8B-Instruct").unwrap().name,
            "llama-3.1-8b"
        );
        assert_eq!(model("LLAMA-3.1-70B").unwrap().name, "llama-3.1-70b");
        assert_eq!(model("Qwen/Qwen3-32B").unwrap().name, "qwen3-32b");
        assert!(model("llama-3.1-405b").is_none());
        assert!(model("llama-3.1-8").is_none());
    }

    #[test]
    fn derived_sizes_match_the_reference_table() {
        let llama8 = model("llama-3.1-8b").unwrap();
        assert_eq!(llama8.kv_bytes_per_token(), 131_072.0);
        assert!((llama8.weight_bytes() / 1e9 - 16.06).abs() < 0.01);
        // 6.98 B parameters excluding the embedding table and LM head.
        let non_embedding = llama8.params - llama8.embedding_params() - llama8.lm_head_params();
        assert!((non_embedding / 1e9 - 6.98).abs() < 0.01);
        // Rank-16 adapter on all seven projections: ~42 M parameters.
        assert!((llama8.lora_adapter_params(16) / 1e6 - 41.9).abs() < 0.1);

        assert_eq!(
            model("llama-3.1-70b").unwrap().kv_bytes_per_token(),
            327_680.0
        );
        let qwen = model("qwen3-32b").unwrap();
        assert_eq!(qwen.kv_bytes_per_token(), 262_144.0);
        let qwen_non_embedding = qwen.params - qwen.embedding_params() - qwen.lm_head_params();
        assert!((qwen_non_embedding / 1e9 - 31.2).abs() < 0.05);
    }

    #[test]
    fn a_tied_head_is_counted_once_and_read_every_step() {
        let small = model("Qwen/Qwen2.5-0.5B-Instruct").unwrap();
        assert_eq!(small.name, "qwen2.5-0.5b");
        // The model card: 0.49 B parameters, 0.36 B of them non-embedding.
        let non_embedding = small.params - small.embedding_params();
        assert!(
            (non_embedding / 1e9 - 0.358).abs() < 0.002,
            "{non_embedding}"
        );
        // Every step multiplies by all of it: the shared table is the head.
        assert_eq!(small.matmul_params(), small.params);
        assert_eq!(small.kv_bytes_per_token(), 12_288.0);
        // An untied model reads its head but not its input table.
        let llama8 = model("llama-3.1-8b").unwrap();
        assert_eq!(
            llama8.matmul_params(),
            llama8.params - llama8.embedding_params()
        );
    }

    #[test]
    fn cpu_profiles_reproduce_the_measured_threads() {
        // LLaMA-3.1-8B BF16 decode on a Threadripper PRO 5975WX: ggml
        // reached 1.37 tokens/s on one thread and 2.53 on two, 15.04 GFLOP a
        // token; faster kernels read at least 2.06 and 3.21 tokens' weights
        // (15.01 GB each) a second.
        for (name, measured, read) in [("cpu-1t", 1.37, 2.06), ("cpu-2t", 2.53, 3.21)] {
            let cpu = hardware(name).unwrap();
            let flops = cpu.peak_bf16_flops * cpu.compute_efficiency;
            assert!((flops / (measured * 15.04e9) - 1.0).abs() < 0.01, "{name}");
            let bytes = cpu.mem_bandwidth_bytes * cpu.bandwidth_efficiency;
            assert!((bytes / (read * 15.01e9) - 1.0).abs() < 0.01, "{name}");
            // Fewer FLOP/s than bytes/s: a BF16 matrix-vector product (one
            // multiply-add per two-byte weight) is bound by the arithmetic.
            assert!(flops < bytes, "{name}");
            assert_eq!(cpu.max_tensor_parallel, 1);
        }
        assert_eq!(hardware("5975WX-2T").unwrap().name, "cpu-2t");
    }
}
