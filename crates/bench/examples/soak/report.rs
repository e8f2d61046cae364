//! The minute lines, the samples file, the checks and the summary.

use super::*;

pub(crate) fn clock(d: Duration) -> String {
    let s = d.as_secs();
    format!("{:2}:{:02}", s / 60, s % 60)
}

pub(crate) fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[i])
}

pub(crate) fn median(mut values: Vec<f64>) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    percentile(&values, 0.5)
}

pub(crate) fn ms(v: Option<f64>) -> String {
    match v {
        None => "n/a".into(),
        Some(v) if v >= 1000.0 => format!("{:.2}s", v / 1e3),
        Some(v) => format!("{v:.0}ms"),
    }
}

pub(crate) fn num(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.0}"))
}

pub(crate) fn mib(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.1} MiB"))
}

/// The checkout's commit, `-dirty` with changes not committed.
pub(crate) fn commit() -> String {
    std::process::Command::new("git")
        .args([
            "describe",
            "--always",
            "--dirty",
            "--match",
            "no tag matches",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// `infergate_migrations_total` as `reason: n outcome, …; …`, e.g.
/// `broken: 12 continued, 1 completed`; `none` before any.
pub(crate) fn migrations_line(migrations: Option<&BTreeMap<(String, String), f64>>) -> String {
    let Some(migrations) = migrations else {
        return "n/a".into();
    };
    let mut by_reason: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for ((reason, outcome), n) in migrations {
        if *n > 0.0 {
            by_reason
                .entry(reason)
                .or_default()
                .push(format!("{n:.0} {outcome}"));
        }
    }
    if by_reason.is_empty() {
        return "none".into();
    }
    by_reason
        .iter()
        .map(|(reason, outcomes)| format!("{reason}: {}", outcomes.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// One line a minute.
pub(crate) fn minute_line(shared: &Shared, sample: &Sample) -> String {
    let (line, mut minute) = {
        let mut stats = shared.stats.lock().unwrap();
        let line = format!(
            "sent {} ok {} left {} streams {} whole {} cut {} not-whole {} lost {} | {} inflight {}",
            stats.sent,
            stats.count(|c| c == Class::Complete),
            stats.count(|c| c == Class::Left),
            stats.streams_sent,
            stats.streams_whole,
            stats.count(Class::is_cut),
            stats.count(Class::is_not_whole),
            stats.count(Class::is_lost),
            stats.errors_line(),
            shared.in_flight.load(Ordering::Relaxed),
        );
        (line, std::mem::take(&mut stats.minute))
    };
    minute.sort_by(f64::total_cmp);
    let slow = shared.slow.lock().unwrap();
    format!(
        "{}  {line} | moved {} | p50 {} p99 {} | rss {} fds {} conns {} (kernel {}) tasks {} | gw reqs {} | slowloris open {}",
        clock(Duration::from_secs_f64(sample.t)),
        migrations_line(sample.migrations()),
        ms(percentile(&minute, 0.5)),
        ms(percentile(&minute, 0.99)),
        mib(sample.rss_mib),
        num(sample.fds),
        num(sample.connections()),
        num(sample.sockets),
        num(sample.tasks()),
        num(sample.requests()),
        slow[0].open + slow[1].open,
    )
}

pub(crate) fn samples_csv(samples: &[Sample]) -> String {
    let mut out = String::from(
        "t_s,rss_mib,fds,cpu_s,client_connections,kernel_sockets,alive_tasks,gateway_requests,\
         migrations,sent,complete,errors,in_flight,streams_cut,lost\n",
    );
    let cell = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.2}"));
    for s in samples {
        let migrations = s.migrations().map(|m| m.values().sum::<f64>());
        let _ = writeln!(
            out,
            "{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            s.t,
            cell(s.rss_mib),
            cell(s.fds),
            cell(s.cpu_seconds),
            cell(s.connections()),
            cell(s.sockets),
            cell(s.tasks()),
            cell(s.requests()),
            cell(migrations),
            s.client[0],
            s.client[1],
            s.client[2],
            s.client[3],
            s.client[4],
            s.client[5],
        );
    }
    out
}

/// One row of the checks table; `pass` is `None` when it cannot be judged
/// (a gauge the gateway does not export).
pub(crate) struct Check {
    pub(crate) name: &'static str,
    pub(crate) before: String,
    pub(crate) after: String,
    pub(crate) limit: String,
    pub(crate) pass: Option<bool>,
}

impl Check {
    pub(crate) fn result(&self) -> &'static str {
        match self.pass {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "n/a",
        }
    }
}

/// The median of `pick` over the samples within `[from, to]`.
pub(crate) fn window_median(
    samples: &[Sample],
    (from, to): (f64, f64),
    pick: impl Fn(&Sample) -> Option<f64>,
) -> Option<f64> {
    let values: Vec<f64> = samples
        .iter()
        .filter(|s| s.t >= from && s.t <= to)
        .filter_map(pick)
        .collect();
    // Fewer than three samples make no median worth comparing.
    if values.len() < 3 {
        None
    } else {
        median(values)
    }
}

pub(crate) fn flat_check(
    name: &'static str,
    samples: &[Sample],
    timeline: &Timeline,
    pick: impl Fn(&Sample) -> Option<f64> + Copy,
    allowed: impl Fn(f64) -> f64,
    show: impl Fn(Option<f64>) -> String,
) -> Check {
    let before = window_median(samples, timeline.baseline(), pick);
    let after = window_median(samples, timeline.last(), pick);
    let limit = before.map(|b| b + allowed(b));
    let pass = match (after, limit) {
        (Some(a), Some(l)) => Some(a <= l),
        _ => Some(false),
    };
    let change = match (before, after) {
        (Some(b), Some(a)) if b > 0.0 => format!(" ({:+.1} %)", (a - b) / b * 100.0),
        _ => String::new(),
    };
    Check {
        name,
        before: show(before),
        after: format!("{}{change}", show(after)),
        limit: format!("≤ {}", show(limit)),
        pass,
    }
}

pub(crate) fn window_name((from, to): (f64, f64)) -> String {
    let c = |s: f64| clock(Duration::from_secs_f64(s)).trim().to_owned();
    format!("{}–{}", c(from), c(to))
}

pub(crate) struct SummaryInput<'a> {
    pub(crate) args: &'a Args,
    /// Seconds of CPU the gateway used per second of traffic.
    pub(crate) cpu: Option<f64>,
    pub(crate) timeline: &'a Timeline,
    pub(crate) stats: &'a Stats,
    pub(crate) commit: &'a str,
    pub(crate) slow: &'a [SlowKind; 2],
    pub(crate) faults: &'a FaultLog,
    pub(crate) end: &'a Sample,
    pub(crate) checks: &'a [Check],
    pub(crate) exit: &'a str,
    pub(crate) passed: bool,
    pub(crate) died: bool,
    pub(crate) interrupted: bool,
}

/// The tables for BENCHMARKS.md.
pub(crate) fn summary(s: &SummaryInput<'_>) -> String {
    let mut out = String::new();
    let a = s.args;
    let stats = s.stats;
    let mut all = stats.all.clone();
    all.sort_by(f64::total_cmp);
    let p = |q| ms(percentile(&all, q));
    let _ = writeln!(
        out,
        "Soak: `scripts/soak --minutes {} --rate {} --seed {}`: {} simulated H100 replicas \
         (time scale {}), the gateway with its default config (continuation on); commit {}.\n",
        a.minutes, a.rate, a.seed, a.replicas, a.time_scale, s.commit
    );
    out.push_str("| run | |\n|---|---|\n");
    let complete = stats.count(|c| c == Class::Complete);
    let _ = writeln!(
        out,
        "| requests | {} sent: {complete} complete, {} left mid-stream on purpose, {} |",
        stats.sent,
        stats.count(|c| c == Class::Left),
        stats.errors_line().replacen("err", "errors", 1),
    );
    let _ = writeln!(
        out,
        "| streams | {} streamed ({:.0} % of requests; {} with include_usage): {} whole, \
         {} left on purpose, {} cut, {} not whole |",
        stats.streams_sent,
        stats.streams_sent as f64 * 100.0 / (stats.sent.max(1)) as f64,
        stats.streams_usage,
        stats.streams_whole,
        stats.count(|c| c == Class::Left),
        stats.count(Class::is_cut),
        stats.count(Class::is_not_whole),
    );
    let messages = |map: &BTreeMap<String, u64>| {
        if map.is_empty() {
            "none".to_owned()
        } else {
            map.iter()
                .map(|(m, n)| format!("{n} × “{}”", m.replace('|', "/")))
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    let _ = writeln!(
        out,
        "| error events in streams | {} |",
        messages(&stats.error_events)
    );
    let _ = writeln!(
        out,
        "| error answers | {} |",
        messages(&stats.error_statuses)
    );
    let migrations = s.end.migrations();
    let total: f64 = migrations.map_or(0.0, |m| m.values().sum());
    let _ = writeln!(
        out,
        "| continuations (`infergate_migrations_total`) | {total:.0}: {} |",
        migrations_line(migrations)
    );
    let _ = writeln!(
        out,
        "| latency of complete answers | p50 {}, p90 {}, p99 {}, max {} |",
        p(0.5),
        p(0.9),
        p(0.99),
        p(1.0)
    );
    let by_code = s
        .end
        .gateway
        .as_ref()
        .map(|g| {
            g.by_code
                .iter()
                .map(|(code, n)| format!("{code}×{n:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| "n/a".into());
    let _ = writeln!(
        out,
        "| gateway's count by status | {by_code}; retries {} |",
        num(s.end.gateway.as_ref().and_then(|g| g.retries))
    );
    let f = s.faults;
    let _ = writeln!(
        out,
        "| faults | {} replicas SIGKILLed, {} restarted; {} /metrics faults ({}); \
         {} slowdowns ×{SLOWDOWN}; {} failed |",
        f.kills,
        f.restarts,
        f.metrics.len(),
        f.metrics.join(", "),
        f.slowdowns,
        f.failures,
    );
    for (name, k) in [("trickling", &s.slow[0]), ("silent", &s.slow[1])] {
        let mut closed = k.closed_after.clone();
        closed.sort_by(f64::total_cmp);
        let statuses: Vec<String> = k.statuses.iter().map(|(c, n)| format!("{c}×{n}")).collect();
        let _ = writeln!(
            out,
            "| slowloris, {name} | {} opened; {} closed by the gateway after {}–{} s{}; {} open at the end |",
            k.opened,
            closed.len(),
            closed.first().map_or("–".into(), |v| format!("{v:.0}")),
            closed.last().map_or("–".into(), |v| format!("{v:.0}")),
            if statuses.is_empty() {
                String::new()
            } else {
                format!(" (answered {})", statuses.join(" "))
            },
            k.open_at_stop.len(),
        );
    }
    let _ = writeln!(
        out,
        "| gateway CPU | {} of a core, on average |",
        s.cpu
            .map_or("n/a".into(), |c| format!("{:.0} %", c * 100.0))
    );
    let _ = writeln!(out, "| gateway exit after SIGTERM | {} |", s.exit);
    let (b, l) = (s.timeline.baseline(), s.timeline.last());
    let _ = writeln!(
        out,
        "\n| check | before | after | limit | result |\n|---|---|---|---|---|"
    );
    for c in s.checks {
        let (before, after) = if c.name.ends_with("median") {
            (
                format!("{} (min {})", c.before, window_name(b)),
                format!("{} (min {})", c.after, window_name(l)),
            )
        } else {
            (c.before.clone(), c.after.clone())
        };
        let _ = writeln!(
            out,
            "| {} | {before} | {after} | {} | {} |",
            c.name,
            c.limit,
            c.result()
        );
    }
    let mut verdict = if s.passed { "PASS" } else { "FAIL" }.to_owned();
    if s.died {
        verdict.push_str(" (the gateway died)");
    }
    if s.interrupted {
        verdict.push_str(" (interrupted)");
    }
    if f.failures > 0 {
        verdict.push_str(" (a fault could not be injected)");
    }
    let _ = writeln!(out, "| **verdict** | | | | **{verdict}** |");
    out
}
