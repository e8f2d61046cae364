//! The routers `infergate bench --routers` compares: infergate with one of
//! its policies, and the peers a user could install instead — nginx
//! `least_conn` and the Rust routers shipped as Python wheels
//! (sglang-router, vllm-router, smg). Every router is started by the bench
//! in front of a fresh simulated fleet, driven with the same requests, and
//! stopped; a peer that is not installed is skipped with the command that
//! installs the pinned version.
//!
//! - [`nginx`]: the generated `nginx.conf`.
//! - [`python`]: the command lines of the pip-installed routers.
//! - [`process`]: a router process: its CPU time and how it is stopped.

pub mod nginx;
pub mod process;
pub mod python;

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::bail;

use crate::policy::PolicyUnderTest;
pub use python::{PythonRouter, SGLANG_ROUTER_VERSION, SMG_VERSION, VLLM_ROUTER_VERSION};

/// One router of `--routers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouterUnderTest {
    /// The gateway with one of its policies.
    Infergate(PolicyUnderTest),
    /// nginx with `least_conn` (least active connections) upstreams.
    NginxLeastConn,
    /// A pip-installed router with one of its `--policy` values.
    Python {
        router: PythonRouter,
        policy: String,
    },
}

impl RouterUnderTest {
    /// The routers of a comma-separated list, in order, repeats dropped.
    pub fn parse_list(list: &str) -> anyhow::Result<Vec<RouterUnderTest>> {
        let mut routers = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let router: RouterUnderTest = name.parse()?;
            if !routers.contains(&router) {
                routers.push(router);
            }
        }
        if routers.is_empty() {
            bail!("--routers names no router");
        }
        Ok(routers)
    }

    /// Whether the router is started from another program than infergate.
    pub fn is_peer(&self) -> bool {
        !matches!(self, RouterUnderTest::Infergate(_))
    }

    /// The program that runs this peer, if it is installed (`None` for
    /// infergate, which the bench runs itself).
    pub fn locate(&self) -> Option<PathBuf> {
        match self {
            RouterUnderTest::Infergate(_) => None,
            RouterUnderTest::NginxLeastConn => {
                find_in_path("nginx").or_else(|| executable(Path::new(nginx::DEBIAN_PATH)))
            }
            RouterUnderTest::Python { router, .. } => find_in_path(router.executable()),
        }
    }

    /// What to run to install this peer, pinned.
    pub fn install_hint(&self) -> String {
        match self {
            RouterUnderTest::Infergate(_) => String::new(),
            RouterUnderTest::NginxLeastConn => "apt-get install nginx".to_owned(),
            RouterUnderTest::Python { router, .. } => format!(
                "pip install {}=={} (or scripts/bench-peers --install)",
                router.package(),
                router.version()
            ),
        }
    }
}

impl std::str::FromStr for RouterUnderTest {
    type Err = anyhow::Error;

    /// `infergate:POLICY` (or a bare infergate policy), `nginx:least_conn`
    /// (or `nginx`), `sglang-router:POLICY`, `vllm-router:POLICY`,
    /// `smg:POLICY` (a bare peer name takes its `cache_aware` policy).
    fn from_str(name: &str) -> anyhow::Result<Self> {
        let name = name.trim();
        let (router, policy) = match name.split_once(':') {
            Some((router, policy)) => (router, Some(policy)),
            None => (name, None),
        };
        match router {
            "infergate" => Ok(RouterUnderTest::Infergate(
                policy.unwrap_or("scored").parse()?,
            )),
            "nginx" => match policy {
                None | Some("least_conn") => Ok(RouterUnderTest::NginxLeastConn),
                Some(other) => bail!(
                    "nginx is compared with its least_conn balancing only, not {other:?}"
                ),
            },
            _ => match PythonRouter::named(router) {
                Some(python) => {
                    let policy = policy.unwrap_or("cache_aware");
                    if !python.policies().contains(&policy) {
                        bail!(
                            "{router} has no policy {policy:?} (it has {})",
                            python.policies().join(", ")
                        );
                    }
                    Ok(RouterUnderTest::Python {
                        router: python,
                        policy: policy.to_owned(),
                    })
                }
                // An infergate policy on its own, as `--policies` takes it.
                None => name
                    .parse::<PolicyUnderTest>()
                    .map(RouterUnderTest::Infergate)
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "unknown router {name:?} (expected infergate:POLICY, nginx:least_conn, sglang-router:POLICY, vllm-router:POLICY or smg:POLICY)"
                        )
                    }),
            },
        }
    }
}

impl fmt::Display for RouterUnderTest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouterUnderTest::Infergate(policy) => write!(f, "infergate:{policy}"),
            RouterUnderTest::NginxLeastConn => f.write_str("nginx:least_conn"),
            RouterUnderTest::Python { router, policy } => {
                write!(f, "{}:{policy}", router.executable())
            }
        }
    }
}

/// `program` in a directory of `PATH`, if it is an executable file there.
pub fn find_in_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find_map(|dir| executable(&dir.join(program)))
}

fn executable(path: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let meta = std::fs::metadata(path).ok()?;
    (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then(|| path.to_owned())
}

/// The installed version of a peer, for the report: nginx's `-v`, or the
/// wheel's version as the Python next to the router's script reports it.
pub fn installed_version(router: &RouterUnderTest, program: &Path) -> Option<String> {
    match router {
        RouterUnderTest::Infergate(_) => None,
        RouterUnderTest::NginxLeastConn => {
            let out = std::process::Command::new(program)
                .arg("-v")
                .output()
                .ok()?;
            // "nginx version: nginx/1.22.1" on stderr.
            let text = String::from_utf8_lossy(&out.stderr);
            text.split('/').nth(1).map(|v| v.trim().to_owned())
        }
        RouterUnderTest::Python { router, .. } => {
            let python = program.parent()?.join("python3");
            let out = std::process::Command::new(python)
                .arg("-c")
                .arg(format!(
                    "import importlib.metadata as m; print(m.version({:?}))",
                    router.package()
                ))
                .output()
                .ok()?;
            let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            (out.status.success() && !version.is_empty()).then_some(version)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print() {
        for name in [
            "infergate:scored",
            "infergate:least-request",
            "infergate:scored:latency",
            "nginx:least_conn",
            "sglang-router:cache_aware",
            "vllm-router:consistent_hash",
            "smg:round_robin",
        ] {
            let router: RouterUnderTest = name.parse().unwrap();
            assert_eq!(router.to_string(), name);
        }
        assert_eq!(
            "nginx".parse::<RouterUnderTest>().unwrap(),
            RouterUnderTest::NginxLeastConn
        );
        assert_eq!(
            "scored".parse::<RouterUnderTest>().unwrap().to_string(),
            "infergate:scored"
        );
        assert_eq!(
            "smg".parse::<RouterUnderTest>().unwrap().to_string(),
            "smg:cache_aware"
        );
        assert!("nginx:round_robin".parse::<RouterUnderTest>().is_err());
        assert!("sglang-router:kv_aware".parse::<RouterUnderTest>().is_err());
        assert!("envoy:least_request".parse::<RouterUnderTest>().is_err());
        assert!("infergate:fastest".parse::<RouterUnderTest>().is_err());
    }

    #[test]
    fn lists_keep_order_and_drop_repeats() {
        let list =
            RouterUnderTest::parse_list("infergate:scored, nginx, nginx:least_conn,smg").unwrap();
        let names: Vec<String> = list.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            ["infergate:scored", "nginx:least_conn", "smg:cache_aware"]
        );
        assert!(RouterUnderTest::parse_list(" , ").is_err());
    }

    #[test]
    fn install_hints_pin_versions() {
        let smg: RouterUnderTest = "smg:cache_aware".parse().unwrap();
        assert!(
            smg.install_hint().contains("smg==1.13.0"),
            "{}",
            smg.install_hint()
        );
        assert!(smg.is_peer());
        assert!(
            !"infergate:scored"
                .parse::<RouterUnderTest>()
                .unwrap()
                .is_peer()
        );
    }

    #[test]
    fn the_install_script_pins_the_same_versions() {
        let script = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/bench-peers"),
        )
        .expect("scripts/bench-peers exists");
        for router in [
            PythonRouter::SglangRouter,
            PythonRouter::VllmRouter,
            PythonRouter::Smg,
        ] {
            let pin = format!("{}=={}", router.package(), router.version());
            assert!(script.contains(&pin), "scripts/bench-peers lacks {pin}");
        }
    }
}
