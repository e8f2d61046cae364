//! The routers that ship as Python wheels around a Rust core: sglang-router,
//! vllm-router and smg (the SGLang model gateway's successor). Each takes
//! the workers on its command line; none of them needs a tokenizer for
//! the policies compared here, and they run with model-hub access off so
//! nothing leaves the machine.

use std::net::SocketAddr;

/// Versions the comparison was written against; `scripts/bench-peers`
/// installs exactly these (a unit test keeps the two in step).
pub const SGLANG_ROUTER_VERSION: &str = "0.3.2";
pub const VLLM_ROUTER_VERSION: &str = "0.1.17";
pub const SMG_VERSION: &str = "1.13.0";

/// A pip-installed router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PythonRouter {
    SglangRouter,
    VllmRouter,
    Smg,
}

impl PythonRouter {
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "sglang-router" => Some(PythonRouter::SglangRouter),
            "vllm-router" => Some(PythonRouter::VllmRouter),
            "smg" => Some(PythonRouter::Smg),
            _ => None,
        }
    }

    /// The console script the wheel installs.
    pub fn executable(self) -> &'static str {
        match self {
            PythonRouter::SglangRouter => "sglang-router",
            PythonRouter::VllmRouter => "vllm-router",
            PythonRouter::Smg => "smg",
        }
    }

    /// The PyPI package.
    pub fn package(self) -> &'static str {
        self.executable()
    }

    /// The version `scripts/bench-peers` installs.
    pub fn version(self) -> &'static str {
        match self {
            PythonRouter::SglangRouter => SGLANG_ROUTER_VERSION,
            PythonRouter::VllmRouter => VLLM_ROUTER_VERSION,
            PythonRouter::Smg => SMG_VERSION,
        }
    }

    /// `--policy` values that route on what a plain OpenAI-compatible
    /// worker offers (the ones needing KV events, a routing key or a
    /// load endpoint of their own engine are left out).
    pub fn policies(self) -> &'static [&'static str] {
        match self {
            PythonRouter::SglangRouter | PythonRouter::Smg => {
                &["cache_aware", "round_robin", "random", "power_of_two"]
            }
            PythonRouter::VllmRouter => &[
                "cache_aware",
                "round_robin",
                "random",
                "power_of_two",
                "consistent_hash",
                "sticky_least_loaded",
            ],
        }
    }

    /// The arguments that start the router on `listen` in front of
    /// `workers` (`host:port`), its Prometheus exporter on `metrics`, all
    /// on loopback; everything else at the router's defaults.
    pub fn args(
        self,
        policy: &str,
        listen: SocketAddr,
        metrics: SocketAddr,
        workers: &[String],
    ) -> Vec<String> {
        let mut args = Vec::new();
        if matches!(self, PythonRouter::SglangRouter | PythonRouter::Smg) {
            // Their console scripts have `launch` (router only) and
            // `server` (router and engines) subcommands.
            args.push("launch".to_owned());
        }
        let log_level = match self {
            PythonRouter::VllmRouter => "warning",
            PythonRouter::SglangRouter | PythonRouter::Smg => "warn",
        };
        args.extend([
            "--host".to_owned(),
            listen.ip().to_string(),
            "--port".to_owned(),
            listen.port().to_string(),
            "--policy".to_owned(),
            policy.to_owned(),
            "--prometheus-host".to_owned(),
            metrics.ip().to_string(),
            "--prometheus-port".to_owned(),
            metrics.port().to_string(),
            "--log-level".to_owned(),
            log_level.to_owned(),
            // The simulated workers answer their health check at once;
            // the default waits 30 s between start-up checks.
            "--worker-startup-check-interval".to_owned(),
            "1".to_owned(),
            "--worker-urls".to_owned(),
        ]);
        args.extend(workers.iter().map(|w| format!("http://{w}")));
        args
    }

    /// Environment of the router process: no model-hub access, so a
    /// router that looks for a tokenizer fails here instead of
    /// downloading one.
    pub fn env(self) -> [(&'static str, &'static str); 3] {
        [
            ("HF_HUB_OFFLINE", "1"),
            ("TRANSFORMERS_OFFLINE", "1"),
            ("HF_HUB_DISABLE_TELEMETRY", "1"),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers() -> Vec<String> {
        vec!["127.0.0.1:9001".to_owned(), "127.0.0.1:9002".to_owned()]
    }

    #[test]
    fn sglang_style_routers_launch_with_workers_and_loopback_ports() {
        let listen: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let metrics: SocketAddr = "127.0.0.1:8001".parse().unwrap();
        for router in [PythonRouter::SglangRouter, PythonRouter::Smg] {
            let args = router.args("cache_aware", listen, metrics, &workers());
            assert_eq!(args[0], "launch");
            let joined = args.join(" ");
            assert!(joined.contains("--host 127.0.0.1 --port 8000"), "{joined}");
            assert!(joined.contains("--policy cache_aware"), "{joined}");
            assert!(
                joined.contains("--prometheus-host 127.0.0.1 --prometheus-port 8001"),
                "{joined}"
            );
            assert!(joined.contains("--log-level warn "), "{joined}");
            assert!(
                joined.ends_with("--worker-urls http://127.0.0.1:9001 http://127.0.0.1:9002"),
                "{joined}"
            );
        }
    }

    #[test]
    fn vllm_router_has_no_subcommand_and_its_own_log_levels() {
        let listen: SocketAddr = "127.0.0.1:8000".parse().unwrap();
        let args = PythonRouter::VllmRouter.args("consistent_hash", listen, listen, &workers());
        assert_eq!(args[0], "--host");
        assert!(args.join(" ").contains("--log-level warning"));
        assert!(args.join(" ").contains("--policy consistent_hash"));
    }

    #[test]
    fn routers_run_offline() {
        let env = PythonRouter::Smg.env();
        assert!(env.contains(&("HF_HUB_OFFLINE", "1")));
    }
}
