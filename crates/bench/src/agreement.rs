//! Do live and virtual mode tell the same story? The same scenario, seed
//! and requests run both ways; this compares the ranking of the policies
//! at each load and the headline figures side by side.
//!
//! Rankings are compared pair by pair: two policies whose TTFT p95 differ
//! by less than [`TIE`] in a mode are a tie there (run-to-run noise is of
//! that order), and a pair only disagrees when both modes separate it and
//! order it differently.

use std::fmt::Write as _;

use crate::report::{ScenarioReport, ms};
use crate::stats::Summary;

/// Relative difference of TTFT p95 below which two policies count as tied.
pub const TIE: f64 = 0.10;

/// How two policies compare on TTFT p95 in one mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Faster,
    Tied,
    Slower,
}

fn order(a: Option<f64>, b: Option<f64>) -> Option<Order> {
    let (a, b) = (a?, b?);
    let larger = a.max(b);
    if larger <= 0.0 || (a - b).abs() / larger < TIE {
        return Some(Order::Tied);
    }
    Some(if a < b { Order::Faster } else { Order::Slower })
}

/// Pairwise comparison of the rankings of both modes over every load.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankingAgreement {
    /// Both modes order the pair the same way (or both call it a tie).
    pub agree: usize,
    /// One mode separates the pair, the other calls it a tie.
    pub tie_in_one: usize,
    /// Both modes separate the pair and order it oppositely.
    pub disagree: usize,
}

/// Compare the policy pairs of `live` and `virtual` at every load both ran.
pub fn ranking_agreement(live: &ScenarioReport, virtual_: &ScenarioReport) -> RankingAgreement {
    let mut tally = RankingAgreement::default();
    for (l, v) in matched(live, virtual_) {
        for (l2, v2) in matched(live, virtual_) {
            if l.load != l2.load || l.policy >= l2.policy {
                continue;
            }
            let in_live = order(l.ttft_p95_ms, l2.ttft_p95_ms);
            let in_virtual = order(v.ttft_p95_ms, v2.ttft_p95_ms);
            match (in_live, in_virtual) {
                (Some(a), Some(b)) if a == b => tally.agree += 1,
                (Some(Order::Tied), Some(_)) | (Some(_), Some(Order::Tied)) => {
                    tally.tie_in_one += 1
                }
                (Some(_), Some(_)) => tally.disagree += 1,
                _ => {}
            }
        }
    }
    tally
}

/// Results present in both reports, paired by load and policy.
fn matched<'a>(
    live: &'a ScenarioReport,
    virtual_: &'a ScenarioReport,
) -> impl Iterator<Item = (&'a Summary, &'a Summary)> + 'a {
    live.results.iter().filter_map(|l| {
        virtual_
            .results
            .iter()
            .find(|v| v.load == l.load && v.policy == l.policy)
            .map(|v| (l, v))
    })
}

/// Policies at `load` from fastest to slowest TTFT p95, ties (see [`TIE`])
/// joined with "≈".
fn ranking(report: &ScenarioReport, load: f64) -> String {
    let mut rows: Vec<&Summary> = report.results.iter().filter(|r| r.load == load).collect();
    rows.sort_by(|a, b| {
        let key = |s: &Summary| s.ttft_p95_ms.unwrap_or(f64::INFINITY);
        key(a).total_cmp(&key(b))
    });
    let mut out = String::new();
    for (i, row) in rows.iter().enumerate() {
        if i > 0 {
            let tied = order(rows[i - 1].ttft_p95_ms, row.ttft_p95_ms) == Some(Order::Tied);
            out.push_str(if tied { " ≈ " } else { " < " });
        }
        out.push_str(&row.policy);
    }
    out
}

/// live / virtual, as "1.23×".
fn ratio(live: Option<f64>, virtual_: Option<f64>) -> String {
    match (live, virtual_) {
        (Some(l), Some(v)) if v > 0.0 => format!("{:.2}×", l / v),
        _ => "—".to_owned(),
    }
}

/// The agreement section: rankings per load, then every figure side by
/// side with the live/virtual ratio.
pub fn markdown(live: &ScenarioReport, virtual_: &ScenarioReport) -> String {
    let tally = ranking_agreement(live, virtual_);
    let mut out = format!(
        "## {}: live vs virtual (seed {})\n\n",
        live.scenario, live.seed
    );
    let _ = writeln!(
        out,
        "Policy pairs ordered the same way by TTFT p95 (ties within {:.0} %): **{} agree, {} tied in one mode only, {} disagree**.\n",
        TIE * 100.0,
        tally.agree,
        tally.tie_in_one,
        tally.disagree
    );
    out.push_str("| load | ranking, live | ranking, virtual |\n|---|---|---|\n");
    let mut loads: Vec<f64> = Vec::new();
    for r in &live.results {
        if !loads.contains(&r.load) {
            loads.push(r.load);
        }
    }
    for &load in &loads {
        let _ = writeln!(
            out,
            "| {:.0} % | {} | {} |",
            load * 100.0,
            ranking(live, load),
            ranking(virtual_, load)
        );
    }
    out.push_str(
        "\n| load | policy | TTFT p50 live / virtual | TTFT p95 live / virtual | TTFT p99 live / virtual | output tok/s live / virtual | completed live / virtual |\n",
    );
    out.push_str("|---|---|---:|---:|---:|---:|---:|\n");
    for (l, v) in matched(live, virtual_) {
        let pair = |f: fn(&Summary) -> Option<f64>| {
            format!("{} / {} ({})", ms(f(l)), ms(f(v)), ratio(f(l), f(v)))
        };
        let _ = writeln!(
            out,
            "| {:.0} % | {} | {} | {} | {} | {:.0} / {:.0} ({}) | {} / {} |",
            l.load * 100.0,
            l.policy,
            pair(|s| s.ttft_p50_ms),
            pair(|s| s.ttft_p95_ms),
            pair(|s| s.ttft_p99_ms),
            l.output_tokens_per_s,
            v.output_tokens_per_s,
            ratio(Some(l.output_tokens_per_s), Some(v.output_tokens_per_s)),
            l.completed,
            v.completed,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::tests::{report_with as report, summary};

    #[test]
    fn pairs_agree_tie_or_disagree() {
        let live = report(
            "live",
            vec![
                summary("round-robin", 0.5, 1000.0),
                summary("least-request", 0.5, 500.0),
                summary("scored", 0.5, 100.0),
            ],
        );
        let virtual_ = report(
            "virtual",
            vec![
                // Same order as live for RR vs both others ...
                summary("round-robin", 0.5, 900.0),
                // ... scored and least-request swapped ...
                summary("least-request", 0.5, 80.0),
                summary("scored", 0.5, 300.0),
            ],
        );
        let tally = ranking_agreement(&live, &virtual_);
        assert_eq!(
            tally,
            RankingAgreement {
                agree: 2,
                tie_in_one: 0,
                disagree: 1
            }
        );

        let close = report(
            "virtual",
            vec![
                summary("round-robin", 0.5, 1000.0),
                summary("least-request", 0.5, 520.0),
                summary("scored", 0.5, 510.0),
            ],
        );
        let tally = ranking_agreement(&live, &close);
        assert_eq!(tally.tie_in_one, 1, "{tally:?}");
        assert_eq!(tally.agree, 2, "{tally:?}");
    }

    #[test]
    fn ranking_joins_ties() {
        let r = report(
            "live",
            vec![
                summary("round-robin", 0.8, 1000.0),
                summary("least-request", 0.8, 105.0),
                summary("scored", 0.8, 100.0),
            ],
        );
        assert_eq!(ranking(&r, 0.8), "scored ≈ least-request < round-robin");
        let md = markdown(&r, &r);
        assert!(
            md.contains("3 agree, 0 tied in one mode only, 0 disagree"),
            "{md}"
        );
        assert!(md.contains("(1.00×)"), "{md}");
    }
}
