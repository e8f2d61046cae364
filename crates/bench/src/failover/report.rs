//! A failover run's report: the markdown table printed and written as
//! NAME.md, the JSON of everything measured, and the share plot.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

use super::analysis::{Measured, RECOVERED_FRACTION, SHARE_WINDOW, Timeline};
use super::options::FailoverOptions;

/// One run of the scenario.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    pub scenario: &'static str,
    pub options: FailoverOptions,
    pub replicas_per_member: usize,
    pub timeline: Timeline,
    pub measured: Measured,
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

fn ms(value: Option<f64>) -> String {
    value.map_or("—".to_owned(), |v| format!("{v:.0} ms"))
}

fn percent(value: Option<f64>) -> String {
    value.map_or("—".to_owned(), |v| format!("{:.1} %", v * 100.0))
}

impl FailoverReport {
    pub fn markdown(&self) -> String {
        let (o, t, m) = (&self.options, &self.timeline, &self.measured);
        let victim = &t.victim;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "### {}: {} members × {} simulated H100 replicas (Llama-3.1-8B), {:.0} streamed requests/s for {}; {victim} killed at {}, back at {}; `unhealthyAfter` {}, `rampUp` {}, seed {}\n",
            self.scenario,
            o.members,
            self.replicas_per_member,
            o.rate,
            secs(o.length),
            secs(t.killed_at),
            secs(t.restarted_at),
            secs(o.unhealthy_after),
            secs(o.ramp_up),
            o.seed,
        );
        let errors = if m.errors.is_empty() {
            String::new()
        } else {
            let causes: Vec<String> = m.errors.iter().map(|(c, n)| format!("{n}× {c}")).collect();
            format!(" ({})", causes.join(", "))
        };
        let rows = [
            (
                "requests / failed".to_owned(),
                format!("{} / {}{errors}", m.requests, m.failed),
            ),
            (
                "requests retried on another member (failed at one before any byte)".to_owned(),
                format!("{:.0}", m.retried),
            ),
            (
                format!("**failover time**: kill → last request the router sent {victim}"),
                format!(
                    "{} (read every {:.0} ms; {:.0} attempts after the kill, {:.0} from `unhealthyAfter` + {} to the restart)",
                    ms(m.failover_ms),
                    m.sample_period_ms,
                    m.attempts_after_kill,
                    m.attempts_while_out,
                    ms(Some(
                        super::analysis::OUT_OF_ROTATION_MARGIN.as_secs_f64() * 1e3
                    )),
                ),
            ),
            (
                format!(
                    "restart → {victim}'s share back to a third (≥ {:.0} % of a fair share over {})",
                    RECOVERED_FRACTION * 100.0,
                    secs(SHARE_WINDOW)
                ),
                ms(m.recovery_ms),
            ),
            (
                format!("{victim}'s share before / while down / first second back / last 3 s"),
                format!(
                    "{} / {} / {} / {}",
                    percent(m.victim_share_before),
                    percent(m.victim_share_down),
                    percent(m.victim_share_first_back),
                    percent(m.victim_share_end)
                ),
            ),
        ];
        let _ = writeln!(out, "| measured | value |\n|---|---|");
        for (what, value) in rows {
            let _ = writeln!(out, "| {what} | {value} |");
        }
        let _ = writeln!(
            out,
            "\n| requests sent | requests | failed | TTFT p50 | TTFT p95 | TTFT p99 |\n|---|---|---|---|---|---|"
        );
        for p in &m.phases {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} |",
                phase_label(p.name, t),
                p.requests,
                p.failed,
                ms(p.ttft_p50_ms),
                ms(p.ttft_p95_ms),
                ms(p.ttft_p99_ms)
            );
        }
        out
    }

    /// Write `STEM.json`, `STEM.md` and `STEM.svg` into `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |ext: &str, text: String| {
            let path = dir.join(format!("{stem}.{ext}"));
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
        };
        write("json", serde_json::to_string_pretty(self)? + "\n")?;
        write("md", self.markdown())?;
        write(
            "svg",
            super::svg::share_plot(&self.timeline, &self.measured.bins),
        )?;
        Ok(())
    }
}

fn phase_label(name: &str, t: &Timeline) -> String {
    match name {
        "before" => format!("before the kill (0–{})", secs(t.killed_at)),
        "during" => format!(
            "{} down ({}–{})",
            t.victim,
            secs(t.killed_at),
            secs(t.restarted_at)
        ),
        _ => format!(
            "after the restart ({}–{})",
            secs(t.restarted_at),
            secs(t.length)
        ),
    }
}
