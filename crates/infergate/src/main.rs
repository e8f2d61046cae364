//! The `infergate` command: wiring only. Each subcommand hands over to the
//! crate that does the work.

mod drain;
mod keys;
mod kubernetes;
mod lifecycle;
mod simulated;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, Subcommand};
use config::LogFormat;

use gateway::file_watch::FileWatch;

use crate::lifecycle::{Overrides, Signal, Signals};
use crate::simulated::Fleets;

// The proxy path allocates and frees many small, short-lived buffers per
// request (headers, body chunks, futures); mimalloc serves them in about
// half the CPU of the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `mi_option_purge_delay`: its position in the `mi_option_e` enum
/// of the mimalloc 3 header that `libmimalloc-sys` builds (a test checks it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// `bench` builds and drops simulated fleets of gigabytes, run after run.
/// By default mimalloc returns freed memory to the OS after a second, so each
/// run (and every doubling of a growing table) faults its memory back in,
/// zeroed page by page: a quarter of a 1,000-replica run. The benchmark is
/// a batch job, so it keeps what it frees.
fn keep_freed_memory() {
    // SAFETY: sets a plain integer option; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// The demo fleet `serve` runs when no config is given.
const DEMO_CONFIG: &str = include_str!("../../../examples/demo.yaml");

#[derive(Parser)]
#[command(
    name = "infergate",
    version,
    about = "An inference gateway: one OpenAI-compatible endpoint in front of a fleet of LLM model servers, routing each request to the replica that will answer fastest.",
    long_about = None,
)]
struct Cli {
    /// Log format: readable text or one JSON object per line.
    #[arg(long, global = true, value_parser = log_format_parser(), default_value = LogFormat::default().as_str(), env = "INFERGATE_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// `--log-format`: the config's names for log formats.
fn log_format_parser() -> impl TypedValueParser<Value = LogFormat> {
    PossibleValuesParser::new(LogFormat::ALL.map(LogFormat::as_str)).map(|name| {
        name.parse::<LogFormat>()
            .expect("every possible value is a format")
    })
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway. Without --config, runs the built-in demo: a gateway
    /// on 127.0.0.1:8080 in front of a simulated H100/A10G fleet.
    Serve {
        /// An InferenceGatewayConfig YAML document.
        #[arg(long, short, conflicts_with = "kubernetes")]
        config: Option<PathBuf>,
        /// Read the config from an InferenceGatewayConfig object in the
        /// cluster and apply every change to it live; its status says
        /// whether each version was accepted (docs/kubernetes.md).
        #[arg(long)]
        kubernetes: bool,
        /// The object's namespace (default: the client's, in a pod its own).
        #[arg(long, requires = "kubernetes")]
        namespace: Option<String>,
        /// The object's name.
        #[arg(long, requires = "kubernetes", default_value = config::defaults::KUBERNETES_CONFIG_NAME)]
        name: String,
        /// Listen on this address instead of the first listener's
        /// (port 0: any free port).
        #[arg(long, value_name = "HOST:PORT")]
        listen: Option<String>,
        /// Serve the admin endpoints on this address instead.
        #[arg(long, value_name = "HOST:PORT")]
        admin_listen: Option<String>,
    },
    /// Validate a config and print every problem with its path. Exit
    /// status 0 when valid, 1 when not.
    Check {
        /// The InferenceGatewayConfig YAML document to check: every check
        /// `serve` makes, the simulator's for simulated pools included,
        /// without starting anything.
        #[arg(long, short, value_name = "FILE")]
        config: PathBuf,
    },
    /// Print the CustomResourceDefinition of InferenceGatewayConfig
    /// (YAML), generated from the config's types; deploy/kubernetes/crd.yaml
    /// holds it.
    Crd,
    /// Make API keys for spec.auth.apiKeys.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Take a replica out of service for maintenance through a running
    /// gateway's admin listener: no new requests, those in flight finish
    /// (or move with --evacuate); --undo puts it back.
    Drain(drain::DrainArgs),
    /// Run simulated model servers (vLLM-compatible API and /metrics).
    Sim(sim::cli::SimArgs),
    /// Compare routing policies on simulated fleets.
    Bench(bench::cli::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log_format;
    // `serve` sets logging up once its config is read: the config may ask
    // for a JSON access log or trace export. `bench` runs gateways of its
    // own, whose access lines would bury its report.
    let filter = match &cli.command {
        Command::Bench(_) => gateway::telemetry::QUIET_ACCESS_FILTER,
        _ => gateway::telemetry::DEFAULT_FILTER,
    };
    let _logging = match &cli.command {
        Command::Serve { .. } => None,
        _ => match init_logging(log_format, &config::Telemetry::default(), filter) {
            Ok(guard) => Some(guard),
            Err(e) => {
                eprintln!("error: {e:#}");
                return ExitCode::FAILURE;
            }
        },
    };
    if matches!(cli.command, Command::Bench(_)) {
        keep_freed_memory();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("cannot start the async runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve {
                config,
                kubernetes,
                namespace,
                name,
                listen,
                admin_listen,
            } => {
                let source = match (config, kubernetes) {
                    (_, true) => Source::Kubernetes { namespace, name },
                    (Some(path), false) => Source::File(path),
                    (None, false) => Source::Demo,
                };
                serve(log_format, source, listen, admin_listen).await
            }
            Command::Check { config } => Ok(check(&config)),
            Command::Crd => {
                print!("{}", infergate_kube::crd::manifest());
                Ok(ExitCode::SUCCESS)
            }
            Command::Keys(command) => keys::run(command).map(|()| ExitCode::SUCCESS),
            Command::Drain(args) => drain::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Sim(args) => sim::cli::run(args).await.map(|()| ExitCode::SUCCESS),
            Command::Bench(args) => bench::cli::run(args).await.map(|()| ExitCode::SUCCESS),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match config::load_file_with(path, lifecycle::problems) {
        Ok(_) => {
            println!("{}: valid", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            match e.problems().len() {
                0 => eprintln!("{}: invalid", path.display()),
                1 => eprintln!("{}: invalid, 1 problem:", path.display()),
                n => eprintln!("{}: invalid, {n} problems:", path.display()),
            }
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// Where `serve` reads its config.
enum Source {
    Demo,
    File(PathBuf),
    Kubernetes {
        namespace: Option<String>,
        name: String,
    },
}

async fn serve(
    log_format: LogFormat,
    source: Source,
    listen: Option<String>,
    admin_listen: Option<String>,
) -> anyhow::Result<ExitCode> {
    let demo = matches!(source, Source::Demo);
    let path = match &source {
        Source::File(p) => Some(p.clone()),
        _ => None,
    };
    let (mut cluster, first) = match source {
        Source::Kubernetes { namespace, name } => {
            let (cluster, first) = kubernetes::Cluster::connect(namespace, Some(name)).await?;
            (Some(cluster), Some(first))
        }
        _ => (None, None),
    };
    let mut config = match (&path, &first) {
        (Some(p), _) => config::load_file_with(p, lifecycle::problems)?,
        (None, Some(object)) => config::from_yaml_with(&object.document, lifecycle::problems)
            .map_err(|e| {
                let object = cluster
                    .as_ref()
                    .map(|c| c.object.as_str())
                    .unwrap_or_default();
                anyhow::anyhow!("InferenceGatewayConfig {object} is invalid:\n{e}")
            })?,
        (None, None) => config::from_yaml(DEMO_CONFIG).expect("the built-in demo config is valid"),
    };
    let overrides = Overrides {
        listen,
        admin_listen,
    };
    overrides.apply(&mut config);
    if demo && config.spec.auth.is_none() {
        // The demo's replicas are simulated: nothing behind it needs
        // protecting, so `--listen 0.0.0.0:8080` (in a container) works
        // without an auth section. A config file gets no such pass.
        config.spec.auth = Some(config::Auth {
            mode: config::AuthMode::None,
            ..Default::default()
        });
    }
    let mut config = config::validated(config)?;
    let telemetry = init_logging(
        log_format,
        &config.spec.telemetry,
        gateway::telemetry::DEFAULT_FILTER,
    )?;
    gateway::telemetry::panics::install_hook();
    check_descriptor_limit(&config);
    let mut signals = Signals::install()?;
    let mut fleets = Fleets::default();
    // Pools found in Kubernetes need a client: a clear error before
    // anything starts when there is none.
    let mut discoveries = infergate_kube::Discoveries::default();
    discoveries.prepare(&config).await?;
    let prepared = fleets.prepare(&mut config).await?;
    let gateway = gateway::Gateway::start(&config).await?;
    fleets.commit(prepared);
    discoveries.sync(&config, &gateway);
    gateway.set_config_source(match (&path, &cluster) {
        (Some(p), _) => format!("file {}", p.display()),
        (None, Some(c)) => format!("InferenceGatewayConfig {}", c.object),
        (None, None) => "the built-in demo".to_owned(),
    });
    if let (Some(cluster), Some(first)) = (&cluster, &first) {
        cluster.report(first.generation, Ok(()));
        cluster.observe(&gateway);
    }
    let mut refresh = tokio::time::interval(config::defaults::STATUS_REFRESH);
    if demo {
        print_demo_banner(&gateway, &config);
    }
    // The file is reloaded when it changes, and on SIGHUP.
    let mut watch = path.as_ref().map(FileWatch::new);
    loop {
        let why = tokio::select! {
            signal = signals.next() => match signal {
                Signal::Stop => break,
                Signal::Reload => "SIGHUP",
            },
            () = lifecycle::changed(&mut watch) => "the file changed",
            object = next_object(&mut cluster) => {
                let cluster = cluster.as_ref().expect("objects come from a cluster");
                let source = format!("InferenceGatewayConfig {}", cluster.object);
                let running = lifecycle::Running {
                    gateway: &gateway,
                    fleets: &mut fleets,
                    discoveries: &mut discoveries,
                };
                let verdict = lifecycle::apply_document(running, &object.document, &overrides, &source, "the object changed").await;
                cluster.report(object.generation, verdict);
                cluster.observe(&gateway);
                continue;
            }
            _ = refresh.tick() => {
                if let Some(cluster) = &cluster {
                    cluster.observe(&gateway);
                }
                continue;
            }
        };
        let running = lifecycle::Running {
            gateway: &gateway,
            fleets: &mut fleets,
            discoveries: &mut discoveries,
        };
        lifecycle::reload(running, path.as_deref(), &overrides, why).await;
    }
    tracing::info!("shutting down: draining in-flight requests (a second signal stops at once)");
    // Readiness turns false and accepting stops at once: the cluster's
    // Lease is given up while the requests in flight finish, not before.
    let stopping = async {
        let release = async {
            if let Some(cluster) = cluster.take() {
                cluster.stop().await;
            }
        };
        tokio::join!(gateway.shutdown(), release).0
    };
    let drained = tokio::select! {
        drained = stopping => drained,
        () = signals.next_stop() => {
            tracing::warn!("second signal: stopping now; requests still in flight are cut");
            false
        }
    };
    telemetry.shutdown().await;
    Ok(if drained {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The next version of the cluster object's spec; never without one.
async fn next_object(
    cluster: &mut Option<kubernetes::Cluster>,
) -> infergate_kube::config_source::ConfigObject {
    match cluster {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}

/// Raise the open-file limit, and say when even the raised one is short
/// of what the connection limit may take: a descriptor per client
/// connection and about as many to replicas.
fn check_descriptor_limit(config: &config::InferenceGatewayConfig) {
    let max_connections = config.spec.limits.max_connections();
    match gateway::raise_descriptor_limit() {
        Ok(limit) if limit < 2 * u64::from(max_connections) => tracing::warn!(
            limit,
            max_connections,
            "the open-file limit is below what limits.maxConnections may need"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
}

fn print_demo_banner(gateway: &gateway::Gateway, config: &config::InferenceGatewayConfig) {
    let addr = gateway.addr();
    let model = config.spec.pools[0].base_model();
    println!("infergate demo: a gateway on http://{addr} in front of simulated replicas");
    for (pool, endpoints) in gateway.pool_endpoints() {
        println!("  pool {pool}: {}", endpoints.join(", "));
    }
    for pool in &config.spec.pools {
        let Some(simulated) = &pool.simulated else {
            continue;
        };
        let load = simulated.load_time.as_deref().unwrap_or("0s");
        if simulated.start_at_zero {
            println!(
                "  pool {} starts at zero: its first request wakes it, its replicas load for {load}, its requests wait meanwhile",
                pool.name
            );
        } else if simulated.load_time.is_some() {
            println!(
                "  pool {} starts cold: its replicas load for {load}; its requests wait meanwhile",
                pool.name
            );
        }
    }
    if let Some(admin) = gateway.admin_addr() {
        println!("  admin: http://{admin}/debug/pools");
        println!("  fleet page: http://{admin}/");
    }
    println!();
    println!("Try it:");
    println!(
        "  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"{model}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 32}}'"
    );
    println!();
    println!("Or with the OpenAI Python SDK:");
    println!("  from openai import OpenAI");
    println!("  client = OpenAI(base_url=\"http://{addr}/v1\", api_key=\"unused\")");
    println!(
        "  print(client.chat.completions.create(model=\"{model}\", messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}], max_tokens=32).choices[0].message.content)"
    );
    println!();
    println!("Press Ctrl-C to stop.");
}

/// Logs on stderr in `format` (filter from `INFERGATE_LOG`, default
/// `info`), the access log and trace export as `telemetry` says. Keep the
/// guard while the process runs.
fn init_logging(
    format: LogFormat,
    telemetry: &config::Telemetry,
    default_filter: &str,
) -> anyhow::Result<gateway::telemetry::TelemetryGuard> {
    gateway::telemetry::init(format, telemetry, default_filter)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The option index is not exported by `libmimalloc-sys`: make sure it
    /// still names the purge delay (1,000 ms by default, in mimalloc 3's
    /// options.c) and that setting it holds.
    #[test]
    fn purge_delay_option_is_the_one_set() {
        // SAFETY: reads a plain integer option.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(
            default, 1000,
            "option {MI_OPTION_PURGE_DELAY} is not mimalloc's purge delay"
        );
        keep_freed_memory();
        // SAFETY: as above.
        let now = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(now, -1);
    }
}
