//! `--routers` end to end with a real peer: infergate's least-request
//! policy against nginx `least_conn`, each in front of a fresh simulated
//! fleet with the same requests, for a few seconds. Skipped, with the
//! reason printed, where nginx is not installed.

use bench::live::GatewayLauncher;
use bench::routers::RouterUnderTest;
use bench::scenario::{RunLength, Size};
use bench::suite::{self, Mode, SuiteOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infergate_and_nginx_serve_the_same_requests() {
    let nginx = RouterUnderTest::NginxLeastConn;
    if nginx.locate().is_none() {
        eprintln!("skipped: nginx is not installed ({})", nginx.install_hint());
        return;
    }
    let mut options = SuiteOptions::new(Mode::Live, Size::Quick, 3);
    // A test binary has no `infergate serve` to start; the gateway library
    // is the same code.
    options.gateway = GatewayLauncher::InProcess;
    options.routers =
        RouterUnderTest::parse_list("infergate:least-request,nginx:least_conn").unwrap();
    options.loads = Some(vec![0.5]);
    options.length = Some(RunLength::Requests(60));
    // Real time: a client timeout of 20 s, so a busy machine delays the
    // run instead of failing it.
    options.time_scale = Some(1.0);
    let report = suite::run_scenario("uniform", &options).await.unwrap();

    let names: Vec<&str> = report.results.iter().map(|r| r.policy.as_str()).collect();
    assert_eq!(names, ["infergate:least-request", "nginx:least_conn"]);
    let offered = report.setup.requests_per_load[0].1 as u64;
    for r in &report.results {
        // Every request was answered through each router.
        assert_eq!(r.completed, offered, "{}: {r:?}", r.policy);
        assert_eq!(r.errors + r.rejected_429, 0, "{}", r.policy);
        assert!(r.ttft_p95_ms.is_some_and(|v| v > 0.0), "{}", r.policy);
        assert!(r.e2e_p50_ms >= r.ttft_p50_ms, "{}", r.policy);
    }
    // nginx ran as processes of its own; the in-process gateway cannot
    // be told apart from the bench.
    assert!(report.results[1].router_cpu_s.is_some_and(|s| s >= 0.0));
    assert_eq!(report.results[0].router_cpu_s, None);

    let md = report.markdown();
    assert!(md.contains("### Routers side by side"), "{md}");
    assert!(md.contains("| 50 % | nginx:least_conn |"), "{md}");
    assert!(md.contains("**TTFT p95**: best"), "{md}");
    assert!(md.contains("nginx:least_conn "), "versions noted: {md}");
}

/// The scenarios written for the comparison run end to end (in virtual
/// time, quick): their workloads generate, their fleets serve them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_scenarios_run_in_virtual_time() {
    let options = SuiteOptions::new(Mode::Virtual, Size::Quick, 5);
    for name in suite::names("peers", Mode::Virtual).unwrap() {
        let report = suite::run_scenario(name, &options).await.unwrap();
        assert_eq!(
            report.results.len(),
            options.policies.len(),
            "{name}: one load, every policy"
        );
        for r in &report.results {
            assert!(r.completed > 0, "{name} {}: nothing completed", r.policy);
        }
    }
    // Peer routers are live only.
    let mut with_peer = options.clone();
    with_peer.routers = RouterUnderTest::parse_list("nginx:least_conn").unwrap();
    assert!(suite::scenario("heterogeneous", &with_peer).is_err());
}
