//! What the process does on signals: SIGINT and SIGTERM stop it (a second
//! one during the drain stops it at once), SIGHUP reloads the config file;
//! and the one path every new config takes, from a file or a cluster object.

use std::path::Path;

use gateway::file_watch::FileWatch;

use crate::simulated::Fleets;

pub enum Signal {
    Stop,
    Reload,
}

/// The process's signal handlers, installed once at start so that a
/// SIGHUP never falls through to its default action (exit).
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> anyhow::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                term: signal(SignalKind::terminate())?,
                hup: signal(SignalKind::hangup())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    pub async fn next(&mut self) -> Signal {
        #[cfg(unix)]
        tokio::select! {
            _ = tokio::signal::ctrl_c() => Signal::Stop,
            _ = self.term.recv() => Signal::Stop,
            _ = self.hup.recv() => Signal::Reload,
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Signal::Stop
        }
    }

    /// The next stop signal; reload requests are ignored (the gateway is
    /// draining).
    pub async fn next_stop(&mut self) {
        while let Signal::Reload = self.next().await {
            tracing::info!("SIGHUP ignored: the gateway is shutting down");
        }
    }
}

/// How the command line changes the config file's listeners; applied to
/// every load so that a reload sees the same addresses.
pub struct Overrides {
    pub listen: Option<String>,
    pub admin_listen: Option<String>,
}

impl Overrides {
    pub fn apply(&self, config: &mut config::InferenceGatewayConfig) {
        if let Some(address) = &self.listen {
            match config.spec.listeners.first_mut() {
                Some(listener) => listener.address = address.clone(),
                // An endpoint picker's config may have no listener: the
                // flag gives it one.
                None => config.spec.listeners.push(config::Listener {
                    name: "public".to_owned(),
                    address: address.clone(),
                    tls: None,
                }),
            }
        }
        if let Some(address) = &self.admin_listen {
            let tls = config.spec.admin.take().and_then(|a| a.tls);
            config.spec.admin = Some(config::Admin {
                address: address.clone(),
                tls,
            });
        }
    }
}

/// Resolves when the watched config file changed; never without one.
pub async fn changed(watch: &mut Option<FileWatch>) {
    match watch {
        Some(w) => {
            // The config is read again by its own loader, which names what
            // is wrong with it; what the watch read is only the signal.
            w.changed().await;
        }
        None => std::future::pending().await,
    }
}

/// The checks of a document beyond the config crate's own, the same for
/// `check`, `serve` and a reload: what the simulator would refuse, and
/// the TLS files (certificates, keys, CAs) as they are now.
pub fn problems(
    config: &config::InferenceGatewayConfig,
    unreadable: &config::Unreadable,
) -> Vec<config::Problem> {
    let mut problems = crate::simulated::problems(config, unreadable);
    problems.extend(gateway::tls::problems(config));
    problems
}

/// What a reload changes besides the config: the gateway, the simulated
/// fleets and the Kubernetes watches.
pub struct Running<'a> {
    pub gateway: &'a gateway::Gateway,
    pub fleets: &'a mut Fleets,
    pub discoveries: &'a mut infergate_kube::Discoveries,
}

/// Read the config file again and put it in force. A file that does not
/// load, validate or apply is logged and changes nothing. `why`: what
/// asked for the reload, for the log.
pub async fn reload(running: Running<'_>, path: Option<&Path>, overrides: &Overrides, why: &str) {
    let Some(path) = path else {
        tracing::info!("{why}: no config file to reload");
        return;
    };
    let loaded = config::load_file_with(path, problems);
    let source = path.display().to_string();
    let _ = put_in_force(running, loaded, overrides, &source, why).await;
}

/// Put a config document (an `InferenceGatewayConfig` object as read from
/// a cluster) in force, as a file reload would. Returns every problem,
/// one per line, when it is refused; the running config then stays.
pub async fn apply_document(
    running: Running<'_>,
    document: &str,
    overrides: &Overrides,
    source: &str,
    why: &str,
) -> Result<(), String> {
    let loaded = config::from_yaml_with(document, problems);
    put_in_force(running, loaded, overrides, source, why).await
}

/// The one path every change of config takes after it is read: validate
/// with the command line's overrides, start simulated fleets and watches it
/// names, apply, count and log. Anything that fails changes nothing.
async fn put_in_force(
    running: Running<'_>,
    loaded: Result<config::InferenceGatewayConfig, config::ConfigError>,
    overrides: &Overrides,
    source: &str,
    why: &str,
) -> Result<(), String> {
    let Running {
        gateway,
        fleets,
        discoveries,
    } = running;
    let applied = async {
        let mut config = loaded?;
        overrides.apply(&mut config);
        let mut config = config::validated(config)?;
        discoveries.prepare(&config).await?;
        let prepared = fleets.prepare(&mut config).await?;
        gateway.apply(&config)?;
        fleets.commit(prepared);
        discoveries.sync(&config, gateway);
        anyhow::Ok(())
    };
    let result = applied.await;
    gateway.count_reload(result.is_ok());
    match result {
        Ok(()) => {
            tracing::info!(%source, trigger = why, "config reloaded");
            Ok(())
        }
        Err(e) => {
            let problems = format!("{e:#}");
            tracing::error!(
                %source,
                trigger = why,
                error = %problems,
                "reload refused; the running config stays in force"
            );
            Err(problems)
        }
    }
}
