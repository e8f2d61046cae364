//! The quick benchmark end to end, as `infergate bench --quick` runs it:
//! every scenario in virtual time, and one live over HTTP through the
//! gateway. Asserts the structure of the results only (every policy at
//! every load, every figure present and finite); how fast anything is
//! belongs to the benchmark, not to a test.

use std::collections::BTreeSet;

use bench::live::GatewayLauncher;
use bench::report::ScenarioReport;
use bench::scenario::Size;
use bench::suite::{self, Mode, SuiteOptions};

fn assert_complete(report: &ScenarioReport, options: &SuiteOptions) {
    let scenario = suite::scenario(&report.scenario, options).unwrap();
    let expected: BTreeSet<(String, u64)> = options
        .policies
        .iter()
        .flat_map(|p| {
            scenario
                .loads
                .iter()
                .map(move |l| (p.to_string(), (l * 1000.0).round() as u64))
        })
        .collect();
    let got: BTreeSet<(String, u64)> = report
        .results
        .iter()
        .map(|r| (r.policy.clone(), (r.load * 1000.0).round() as u64))
        .collect();
    assert_eq!(
        got, expected,
        "{}: every policy at every load",
        report.scenario
    );
    assert_eq!(report.results.len(), expected.len(), "no duplicate rows");

    for r in &report.results {
        let what = format!("{} {} at {}", report.scenario, r.policy, r.load);
        assert!(r.completed > 0, "{what}: nothing completed");
        for (name, value) in [
            ("ttft_p50", r.ttft_p50_ms),
            ("ttft_p95", r.ttft_p95_ms),
            ("ttft_p99", r.ttft_p99_ms),
            ("itl_p50", r.itl_p50_ms),
            ("itl_p99", r.itl_p99_ms),
            ("e2e_p50", r.e2e_p50_ms),
            ("e2e_p99", r.e2e_p99_ms),
        ] {
            let value = value.unwrap_or_else(|| panic!("{what}: {name} missing"));
            assert!(value.is_finite() && value > 0.0, "{what}: {name} = {value}");
        }
        assert!(
            r.ttft_p50_ms <= r.ttft_p99_ms,
            "{what}: percentiles ordered"
        );
        assert!(
            r.output_tokens_per_s.is_finite() && r.output_tokens_per_s > 0.0,
            "{what}: throughput {}",
            r.output_tokens_per_s
        );
        assert!(
            (0.0..=1.0).contains(&r.prefix_hit_rate),
            "{what}: hit rate {}",
            r.prefix_hit_rate
        );
    }
    assert!(report.fleet.capacity_requests_per_s > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_benchmark_runs_every_policy_at_every_load() {
    let virtual_options = SuiteOptions::new(Mode::Virtual, Size::Quick, 7);
    for name in suite::names("all", Mode::Virtual).unwrap() {
        let report = suite::run_scenario(name, &virtual_options).await.unwrap();
        assert_eq!(report.mode, "virtual");
        assert_complete(&report, &virtual_options);
    }

    let mut live_options = SuiteOptions::new(Mode::Live, Size::Quick, 7);
    // A test binary has no `infergate serve` to start; the gateway library
    // is the same code.
    live_options.gateway = GatewayLauncher::InProcess;
    let report = suite::run_scenario("uniform", &live_options).await.unwrap();
    assert_eq!(report.mode, "live");
    assert_complete(&report, &live_options);

    let dir = tempfile::tempdir().unwrap();
    report.write(dir.path(), "uniform").unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("uniform.json")).unwrap())
            .unwrap();
    assert_eq!(json["scenario"], "uniform");
    assert_eq!(json["mode"], "live");
    assert_eq!(json["seed"], 7);
    assert_eq!(
        json["results"].as_array().unwrap().len(),
        report.results.len()
    );
    let md = std::fs::read_to_string(dir.path().join("uniform.md")).unwrap();
    assert!(md.contains("| load | policy |"));
    let svg = std::fs::read_to_string(dir.path().join("uniform.svg")).unwrap();
    assert_eq!(
        svg.matches("<polyline").count(),
        live_options.policies.len()
    );
}
