//! Engine configuration: vLLM's defaults for a hardware × model pair, and the
//! memory plan that decides whether the model fits and how much KV cache is
//! left.

use super::profiles::{self, HardwareProfile, ModelProfile};

/// Memory per GPU that vLLM's profiling run leaves to activations, CUDA
/// graphs and the sampler (reference/gpu-calibration.md §6: "~1.5 GB
/// activations/CUDA-graph reserve").
pub const ACTIVATION_RESERVE_BYTES: f64 = 1.5e9;
/// vLLM `CacheConfig.DEFAULT_BLOCK_SIZE`.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
/// vLLM `gpu_memory_utilization` default for most of its history (0.92 in
/// the newest releases).
pub const DEFAULT_GPU_MEMORY_UTILIZATION: f64 = 0.9;
/// vLLM `max_loras` default (adapters in one batch).
pub const DEFAULT_MAX_LORAS: u32 = 1;
/// vLLM `max_lora_rank` default; LoRA slots are sized for this rank.
pub const DEFAULT_MAX_LORA_RANK: u32 = 16;
/// Time to bring a non-resident adapter into a GPU slot. Measured loads range
/// from ~25–50 ms (PEFT) to 0.5–1 s (LoRAX before optimisation); 100 ms sits
/// between them. See docs/simulator.md.
pub const DEFAULT_LORA_LOAD_SECONDS: f64 = 0.1;
/// Host-side cost of one engine step (scheduling, input preparation,
/// sampling, output processing) that does not overlap the GPU work.
pub const DEFAULT_STEP_OVERHEAD_SECONDS: f64 = 1e-3;
/// Largest tensor-parallel group modelled: one node of eight GPUs.
pub const MAX_TENSOR_PARALLEL: u32 = 8;

/// How the engine orders its waiting and running requests, as vLLM's
/// `--scheduling-policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SchedulingPolicy {
    /// First come, first served (vLLM's default). A request's `priority`
    /// other than 0 is refused, as vLLM refuses it.
    #[default]
    Fcfs,
    /// By the request's `priority` (lower first), then arrival. A waiting
    /// request that does not fit in KV memory preempts running requests of
    /// a worse priority.
    Priority,
}

impl SchedulingPolicy {
    pub const ALL: [SchedulingPolicy; 2] = [SchedulingPolicy::Fcfs, SchedulingPolicy::Priority];

    /// vLLM's spelling: `fcfs`, `priority`.
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingPolicy::Fcfs => "fcfs",
            SchedulingPolicy::Priority => "priority",
        }
    }
}

impl std::fmt::Display for SchedulingPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SchedulingPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| format!("unknown scheduling policy {s:?} (expected fcfs or priority)"))
    }
}

/// Why a configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("unknown hardware {name:?}; known: {}", profiles::hardware_names().join(", "))]
    UnknownHardware { name: String },
    #[error("unknown model {name:?}; known: {}", profiles::model_names().join(", "))]
    UnknownModel { name: String },
    #[error("tensor_parallel {tensor_parallel} is not valid for {model}: {reason}")]
    InvalidTensorParallel {
        model: &'static str,
        tensor_parallel: u32,
        reason: String,
    },
    #[error(
        "{model} does not fit on {tensor_parallel} x {hardware}: it needs {needed_gb:.1} GB per GPU \
         ({weights_gb:.1} GB of BF16 weights / TP {tensor_parallel} + {reserve_gb:.1} GB activation reserve \
         + {lora_gb:.1} GB LoRA slots + room for the KV cache) but each GPU offers {available_gb:.1} GB \
         ({memory_gb:.1} GB x gpu_memory_utilization {utilization:.2}){}",
        suggestion(*.smallest_fitting_tp)
    )]
    DoesNotFit {
        model: &'static str,
        hardware: &'static str,
        tensor_parallel: u32,
        needed_gb: f64,
        weights_gb: f64,
        reserve_gb: f64,
        lora_gb: f64,
        available_gb: f64,
        memory_gb: f64,
        utilization: f64,
        smallest_fitting_tp: Option<u32>,
    },
    #[error("invalid {field}: {reason}")]
    InvalidSetting { field: &'static str, reason: String },
}

fn suggestion(tp: Option<u32>) -> String {
    match tp {
        Some(tp) => format!("; tensor_parallel {tp} would fit"),
        None => format!("; no tensor_parallel up to {MAX_TENSOR_PARALLEL} fits"),
    }
}

/// How one GPU's memory is spent (bytes). `kv_cache` is what remains and is
/// negative when the model does not fit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemoryPlan {
    /// `mem_bytes × gpu_memory_utilization`.
    pub usable: f64,
    pub weights: f64,
    pub activation_reserve: f64,
    /// Slots for `max_loras` adapters of `max_lora_rank`.
    pub lora_slots: f64,
    pub kv_cache: f64,
    /// Bytes one KV block occupies on one GPU.
    pub kv_block: f64,
}

/// Everything that shapes one simulated replica. Build it with
/// [`EngineConfig::new`] (vLLM defaults), then adjust fields as a server's
/// command line would, and call [`EngineConfig::validate`].
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub hardware: &'static HardwareProfile,
    pub model: &'static ModelProfile,
    pub tensor_parallel: u32,
    /// Most sequences in one batch.
    pub max_num_seqs: u32,
    /// Token budget of one step (chunked prefill).
    pub max_num_batched_tokens: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    pub gpu_memory_utilization: f64,
    pub enable_prefix_caching: bool,
    /// Distinct LoRA adapters in one batch (= GPU adapter slots); 0 disables
    /// LoRA, and adapter requests are rejected.
    pub max_loras: u32,
    pub max_lora_rank: u32,
    /// Longest prompt + output a request may ask for.
    pub max_model_len: u32,
    /// Added to the step that loads a non-resident adapter.
    pub lora_load_seconds: f64,
    /// Step-time multiplier (1.0 = normal); a fault-injection knob.
    pub slowdown: f64,
    /// Fixed host-side cost added to every step.
    pub step_overhead_seconds: f64,
    /// Use this many KV blocks instead of the memory plan's figure (vLLM's
    /// `--num-gpu-blocks-override`); for experiments and tests.
    pub num_gpu_blocks_override: Option<u64>,
    /// vLLM's `--scheduling-policy`.
    pub scheduling_policy: SchedulingPolicy,
}

impl EngineConfig {
    /// vLLM's OpenAI-server defaults for this hardware and model.
    /// `tensor_parallel: None` uses the model's default TP. Fails with a
    /// message naming the memory needed and available when the model does
    /// not fit, and on unknown names. `max_model_len` is the model's context
    /// length, lowered to what the KV cache can hold (what an operator does
    /// when vLLM refuses to start with the full length).
    pub fn new(
        hardware: &str,
        model: &str,
        tensor_parallel: Option<u32>,
    ) -> Result<Self, ProfileError> {
        let hw = profiles::hardware(hardware).ok_or_else(|| ProfileError::UnknownHardware {
            name: hardware.to_owned(),
        })?;
        let m = profiles::model(model).ok_or_else(|| ProfileError::UnknownModel {
            name: model.to_owned(),
        })?;
        let tp = tensor_parallel.unwrap_or(m.default_tp);
        check_tensor_parallel(hw, m, tp)?;
        let max_num_batched_tokens = hw.default_max_num_batched_tokens;
        let mut cfg = EngineConfig {
            hardware: hw,
            model: m,
            tensor_parallel: tp,
            max_num_seqs: hw.default_max_num_seqs.min(max_num_batched_tokens),
            max_num_batched_tokens,
            block_size: DEFAULT_BLOCK_SIZE,
            gpu_memory_utilization: DEFAULT_GPU_MEMORY_UTILIZATION,
            enable_prefix_caching: true,
            max_loras: DEFAULT_MAX_LORAS,
            max_lora_rank: DEFAULT_MAX_LORA_RANK,
            max_model_len: m.max_context,
            lora_load_seconds: DEFAULT_LORA_LOAD_SECONDS,
            slowdown: 1.0,
            step_overhead_seconds: DEFAULT_STEP_OVERHEAD_SECONDS,
            num_gpu_blocks_override: None,
            scheduling_policy: SchedulingPolicy::default(),
        };
        cfg.check_fits()?;
        cfg.max_model_len = cfg.max_model_len.min(cfg.kv_capacity_tokens());
        Ok(cfg)
    }

    /// How one GPU's memory is divided between weights, reserves and KV.
    pub fn memory_plan(&self) -> MemoryPlan {
        let tp = f64::from(self.tensor_parallel.max(1));
        let usable = self.hardware.mem_bytes * self.gpu_memory_utilization;
        let weights = self.model.weight_bytes() / tp;
        let lora_slots = if self.max_loras == 0 {
            0.0
        } else {
            f64::from(self.max_loras) * self.model.lora_adapter_bytes(self.max_lora_rank) / tp
        };
        let kv_cache = usable - weights - ACTIVATION_RESERVE_BYTES - lora_slots;
        MemoryPlan {
            usable,
            weights,
            activation_reserve: ACTIVATION_RESERVE_BYTES,
            lora_slots,
            kv_cache,
            kv_block: f64::from(self.block_size.max(1)) * self.kv_bytes_per_token_per_gpu(),
        }
    }

    /// KV bytes one token occupies on one GPU. KV heads are split across the
    /// tensor-parallel group (replicated when TP exceeds the KV heads).
    pub fn kv_bytes_per_token_per_gpu(&self) -> f64 {
        let tp = self.tensor_parallel.max(1);
        let heads_per_gpu = self.model.kv_heads.div_ceil(tp);
        self.model.kv_bytes_per_token() * f64::from(heads_per_gpu) / f64::from(self.model.kv_heads)
    }

    /// KV-cache capacity in blocks (each GPU of the group holds its shard of
    /// every block, so this is also the replica's capacity).
    pub fn num_gpu_blocks(&self) -> u64 {
        self.num_gpu_blocks_override
            .unwrap_or_else(|| self.memory_blocks())
    }

    /// Blocks the memory left after weights and reserves can hold.
    fn memory_blocks(&self) -> u64 {
        let plan = self.memory_plan();
        if plan.kv_cache <= 0.0 || plan.kv_block <= 0.0 {
            return 0;
        }
        (plan.kv_cache / plan.kv_block).floor() as u64
    }

    /// KV-cache capacity in tokens.
    pub fn kv_capacity_tokens(&self) -> u32 {
        let tokens = self.num_gpu_blocks() * u64::from(self.block_size.max(1));
        u32::try_from(tokens).unwrap_or(u32::MAX)
    }

    /// Check every field, as vLLM does at start-up.
    pub fn validate(&self) -> Result<(), ProfileError> {
        check_tensor_parallel(self.hardware, self.model, self.tensor_parallel)?;
        let invalid = |field, reason: &str| {
            Err(ProfileError::InvalidSetting {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.max_num_seqs == 0 {
            return invalid("max_num_seqs", "must be at least 1");
        }
        if self.max_num_batched_tokens < self.max_num_seqs {
            return Err(ProfileError::InvalidSetting {
                field: "max_num_batched_tokens",
                reason: format!(
                    "{} must be at least max_num_seqs ({})",
                    self.max_num_batched_tokens, self.max_num_seqs
                ),
            });
        }
        if self.block_size == 0 {
            return invalid("block_size", "must be at least 1");
        }
        if !(self.gpu_memory_utilization > 0.0 && self.gpu_memory_utilization <= 1.0) {
            return invalid("gpu_memory_utilization", "must be in (0, 1]");
        }
        if !(self.slowdown.is_finite() && self.slowdown > 0.0) {
            return invalid("slowdown", "must be a positive number");
        }
        if !(self.lora_load_seconds.is_finite() && self.lora_load_seconds >= 0.0) {
            return invalid("lora_load_seconds", "must be zero or positive");
        }
        if !(self.step_overhead_seconds.is_finite() && self.step_overhead_seconds >= 0.0) {
            return invalid("step_overhead_seconds", "must be zero or positive");
        }
        if self.max_loras > 0 && self.max_lora_rank == 0 {
            return invalid("max_lora_rank", "must be at least 1 when LoRA is enabled");
        }
        self.check_fits()?;
        if self.max_model_len == 0 {
            return invalid("max_model_len", "must be at least 1");
        }
        if self.max_model_len > self.kv_capacity_tokens() {
            return Err(ProfileError::InvalidSetting {
                field: "max_model_len",
                reason: format!(
                    "{} tokens exceed the KV cache ({} tokens); lower max_model_len or raise \
                     gpu_memory_utilization",
                    self.max_model_len,
                    self.kv_capacity_tokens()
                ),
            });
        }
        Ok(())
    }

    /// Fails unless the weights, the reserves and at least one KV block fit.
    fn check_fits(&self) -> Result<(), ProfileError> {
        if self.memory_blocks() > 0 {
            return Ok(());
        }
        let plan = self.memory_plan();
        let smallest_fitting_tp = [1, 2, 4, 8]
            .into_iter()
            .filter(|tp| check_tensor_parallel(self.hardware, self.model, *tp).is_ok())
            .find(|tp| {
                let candidate = EngineConfig {
                    tensor_parallel: *tp,
                    ..self.clone()
                };
                candidate.memory_blocks() > 0
            });
        Err(ProfileError::DoesNotFit {
            model: self.model.name,
            hardware: self.hardware.display_name,
            tensor_parallel: self.tensor_parallel,
            needed_gb: (plan.weights + plan.activation_reserve + plan.lora_slots + plan.kv_block)
                / 1e9,
            weights_gb: self.model.weight_bytes() / 1e9,
            reserve_gb: plan.activation_reserve / 1e9,
            lora_gb: plan.lora_slots / 1e9,
            available_gb: plan.usable / 1e9,
            memory_gb: self.hardware.mem_bytes / 1e9,
            utilization: self.gpu_memory_utilization,
            smallest_fitting_tp,
        })
    }
}

/// Attention heads must split evenly across the group, one node holds at
/// most eight GPUs, and a CPU runs alone.
fn check_tensor_parallel(
    hardware: &'static HardwareProfile,
    model: &'static ModelProfile,
    tp: u32,
) -> Result<(), ProfileError> {
    let reason = if tp == 0 {
        Some("must be at least 1".to_owned())
    } else if hardware.max_tensor_parallel <= 1 && tp > 1 {
        Some(format!("{} runs on one processor", hardware.name))
    } else if tp > MAX_TENSOR_PARALLEL.min(hardware.max_tensor_parallel) {
        Some(format!(
            "at most {MAX_TENSOR_PARALLEL} GPUs (one node) are modelled"
        ))
    } else if !model.q_heads.is_multiple_of(tp) {
        Some(format!(
            "{} attention heads do not split evenly",
            model.q_heads
        ))
    } else if !model.kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(model.kv_heads) {
        Some(format!("{} KV heads do not split evenly", model.kv_heads))
    } else {
        None
    };
    match reason {
        Some(reason) => Err(ProfileError::InvalidTensorParallel {
            model: model.name,
            tensor_parallel: tp,
            reason,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_vllm_per_gpu_class() {
        let h100 = EngineConfig::new("h100", "llama-3.1-8b", None).unwrap();
        assert_eq!(h100.tensor_parallel, 1);
        assert_eq!(h100.max_num_seqs, 1024);
        assert_eq!(h100.max_num_batched_tokens, 8192);
        assert_eq!(h100.block_size, 16);
        assert!(h100.enable_prefix_caching);
        h100.validate().unwrap();

        let a100 = EngineConfig::new("a100", "llama-3.1-8b", None).unwrap();
        assert_eq!(a100.max_num_seqs, 256);
        assert_eq!(a100.max_num_batched_tokens, 2048);

        let seventy = EngineConfig::new("h100", "llama-3.1-70b", None).unwrap();
        assert_eq!(seventy.tensor_parallel, 4);
        seventy.validate().unwrap();
    }

    #[test]
    fn kv_capacity_matches_the_worked_example() {
        // reference §6: ~415k tokens on an H100 and ~31k on a 24 GB card for
        // Llama-3.1-8B (weights 16.06 GB, 1.5 GB reserve, utilisation 0.9).
        let h100 = EngineConfig::new("h100", "llama-3.1-8b", Some(1)).unwrap();
        let tokens = h100.kv_capacity_tokens();
        assert!((405_000..420_000).contains(&tokens), "{tokens}");
        let a10g = EngineConfig::new("a10g", "llama-3.1-8b", Some(1)).unwrap();
        let tokens = a10g.kv_capacity_tokens();
        assert!((29_000..32_000).contains(&tokens), "{tokens}");
        // The 128k context does not fit a 24 GB card: lowered to capacity.
        assert_eq!(a10g.max_model_len, a10g.kv_capacity_tokens());
        assert_eq!(h100.max_model_len, 131_072);
    }

    #[test]
    fn tensor_parallel_splits_weights_and_kv() {
        let tp1 = EngineConfig::new("h100", "qwen3-32b", Some(1)).unwrap();
        let tp2 = EngineConfig::new("h100", "qwen3-32b", Some(2)).unwrap();
        assert!(tp2.memory_plan().weights * 2.0 - tp1.memory_plan().weights < 1.0);
        assert_eq!(
            tp2.kv_bytes_per_token_per_gpu() * 2.0,
            tp1.kv_bytes_per_token_per_gpu()
        );
        assert!(tp2.num_gpu_blocks() > 4 * tp1.num_gpu_blocks());
    }

    #[test]
    fn seventy_b_on_one_a10g_is_refused_with_the_numbers() {
        let err = EngineConfig::new("a10g", "llama-3.1-70b", Some(1)).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, ProfileError::DoesNotFit { .. }), "{message}");
        assert!(message.contains("141.1 GB"), "{message}");
        assert!(message.contains("21.6 GB"), "{message}");
        assert!(message.contains("tensor_parallel 8 would fit"), "{message}");
        // The default TP (4) does not fit a 24 GB card either.
        assert!(EngineConfig::new("l4", "llama-3.1-70b", None).is_err());
        assert!(EngineConfig::new("a10g", "llama-3.1-70b", Some(8)).is_ok());
    }

    #[test]
    fn unknown_names_and_bad_tp_are_refused() {
        let err = EngineConfig::new("tpu", "llama-3.1-8b", None).unwrap_err();
        assert!(
            err.to_string().contains("h100"),
            "lists the known names: {err}"
        );
        assert!(matches!(
            EngineConfig::new("h100", "gpt-5", None),
            Err(ProfileError::UnknownModel { .. })
        ));
        assert!(matches!(
            EngineConfig::new("h100", "llama-3.1-8b", Some(3)),
            Err(ProfileError::InvalidTensorParallel { .. })
        ));
        assert!(matches!(
            EngineConfig::new("h100", "llama-3.1-8b", Some(16)),
            Err(ProfileError::InvalidTensorParallel { .. })
        ));
    }

    #[test]
    fn a_cpu_replica_runs_a_small_model_alone() {
        let cpu = EngineConfig::new("cpu-2t", "qwen2.5-0.5b", None).unwrap();
        cpu.validate().unwrap();
        assert_eq!(cpu.tensor_parallel, 1);
        assert_eq!(cpu.max_num_seqs, 4, "llama-server slots");
        assert_eq!(cpu.max_model_len, 32_768);
        let err = EngineConfig::new("cpu-1t", "qwen2.5-0.5b", Some(2)).unwrap_err();
        assert!(
            err.to_string().contains("cpu-1t runs on one processor"),
            "{err}"
        );
        // Too big for the replica's RAM: no tensor-parallel group helps.
        let err = EngineConfig::new("cpu-1t", "llama-3.1-70b", Some(1)).unwrap_err();
        assert!(
            err.to_string().contains("no tensor_parallel up to 8 fits"),
            "{err}"
        );
    }

    #[test]
    fn validate_catches_settings_vllm_refuses() {
        let mut cfg = EngineConfig::new("h100", "llama-3.1-8b", None).unwrap();
        cfg.max_num_batched_tokens = 512;
        assert!(cfg.validate().is_err(), "budget below max_num_seqs");
        cfg.max_num_seqs = 256;
        cfg.validate().unwrap();
        cfg.gpu_memory_utilization = 1.5;
        assert!(cfg.validate().is_err());
        cfg.gpu_memory_utilization = 0.9;
        cfg.max_model_len = cfg.kv_capacity_tokens() + 1;
        assert!(cfg.validate().is_err());
    }
}
