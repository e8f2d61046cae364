//! A scenario's results as `NAME.json`, a markdown table (`NAME.md` and
//! stdout) and an SVG chart (`NAME.svg`): TTFT p95 against load, or for
//! the flow-control comparison, TTFT p99 per band in each flow-control
//! mode (on, flat, off, priority).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use crate::allocation::StaticAllocation;
use crate::stats::{BandSummary, Outcome, Status, Summary, change_percent};

/// Everything one scenario run produced. Serializes to the `NAME.json`
/// schema: `scenario`, `mode`, `seed`, `fleet`, `results`, and in scenarios
/// that compute it, `static_allocation`.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: String,
    pub mode: String,
    pub seed: u64,
    pub fleet: FleetReport,
    pub results: Vec<Summary>,
    /// The best static allocation of each load, computed from the engine
    /// profiles ([`crate::allocation`]), when the scenario asks for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub static_allocation: Vec<StaticAllocation>,
    /// How the runs were set up, for the markdown.
    #[serde(skip)]
    pub setup: Setup,
}

/// The fleet, and the capacity its load levels are fractions of.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// "4 × h100 + 4 × a10g, llama-3.1-8b".
    pub description: String,
    pub replicas: usize,
    /// GPU profile of each replica.
    pub hardware: Vec<String>,
    pub model: String,
    /// GPUs per replica.
    pub tensor_parallel: u32,
    pub adapters: usize,
    pub max_loras: u32,
    /// Estimated saturation throughput of the fleet.
    pub capacity_requests_per_s: f64,
    /// Per GPU profile: saturation throughput of one replica.
    pub replica_capacity: BTreeMap<String, ReplicaCapacityReport>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReplicaCapacityReport {
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
}

/// How the runs were set up.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    pub about: String,
    /// "60 s of arrivals".
    pub length: String,
    pub client_timeout: f64,
    /// Live mode: engine seconds per wall second, per load.
    pub time_scales: Vec<(f64, f64)>,
    /// Requests offered at each load.
    pub requests_per_load: Vec<(f64, usize)>,
    /// Wall-clock seconds of each run, in result order.
    pub wall_seconds: Vec<f64>,
    /// What each run's figures rest on, in result order.
    pub runs: Vec<RunDetail>,
    /// Overrides of the scored policies' scheduling config, as JSON.
    pub scheduling: Option<String>,
    /// More setup lines, one bullet each.
    pub notes: Vec<String>,
    /// The runs compare routers (`--routers`): add the side-by-side
    /// comparison of [`crate::comparison`].
    pub routers: bool,
}

/// What one run's summary does not say: how many samples each
/// percentile rests on, and why its errors failed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunDetail {
    /// Requests behind the TTFT percentiles (completed and timed out).
    pub ttft_samples: u64,
    /// Requests behind the inter-token percentiles (completed, two tokens
    /// or more).
    pub itl_samples: u64,
    /// Requests behind the end-to-end percentiles (completed and timed
    /// out).
    pub e2e_samples: u64,
    /// Client timeouts before the first token: queued or in prefill for the
    /// whole timeout.
    pub timed_out_before_first_token: u64,
    /// Client timeouts after the first token: the answer was still
    /// streaming when the timeout came.
    pub timed_out_mid_answer: u64,
    /// Error statuses and broken streams.
    pub failed: u64,
}

impl RunDetail {
    /// Counted as [`crate::stats::summarize`] counts them.
    pub fn of(outcomes: &[Outcome]) -> Self {
        let mut detail = RunDetail::default();
        for o in outcomes {
            match o.status {
                Status::Completed => {
                    detail.ttft_samples += u64::from(o.ttft.is_some());
                    detail.itl_samples += u64::from(o.itl.is_some());
                    detail.e2e_samples += u64::from(o.e2e.is_some());
                }
                Status::TimedOut => {
                    detail.ttft_samples += 1;
                    detail.e2e_samples += 1;
                    if o.ttft.is_some() {
                        detail.timed_out_mid_answer += 1;
                    } else {
                        detail.timed_out_before_first_token += 1;
                    }
                }
                Status::Failed => detail.failed += 1,
                Status::Rejected => {}
            }
        }
        detail
    }

    /// For a summary without its outcomes: at most this many samples.
    fn estimated(summary: &Summary) -> Self {
        RunDetail {
            ttft_samples: summary.completed + summary.errors,
            itl_samples: summary.completed,
            e2e_samples: summary.completed + summary.errors,
            ..RunDetail::default()
        }
    }

    fn timed_out(&self) -> u64 {
        self.timed_out_before_first_token + self.timed_out_mid_answer
    }

    /// "11 client timeouts (7 mid-answer, 4 before the first token) and
    /// 1 failure".
    fn errors(&self) -> String {
        let mut parts = Vec::new();
        let timed_out = self.timed_out();
        if timed_out > 0 {
            let mut causes = Vec::new();
            if self.timed_out_mid_answer > 0 {
                causes.push(format!("{} mid-answer", self.timed_out_mid_answer));
            }
            if self.timed_out_before_first_token > 0 {
                causes.push(format!(
                    "{} before the first token",
                    self.timed_out_before_first_token
                ));
            }
            parts.push(format!(
                "{timed_out} client timeout{} ({})",
                plural(timed_out),
                causes.join(", ")
            ));
        }
        if self.failed > 0 {
            parts.push(format!("{} failure{}", self.failed, plural(self.failed)));
        }
        parts.join(" and ")
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A percentile with fewer samples above it than this is marked in the
/// tables: it is little more than the run's largest value or two, and one
/// request more or less moves it.
pub const MIN_SAMPLES_ABOVE: f64 = 5.0;

/// Whether `p` (0..=100) of `samples` values leaves too few above it to
/// mean much: a p99 needs 500 samples, a p95 100, a p50 10.
pub fn thin_percentile(samples: u64, p: f64) -> bool {
    (samples as f64) * (1.0 - p / 100.0) < MIN_SAMPLES_ABOVE
}

/// Samples a `p` percentile needs not to be thin.
fn min_samples(p: f64) -> u64 {
    (MIN_SAMPLES_ABOVE / (1.0 - p / 100.0)).round() as u64
}

/// The marker of a thin percentile in the tables.
const THIN: &str = "†";

/// A latency cell: `value`, marked when it rests on too few samples.
fn ms_cell(value: Option<f64>, samples: u64, p: f64) -> String {
    let text = ms(value);
    if value.is_some() && thin_percentile(samples, p) {
        format!("{text} {THIN}")
    } else {
        text
    }
}

impl ScenarioReport {
    /// Write `STEM.json`, `STEM.md` and `STEM.svg` into `dir`.
    pub fn write(&self, dir: &Path, stem: &str) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let write = |ext: &str, contents: String| {
            let path = dir.join(format!("{stem}.{ext}"));
            std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))
        };
        write(
            "json",
            serde_json::to_string_pretty(self).expect("reports serialize") + "\n",
        )?;
        write("md", self.markdown())?;
        write("svg", self.svg())?;
        Ok(())
    }

    /// Policies in the order they were run.
    fn policies(&self) -> Vec<&str> {
        let mut policies: Vec<&str> = Vec::new();
        for r in &self.results {
            if !policies.contains(&r.policy.as_str()) {
                policies.push(&r.policy);
            }
        }
        policies
    }

    fn loads(&self) -> Vec<f64> {
        let mut loads: Vec<f64> = Vec::new();
        for r in &self.results {
            if !loads.contains(&r.load) {
                loads.push(r.load);
            }
        }
        loads
    }

    fn baseline(&self, load: f64) -> Option<&Summary> {
        self.results
            .iter()
            .find(|r| r.load == load && r.policy == "round-robin")
    }

    /// What result `index` rests on: as counted during the run, else
    /// estimated from its summary.
    fn detail(&self, index: usize) -> RunDetail {
        match (self.setup.runs.get(index), self.results.get(index)) {
            (Some(detail), _) => *detail,
            (None, Some(summary)) => RunDetail::estimated(summary),
            (None, None) => RunDetail::default(),
        }
    }

    /// Whether the causes of the errors were counted.
    fn errors_counted(&self) -> bool {
        self.setup.runs.len() == self.results.len()
    }

    /// The scenario's section: heading, setup, one table row per policy
    /// and load.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let f = &self.fleet;
        let _ = writeln!(
            out,
            "## {} ({} mode, seed {})\n",
            self.scenario, self.mode, self.seed
        );
        if !self.setup.about.is_empty() {
            let _ = writeln!(out, "{}\n", self.setup.about);
        }
        let per_replica = f
            .replica_capacity
            .iter()
            .map(|(hw, c)| {
                format!(
                    "{hw} {:.2} req/s, {:.0} output tok/s",
                    c.requests_per_s, c.output_tokens_per_s
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let _ = writeln!(
            out,
            "- Fleet: {}. Estimated capacity {:.1} req/s (per replica: {per_replica}).",
            f.description, f.capacity_requests_per_s
        );
        let requests = self
            .setup
            .requests_per_load
            .iter()
            .map(|(load, n)| format!("{} at {}", n, percent(*load)))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "- Each run: {} (offered: {requests}); client timeout {} s (simulated).",
            self.setup.length, self.setup.client_timeout
        );
        if let Some(scheduling) = &self.setup.scheduling {
            let _ = writeln!(
                out,
                "- Scored policies ran with these scheduling overrides: `{scheduling}`."
            );
        }
        for note in &self.setup.notes {
            let _ = writeln!(out, "- {note}");
        }
        if !self.setup.time_scales.is_empty() {
            let scales = self
                .setup
                .time_scales
                .iter()
                .map(|(load, scale)| format!("{scale}× at {}", percent(*load)))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "- Replicas ran faster than real time ({scales}); latencies are in simulated time."
            );
        }
        if !self.setup.wall_seconds.is_empty() {
            let total: f64 = self.setup.wall_seconds.iter().sum();
            let _ = writeln!(
                out,
                "- Wall time: {total:.1} s for {} runs.",
                self.setup.wall_seconds.len()
            );
        }
        out.push('\n');
        if self.compares_flow_control() {
            self.flow_table(&mut out);
            return out;
        }
        out.push_str(
            "| load | policy | TTFT p50 | TTFT p95 | TTFT p99 | ITL p50 | ITL p99 | e2e p50 | e2e p99 | output tok/s | completed | errors | 429s | prefix hits | TTFT p95 vs RR | TTFT p99 vs RR | tok/s vs RR |\n",
        );
        out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let mut thin = false;
        for load in self.loads() {
            let base = self
                .results
                .iter()
                .position(|r| r.load == load && r.policy == "round-robin");
            for (i, r) in self
                .results
                .iter()
                .enumerate()
                .filter(|(_, r)| r.load == load)
            {
                let d = self.detail(i);
                let base_ttft = base.map_or(0, |b| self.detail(b).ttft_samples);
                let vs = |value: fn(&Summary) -> Option<f64>, p: Option<f64>| match base {
                    Some(b) if b != i => {
                        let change =
                            signed_percent(change_percent(value(r), value(&self.results[b])));
                        let thin = p.is_some_and(|p| {
                            thin_percentile(d.ttft_samples, p) || thin_percentile(base_ttft, p)
                        });
                        if thin && change != "—" {
                            format!("{change} {THIN}")
                        } else {
                            change
                        }
                    }
                    _ => "—".to_owned(),
                };
                let cells = [
                    ms_cell(r.ttft_p50_ms, d.ttft_samples, 50.0),
                    ms_cell(r.ttft_p95_ms, d.ttft_samples, 95.0),
                    ms_cell(r.ttft_p99_ms, d.ttft_samples, 99.0),
                    ms_cell(r.itl_p50_ms, d.itl_samples, 50.0),
                    ms_cell(r.itl_p99_ms, d.itl_samples, 99.0),
                    ms_cell(r.e2e_p50_ms, d.e2e_samples, 50.0),
                    ms_cell(r.e2e_p99_ms, d.e2e_samples, 99.0),
                    vs(|s| s.ttft_p95_ms, Some(95.0)),
                    vs(|s| s.ttft_p99_ms, Some(99.0)),
                    vs(|s| Some(s.output_tokens_per_s), None),
                ];
                thin |= cells.iter().any(|c| c.ends_with(THIN));
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {:.1} % | {} | {} | {} |",
                    percent(load),
                    r.policy,
                    cells[0],
                    cells[1],
                    cells[2],
                    cells[3],
                    cells[4],
                    cells[5],
                    cells[6],
                    r.output_tokens_per_s,
                    r.completed,
                    r.errors,
                    r.rejected_429,
                    r.prefix_hit_rate * 100.0,
                    cells[7],
                    cells[8],
                    cells[9],
                );
            }
        }
        out.push('\n');
        if thin {
            let _ = writeln!(
                out,
                "{THIN} Too few samples for this percentile to mean much: fewer than {MIN_SAMPLES_ABOVE} requests lie above it (a p99 needs {}, a p95 {} requests behind it), so it is close to the run's slowest request and one request more or less moves it; so does a change computed from it. Longer runs (without `--quick`, or with `--requests`) give tails to compare.\n",
                min_samples(99.0),
                min_samples(95.0),
            );
        }
        self.errors_note(&mut out);
        self.allocation_tables(&mut out);
        if self.setup.routers {
            out.push('\n');
            out.push_str(&crate::comparison::markdown(&self.results));
        }
        out
    }

    /// The best static allocation of each load, then each run's mean e2e
    /// beside its percentiles and the allocation's mean.
    fn allocation_tables(&self, out: &mut String) {
        let Some(first) = self.static_allocation.first() else {
            return;
        };
        let _ = writeln!(
            out,
            "\n**Best static allocation**, computed from the engine profiles, not measured: each replica a queue whose completion rate depends on how many requests it holds (the simulator's step times at the mean request, {:.0} prompt and {:.0} output tokens), the split of the arrivals that minimises the mean end-to-end time. A policy that sees the replicas' state can do better than any static split.\n",
            first.request.prompt_tokens, first.request.output_tokens
        );
        out.push_str(
            "| load | offered | best split | mean e2e, best split | mean e2e, even split |\n",
        );
        out.push_str("|---|---:|---|---:|---:|\n");
        for a in &self.static_allocation {
            let split = if a.replicas.is_empty() {
                "none keeps up".to_owned()
            } else {
                a.replicas
                    .iter()
                    .map(|r| format!("{} {}", r.hardware, percent(r.share)))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let even = match a.even_split_mean_e2e_ms {
                Some(mean) => ms(Some(mean)),
                None => "a replica falls behind".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {} | {:.3} req/s | {split} | {} | {even} |",
                percent(a.load),
                a.requests_per_s,
                ms(a.mean_e2e_ms),
            );
        }
        out.push_str("\n| load | policy | e2e mean | e2e p50 | e2e p95 | TTFT p95 | errors | mean ÷ best static |\n");
        out.push_str("|---|---|---:|---:|---:|---:|---:|---:|\n");
        let mut thin = false;
        for (i, r) in self.results.iter().enumerate() {
            let best = self
                .static_allocation
                .iter()
                .find(|a| a.load == r.load)
                .and_then(|a| a.mean_e2e_ms);
            let ratio = match (r.e2e_mean_ms, best) {
                (Some(mean), Some(best)) if best > 0.0 => format!("{:.2}", mean / best),
                _ => "—".to_owned(),
            };
            let d = self.detail(i);
            let p50 = ms_cell(r.e2e_p50_ms, d.e2e_samples, 50.0);
            let p95 = ms_cell(r.e2e_p95_ms, d.e2e_samples, 95.0);
            let ttft = ms_cell(r.ttft_p95_ms, d.ttft_samples, 95.0);
            thin |= [&p50, &p95, &ttft].iter().any(|c| c.ends_with(THIN));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {p50} | {p95} | {ttft} | {} | {ratio} |",
                percent(r.load),
                r.policy,
                ms(r.e2e_mean_ms),
                r.errors,
            );
        }
        if thin {
            let _ = writeln!(
                out,
                "\n{THIN} Too few samples for this percentile to mean much (see above)."
            );
        }
        if self.results.iter().any(|r| r.errors > 0) {
            let _ = writeln!(
                out,
                "\nTimed-out requests count at the client timeout ({} s) in the mean, which understates it.",
                self.setup.client_timeout
            );
        }
    }

    /// Why the runs' errors failed, when there were any.
    fn errors_note(&self, out: &mut String) {
        if self.results.iter().all(|r| r.errors == 0) {
            return;
        }
        if !self.errors_counted() {
            out.push_str("Errors are failed requests and client timeouts together.\n");
            return;
        }
        let runs: Vec<String> = self
            .results
            .iter()
            .enumerate()
            .filter(|(_, r)| r.errors > 0)
            .map(|(i, r)| {
                format!(
                    "{} at {}: {}",
                    r.policy,
                    percent(r.load),
                    self.detail(i).errors()
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "Errors by cause — {}. A client timeout is a request without its complete answer {} s (simulated) after it was sent: mid-answer, the first token came but the answer was still streaming (a long answer on a slow replica); before the first token, it waited in a queue or in prefill the whole time. Timed-out requests count in the TTFT and e2e percentiles at the timeout. A failure is an error status or a broken stream.",
            runs.join("; "),
            self.setup.client_timeout,
        );
    }

    /// Whether the runs compare flow-control modes.
    fn compares_flow_control(&self) -> bool {
        self.results.iter().any(|r| r.flow_control.is_some())
    }

    /// What tells one flow-control run from another: on/off, with the
    /// policy and load when the report has several.
    fn run_label(&self, r: &Summary) -> String {
        let flow = r.flow_control.map_or("—", |f| f.as_str());
        let mut parts = Vec::new();
        if self.policies().len() > 1 {
            parts.push(r.policy.clone());
        }
        if self.loads().len() > 1 {
            parts.push(percent(r.load));
        }
        parts.push(flow.to_owned());
        parts.join(", ")
    }

    /// Per band (on and off next to each other), then per run: every
    /// request accounted for.
    fn flow_table(&self, out: &mut String) {
        out.push_str("| flow control | band | requests | completed | TTFT p50 | TTFT p99 | 429 saturated | 429 queue-full | 429 wait-expired | errors | queue wait p50 | queue wait p99 |\n");
        out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let mut bands: Vec<&str> = Vec::new();
        for b in self.results.iter().flat_map(|r| &r.bands) {
            if !bands.contains(&b.band.as_str()) {
                bands.push(&b.band);
            }
        }
        let mut thin = false;
        for band in bands {
            for r in &self.results {
                let Some(b) = r.bands.iter().find(|b| b.band == band) else {
                    continue;
                };
                // TTFT here is of completed requests only.
                let ttft = [
                    ms_cell(b.ttft_p50_ms, b.completed, 50.0),
                    ms_cell(b.ttft_p99_ms, b.completed, 99.0),
                ];
                thin |= ttft.iter().any(|c| c.ends_with(THIN));
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    self.run_label(r),
                    b.band,
                    b.requests,
                    b.completed,
                    ttft[0],
                    ttft[1],
                    b.refused_saturated,
                    b.refused_queue_full,
                    b.refused_wait_expired,
                    b.errors,
                    ms(b.queue_wait_p50_ms),
                    ms(b.queue_wait_p99_ms),
                );
            }
        }
        out.push('\n');
        if thin {
            let _ = writeln!(
                out,
                "{THIN} Too few completed requests for this percentile to mean much: fewer than {MIN_SAMPLES_ABOVE} lie above it (a p99 needs {} behind it).\n",
                min_samples(99.0),
            );
        }
        let other: u64 = self
            .results
            .iter()
            .flat_map(|r| &r.bands)
            .filter(|b| b.band == "all")
            .map(|b| b.refused_other)
            .sum();
        if other > 0 {
            let _ = writeln!(
                out,
                "{other} refusals gave no known `x-infergate-dropped-reason`; they count as refused, in none of the reason columns.\n"
            );
        }
        let totals = self
            .results
            .iter()
            .filter_map(|r| {
                let all = r.bands.iter().find(|b| b.band == "all")?;
                Some(format!(
                    "{}: {} sent = {} completed + {} refused + {} errors ({} of them client timeouts)",
                    self.run_label(r),
                    all.requests,
                    all.completed,
                    all.refused,
                    all.errors,
                    all.timed_out,
                ))
            })
            .collect::<Vec<_>>()
            .join("; ");
        let unaccounted: Vec<String> = self
            .results
            .iter()
            .flat_map(|r| r.bands.iter().map(move |b| (r, b)))
            .filter(|(_, b)| !b.accounted())
            .map(|(r, b)| format!("{} {}", self.run_label(r), b.band))
            .collect();
        if unaccounted.is_empty() {
            let _ = writeln!(
                out,
                "Every request is accounted for, in every band: {totals}."
            );
        } else {
            let _ = writeln!(
                out,
                "**Requests not accounted for** in {}: {totals}.",
                unaccounted.join(", ")
            );
        }
        out.push_str(
            "TTFT is of completed requests; queue wait is of requests sent to a replica (a `wait-expired` refusal waited its band's `maxWait`).\n",
        );
    }

    /// Flow control: TTFT p99 of completed requests per band, a bar for
    /// each run, with the share of the band that was refused.
    fn flow_svg(&self) -> String {
        let mut bands: Vec<&str> = Vec::new();
        for b in self.results.iter().flat_map(|r| &r.bands) {
            if b.band != "all" && !bands.contains(&b.band.as_str()) {
                bands.push(&b.band);
            }
        }
        let runs = &self.results;
        let top = runs
            .iter()
            .flat_map(|r| &r.bands)
            .filter_map(|b| b.ttft_p99_ms)
            .fold(0.0f64, f64::max);
        let (top, step) = nice_axis(top);
        let y = |ms: f64| TOP + PLOT_H * (1.0 - ms / top);
        let group_w = PLOT_W / bands.len().max(1) as f64;
        let bar_w = (group_w * 0.8 / runs.len().max(1) as f64).min(60.0);

        let mut svg = chart_open(&format!(
            "{}: TTFT p99 per band, by flow-control mode ({} mode)",
            self.scenario, self.mode
        ));
        let mut tick = 0.0;
        while tick <= top + step / 2.0 {
            chart_gridline(&mut svg, y(tick), &axis_ms(tick));
            tick += step;
        }
        for (g, band) in bands.iter().enumerate() {
            let center = LEFT + group_w * (g as f64 + 0.5);
            let start = center - bar_w * runs.len() as f64 / 2.0;
            for (i, r) in runs.iter().enumerate() {
                let Some(b) = r.bands.iter().find(|b| b.band == *band) else {
                    continue;
                };
                let x = start + bar_w * i as f64;
                let color = COLORS[i % COLORS.len()];
                if let Some(v) = b.ttft_p99_ms {
                    let yy = y(v);
                    let _ = writeln!(
                        svg,
                        r#"<rect x="{:.1}" y="{yy:.1}" width="{:.1}" height="{:.1}" fill="{color}"/>"#,
                        x + 2.0,
                        bar_w - 4.0,
                        TOP + PLOT_H - yy
                    );
                    let _ = writeln!(
                        svg,
                        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="11">{}</text>"#,
                        x + bar_w / 2.0,
                        yy - 4.0,
                        ms(Some(v))
                    );
                }
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
                    x + bar_w / 2.0,
                    TOP + PLOT_H + 14.0,
                    refused_share(b)
                );
            }
            let _ = writeln!(
                svg,
                r#"<text x="{center:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + PLOT_H + 32.0,
                escape(band)
            );
        }
        chart_frame(
            &mut svg,
            "band (under each bar: share refused with 429)",
            "TTFT p99 of completed requests",
        );
        for (i, r) in runs.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let ly = TOP + 10.0 + 20.0 * i as f64;
            let lx = LEFT + PLOT_W + 16.0;
            let _ = writeln!(
                svg,
                r#"<rect x="{lx:.1}" y="{:.1}" width="14" height="10" fill="{color}"/>"#,
                ly - 5.0
            );
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}">flow control {}</text>"#,
                lx + 20.0,
                ly + 4.0,
                escape(&self.run_label(r))
            );
        }
        svg.push_str("</svg>\n");
        svg
    }

    /// TTFT p95 against load, one line per policy, on a log scale (tails
    /// differ by orders of magnitude between policies); or per band for
    /// the flow-control comparison.
    pub fn svg(&self) -> String {
        if self.compares_flow_control() {
            return self.flow_svg();
        }
        let loads = self.loads();
        let values: Vec<f64> = self
            .results
            .iter()
            .filter_map(|r| r.ttft_p95_ms)
            .filter(|v| *v > 0.0)
            .collect();
        let (lo, hi) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            });
        let axis = if values.is_empty() {
            LogAxis::new(1.0, 10.0)
        } else {
            LogAxis::new(lo, hi)
        };
        let (load_lo, load_hi) = loads
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), l| {
                (lo.min(*l), hi.max(*l))
            });
        let load_span = if load_hi > load_lo {
            load_hi - load_lo
        } else {
            1.0
        };
        let x = |load: f64| LEFT + (load - load_lo) / load_span * PLOT_W;
        let x = |load: f64| {
            if loads.len() > 1 {
                x(load)
            } else {
                LEFT + PLOT_W / 2.0
            }
        };
        let y = |ms: f64| TOP + PLOT_H * (1.0 - axis.fraction(ms));

        let mut svg = chart_open(&format!(
            "{}: TTFT p95 vs load ({} mode)",
            self.scenario, self.mode
        ));
        for tick in axis.ticks() {
            match tick.label {
                Some(label) => chart_gridline(&mut svg, y(tick.ms), &label),
                None => chart_minor_gridline(&mut svg, y(tick.ms)),
            }
        }
        for &load in &loads {
            let xx = x(load);
            let _ = writeln!(
                svg,
                r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#eee"/>"##,
                TOP + PLOT_H
            );
            let _ = writeln!(
                svg,
                r#"<text x="{xx:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + PLOT_H + 18.0,
                percent(load)
            );
        }
        chart_frame(
            &mut svg,
            "offered load (fraction of estimated capacity)",
            "TTFT p95 (log scale)",
        );
        for (i, policy) in self.policies().into_iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<(f64, f64)> = self
                .results
                .iter()
                .filter(|r| r.policy == policy)
                .filter_map(|r| {
                    r.ttft_p95_ms
                        .filter(|v| *v > 0.0)
                        .map(|v| (x(r.load), y(v)))
                })
                .collect();
            if points.len() > 1 {
                let path = points
                    .iter()
                    .map(|(px, py)| format!("{px:.1},{py:.1}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                let _ = writeln!(
                    svg,
                    r#"<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>"#
                );
            }
            for (px, py) in &points {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{px:.1}" cy="{py:.1}" r="3.5" fill="{color}"/>"#
                );
            }
            let ly = TOP + 10.0 + 20.0 * i as f64;
            let lx = LEFT + PLOT_W + 16.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"/>"#,
                lx + 22.0
            );
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
                lx + 28.0,
                ly + 4.0,
                escape(policy)
            );
        }
        svg.push_str("</svg>\n");
        svg
    }
}

/// Chart geometry shared by the SVG charts: canvas, margins (the legend
/// goes in the right one), plot area.
const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 440.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 70.0;
const PLOT_W: f64 = WIDTH - LEFT - RIGHT;
const PLOT_H: f64 = HEIGHT - TOP - BOTTOM;
/// Series colours, in order.
const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// An SVG document `width` × `height` on a white canvas, left open for
/// what is drawn on it.
pub(crate) fn svg_canvas(width: f64, height: f64) -> String {
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    svg
}

/// An SVG document on a white canvas with `title` above the plot.
fn chart_open(title: &str) -> String {
    let mut svg = svg_canvas(WIDTH, HEIGHT);
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{}</text>"#,
        escape(title)
    );
    svg
}

/// A horizontal grid line across the plot at `y`, labelled on the left.
fn chart_gridline(svg: &mut String, y: f64, label: &str) {
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##,
        LEFT + PLOT_W
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"#,
        LEFT - 8.0,
        y + 4.0
    );
}

/// An unlabelled, fainter grid line across the plot at `y`.
fn chart_minor_gridline(svg: &mut String, y: f64) {
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#f2f2f2"/>"##,
        LEFT + PLOT_W
    );
}

/// A logarithmic latency axis: bounds at the 1-2-5 steps around the data,
/// a grid line at every whole multiple of a power of ten between them,
/// labelled at 1, 2 and 5 (every one when the axis spans a decade or less,
/// only the powers of ten when it spans more than six).
#[derive(Debug, Clone, Copy, PartialEq)]
struct LogAxis {
    /// Bounds in milliseconds.
    lo: f64,
    hi: f64,
}

/// One grid line of a [`LogAxis`].
#[derive(Debug, Clone, PartialEq)]
struct Tick {
    ms: f64,
    label: Option<String>,
}

/// Relative slack for comparing computed powers of ten.
const EPSILON: f64 = 1e-9;

impl LogAxis {
    /// The axis for values from `lo` to `hi` milliseconds (both positive).
    fn new(lo: f64, hi: f64) -> Self {
        let (mut lo, mut hi) = (step_at_or_below(lo), step_at_or_above(hi));
        if hi <= lo * (1.0 + EPSILON) {
            // A single value on a step: one step either side.
            lo = step_at_or_below(lo * (1.0 - 1e-6));
            hi = step_at_or_above(hi * (1.0 + 1e-6));
        }
        LogAxis { lo, hi }
    }

    /// Where `ms` lies between the bounds, 0 at `lo`, 1 at `hi`.
    fn fraction(&self, ms: f64) -> f64 {
        (ms / self.lo).log10() / (self.hi / self.lo).log10()
    }

    fn ticks(&self) -> Vec<Tick> {
        let decades = (self.hi / self.lo).log10();
        let labelled: &[u32] = if decades <= 1.0 + EPSILON {
            &[1, 2, 3, 4, 5, 6, 7, 8, 9]
        } else if decades <= 6.0 + EPSILON {
            &[1, 2, 5]
        } else {
            &[1]
        };
        let first = (self.lo.log10() - EPSILON).floor() as i32;
        let last = (self.hi.log10() + EPSILON).ceil() as i32;
        let mut ticks = Vec::new();
        for exponent in first..=last {
            for mantissa in 1..=9u32 {
                let ms = f64::from(mantissa) * 10f64.powi(exponent);
                if ms < self.lo * (1.0 - EPSILON) || ms > self.hi * (1.0 + EPSILON) {
                    continue;
                }
                let label = labelled
                    .contains(&mantissa)
                    .then(|| log_label(mantissa, exponent));
                ticks.push(Tick { ms, label });
            }
        }
        ticks
    }
}

/// The largest 1, 2 or 5 × 10^k at or below `v`.
fn step_at_or_below(v: f64) -> f64 {
    let exponent = (v.log10() + EPSILON).floor() as i32;
    let magnitude = 10f64.powi(exponent);
    [5.0, 2.0, 1.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step <= v * (1.0 + EPSILON))
        .unwrap_or(magnitude / 2.0)
}

/// The smallest 1, 2 or 5 × 10^k at or above `v`.
fn step_at_or_above(v: f64) -> f64 {
    let exponent = (v.log10() - EPSILON).floor() as i32;
    let magnitude = 10f64.powi(exponent);
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|step| *step >= v * (1.0 - EPSILON))
        .unwrap_or(10.0 * magnitude)
}

/// `mantissa × 10^exponent` milliseconds, written exactly: "0.5 ms",
/// "20 ms", "2 s", "50 s".
fn log_label(mantissa: u32, exponent: i32) -> String {
    let m = u64::from(mantissa);
    if exponent >= 3 {
        format!("{} s", m * 10u64.pow((exponent - 3) as u32))
    } else if exponent >= 0 {
        format!("{} ms", m * 10u64.pow(exponent as u32))
    } else {
        let places = (-exponent) as usize;
        format!("{:.places$} ms", f64::from(mantissa) * 10f64.powi(exponent))
    }
}

/// The plot area's border and the two axis titles.
fn chart_frame(svg: &mut String, x_title: &str, y_title: &str) {
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        LEFT + PLOT_W / 2.0,
        HEIGHT - 14.0,
        escape(x_title)
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        TOP + PLOT_H / 2.0,
        escape(y_title)
    );
}

/// Run-to-run spread of one scenario over several seeds: per policy and
/// load, the median and the range of each headline figure, and of the
/// change against round-robin. `reports` are the same scenario and mode.
pub fn spread_markdown(reports: &[ScenarioReport]) -> String {
    let Some(first) = reports.first() else {
        return String::new();
    };
    let seeds = reports
        .iter()
        .map(|r| r.seed.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let mut out = format!(
        "## {} ({} mode): spread over seeds {seeds}\n\nMedian, and the range over the seeds in brackets.\n\n",
        first.scenario, first.mode
    );
    out.push_str("| load | policy | TTFT p50 | TTFT p95 | TTFT p99 | e2e p50 | prefix hits | output tok/s | 429s | TTFT p95 vs RR | TTFT p99 vs RR |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &first.results {
        let same: Vec<(&Summary, Option<&Summary>)> = reports
            .iter()
            .filter_map(|r| {
                let this = r
                    .results
                    .iter()
                    .find(|s| s.load == row.load && s.policy == row.policy)?;
                Some((this, r.baseline(row.load)))
            })
            .collect();
        let values = |f: fn(&Summary) -> Option<f64>| -> Vec<f64> {
            same.iter().filter_map(|(s, _)| f(s)).collect()
        };
        let changes = |f: fn(&Summary) -> Option<f64>| -> Vec<f64> {
            same.iter()
                .filter_map(|(s, base)| change_percent(f(s), base.and_then(f)))
                .collect()
        };
        let is_base = row.policy == "round-robin";
        let vs = |f: fn(&Summary) -> Option<f64>| {
            if is_base {
                "—".to_owned()
            } else {
                spread(changes(f), |v| signed_percent(Some(v)))
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            percent(row.load),
            row.policy,
            spread(values(|s| s.ttft_p50_ms), |v| ms(Some(v))),
            spread(values(|s| s.ttft_p95_ms), |v| ms(Some(v))),
            spread(values(|s| s.ttft_p99_ms), |v| ms(Some(v))),
            spread(values(|s| s.e2e_p50_ms), |v| ms(Some(v))),
            spread(values(|s| Some(s.prefix_hit_rate)), |v| format!(
                "{:.1} %",
                v * 100.0
            )),
            spread(values(|s| Some(s.output_tokens_per_s)), |v| format!(
                "{v:.0}"
            )),
            spread(values(|s| Some(s.rejected_429 as f64)), |v| format!(
                "{v:.0}"
            )),
            vs(|s| s.ttft_p95_ms),
            vs(|s| s.ttft_p99_ms),
        );
    }
    if !first.static_allocation.is_empty() {
        allocation_spread(reports, &mut out);
    }
    out
}

/// The spread of each run's mean e2e, its p95 and its ratio to the best
/// static allocation of the same seed and load.
fn allocation_spread(reports: &[ScenarioReport], out: &mut String) {
    out.push_str(
        "\n| load | best static mean e2e | policy | e2e mean | e2e p95 | mean ÷ best static |\n",
    );
    out.push_str("|---|---:|---|---:|---:|---:|\n");
    let best = |r: &ScenarioReport, load: f64| {
        r.static_allocation
            .iter()
            .find(|a| a.load == load)
            .and_then(|a| a.mean_e2e_ms)
    };
    for row in &reports[0].results {
        let mut means = Vec::new();
        let mut p95s = Vec::new();
        let mut bests = Vec::new();
        let mut ratios = Vec::new();
        for r in reports {
            let Some(this) = r
                .results
                .iter()
                .find(|s| s.load == row.load && s.policy == row.policy)
            else {
                continue;
            };
            means.extend(this.e2e_mean_ms);
            p95s.extend(this.e2e_p95_ms);
            let b = best(r, row.load);
            bests.extend(b);
            if let (Some(mean), Some(b)) = (this.e2e_mean_ms, b.filter(|b| *b > 0.0)) {
                ratios.push(mean / b);
            }
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            percent(row.load),
            spread(bests, |v| ms(Some(v))),
            row.policy,
            spread(means, |v| ms(Some(v))),
            spread(p95s, |v| ms(Some(v))),
            spread(ratios, |v| format!("{v:.2}")),
        );
    }
}

/// "median (min … max)".
fn spread(mut values: Vec<f64>, show: impl Fn(f64) -> String) -> String {
    if values.is_empty() {
        return "—".to_owned();
    }
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    let (lo, hi) = (values[0], values[values.len() - 1]);
    format!("{} ({} … {})", show(median), show(lo), show(hi))
}

/// "12 %" of the band refused.
fn refused_share(b: &BandSummary) -> String {
    if b.requests == 0 {
        return "—".to_owned();
    }
    format!("{:.0} %", b.refused as f64 / b.requests as f64 * 100.0)
}

/// An axis top at or above `max` and a round step, about five ticks.
fn nice_axis(max: f64) -> (f64, f64) {
    if !(max.is_finite() && max > 0.0) {
        return (1.0, 0.2);
    }
    let raw = max / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    ((max / step).ceil() * step, step)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn percent(fraction: f64) -> String {
    format!("{:.0} %", fraction * 100.0)
}

/// A latency for the table: milliseconds below a second, seconds above.
pub fn ms(value: Option<f64>) -> String {
    match value {
        None => "—".to_owned(),
        Some(v) if v < 10.0 => format!("{v:.1} ms"),
        Some(v) if v < 1000.0 => format!("{v:.0} ms"),
        Some(v) => format!("{:.2} s", v / 1000.0),
    }
}

fn axis_ms(v: f64) -> String {
    if v >= 1000.0 {
        format!("{} s", v / 1000.0)
    } else {
        format!("{v} ms")
    }
}

fn signed_percent(value: Option<f64>) -> String {
    match value {
        None => "—".to_owned(),
        Some(v) => format!("{v:+.1} %").replace('-', "−"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A result row whose TTFT percentiles derive from `p95`.
    pub(crate) fn summary(policy: &str, load: f64, p95: f64) -> Summary {
        Summary {
            policy: policy.into(),
            load,
            ttft_p50_ms: Some(p95 / 2.0),
            ttft_p95_ms: Some(p95),
            ttft_p99_ms: Some(p95 * 2.0),
            itl_p50_ms: Some(7.0),
            itl_p99_ms: Some(12.0),
            e2e_p50_ms: Some(900.0),
            e2e_p95_ms: Some(2500.0),
            e2e_p99_ms: Some(4000.0),
            e2e_mean_ms: Some(1200.0),
            output_tokens_per_s: 1000.0,
            completed: 10,
            errors: 0,
            rejected_429: 0,
            prefix_hit_rate: 0.25,
            router_cpu_s: None,
            flow_control: None,
            bands: Vec::new(),
        }
    }

    /// Four results, each counted over enough requests for its p99.
    fn report() -> ScenarioReport {
        let mut report = report_with(
            "virtual",
            vec![
                summary("round-robin", 0.5, 200.0),
                summary("scored", 0.5, 100.0),
                summary("round-robin", 1.0, 20_000.0),
                summary("scored", 1.0, 500.0),
            ],
        );
        let plenty = RunDetail {
            ttft_samples: 5000,
            itl_samples: 5000,
            e2e_samples: 5000,
            ..RunDetail::default()
        };
        report.setup.runs = vec![plenty; 4];
        report
    }

    /// A `uniform` report of `mode` with `results`.
    pub(crate) fn report_with(mode: &str, results: Vec<Summary>) -> ScenarioReport {
        ScenarioReport {
            scenario: "uniform".into(),
            mode: mode.into(),
            seed: 1,
            fleet: FleetReport {
                description: "2 × h100, llama-3.1-8b".into(),
                replicas: 2,
                hardware: vec!["h100".into(), "h100".into()],
                model: "llama-3.1-8b".into(),
                tensor_parallel: 1,
                adapters: 0,
                max_loras: 1,
                capacity_requests_per_s: 50.0,
                replica_capacity: BTreeMap::new(),
            },
            results,
            static_allocation: Vec::new(),
            setup: Setup::default(),
        }
    }

    #[test]
    fn json_has_the_documented_shape() {
        let value = serde_json::to_value(report()).unwrap();
        let keys: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(keys, ["fleet", "mode", "results", "scenario", "seed"]);
        let row = value["results"][0].as_object().unwrap();
        for key in [
            "policy",
            "load",
            "ttft_p50_ms",
            "ttft_p95_ms",
            "ttft_p99_ms",
            "itl_p50_ms",
            "itl_p99_ms",
            "e2e_p50_ms",
            "e2e_p95_ms",
            "e2e_p99_ms",
            "e2e_mean_ms",
            "output_tokens_per_s",
            "completed",
            "errors",
            "rejected_429",
            "prefix_hit_rate",
        ] {
            assert!(row.contains_key(key), "missing {key}");
        }
        assert_eq!(row.len(), 16);
    }

    #[test]
    fn markdown_compares_with_round_robin() {
        let md = report().markdown();
        assert!(md.contains("## uniform (virtual mode, seed 1)"));
        // 200 → 100 ms is −50 %; 20 s → 500 ms is −97.5 %.
        assert!(
            md.contains("| 50 % | scored | 50 ms | 100 ms | 200 ms |"),
            "{md}"
        );
        assert!(md.contains("−50.0 %"), "{md}");
        assert!(md.contains("−97.5 %"), "{md}");
        assert!(
            md.contains("| 100 % | round-robin | 10.00 s | 20.00 s |"),
            "{md}"
        );
        assert!(!md.contains(THIN), "enough samples everywhere: {md}");
        assert!(!md.contains("Errors by cause"), "no errors: {md}");
    }

    /// A run of `n` requests: all completed but for `mid` timeouts after
    /// the first token, `before` timeouts before it and `failed` failures.
    fn outcomes(n: usize, mid: usize, before: usize, failed: usize) -> Vec<Outcome> {
        let mut outcomes: Vec<Outcome> = (0..n - mid - before - failed)
            .map(|i| Outcome::completed(i as f64, 0.1 + i as f64 * 1e-3, 2.0, 20, 100, 0))
            .collect();
        outcomes.extend((0..mid).map(|_| Outcome::timed_out(0.0, Some(1.0))));
        outcomes.extend((0..before).map(|_| Outcome::timed_out(0.0, None)));
        outcomes.extend((0..failed).map(|_| Outcome::failed(0.0)));
        outcomes
    }

    #[test]
    fn run_details_count_samples_and_causes() {
        let detail = RunDetail::of(&outcomes(110, 6, 2, 3));
        assert_eq!(
            detail,
            RunDetail {
                ttft_samples: 99 + 8,
                itl_samples: 99,
                e2e_samples: 99 + 8,
                timed_out_before_first_token: 2,
                timed_out_mid_answer: 6,
                failed: 3,
            }
        );
        assert_eq!(
            detail.errors(),
            "8 client timeouts (6 mid-answer, 2 before the first token) and 3 failures"
        );
        assert_eq!(
            RunDetail::of(&outcomes(10, 1, 0, 0)).errors(),
            "1 client timeout (1 mid-answer)"
        );
    }

    #[test]
    fn thin_percentiles_have_fewer_than_five_samples_above() {
        assert!(thin_percentile(499, 99.0) && !thin_percentile(500, 99.0));
        assert!(thin_percentile(99, 95.0) && !thin_percentile(100, 95.0));
        assert!(thin_percentile(9, 50.0) && !thin_percentile(10, 50.0));
        assert_eq!((min_samples(99.0), min_samples(95.0)), (500, 100));
    }

    #[test]
    fn small_runs_are_marked_and_their_errors_explained() {
        use crate::stats::summarize;
        // As `--quick` runs: about 110 requests, a few timed out.
        let runs = [
            ("round-robin", outcomes(110, 6, 2, 0)),
            ("scored", outcomes(110, 0, 0, 1)),
        ];
        let mut report = report_with(
            "live",
            runs.iter()
                .map(|(policy, o)| summarize(policy, 0.5, o, 20.0))
                .collect(),
        );
        report.setup.client_timeout = 20.0;
        report.setup.runs = runs.iter().map(|(_, o)| RunDetail::of(o)).collect();
        let md = report.markdown();
        let row = md
            .lines()
            .find(|l| l.starts_with("| 50 % | round-robin |"))
            .unwrap();
        let cells: Vec<&str> = row.split(" | ").collect();
        // p50 rests on enough requests, p95 (107 behind it) too, p99 not.
        assert!(!cells[2].contains(THIN), "{row}");
        assert!(!cells[3].contains(THIN), "{row}");
        assert!(cells[4].ends_with(THIN), "{row}");
        let scored = md
            .lines()
            .find(|l| l.starts_with("| 50 % | scored |"))
            .unwrap();
        // 109 requests behind scored's TTFT: its p99, and the change of
        // the p99 against round-robin, are marked.
        assert!(scored.contains(&format!(" {THIN} | ")), "{scored}");
        assert!(md.contains("a p99 needs 500"), "{md}");
        assert!(
            md.contains(
                "Errors by cause — round-robin at 50 %: 8 client timeouts (6 mid-answer, 2 before the first token); scored at 50 %: 1 failure."
            ),
            "{md}"
        );
        assert!(md.contains("20 s (simulated) after it was sent"), "{md}");

        // Without the runs' details the errors are not split.
        report.setup.runs.clear();
        let md = report.markdown();
        assert!(!md.contains("Errors by cause"), "{md}");
        assert!(
            md.contains("failed requests and client timeouts together"),
            "{md}"
        );
    }

    #[test]
    fn svg_draws_one_line_per_policy() {
        let svg = report().svg();
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        // p95 from 100 ms to 20 s: labelled in 1-2-5 steps, no further.
        for label in [
            "100 ms", "200 ms", "500 ms", "1 s", "2 s", "5 s", "10 s", "20 s",
        ] {
            assert!(svg.contains(&format!(">{label}<")), "{label}: {svg}");
        }
        assert!(!svg.contains(">50 s<") && !svg.contains(">50 ms<"), "{svg}");
        // A faint line at the other whole multiples: 300, 400, 600, 700,
        // 800 and 900 ms, and 3 ... 9 s; 30 s and above are off the axis.
        assert_eq!(svg.matches(r##"stroke="#f2f2f2""##).count(), 6 * 2);
    }

    #[test]
    fn log_axes_are_readable_at_any_span() {
        let labels = |axis: LogAxis| -> Vec<String> {
            axis.ticks().into_iter().filter_map(|t| t.label).collect()
        };
        // A quick run's p95s, 3.6 s to 7.7 s: within a decade, every
        // second is labelled.
        let narrow = LogAxis::new(3_630.0, 7_710.0);
        assert_eq!(
            narrow,
            LogAxis {
                lo: 2_000.0,
                hi: 10_000.0
            }
        );
        assert_eq!(
            labels(narrow),
            [
                "2 s", "3 s", "4 s", "5 s", "6 s", "7 s", "8 s", "9 s", "10 s"
            ]
        );
        assert!((narrow.fraction(2_000.0)).abs() < 1e-12);
        assert!((narrow.fraction(10_000.0) - 1.0).abs() < 1e-12);
        // Milliseconds to seconds: 1-2-5.
        assert_eq!(
            labels(LogAxis::new(0.4, 1_500.0)),
            [
                "0.2 ms", "0.5 ms", "1 ms", "2 ms", "5 ms", "10 ms", "20 ms", "50 ms", "100 ms",
                "200 ms", "500 ms", "1 s", "2 s"
            ]
        );
        // Eight decades: only the powers of ten.
        assert_eq!(
            labels(LogAxis::new(0.1, 10_000_000.0)),
            [
                "0.1 ms", "1 ms", "10 ms", "100 ms", "1 s", "10 s", "100 s", "1000 s", "10000 s"
            ]
        );
        // One value on a step: a step either side.
        assert_eq!(
            LogAxis::new(200.0, 200.0),
            LogAxis {
                lo: 100.0,
                hi: 500.0
            }
        );
        assert_eq!(log_label(5, -1), "0.5 ms");
        assert_eq!(log_label(2, 4), "20 s");
    }

    #[test]
    fn spread_shows_median_and_range_over_seeds() {
        let mut second = report();
        second.seed = 2;
        second.results[1].ttft_p95_ms = Some(150.0); // scored at 50 %
        let mut third = report();
        third.seed = 3;
        third.results[1].ttft_p95_ms = Some(120.0);
        let md = spread_markdown(&[report(), second, third]);
        assert!(md.contains("spread over seeds 1, 2, 3"), "{md}");
        // scored at 50 %: p95 100, 150, 120 ms against 200 ms round-robin.
        assert!(md.contains("| 120 ms (100 ms … 150 ms) |"), "{md}");
        assert!(md.contains("−40.0 % (−50.0 % … −25.0 %)"), "{md}");
        // The cache and the end to end, which prefix routing trades.
        assert!(md.contains("| e2e p50 | prefix hits |"), "{md}");
        assert!(md.contains("| 25.0 % (25.0 % … 25.0 %) |"), "{md}");
        assert_eq!(
            md.matches("\n| ").count(),
            5,
            "a header and four rows:\n{md}"
        );
    }

    #[test]
    fn a_static_allocation_is_printed_beside_the_means() {
        use crate::allocation::{ReplicaShare, RequestShape, StaticAllocation};
        let mut report = report();
        let share = |hardware: &str, share: f64| ReplicaShare {
            hardware: hardware.into(),
            share,
            requests_per_s: share * 0.3,
            mean_e2e_ms: Some(8000.0),
        };
        let request = RequestShape {
            prompt_tokens: 190.0,
            output_tokens: 96.0,
        };
        report.static_allocation = vec![
            StaticAllocation {
                load: 0.5,
                requests_per_s: 0.3,
                request,
                replicas: vec![
                    share("cpu-2t", 0.4),
                    share("cpu-2t", 0.4),
                    share("cpu-1t", 0.2),
                ],
                mean_e2e_ms: Some(600.0),
                even_split_mean_e2e_ms: None,
            },
            StaticAllocation {
                load: 1.0,
                requests_per_s: 0.6,
                request,
                replicas: Vec::new(),
                mean_e2e_ms: None,
                even_split_mean_e2e_ms: None,
            },
        ];
        let md = report.markdown();
        assert!(md.contains("190 prompt and 96 output tokens"), "{md}");
        assert!(
            md.contains("| 50 % | 0.300 req/s | cpu-2t 40 %, cpu-2t 40 %, cpu-1t 20 % | 600 ms | a replica falls behind |"),
            "{md}"
        );
        assert!(
            md.contains("| 100 % | 0.600 req/s | none keeps up | — |"),
            "{md}"
        );
        // Each run's mean (1.2 s) over the allocation's (0.6 s) at its load.
        assert!(
            md.contains("| 50 % | round-robin | 1.20 s | 900 ms | 2.50 s | 200 ms | 0 | 2.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| 100 % | scored | 1.20 s | 900 ms | 2.50 s | 500 ms | 0 | — |"),
            "{md}"
        );
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(
            value["static_allocation"][0]["replicas"][2]["hardware"],
            "cpu-1t"
        );
        assert_eq!(
            value["static_allocation"][0]["request"]["prompt_tokens"],
            190.0
        );
        // Over seeds: the spread of each run's ratio to its own seed's
        // allocation.
        let mut other = report.clone();
        other.seed = 2;
        other.static_allocation[0].mean_e2e_ms = Some(1200.0);
        let spread = spread_markdown(&[report.clone(), other]);
        assert!(
            spread.contains("| 50 % | 1.20 s (600 ms … 1.20 s) | scored | 1.20 s (1.20 s … 1.20 s) | 2.50 s (2.50 s … 2.50 s) | 2.00 (1.00 … 2.00) |"),
            "{spread}"
        );
        // Scenarios without one neither print nor serialize it.
        report.static_allocation.clear();
        assert!(!spread_markdown(&[report.clone()]).contains("best static"));
        assert!(!report.markdown().contains("Best static allocation"));
        assert!(
            serde_json::to_value(&report)
                .unwrap()
                .get("static_allocation")
                .is_none()
        );
    }

    fn flow_report() -> ScenarioReport {
        use crate::flow::FlowMode;
        use crate::stats::{Outcome, Refusal, band_summaries};
        use config::Priority;
        let run = |flow: FlowMode, refusal: Refusal, ttft: f64| {
            let outcomes = [
                Outcome::completed(0.0, ttft, 2.0, 10, 10, 0)
                    .in_band(Some(Priority::Critical))
                    .after_queue_wait(Some(0.5)),
                Outcome::refused(0.1, refusal).in_band(Some(Priority::Sheddable)),
            ];
            Summary {
                flow_control: Some(flow),
                bands: band_summaries(&outcomes),
                ..summary("scored", 1.0, 100.0)
            }
        };
        ScenarioReport {
            scenario: "flow-control".into(),
            results: vec![
                run(FlowMode::On, Refusal::Saturated, 0.8),
                run(FlowMode::Off, Refusal::Other, 0.3),
            ],
            ..report()
        }
    }

    #[test]
    fn flow_control_reports_bands_on_and_off() {
        let report = flow_report();
        let value = serde_json::to_value(&report).unwrap();
        let row = &value["results"][0];
        assert_eq!(row["flow_control"], "on");
        assert_eq!(row["bands"][0]["band"], "critical");
        assert_eq!(row["bands"][2]["band"], "all");
        let md = report.markdown();
        assert!(md.contains("| flow control | band | requests |"), "{md}");
        // On and off next to each other, per band.
        assert!(
            md.contains("| on | critical | 1 | 1 | 800 ms † | 800 ms † | 0 | 0 | 0 | 0 | 500 ms | 500 ms |\n| off | critical |"),
            "{md}"
        );
        assert!(
            md.contains("| on | sheddable | 1 | 0 | — | — | 1 | 0 | 0 | 0 | — | — |"),
            "{md}"
        );
        assert!(
            md.contains(
                "on: 2 sent = 1 completed + 1 refused + 0 errors (0 of them client timeouts)"
            ),
            "{md}"
        );
        assert!(md.contains("1 refusals gave no known"), "{md}");
        assert!(md.contains("† Too few completed requests"), "{md}");
        let svg = report.svg();
        assert!(svg.contains("TTFT p99 per band"), "{svg}");
        // A bar per band and run that completed anything, plus the legend.
        assert_eq!(svg.matches("<rect").count(), 1 + 2 + 1 + 2, "{svg}");
        assert!(svg.contains(">flow control off<"), "{svg}");
        assert!(svg.contains(">100 %<"), "sheddable refused: {svg}");
    }

    #[test]
    fn axis_steps_are_round() {
        assert_eq!(nice_axis(9_300.0), (10_000.0, 2_000.0));
        assert_eq!(nice_axis(420.0), (500.0, 100.0));
        assert_eq!(nice_axis(0.0), (1.0, 0.2));
    }

    #[test]
    fn latency_formatting() {
        assert_eq!(ms(Some(5.26)), "5.3 ms");
        assert_eq!(ms(Some(123.4)), "123 ms");
        assert_eq!(ms(Some(4410.0)), "4.41 s");
        assert_eq!(ms(None), "—");
        assert_eq!(signed_percent(Some(-97.04)), "−97.0 %");
        assert_eq!(signed_percent(Some(3.0)), "+3.0 %");
    }
}
