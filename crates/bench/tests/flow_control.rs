//! The quick flow-control benchmark end to end, live: bursts of three
//! priority bands through the real gateway, flow control on, flat (no
//! per-band queue shares), off, and on with the band sent to replicas
//! that schedule by it.
//! Asserts the structure of the results and what flow control is for, not
//! how fast anything is.

use bench::flow::FlowMode;
use bench::live::GatewayLauncher;
use bench::scenario::Size;
use bench::suite::{self, Mode, SuiteOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_flow_control_accounts_for_every_request_in_every_band() {
    let mut options = SuiteOptions::new(Mode::Live, Size::Quick, 7);
    // A test binary has no `infergate serve` to start.
    options.gateway = GatewayLauncher::InProcess;
    let report = suite::run_scenario("flow-control", &options).await.unwrap();
    assert_eq!(report.scenario, "flow-control");

    let flows: Vec<_> = report.results.iter().map(|r| r.flow_control).collect();
    assert_eq!(
        flows,
        [
            Some(FlowMode::On),
            Some(FlowMode::Flat),
            Some(FlowMode::Off),
            Some(FlowMode::Priority)
        ]
    );
    for r in &report.results {
        let what = format!("flow control {:?}", r.flow_control);
        let bands: Vec<&str> = r.bands.iter().map(|b| b.band.as_str()).collect();
        assert_eq!(
            bands,
            ["critical", "standard", "sheddable", "all"],
            "{what}"
        );
        let sent: u64 = r.bands[..3].iter().map(|b| b.requests).sum();
        assert_eq!(
            sent, r.bands[3].requests,
            "{what}: bands partition the requests"
        );
        assert_eq!(
            r.bands[3].completed + r.bands[3].refused + r.bands[3].errors,
            r.completed + r.rejected_429 + r.errors,
            "{what}: the band rows agree with the run's totals"
        );
        for b in &r.bands {
            let what = format!("{what}, {}", b.band);
            assert!(b.requests > 0, "{what}: no requests");
            assert!(b.accounted(), "{what}: {b:?}");
            for (name, value) in [
                ("ttft_p50", b.ttft_p50_ms),
                ("ttft_p99", b.ttft_p99_ms),
                ("queue_wait_p50", b.queue_wait_p50_ms),
                ("queue_wait_p99", b.queue_wait_p99_ms),
            ] {
                if let Some(v) = value {
                    assert!(v.is_finite() && v >= 0.0, "{what}: {name} = {v}");
                }
            }
            if b.completed > 0 {
                assert!(
                    b.ttft_p50_ms <= b.ttft_p99_ms,
                    "{what}: percentiles ordered"
                );
                // A completed request reached a replica, which the gateway
                // reports with its queue wait.
                assert!(b.queue_wait_p99_ms.is_some(), "{what}: queue wait missing");
            }
        }
        assert!(r.bands[3].completed > 0, "{what}: nothing completed");
    }
    let (on, off, priority) = (&report.results[0], &report.results[2], &report.results[3]);
    // What flow control exists for: a critical request waits for room
    // instead of being refused because the pool is saturated.
    assert_eq!(on.bands[0].refused_saturated, 0, "{:?}", on.bands[0]);
    // With the band sent on, the replicas (running priority scheduling)
    // accept every request: a replica without it would refuse each
    // non-zero priority with a 400, counted as a failure (timeouts are
    // the load's doing, not a refusal).
    assert_eq!(
        priority.bands[0].refused_saturated, 0,
        "{:?}",
        priority.bands[0]
    );
    let all = &priority.bands[3];
    assert_eq!(all.errors - all.timed_out, 0, "{all:?}");
    // Without a queue nothing waits.
    for b in &off.bands {
        assert_eq!(b.refused_wait_expired + b.refused_queue_full, 0, "{b:?}");
        if let Some(wait) = b.queue_wait_p99_ms {
            assert_eq!(wait, 0.0, "{b:?}");
        }
    }

    let dir = tempfile::tempdir().unwrap();
    report.write(dir.path(), "flow-control").unwrap();
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("flow-control.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(json["results"][1]["flow_control"], "flat");
    assert_eq!(json["results"][2]["flow_control"], "off");
    assert_eq!(json["results"][3]["flow_control"], "priority");
    assert_eq!(json["results"][0]["bands"].as_array().unwrap().len(), 4);
    let md = std::fs::read_to_string(dir.path().join("flow-control.md")).unwrap();
    assert!(md.contains("| flow control | band |"), "{md}");
    assert!(md.contains("Every request is accounted for"), "{md}");
    let svg = std::fs::read_to_string(dir.path().join("flow-control.svg")).unwrap();
    for mode in ["on", "flat", "off", "priority"] {
        assert!(svg.contains(&format!("flow control {mode}")), "{mode}");
    }
}
