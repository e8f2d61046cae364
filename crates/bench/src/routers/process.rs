//! A router running as a child process, in a process group of its own
//! (nginx forks workers; the Python routers may start helpers): its CPU
//! time is the group's, read from `/proc`, and stopping it stops the group.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use tokio::process::{Child, Command};

/// What to run.
#[derive(Debug, Clone)]
pub struct Launch {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// A running router process and the directory holding its files.
pub struct RouterProcess {
    child: Child,
    /// Process group id (the child's pid).
    group: i32,
    workdir: tempfile::TempDir,
}

/// The router's stderr and stdout, in its directory.
const LOG_FILE: &str = "router.log";

impl RouterProcess {
    /// Start `launch` in `workdir`, its output to `workdir`/router.log.
    pub fn spawn(launch: &Launch, workdir: tempfile::TempDir) -> anyhow::Result<Self> {
        let log = std::fs::File::create(workdir.path().join(LOG_FILE))?;
        let child = Command::new(&launch.program)
            .args(&launch.args)
            .envs(launch.env.iter().map(|(k, v)| (k, v)))
            .current_dir(workdir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("running {}", launch.program.display()))?;
        let group = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .context("the router exited at once")?;
        Ok(RouterProcess {
            child,
            group,
            workdir,
        })
    }

    pub fn dir(&self) -> &Path {
        self.workdir.path()
    }

    /// The exit status, if the router has exited.
    pub fn exited(&mut self) -> anyhow::Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// CPU seconds (user + system) used so far by every process of the
    /// router's group.
    pub fn cpu_seconds(&self) -> Option<f64> {
        group_cpu_seconds(self.group)
    }

    /// The last lines of the router's output, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir().join(LOG_FILE)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// SIGTERM to the group, then SIGKILL if it has not exited within a
    /// few seconds (nginx's workers outlive a killed master otherwise).
    pub async fn stop(mut self) {
        signal_group(self.group, libc::SIGTERM);
        let graceful = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        // Whatever is left of the group (workers, helpers) goes too.
        signal_group(self.group, libc::SIGKILL);
        if graceful.is_err() {
            let _ = self.child.wait().await;
        }
    }
}

fn signal_group(group: i32, signal: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals a process group; it has
    // no memory effects on this process.
    unsafe {
        libc::kill(-group, signal);
    }
}

/// CPU seconds of every live process whose process group is `group`.
pub fn group_cpu_seconds(group: i32) -> Option<f64> {
    let ticks_per_second = clock_ticks()?;
    let mut ticks = 0u64;
    let mut found = false;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some(stat) = ProcStat::parse(&text)
            && stat.group == group
        {
            found = true;
            ticks += stat.cpu_ticks;
        }
    }
    found.then(|| ticks as f64 / ticks_per_second)
}

fn clock_ticks() -> Option<f64> {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

/// The fields of `/proc/PID/stat` the bench reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Process group id (field 5).
    pub group: i32,
    /// utime + stime + cutime + cstime (fields 14-17): the process's own
    /// CPU time and that of children it has reaped, in clock ticks.
    pub cpu_ticks: u64,
}

impl ProcStat {
    /// Parse one `stat` line. The command name (field 2) is in parentheses
    /// and may itself hold spaces and parentheses, so fields are counted
    /// from its last `)`.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // fields[0] is field 3 (state).
        let field = |n: usize| fields.get(n - 3).copied();
        let ticks = |n: usize| field(n)?.parse::<u64>().ok();
        Some(ProcStat {
            group: field(5)?.parse().ok()?,
            cpu_ticks: ticks(14)? + ticks(15)? + ticks(16)? + ticks(17)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_past_odd_command_names() {
        let line = "4242 (nginx: worker (x)) S 4241 4241 4241 0 -1 4194624 180 0 0 0 \
                    25 7 3 1 20 0 1 0 123 1000 200 18446744073709551615";
        let stat = ProcStat::parse(line).unwrap();
        assert_eq!(stat.group, 4241);
        assert_eq!(stat.cpu_ticks, 25 + 7 + 3 + 1);
        assert_eq!(ProcStat::parse("12 (short) S 1"), None);
        assert_eq!(ProcStat::parse("garbage"), None);
    }

    #[test]
    fn this_process_group_has_cpu_time() {
        // SAFETY: getpgrp has no preconditions.
        let group = unsafe { libc::getpgrp() };
        let seconds = group_cpu_seconds(group).expect("this process is in its group");
        assert!(seconds >= 0.0);
        assert_eq!(group_cpu_seconds(i32::MAX), None);
    }
}
