//! The config loader on any text: `config::from_yaml`, then what
//! `infergate serve` does with a config it accepted.
//!
//! Checked beyond "no panic":
//! - a refusal names at least one problem;
//! - an accepted config passes `config::validated` again unchanged;
//! - an accepted config written back out as YAML loads again, equal to
//!   itself (what `infergate check` accepts stays accepted once saved);
//! - every accessor and the picker's view of each pool can be read.

#![no_main]

use config::{ConfigError, InferenceGatewayConfig, Priority};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &[u8]| {
    // `load_file` reads the file as UTF-8 first; so does this.
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let config = match config::from_yaml(text) {
        Ok(config) => config,
        Err(e) => {
            assert_refusal(&e);
            return;
        }
    };

    let again = config::validated(config.clone()).expect("an accepted config validates again");
    assert_eq!(again, config);

    let yaml = serde_yaml_ng::to_string(&config).expect("a config serializes");
    match config::from_yaml(&yaml) {
        Ok(reloaded) => assert_eq!(reloaded, config, "reloaded from\n{yaml}"),
        Err(e) => panic!("written back out, the config is refused: {e}\n{yaml}"),
    }

    read_everything(&config);
});

fn assert_refusal(e: &ConfigError) {
    assert!(
        !e.problems().is_empty(),
        "a refusal without a problem: {e:?}"
    );
    assert!(!e.to_string().is_empty());
}

/// What the gateway reads from a config at start.
fn read_everything(config: &InferenceGatewayConfig) {
    let spec = &config.spec;
    let _ = (
        spec.limits.max_body_bytes(),
        spec.limits.max_buffered_body_bytes(),
    );
    let _ = (spec.limits.max_connections(), spec.limits.header_timeout());
    let _ = (
        spec.timeouts.connect(),
        spec.timeouts.first_byte(),
        spec.timeouts.idle(),
    );
    let _ = spec.shutdown.drain_timeout();
    let _ = spec.forwarding.trusted_proxies();
    for band in Priority::ALL {
        let limits = spec.flow_control.band(band);
        let _ = (
            limits.max_queued(),
            limits.max_queued_bytes(),
            limits.max_wait(band),
        );
    }
    if let Some(otlp) = &spec.telemetry.otlp {
        let _ = (otlp.service_name(), otlp.timeout(), otlp.traces_url());
        let ratio = otlp.sample_ratio();
        assert!((0.0..=1.0).contains(&ratio), "sampleRatio {ratio}");
    }
    for pool in &spec.pools {
        assert!(!pool.base_model().is_empty());
        let _ = (pool.policy(), pool.retry.max_retries());
        let _ = (
            pool.scheduling.metrics.interval(),
            pool.scheduling.metrics.timeout(),
        );
        let _ = gateway::picker_config(pool);
    }
}
