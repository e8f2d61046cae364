//! The router comparison of a scenario (`--routers`): TTFT, inter-token and
//! end-to-end latency of every router side by side with the CPU each
//! router used, and which router is best at TTFT p95 and p99, by how much.
//!
//! Ratios are `value / best` (1.00 for the best router, 1.25 for one whose
//! TTFT is a quarter longer); lower latency is better.

use std::fmt::Write as _;

use crate::stats::Summary;

/// How the routers of one load rank on one latency.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranking {
    /// "TTFT p95".
    pub metric: &'static str,
    /// Routers with the figure, best first: (router, milliseconds).
    pub order: Vec<(String, f64)>,
}

impl Ranking {
    /// Rank the routers of `rows` by `value` (lower is better); routers
    /// without the figure are left out. `None` when no router has it.
    pub fn of(
        metric: &'static str,
        rows: &[&Summary],
        value: fn(&Summary) -> Option<f64>,
    ) -> Option<Self> {
        let mut order: Vec<(String, f64)> = rows
            .iter()
            .filter_map(|r| Some((r.policy.clone(), value(r)?)))
            .collect();
        if order.is_empty() {
            return None;
        }
        // Stable: ties keep the order the routers ran in.
        order.sort_by(|a, b| a.1.total_cmp(&b.1));
        Some(Ranking { metric, order })
    }

    pub fn best(&self) -> &(String, f64) {
        &self.order[0]
    }

    /// `router`'s figure divided by the best one's.
    pub fn ratio(&self, router: &str) -> Option<f64> {
        let (_, best) = self.best();
        let (_, value) = self.order.iter().find(|(name, _)| name == router)?;
        ratio(*value, *best)
    }

    /// "TTFT p95: best infergate:scored 120 ms; nginx:least_conn ×1.25,
    /// sglang-router:cache_aware ×1.40".
    pub fn sentence(&self) -> String {
        let (best, best_ms) = self.best();
        let mut text = format!("**{}**: best `{best}` ({})", self.metric, ms(*best_ms));
        let others: Vec<String> = self.order[1..]
            .iter()
            .map(|(name, value)| match ratio(*value, *best_ms) {
                Some(r) => format!("`{name}` ×{r:.2}"),
                None => format!("`{name}` {}", ms(*value)),
            })
            .collect();
        if !others.is_empty() {
            let _ = write!(text, "; then {}", others.join(", "));
        }
        text
    }
}

fn ratio(value: f64, best: f64) -> Option<f64> {
    (best > 0.0).then(|| value / best)
}

/// Where infergate stands at one latency: its best router against the best
/// peer, and against nginx `least_conn`, as "×1.12 of the best peer".
pub fn infergate_standing(ranking: &Ranking) -> Option<String> {
    let infergate = ranking
        .order
        .iter()
        .find(|(name, _)| name.starts_with("infergate:"))?;
    let peer = ranking
        .order
        .iter()
        .find(|(name, _)| !name.starts_with("infergate:"))?;
    let vs_peer = ratio(infergate.1, peer.1)?;
    let mut text = format!(
        "`{}` is ×{vs_peer:.2} the best peer's (`{}`)",
        infergate.0, peer.0
    );
    if let Some(nginx) = ranking.order.iter().find(|(n, _)| n == "nginx:least_conn")
        && let Some(vs_nginx) = ratio(infergate.1, nginx.1)
    {
        let _ = write!(text, ", ×{vs_nginx:.2} nginx `least_conn`'s");
    }
    let verdict = if vs_peer <= 1.0 { "ahead" } else { "behind" };
    let _ = write!(text, " — {verdict}");
    Some(text)
}

/// Every infergate router's TTFT p95 and p99 ÷ the best peer's, when a
/// run compares several (sources of prefix affinity, gateway replicas):
/// "`infergate:scored` ×0.92 / ×0.95, `infergate:scored@2` ×0.97 / ×1.01".
pub fn each_infergate_vs_best_peer(p95: &Ranking, p99: &Ranking) -> Option<String> {
    let is_peer = |name: &str| !name.starts_with("infergate:");
    let best_peer = |ranking: &Ranking| ranking.order.iter().find(|(n, _)| is_peer(n)).map(|r| r.1);
    let (peer95, peer99) = (best_peer(p95)?, best_peer(p99));
    let infergate: Vec<String> = p95
        .order
        .iter()
        .filter(|(name, _)| !is_peer(name))
        .map(|(name, value)| {
            let at_p99 = p99
                .order
                .iter()
                .find(|(n, _)| n == name)
                .zip(peer99)
                .and_then(|((_, v), peer)| ratio(*v, peer))
                .map_or("—".to_owned(), |r| format!("×{r:.2}"));
            let at_p95 = ratio(*value, peer95).map_or("—".to_owned(), |r| format!("×{r:.2}"));
            format!("`{name}` {at_p95} / {at_p99}")
        })
        .collect();
    (infergate.len() > 1).then(|| infergate.join(", "))
}

/// The comparison section for `results` (one scenario, one or more loads).
pub fn markdown(results: &[Summary]) -> String {
    let mut out = String::new();
    let mut loads: Vec<f64> = Vec::new();
    for r in results {
        if !loads.contains(&r.load) {
            loads.push(r.load);
        }
    }
    out.push_str("### Routers side by side\n\n");
    out.push_str("| load | router | TTFT p50 | TTFT p95 | TTFT p99 | ITL p50 | ITL p99 | e2e p50 | e2e p99 | prefix hits | errors | router CPU s | CPU ms / request | TTFT p95 ÷ best | TTFT p99 ÷ best |\n");
    out.push_str("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for &load in &loads {
        let rows: Vec<&Summary> = results.iter().filter(|r| r.load == load).collect();
        let p95 = Ranking::of("TTFT p95", &rows, |s| s.ttft_p95_ms);
        let p99 = Ranking::of("TTFT p99", &rows, |s| s.ttft_p99_ms);
        for r in &rows {
            let requests = r.completed + r.errors + r.rejected_429;
            let cpu = r.router_cpu_s.map_or("—".to_owned(), |s| format!("{s:.1}"));
            let per_request = match r.router_cpu_s {
                Some(s) if requests > 0 => format!("{:.2}", s * 1e3 / requests as f64),
                _ => "—".to_owned(),
            };
            let times = |ranking: &Option<Ranking>| {
                ranking
                    .as_ref()
                    .and_then(|k| k.ratio(&r.policy))
                    .map_or("—".to_owned(), |x| format!("×{x:.2}"))
            };
            let _ = writeln!(
                out,
                "| {:.0} % | {} | {} | {} | {} | {} | {} | {} | {} | {:.1} % | {} | {cpu} | {per_request} | {} | {} |",
                load * 100.0,
                r.policy,
                ms(r.ttft_p50_ms.unwrap_or(f64::NAN)),
                ms(r.ttft_p95_ms.unwrap_or(f64::NAN)),
                ms(r.ttft_p99_ms.unwrap_or(f64::NAN)),
                ms(r.itl_p50_ms.unwrap_or(f64::NAN)),
                ms(r.itl_p99_ms.unwrap_or(f64::NAN)),
                ms(r.e2e_p50_ms.unwrap_or(f64::NAN)),
                ms(r.e2e_p99_ms.unwrap_or(f64::NAN)),
                r.prefix_hit_rate * 100.0,
                r.errors + r.rejected_429,
                times(&p95),
                times(&p99),
            );
        }
    }
    out.push('\n');
    for &load in &loads {
        let rows: Vec<&Summary> = results.iter().filter(|r| r.load == load).collect();
        for ranking in [
            Ranking::of("TTFT p95", &rows, |s| s.ttft_p95_ms),
            Ranking::of("TTFT p99", &rows, |s| s.ttft_p99_ms),
        ]
        .into_iter()
        .flatten()
        {
            let _ = write!(out, "- At {:.0} %: {}.", load * 100.0, ranking.sentence());
            if let Some(standing) = infergate_standing(&ranking) {
                let _ = write!(out, " {standing}.");
            }
            out.push('\n');
        }
        if let (Some(p95), Some(p99)) = (
            Ranking::of("TTFT p95", &rows, |s| s.ttft_p95_ms),
            Ranking::of("TTFT p99", &rows, |s| s.ttft_p99_ms),
        ) && let Some(each) = each_infergate_vs_best_peer(&p95, &p99)
        {
            let _ = writeln!(
                out,
                "- At {:.0} %: each infergate router's TTFT p95 / p99 ÷ the best peer's: {each}.",
                load * 100.0
            );
        }
    }
    out.push_str("\nRatios are the router's figure ÷ the best router's at that load (lower latency is better). Errors are failed, timed-out and refused (429) requests; a router with errors may show a shorter TTFT than one that served everything. CPU is of the router's own processes only; `—` where the gateway ran inside the bench's process.\n");
    out
}

/// Milliseconds for the tables: "850 ms", "1.25 s", "—" when not a number.
fn ms(value: f64) -> String {
    if !value.is_finite() {
        "—".to_owned()
    } else if value >= 1000.0 {
        format!("{:.2} s", value / 1000.0)
    } else {
        format!("{value:.0} ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(router: &str, p95: f64, p99: Option<f64>, cpu: Option<f64>) -> Summary {
        let mut s = crate::stats::summarize(router, 0.75, &[], 60.0);
        s.ttft_p95_ms = Some(p95);
        s.ttft_p99_ms = p99;
        s.completed = 100;
        s.router_cpu_s = cpu;
        s
    }

    #[test]
    fn ranks_by_latency_with_ratios_to_the_best() {
        let rows = [
            row("infergate:scored", 150.0, Some(400.0), Some(2.0)),
            row("nginx:least_conn", 120.0, Some(500.0), Some(1.0)),
            row("sglang-router:cache_aware", 300.0, None, None),
        ];
        let refs: Vec<&Summary> = rows.iter().collect();
        let p95 = Ranking::of("TTFT p95", &refs, |s| s.ttft_p95_ms).unwrap();
        assert_eq!(p95.best(), &("nginx:least_conn".to_owned(), 120.0));
        assert!((p95.ratio("infergate:scored").unwrap() - 1.25).abs() < 1e-12);
        assert!((p95.ratio("sglang-router:cache_aware").unwrap() - 2.5).abs() < 1e-12);
        assert_eq!(p95.ratio("absent"), None);
        assert_eq!(
            p95.sentence(),
            "**TTFT p95**: best `nginx:least_conn` (120 ms); then `infergate:scored` ×1.25, `sglang-router:cache_aware` ×2.50"
        );
        assert_eq!(
            infergate_standing(&p95).unwrap(),
            "`infergate:scored` is ×1.25 the best peer's (`nginx:least_conn`), ×1.25 nginx `least_conn`'s — behind"
        );
        // A router without the figure is left out of the ranking.
        let p99 = Ranking::of("TTFT p99", &refs, |s| s.ttft_p99_ms).unwrap();
        assert_eq!(p99.order.len(), 2);
        assert_eq!(p99.best().0, "infergate:scored");
        assert!((p99.ratio("nginx:least_conn").unwrap() - 1.25).abs() < 1e-12);
        assert!(infergate_standing(&p99).unwrap().ends_with("— ahead"));
    }

    #[test]
    fn the_section_shows_every_router_and_its_cpu() {
        let rows = [
            row("infergate:scored", 150.0, Some(400.0), Some(2.0)),
            row("nginx:least_conn", 120.0, Some(500.0), None),
        ];
        let md = markdown(&rows);
        let line = md
            .lines()
            .find(|l| l.contains("| infergate:scored |"))
            .unwrap();
        // 2 CPU seconds over 100 requests: 20 ms each; ×1.25 of nginx's p95.
        assert!(line.contains("| 2.0 | 20.00 | ×1.25 | ×1.00 |"), "{line}");
        let nginx = md
            .lines()
            .find(|l| l.contains("| nginx:least_conn |"))
            .unwrap();
        assert!(nginx.contains("| — | — | ×1.00 | ×1.25 |"), "{nginx}");
        assert!(md.contains("At 75 %: **TTFT p95**: best `nginx:least_conn`"));
        assert_eq!(Ranking::of("TTFT p95", &[], |s| s.ttft_p95_ms), None);
        assert!(
            !md.contains("each infergate router"),
            "one infergate router: {md}"
        );
    }

    #[test]
    fn several_infergate_routers_each_face_the_best_peer() {
        let rows = [
            row("infergate:scored", 90.0, Some(180.0), None),
            row("infergate:scored-events@2", 110.0, Some(220.0), None),
            row("nginx:least_conn", 200.0, Some(400.0), None),
            row("smg:cache_aware", 100.0, Some(200.0), None),
        ];
        let md = markdown(&rows);
        assert!(
            md.contains("each infergate router's TTFT p95 / p99 ÷ the best peer's: `infergate:scored` ×0.90 / ×0.90, `infergate:scored-events@2` ×1.10 / ×1.10."),
            "{md}"
        );
    }
}
