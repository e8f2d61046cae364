//! Roofline step-time model.
//!
//! One engine step runs one forward pass over every token scheduled in it
//! (prefill chunks and one token per decoding sequence). Its GPU time is the
//! larger of the compute time and the memory time — whichever resource the
//! step saturates — plus the tensor-parallel all-reduces, which sit on the
//! critical path between layers, plus a fixed host-side overhead:
//!
//! ```text
//! compute  = FLOPs / (peak_bf16_flops × TP × compute_efficiency)
//! memory   = bytes per GPU / (mem_bandwidth × bandwidth_efficiency)
//! step     = max(compute, memory) + all-reduce time + step overhead
//! ```
//!
//! On a GPU, prefill chunks of hundreds of tokens land on the compute side,
//! decode batches on the memory side (weights plus the KV cache they read),
//! so a decode batch costs little more than one sequence until it holds
//! hundreds. On the CPU profiles a thread's arithmetic is slower than its
//! memory, so even a decode of one sequence is compute-bound and a batch of
//! `b` costs nearly `b` times one.

use super::config::EngineConfig;

/// What one step computes, summed over the requests scheduled in it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepLoad {
    /// Tokens run through the model (prefill chunk tokens + one per decode).
    pub tokens: u64,
    /// Sequences that sample a token at the end of the step (LM-head rows).
    pub sampled: u64,
    /// Σ over computed tokens of the context length each attends to.
    pub attention_pairs: f64,
    /// KV-cache tokens already stored that the step reads.
    pub kv_tokens_read: u64,
    /// Tokens computed for requests that use a LoRA adapter.
    pub lora_tokens: u64,
    /// Distinct adapters whose weights the step reads.
    pub adapters: u32,
}

impl StepLoad {
    /// Account one request's share of a step: `new_tokens` computed on top
    /// of `computed_before` tokens already in its KV cache.
    pub fn add_chunk(&mut self, computed_before: u32, new_tokens: u32, samples: bool, lora: bool) {
        let before = f64::from(computed_before);
        let new = f64::from(new_tokens);
        self.tokens += u64::from(new_tokens);
        self.sampled += u64::from(samples);
        // Token i of the chunk (1-based) attends to before + i positions.
        self.attention_pairs += new * before + new * (new + 1.0) / 2.0;
        self.kv_tokens_read += u64::from(computed_before);
        if lora {
            self.lora_tokens += u64::from(new_tokens);
        }
    }
}

/// Where a step's time goes, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTime {
    pub compute: f64,
    pub memory: f64,
    pub communication: f64,
    pub overhead: f64,
}

impl StepTime {
    /// Step duration: the bound resource, then the serial parts.
    pub fn total(&self) -> f64 {
        self.compute.max(self.memory) + self.communication + self.overhead
    }

    /// True when the step is limited by FLOPs rather than bytes.
    pub fn compute_bound(&self) -> bool {
        self.compute >= self.memory
    }
}

/// Per-configuration constants of the roofline, computed once.
#[derive(Clone, Debug)]
pub struct Roofline {
    /// FLOPs per token through every matmul except the LM head.
    body_flops_per_token: f64,
    /// FLOPs per sampled row through the LM head.
    head_flops_per_sample: f64,
    attention_flops_per_pair: f64,
    lora_flops_per_token: f64,
    /// Aggregate FLOP/s of the tensor-parallel group at the modelled efficiency.
    group_flops: f64,
    weight_bytes_per_gpu: f64,
    kv_bytes_per_token_per_gpu: f64,
    lora_bytes_per_adapter_per_gpu: f64,
    /// Achieved bytes/s of one GPU.
    gpu_bandwidth: f64,
    tensor_parallel: u32,
    /// All-reduces per forward pass (after attention and after the MLP).
    allreduces_per_step: f64,
    /// Bytes of one token's hidden state.
    activation_bytes_per_token: f64,
    link_bandwidth: f64,
    allreduce_latency: f64,
    overhead: f64,
}

impl Roofline {
    pub fn new(cfg: &EngineConfig) -> Self {
        let model = cfg.model;
        let hw = cfg.hardware;
        let tp = cfg.tensor_parallel.max(1);
        let head = model.lm_head_params();
        let rank = cfg.max_lora_rank;
        Roofline {
            body_flops_per_token: 2.0 * (model.matmul_params() - head),
            head_flops_per_sample: 2.0 * head,
            attention_flops_per_pair: model.attention_flops_per_pair(),
            lora_flops_per_token: 2.0 * model.lora_adapter_params(rank),
            group_flops: hw.peak_bf16_flops * f64::from(tp) * hw.compute_efficiency,
            weight_bytes_per_gpu: model.matmul_params() * super::profiles::BF16_BYTES
                / f64::from(tp),
            kv_bytes_per_token_per_gpu: cfg.kv_bytes_per_token_per_gpu(),
            lora_bytes_per_adapter_per_gpu: model.lora_adapter_bytes(rank) / f64::from(tp),
            gpu_bandwidth: hw.mem_bandwidth_bytes * hw.bandwidth_efficiency,
            tensor_parallel: tp,
            allreduces_per_step: 2.0 * f64::from(model.layers),
            activation_bytes_per_token: f64::from(model.hidden) * super::profiles::BF16_BYTES,
            link_bandwidth: hw.interconnect.bandwidth_bytes,
            allreduce_latency: hw.interconnect.allreduce_latency_seconds,
            overhead: cfg.step_overhead_seconds,
        }
    }

    /// Time of one step, broken down.
    pub fn breakdown(&self, load: &StepLoad) -> StepTime {
        let flops = self.body_flops_per_token * load.tokens as f64
            + self.head_flops_per_sample * load.sampled as f64
            + self.attention_flops_per_pair * load.attention_pairs
            + self.lora_flops_per_token * load.lora_tokens as f64;
        // Every GPU streams its weight shard once per step, reads the KV its
        // heads attend to, and writes the KV of the new tokens.
        let bytes = self.weight_bytes_per_gpu
            + self.kv_bytes_per_token_per_gpu * (load.kv_tokens_read + load.tokens) as f64
            + self.lora_bytes_per_adapter_per_gpu * f64::from(load.adapters);
        let communication = if self.tensor_parallel > 1 {
            // Ring all-reduce: each GPU sends and receives 2(n-1)/n of the message.
            let n = f64::from(self.tensor_parallel);
            let message = self.activation_bytes_per_token * load.tokens as f64;
            let transfer = 2.0 * (n - 1.0) / n * message / self.link_bandwidth;
            self.allreduces_per_step * (self.allreduce_latency + transfer)
        } else {
            0.0
        };
        StepTime {
            compute: flops / self.group_flops,
            memory: bytes / self.gpu_bandwidth,
            communication,
            overhead: self.overhead,
        }
    }

    /// Duration of one step in seconds (before any slowdown factor).
    pub fn step_seconds(&self, load: &StepLoad) -> f64 {
        self.breakdown(load).total()
    }

    /// Duration of a step that prefills `tokens` new prompt tokens of one
    /// request on top of `cached` tokens, and samples its first token.
    pub fn prefill_seconds(&self, cached: u32, tokens: u32) -> f64 {
        let mut load = StepLoad::default();
        load.add_chunk(cached, tokens, true, false);
        self.step_seconds(&load)
    }

    /// Duration of a decode step of `batch` sequences with `context` tokens
    /// each.
    pub fn decode_seconds(&self, batch: u32, context: u32) -> f64 {
        let mut load = StepLoad::default();
        for _ in 0..batch {
            load.add_chunk(context, 1, true, false);
        }
        self.step_seconds(&load)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roofline(hw: &str, model: &str, tp: u32) -> Roofline {
        let mut cfg = EngineConfig::new(hw, model, Some(tp)).unwrap();
        cfg.step_overhead_seconds = 0.0;
        Roofline::new(&cfg)
    }

    #[test]
    fn prefill_is_compute_bound_and_decode_memory_bound() {
        let r = roofline("h100", "llama-3.1-8b", 1);
        let mut prefill = StepLoad::default();
        prefill.add_chunk(0, 2048, true, false);
        assert!(r.breakdown(&prefill).compute_bound());
        let mut decode = StepLoad::default();
        for _ in 0..8 {
            decode.add_chunk(1000, 1, true, false);
        }
        assert!(!r.breakdown(&decode).compute_bound());
    }

    #[test]
    fn single_token_decode_matches_weights_over_bandwidth() {
        // Llama-3.1-8B streams 15.0 GB of matmul weights per step (all but
        // the 0.53 B-parameter embedding table).
        let r = roofline("h100", "llama-3.1-8b", 1);
        let expected = 15.007e9 / (3.35e12 * 0.8);
        let got = r.decode_seconds(1, 0);
        assert!((got / expected - 1.0).abs() < 0.01, "{got} vs {expected}");
    }

    #[test]
    fn long_prefill_matches_flops_over_peak() {
        let r = roofline("a100", "llama-3.1-8b", 1);
        let tokens = 2048.0;
        let body = 2.0 * 6.98e9 * tokens;
        let attention = 4.0 * 32.0 * 4096.0 * tokens * (tokens + 1.0) / 2.0;
        let head = 2.0 * 128_256.0 * 4096.0;
        let expected = (body + attention + head) / (312e12 * 0.65);
        let got = r.prefill_seconds(0, 2048);
        assert!((got / expected - 1.0).abs() < 0.01, "{got} vs {expected}");
    }

    #[test]
    fn tensor_parallel_adds_allreduce_time() {
        let tp4 = roofline("h100", "llama-3.1-70b", 4);
        let mut load = StepLoad::default();
        load.add_chunk(100, 1, true, false);
        let t = tp4.breakdown(&load);
        // 160 all-reduces of a tiny message cost about 160 × 10 µs.
        assert!((t.communication - 160.0 * 10e-6).abs() < 1e-4, "{t:?}");
        let tp1 = roofline("h100", "llama-3.1-8b", 1);
        assert_eq!(tp1.breakdown(&load).communication, 0.0);
    }

    /// A replica's roofline as the engine runs it (with the step overhead).
    fn engine_roofline(hw: &str, model: &str) -> Roofline {
        Roofline::new(&EngineConfig::new(hw, model, None).unwrap())
    }

    #[test]
    fn a_cpu_pays_for_every_sequence_in_a_batch_and_a_gpu_does_not() {
        for hw in ["cpu-1t", "cpu-2t"] {
            let cpu = engine_roofline(hw, "qwen2.5-0.5b");
            let one = cpu.decode_seconds(1, 500);
            let mut load = StepLoad::default();
            load.add_chunk(500, 1, true, false);
            assert!(cpu.breakdown(&load).compute_bound(), "{hw}");
            for batch in 2..=8 {
                let ratio = cpu.decode_seconds(batch, 500) / one;
                let b = f64::from(batch);
                assert!(
                    ratio > 0.93 * b && ratio <= b,
                    "{hw}: batch {batch} costs {ratio:.2} times one"
                );
            }
        }
        for model in ["qwen2.5-0.5b", "llama-3.1-8b"] {
            let h100 = engine_roofline("h100", model);
            let ratio = h100.decode_seconds(4, 500) / h100.decode_seconds(1, 500);
            assert!(ratio < 1.02, "{model} on an H100: {ratio:.3}");
            let ratio = h100.decode_seconds(64, 500) / h100.decode_seconds(1, 500);
            assert!(ratio < 1.5, "{model} on an H100: {ratio:.3}");
        }
    }

    #[test]
    fn a_small_model_answers_in_seconds_on_a_cpu() {
        // A 200-token prompt and a 100-token answer, alone on the replica.
        let alone = |r: &Roofline| {
            r.prefill_seconds(0, 200) + (1..100).map(|i| r.decode_seconds(1, 200 + i)).sum::<f64>()
        };
        let slow = alone(&engine_roofline("cpu-1t", "qwen2.5-0.5b"));
        let fast = alone(&engine_roofline("cpu-2t", "qwen2.5-0.5b"));
        assert!((5.0..20.0).contains(&slow), "{slow} s on one thread");
        assert!((2.5..10.0).contains(&fast), "{fast} s on two threads");
        // Two threads are nearly twice as fast (1.85x in the measurement).
        assert!((1.7..2.0).contains(&(slow / fast)), "{}", slow / fast);
    }

    #[test]
    fn kv_reads_grow_decode_time() {
        let r = roofline("h100", "llama-3.1-8b", 1);
        let short = r.decode_seconds(64, 100);
        let long = r.decode_seconds(64, 4000);
        // 64 × 3,900 extra tokens × 128 KiB = 32.7 GB more to read.
        let extra = 64.0 * 3900.0 * 131_072.0 / (3.35e12 * 0.8);
        assert!(((long - short) / extra - 1.0).abs() < 0.02);
    }
}
