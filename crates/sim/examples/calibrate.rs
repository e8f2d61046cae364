//! Prints the engine model's side of the calibration tables in
//! docs/simulator.md, next to the published figures they are compared with.
//!
//! cargo run -p infergate-sim --release --example calibrate
//!
//! Published figures come from reference/gpu-calibration.md (§3); each table
//! names its source. Everything here is deterministic.

use sim::engine::calibration::{LoadReport, Workload, burst, closed_loop};
use sim::engine::timing::Roofline;
use sim::engine::{Engine, EngineConfig, HardwareProfile};

/// Requests per client in closed-loop runs: enough for the clients to fall
/// out of the lockstep of their simultaneous start.
const ROUNDS: u32 = 20;

fn config(hw: &str, model: &str, tp: u32) -> EngineConfig {
    EngineConfig::new(hw, model, Some(tp)).expect("calibration configs fit")
}

fn ms(seconds: f64) -> f64 {
    seconds * 1e3
}

fn ratio(model: f64, published: f64) -> String {
    format!("{:.2}", model / published)
}

fn describe(cfg: &EngineConfig) -> String {
    format!(
        "{} on {} x {} (TP {}), max_num_seqs {}, max_num_batched_tokens {}, {} KV blocks",
        cfg.model.name,
        cfg.tensor_parallel,
        cfg.hardware.display_name,
        cfg.tensor_parallel,
        cfg.max_num_seqs,
        cfg.max_num_batched_tokens,
        cfg.num_gpu_blocks()
    )
}

/// NIM 1.8.0, Llama-3.3-70B-Instruct, 2 x H100 FP8 TP2, 5,000 in / 500 out.
fn nim_70b_sweep() {
    const PUBLISHED: [(u32, f64, f64, f64); 8] = [
        (1, 406.77, 18.58, 51.67),
        (5, 546.7, 21.83, 218.48),
        (25, 688.69, 38.75, 623.4),
        (50, 834.51, 59.73, 814.37),
        (100, 7996.25, 92.91, 917.26),
        (150, 34794.22, 92.86, 920.9),
        (200, 61680.22, 93.06, 920.54),
        (250, 88605.32, 93.2, 920.12),
    ];
    let cfg = config("h100", "llama-3.1-70b", 4);
    println!("### Llama-70B, H100, 5,000 in / 500 out, closed loop\n");
    println!("Model: {}.", describe(&cfg));
    println!(
        "Published: NVIDIA NIM 1.8.0, Llama-3.3-70B-Instruct, 2 x H100 FP8 TP2 (same weight bytes \
         per GPU and same aggregate tensor FLOP/s as BF16 TP4).\n"
    );
    println!(
        "| concurrency | TTFT model (ms) | TTFT NIM (ms) | ratio | ITL model (ms) | ITL NIM (ms) | ratio | out tok/s model | out tok/s NIM | ratio | preemptions |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let work = Workload {
        prompt_tokens: 5000,
        output_tokens: 500,
    };
    for (c, ttft, itl, tps) in PUBLISHED {
        let r = closed_loop(&cfg, c, work, ROUNDS);
        println!(
            "| {c} | {:.0} | {ttft:.0} | {} | {:.1} | {itl:.1} | {} | {:.0} | {tps:.0} | {} | {} |",
            ms(r.ttft_mean),
            ratio(r.ttft_mean, ttft / 1e3),
            ms(r.itl_mean),
            ratio(r.itl_mean, itl / 1e3),
            r.output_tokens_per_second,
            ratio(r.output_tokens_per_second, tps),
            r.preemptions
        );
    }
    println!();
}

/// vLLM, A100 40GB, Llama-3.1-8B BF16, 1,024 in / 128 out (johnmusgrave.com).
fn a100_40gb_sweep() {
    let cfg = config("a100-40gb", "llama-3.1-8b", 1);
    let work = Workload {
        prompt_tokens: 1024,
        output_tokens: 128,
    };
    println!("### Llama-3.1-8B, A100 40GB, 1,024 in / 128 out, closed loop\n");
    println!("Model: {}.", describe(&cfg));
    println!(
        "Published: vLLM `bench serve`, BF16 (independent blog; c=1 ~75 out tok/s; c=8 ~6.6x c=1).\n"
    );
    println!(
        "| concurrency | TTFT model (ms) | ITL model (ms) | out tok/s model | out tok/s published | ratio |"
    );
    println!("|---|---|---|---|---|---|");
    let c1 = closed_loop(&cfg, 1, work, ROUNDS);
    let c8 = closed_loop(&cfg, 8, work, ROUNDS);
    let row = |c: u32, r: &LoadReport, published: f64| {
        println!(
            "| {c} | {:.1} | {:.2} | {:.1} | {published:.0} | {} |",
            ms(r.ttft_mean),
            ms(r.itl_mean),
            r.output_tokens_per_second,
            ratio(r.output_tokens_per_second, published)
        );
    };
    row(1, &c1, 75.0);
    row(8, &c8, 6.6 * 75.0);
    println!(
        "\nModel c=8 / c=1 throughput: {:.2}x (published ~6.6x).\n",
        c8.output_tokens_per_second / c1.output_tokens_per_second
    );
}

/// Batch-1 first-token latency, TensorRT-LLM docs, A100 FP16 LLaMA-7B.
fn single_prompt_ttft() {
    println!("### Batch-1 time to first token\n");
    println!(
        "Published: TensorRT-LLM performance table (v0.5-0.6), LLaMA-7B FP16 on A100 (6.74 B \
         parameters; the model runs Llama-3.1-8B, whose per-token matmul FLOPs are 8% higher \
         and whose 128k-vocabulary LM head is larger).\n"
    );
    println!("| GPU | prompt | TTFT model, 8B (ms) | TTFT published, 7B (ms) | ratio |");
    println!("|---|---|---|---|---|");
    for (hw, prompt, published) in [("a100", 128u32, 16.0), ("a100", 2048, 133.0)] {
        let cfg = config(hw, "llama-3.1-8b", 1);
        let r = burst(
            &cfg,
            1,
            Workload {
                prompt_tokens: prompt,
                output_tokens: 1,
            },
        );
        println!(
            "| {} | {prompt} | {:.1} | {published:.0} | {} |",
            cfg.hardware.display_name,
            ms(r.ttft_mean),
            ratio(ms(r.ttft_mean), published)
        );
    }
    println!();
}

/// Batch-1 decode step against single-GPU measurements.
fn batch_one_decode() {
    println!("### Batch-1 decode step (inter-token latency)\n");
    println!("| GPU | model | ITL model (ms) | published (ms) | ratio | published run |");
    println!("|---|---|---|---|---|---|");
    let rows: [(&str, &str, u32, f64, &str); 4] = [
        (
            "a100-40gb",
            "llama-3.1-8b",
            1,
            13.3,
            "vLLM, Llama-3.1-8B BF16, 75 tok/s at c=1",
        ),
        (
            "a10g",
            "llama-3.1-8b",
            1,
            27.0,
            "LMDeploy, LLaMA-2-7B FP16 on A10 (same 600 GB/s)",
        ),
        (
            "h100",
            "llama-3.1-8b",
            1,
            4.63,
            "NIM 1.8.0 Llama-3.1-8B c=1 (hardware/precision unstated)",
        ),
        (
            "h100",
            "llama-3.1-70b",
            4,
            18.58,
            "NIM 1.8.0 Llama-3.3-70B FP8 TP2 c=1",
        ),
    ];
    for (hw, model, tp, published, run) in rows {
        let cfg = config(hw, model, tp);
        let r = closed_loop(
            &cfg,
            1,
            Workload {
                prompt_tokens: 128,
                output_tokens: 256,
            },
            3,
        );
        println!(
            "| {} x{tp} | {model} | {:.2} | {published:.2} | {} | {run} |",
            cfg.hardware.display_name,
            ms(r.itl_mean),
            ratio(ms(r.itl_mean), published)
        );
    }
    println!();
}

/// Offline bursts: every request at time zero.
fn offline_bursts() {
    println!("### Offline bursts (all requests at t = 0)\n");
    println!(
        "| setup | requests | in / out | out tok/s model | out tok/s published | ratio | req/s model | req/s published | mean TTFT model (s) | mean TTFT published (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    // vLLM 0.6.6 benchmark_throughput, 4 x A100, Llama-3.3-70B, ShareGPT
    // 200 prompts: 3.28 req/s, 714 out tok/s (=> ~218 out tokens/request;
    // ShareGPT averages ~202 input tokens per the vLLM blog).
    let cfg = config("a100", "llama-3.1-70b", 4);
    let r = burst(
        &cfg,
        200,
        Workload {
            prompt_tokens: 202,
            output_tokens: 218,
        },
    );
    println!(
        "| 70B, 4 x A100 80GB TP4 (vLLM 0.6.6) | 200 | 202 / 218 | {:.0} | 714 | {} | {:.2} | 3.28 | {:.2} | n/a |",
        r.output_tokens_per_second,
        ratio(r.output_tokens_per_second, 714.0),
        r.requests_per_second,
        r.ttft_mean
    );
    // vLLM, 2 x A10G (g5.12xlarge) TP2, Llama-3-8B fine-tune, ShareGPT 1,000
    // prompts: 10.24 req/s, 2,203.64 in tok/s, 441.76 out tok/s, mean TTFT
    // 14,807.83 ms => ~215 in / ~43 out tokens per request.
    // The A10G's tensor throughput is not published: 70 TFLOP/s is the
    // conservative profile value, 125 the A10 datasheet figure.
    let a10g = sim::engine::hardware("a10g").expect("profile");
    let a10g_125: &'static HardwareProfile = Box::leak(Box::new(HardwareProfile {
        peak_bf16_flops: 125e12,
        ..a10g.clone()
    }));
    for (label, hw) in [("70 TFLOP/s", a10g), ("125 TFLOP/s", a10g_125)] {
        let cfg = EngineConfig {
            hardware: hw,
            ..config("a10g", "llama-3.1-8b", 2)
        };
        let r = burst(
            &cfg,
            1000,
            Workload {
                prompt_tokens: 215,
                output_tokens: 43,
            },
        );
        println!(
            "| 8B, 2 x A10G TP2 at {label} (vLLM) | 1000 | 215 / 43 | {:.0} | 442 | {} | {:.2} | 10.24 | {:.2} | 14.81 |",
            r.output_tokens_per_second,
            ratio(r.output_tokens_per_second, 441.76),
            r.requests_per_second,
            r.ttft_mean
        );
    }
    println!();
}

/// The roofline's raw terms for the worked example of the reference (§6).
fn worked_example() {
    println!("### Roofline terms, Llama-3.1-8B, one GPU, no step overhead\n");
    println!("| GPU | prefill 2,048 tokens (ms) | decode step b=1 (ms) | KV capacity (tokens) |");
    println!("|---|---|---|---|");
    for hw in ["h100", "a100", "a100-40gb", "l4", "a10g"] {
        let mut cfg = config(hw, "llama-3.1-8b", 1);
        cfg.step_overhead_seconds = 0.0;
        let roofline = Roofline::new(&cfg);
        let engine = Engine::new(cfg.clone());
        println!(
            "| {} | {:.1} | {:.2} | {} |",
            cfg.hardware.display_name,
            ms(roofline.prefill_seconds(0, 2048)),
            ms(roofline.decode_seconds(1, 0)),
            engine.config().kv_capacity_tokens()
        );
    }
    println!();
}

/// The CPU profiles against the llama-bench runs they were calibrated on
/// (LLaMA-3.1-8B BF16 on a Threadripper PRO 5975WX,
/// github.com/ikawrakow/ik_llama.cpp/pull/175), and what a decode batch
/// costs on them against a GPU.
fn cpu_threads() {
    println!("### llama.cpp on CPU threads\n");
    println!(
        "Published: llama-bench, LLaMA-3.1-8B BF16, Threadripper PRO 5975WX, ggml's BF16 path \
         (tg128 at 1 and 2 threads; pp512 at 32 threads).\n"
    );
    println!("| profile | test | model (tokens/s) | published (tokens/s) | ratio |");
    println!("|---|---|---|---|---|");
    for (hw, published) in [("cpu-1t", 1.37), ("cpu-2t", 2.53)] {
        let roofline = Roofline::new(&config(hw, "llama-3.1-8b", 1));
        // tg128: 128 tokens after an empty prompt, context 0..127.
        let seconds: f64 = (0..128).map(|c| roofline.decode_seconds(1, c)).sum();
        let rate = 128.0 / seconds;
        println!(
            "| {hw} | tg128 | {rate:.2} | {published:.2} | {} |",
            ratio(rate, published)
        );
    }
    // pp512 on 32 threads: one thread's FLOP/s, 32 times (no 32-thread
    // profile; the check is that a thread computes as fast in a prompt as
    // in a decode).
    let one = config("cpu-1t", "llama-3.1-8b", 1);
    let mut prompt = one.clone();
    prompt.step_overhead_seconds = 0.0;
    let pp = 512.0 / (Roofline::new(&prompt).prefill_seconds(0, 512) / 32.0);
    println!(
        "| 32 x cpu-1t | pp512 | {pp:.1} | 47.17 | {} |\n",
        ratio(pp, 47.17)
    );
    println!("Decode step of a batch against one sequence (Qwen2.5-0.5B, context 500):\n");
    println!("| profile | b=1 (ms) | b=2 | b=4 | b=8 |");
    println!("|---|---|---|---|---|");
    for hw in ["cpu-1t", "cpu-2t", "h100"] {
        let roofline = Roofline::new(&config(hw, "qwen2.5-0.5b", 1));
        let one = roofline.decode_seconds(1, 500);
        let times = |b: u32| format!("{:.2}x", roofline.decode_seconds(b, 500) / one);
        println!(
            "| {hw} | {:.2} | {} | {} | {} |",
            ms(one),
            times(2),
            times(4),
            times(8)
        );
    }
    println!();
}

fn main() {
    worked_example();
    single_prompt_ttft();
    batch_one_decode();
    a100_40gb_sweep();
    nim_70b_sweep();
    offline_bursts();
    cpu_threads();
}
