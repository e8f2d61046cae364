//! `infergate sim`: start a fleet of simulated replicas and run until Ctrl-C.

use std::fmt::Write;
use std::net::IpAddr;

use crate::disaggregation::Role;
use crate::engine::kv_transfer::link_preset;
use crate::engine::{KvLink, SchedulingPolicy};
use crate::faults::{Faults, MetricsFault};
use crate::fleet::{Fleet, FleetSpec, LoadTime, start_fleet};
use crate::kv_cache_events::KvEventsSpec;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use crate::metrics::{self, Dialect};

/// Simulated model servers (vLLM-like engines on simulated GPUs) behind
/// OpenAI-compatible HTTP endpoints with Prometheus `/metrics`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Number of replicas.
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Hardware profile of each replica, cycled over the replicas
    /// (h100, a100, a100-40gb, l4, a10g; llama.cpp on CPU threads: cpu-1t,
    /// cpu-2t), e.g. `h100,h100,a10g,a10g`.
    #[arg(long, value_delimiter = ',', default_value = "h100")]
    pub hardware: Vec<String>,
    /// Model profile (llama-3.1-8b, qwen3-32b, llama-3.1-70b, qwen2.5-0.5b)
    /// or its HF id.
    #[arg(long, default_value = "llama-3.1-8b")]
    pub model: String,
    /// Name clients send as `model` (default: the model's HF id).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Tensor-parallel GPUs per replica (default: the model's usual TP).
    #[arg(long = "tp")]
    pub tensor_parallel: Option<u32>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port of the first replica; replica i listens on base-port + i
    /// (0: let the OS pick each port).
    #[arg(long, default_value_t = 9001)]
    pub base_port: u16,
    /// LoRA adapters every replica loads at start, e.g. `sql,chat,math`.
    #[arg(long, value_delimiter = ',')]
    pub adapters: Vec<String>,
    /// Adapters per batch (GPU adapter slots); vLLM's default is 1.
    #[arg(long)]
    pub max_loras: Option<u32>,
    /// Sequences per batch (default: vLLM's default for the GPU).
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// How each engine orders its requests, as vLLM's flag of that name.
    #[arg(long, value_parser = scheduling_policy_parser(), default_value = SchedulingPolicy::default().as_str())]
    pub scheduling_policy: SchedulingPolicy,
    /// Engine seconds per wall second: 10 runs the simulated GPUs 10× faster
    /// than real time (latencies in /metrics stay in engine seconds).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Which engine's /metrics names to speak.
    #[arg(long, value_parser = dialect_parser(), default_value = Dialect::default().as_str())]
    pub dialect: Dialect,
    /// Seed of answer lengths, answer words and injected errors.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Fault: fraction of inference requests answered with HTTP 500.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// Fault: accept inference requests and never answer.
    #[arg(long)]
    pub hang: bool,
    /// Fault: /metrics ok, dead (503), hang, frozen (stale values) or garbage
    /// (200 with an HTML page).
    #[arg(long, value_enum, default_value_t = MetricsFault::Ok)]
    pub metrics_fault: MetricsFault,
    /// Fault: every engine step takes this many times longer.
    #[arg(long, default_value_t = 1.0)]
    pub slowdown: f64,
    /// Fault: close the connection of every answer after this many of its
    /// tokens, as a dying process would (a stream's body breaks off, a
    /// non-streaming request gets no response).
    #[arg(long)]
    pub cut_after_tokens: Option<u32>,
    /// Fault: stop sending every answer after this many of its tokens,
    /// keeping the connection open.
    #[arg(long)]
    pub stall_after_tokens: Option<u32>,
    /// Fault: crash the replica (stop listening, drop every connection)
    /// after this many tokens of any answer.
    #[arg(long)]
    pub crash_after_tokens: Option<u32>,
    /// Publish KV-cache events (vLLM's --kv-events-config wire format) on
    /// this port, replica i on port + i.
    #[arg(long)]
    pub kv_events_port: Option<u16>,
    /// Answer KV-event replays on this port, replica i on port + i.
    #[arg(long, requires = "kv_events_port")]
    pub kv_events_replay_port: Option<u16>,
    /// Topic of the KV events (vLLM's default is empty).
    #[arg(long, default_value = "", requires = "kv_events_port")]
    pub kv_events_topic: String,
    /// Engine time each replica loads before it listens (connections are
    /// refused meanwhile): a duration (`90s`), or `calibrated` for the
    /// model's weights read at a network volume's speed plus engine
    /// start-up. Divided by --time-scale in wall time.
    #[arg(long, default_value = "0s")]
    pub load_time: LoadTime,
    /// Prefill/decode disaggregation: the role of each replica in order
    /// (`prefill`, `decode`, `both`); replicas past the list are `both`.
    #[arg(long, value_delimiter = ',', value_parser = parse_role)]
    pub roles: Vec<Role>,
    /// The link decode replicas pull KV over: `rdma` (400 Gb/s) or `tcp`
    /// (100 Gb Ethernet).
    #[arg(long, default_value = "rdma", value_parser = parse_kv_link)]
    pub kv_link: KvLink,
}

fn parse_role(name: &str) -> Result<Role, String> {
    name.parse()
}

fn parse_kv_link(name: &str) -> Result<KvLink, String> {
    link_preset(name).ok_or_else(|| format!("unknown KV link `{name}`: use rdma or tcp"))
}

/// `--dialect`: the dialects the simulator renders, each with the metric
/// names that mark it.
fn dialect_parser() -> impl TypedValueParser<Value = Dialect> {
    let values = metrics::DIALECTS.map(|dialect| {
        let help = match dialect {
            Dialect::Vllm => {
                "vLLM V1 (`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, ...)"
            }
            Dialect::Sglang => "SGLang (`sglang:num_running_reqs`, `sglang:token_usage`, ...)",
            Dialect::Tgi => "Hugging Face TGI (`tgi_queue_size`, `tgi_batch_current_size`, ...)",
            Dialect::Llamacpp => "llama.cpp server (`llamacpp:requests_processing`, ...)",
            Dialect::Trtllm | Dialect::Triton | Dialect::None => unreachable!("not rendered"),
        };
        PossibleValue::new(dialect.as_str()).help(help)
    });
    PossibleValuesParser::new(values)
        .map(|name| metrics::parse_dialect(&name).expect("every possible value is a dialect"))
}

/// `--scheduling-policy`: vLLM's names, with what each does.
fn scheduling_policy_parser() -> impl TypedValueParser<Value = SchedulingPolicy> {
    let values = SchedulingPolicy::ALL.map(|policy| {
        let help = match policy {
            SchedulingPolicy::Fcfs => {
                "first come, first served; a request with a non-zero `priority` is refused (400)"
            }
            SchedulingPolicy::Priority => {
                "by the request's `priority` (lower first), then arrival; a waiting request short of KV memory preempts worse-priority running ones"
            }
        };
        PossibleValue::new(policy.as_str()).help(help)
    });
    PossibleValuesParser::new(values)
        .map(|name| name.parse().expect("every possible value is a policy"))
}

impl SimArgs {
    pub fn fleet_spec(&self) -> FleetSpec {
        FleetSpec {
            replicas: self.replicas,
            hardware: self.hardware.clone(),
            model: self.model.clone(),
            served_model_name: self.served_model_name.clone(),
            tensor_parallel: self.tensor_parallel,
            adapters: self.adapters.clone(),
            max_loras: self.max_loras,
            max_num_seqs: self.max_num_seqs,
            scheduling_policy: self.scheduling_policy,
            time_scale: self.time_scale,
            dialect: self.dialect,
            seed: self.seed,
            host: self.host,
            base_port: (self.base_port != 0).then_some(self.base_port),
            faults: Faults {
                error_rate: self.error_rate,
                hang: self.hang,
                metrics: self.metrics_fault,
                slowdown: self.slowdown,
                cut_after_tokens: self.cut_after_tokens,
                stall_after_tokens: self.stall_after_tokens,
                crash_after_tokens: self.crash_after_tokens,
            },
            kv_events: self.kv_events_port.map(|port| KvEventsSpec {
                port,
                replay_port: self.kv_events_replay_port,
                topic: self.kv_events_topic.clone(),
                ..KvEventsSpec::default()
            }),
            roles: self.roles.clone(),
            kv_link: self.kv_link,
            load_time: self.load_time,
            start_asleep: false,
        }
    }
}

/// Starts the fleet, prints each replica, and serves until Ctrl-C.
pub async fn run(args: SimArgs) -> anyhow::Result<()> {
    let spec = args.fleet_spec();
    let fleet = start_fleet(spec.clone()).await?;
    print!("{}", describe(&fleet, &spec));
    tokio::signal::ctrl_c().await?;
    println!("stopping {} replica(s)", fleet.replicas().len());
    fleet.shutdown().await;
    Ok(())
}

/// The start-up summary: one line per replica.
pub fn describe(fleet: &Fleet, spec: &FleetSpec) -> String {
    let mut out = String::new();
    let Some(first) = fleet.replicas().first() else {
        return out;
    };
    let first = first.info();
    let _ = writeln!(
        out,
        "simulating {} replica(s) of {} (model name \"{}\"), /metrics dialect {}, time scale {}x",
        fleet.replicas().len(),
        first.model,
        first.served_model,
        first.dialect,
        first.time_scale,
    );
    for (index, replica) in fleet.replicas().iter().enumerate() {
        let info = replica.info();
        let _ = writeln!(
            out,
            "  replica {index}  http://{}  {} x{}  KV {} blocks of {} tokens ({} tokens)  \
             max_num_seqs {}  max_model_len {}",
            info.addr,
            info.hardware,
            info.tensor_parallel,
            info.num_gpu_blocks,
            info.block_size,
            info.num_gpu_blocks * u64::from(info.block_size),
            info.max_num_seqs,
            info.max_model_len,
        );
        if let Some(endpoint) = &info.kv_events_endpoint {
            let replay = info.kv_events_replay_endpoint.as_deref().unwrap_or("none");
            let _ = writeln!(out, "    KV events {endpoint}  replay {replay}");
        }
    }
    if !spec.adapters.is_empty() {
        let _ = writeln!(
            out,
            "  adapters: {} (max_loras {})",
            spec.adapters.join(", "),
            first.max_loras
        );
    }
    if spec.scheduling_policy != SchedulingPolicy::default() {
        let _ = writeln!(out, "  scheduling policy: {}", spec.scheduling_policy);
    }
    if spec.faults.any() {
        let faults = serde_json::to_string(&spec.faults).unwrap_or_default();
        let _ = writeln!(out, "  faults: {faults}");
    }
    out.push_str("Ctrl-C to stop.\n");
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn flags_map_to_the_fleet_spec() {
        let cli = Cli::parse_from([
            "sim",
            "--replicas",
            "4",
            "--hardware",
            "h100,h100,a10g,a10g",
            "--model",
            "llama-3.1-8b",
            "--base-port",
            "9001",
            "--adapters",
            "a,b,c",
            "--max-loras",
            "2",
            "--time-scale",
            "10",
            "--dialect",
            "sglang",
            "--seed",
            "7",
            "--tp",
            "1",
            "--error-rate",
            "0.25",
            "--metrics-fault",
            "frozen",
            "--slowdown",
            "2",
            "--scheduling-policy",
            "priority",
            "--cut-after-tokens",
            "5",
            "--stall-after-tokens",
            "6",
            "--crash-after-tokens",
            "7",
        ]);
        let spec = cli.sim.fleet_spec();
        assert_eq!(spec.replicas, 4);
        assert_eq!(spec.hardware, ["h100", "h100", "a10g", "a10g"]);
        assert_eq!(spec.adapters, ["a", "b", "c"]);
        assert_eq!(spec.max_loras, Some(2));
        assert_eq!(spec.time_scale, 10.0);
        assert_eq!(spec.dialect, Dialect::Sglang);
        assert_eq!(spec.seed, 7);
        assert_eq!(spec.tensor_parallel, Some(1));
        assert_eq!(spec.base_port, Some(9001));
        assert_eq!(spec.replica(2).hardware, "a10g");
        assert_eq!(spec.faults.metrics, MetricsFault::Frozen);
        assert_eq!(spec.faults.error_rate, 0.25);
        assert_eq!(spec.faults.slowdown, 2.0);
        assert_eq!(spec.faults.cut_after_tokens, Some(5));
        assert_eq!(spec.faults.stall_after_tokens, Some(6));
        assert_eq!(spec.faults.crash_after_tokens, Some(7));
        assert_eq!(spec.scheduling_policy, SchedulingPolicy::Priority);
        assert_eq!(
            spec.replica(1).engine_config().unwrap().scheduling_policy,
            SchedulingPolicy::Priority
        );
    }

    #[test]
    fn roles_and_the_kv_link_go_to_the_replicas() {
        let spec = Cli::parse_from([
            "sim",
            "--replicas",
            "3",
            "--roles",
            "prefill,decode",
            "--kv-link",
            "tcp",
        ])
        .sim
        .fleet_spec();
        let role = |i| spec.replica(i).disaggregation.role;
        assert_eq!(
            (role(0), role(1), role(2)),
            (Role::Prefill, Role::Decode, Role::Both)
        );
        assert_eq!(
            spec.replica(1).disaggregation.link,
            crate::engine::kv_transfer::TCP_100G
        );
        assert!(Cli::try_parse_from(["sim", "--roles", "producer"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--kv-link", "nvlink"]).is_err());
    }

    #[test]
    fn kv_event_flags_turn_them_on_replica_by_replica() {
        let spec = Cli::parse_from([
            "sim",
            "--replicas",
            "2",
            "--kv-events-port",
            "5557",
            "--kv-events-replay-port",
            "5657",
            "--kv-events-topic",
            "kv@sim",
        ])
        .sim
        .fleet_spec();
        let second = spec.replica(1).kv_events.unwrap();
        assert_eq!((second.port, second.replay_port), (5558, Some(5658)));
        assert_eq!(second.topic, "kv@sim");
        assert!(Cli::try_parse_from(["sim", "--kv-events-topic", "t"]).is_err());
        assert_eq!(Cli::parse_from(["sim"]).sim.fleet_spec().kv_events, None);
    }

    #[test]
    fn defaults_are_one_h100_replica_on_9001() {
        let spec = Cli::parse_from(["sim"]).sim.fleet_spec();
        assert_eq!((spec.replicas, spec.base_port), (1, Some(9001)));
        assert_eq!(spec.hardware, ["h100"]);
        assert!(!spec.faults.any());
        assert_eq!(spec.scheduling_policy, SchedulingPolicy::Fcfs);
        let os_ports = Cli::parse_from(["sim", "--base-port", "0"])
            .sim
            .fleet_spec();
        assert_eq!(os_ports.base_port, None);
    }

    #[test]
    fn unknown_dialects_are_refused_by_the_parser() {
        assert!(Cli::try_parse_from(["sim", "--dialect", "triton"]).is_err());
    }

    #[tokio::test]
    async fn a_model_too_big_for_the_gpu_is_a_clear_error() {
        let cli = Cli::parse_from([
            "sim",
            "--hardware",
            "a10g",
            "--model",
            "llama-3.1-70b",
            "--tp",
            "1",
            "--base-port",
            "0",
        ]);
        let error = start_fleet(cli.sim.fleet_spec()).await.unwrap_err();
        let message = format!("{error:#}");
        assert!(message.contains("does not fit"), "{message}");
        assert!(message.contains("replica 0"), "{message}");
    }

    #[tokio::test]
    async fn describe_lists_every_replica() {
        let cli = Cli::parse_from([
            "sim",
            "--replicas",
            "2",
            "--hardware",
            "h100,a10g",
            "--base-port",
            "0",
            "--adapters",
            "x",
        ]);
        let spec = cli.sim.fleet_spec();
        let fleet = start_fleet(spec.clone()).await.unwrap();
        let text = describe(&fleet, &spec);
        for addr in fleet.addrs() {
            assert!(text.contains(&format!("http://{addr}")), "{text}");
        }
        assert!(
            text.contains("h100 x1") && text.contains("a10g x1"),
            "{text}"
        );
        assert!(text.contains("adapters: x"), "{text}");
        fleet.shutdown().await;
    }
}
