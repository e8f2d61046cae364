//! The picker's scorer table as the config sees it: every scorer has a
//! field under a pool's `scheduling.weights`, that field reaches the
//! scorer's weight in the picker, and its value is checked.

use config::from_yaml;
use picker::{Scorer, Weights};

fn pool_scheduling(scheduling: &str) -> String {
    format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners:\n    - {{name: public, address: \"127.0.0.1:8080\"}}\n  pools:\n    - {{name: a, models: [m], endpoints: [\"127.0.0.1:1\"], scheduling: {scheduling}}}\n"
    )
}

fn picker_weights(scheduling: &str) -> Weights {
    let config = from_yaml(&pool_scheduling(scheduling))
        .unwrap_or_else(|e| panic!("{scheduling} refused:\n{e}"));
    config.spec.pools[0].scheduling.picker_weights()
}

fn problems(scheduling: &str) -> Vec<String> {
    match from_yaml(&pool_scheduling(scheduling)) {
        Ok(_) => panic!("expected {scheduling} to be refused"),
        Err(e) => e.problems().iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn each_scorers_config_field_sets_that_scorers_weight_and_no_other() {
    for scorer in Scorer::ALL {
        let name = scorer.name();
        let weights = picker_weights(&format!("{{preset: latency, weights: {{{name}: 7.5}}}}"));
        for other in Scorer::ALL {
            let expected = if other == scorer {
                7.5
            } else {
                Weights::LATENCY.get(other)
            };
            assert_eq!(weights.get(other), expected, "weights.{name}: {other:?}");
        }
    }
}

#[test]
fn the_preset_fills_in_what_is_not_given() {
    assert_eq!(picker_weights("{}"), Weights::CHAT);
    assert_eq!(picker_weights("{weights: {}}"), Weights::CHAT);
    for preset in Weights::PRESETS {
        assert_eq!(
            picker_weights(&format!("{{preset: {preset}}}")),
            Weights::preset(preset).unwrap(),
        );
    }
}

#[test]
fn a_negative_nan_or_infinite_weight_is_refused_for_each_scorer() {
    for scorer in Scorer::ALL {
        let name = scorer.name();
        for bad in ["-1", "-0.5", ".nan", ".inf"] {
            assert_eq!(
                problems(&format!("{{weights: {{{name}: {bad}}}}}")),
                [format!(
                    "spec.pools[0].scheduling.weights.{name}: must be a number >= 0"
                )],
                "{name}: {bad}"
            );
        }
        // Zero turns a scorer off: allowed.
        picker_weights(&format!("{{weights: {{{name}: 0}}}}"));
    }
}

#[test]
fn speed_weight_is_checked_like_the_others() {
    for bad in ["-1", ".nan"] {
        assert_eq!(
            problems(&format!("{{weights: {{speed: {bad}}}}}")),
            ["spec.pools[0].scheduling.weights.speed: must be a number >= 0"],
            "{bad}"
        );
    }
}

#[test]
fn every_bad_weight_is_reported_in_one_run() {
    let all: Vec<String> = Scorer::ALL
        .iter()
        .map(|s| format!("{}: -1", s.name()))
        .collect();
    let reported = problems(&format!("{{weights: {{{}}}}}", all.join(", ")));
    let expected: Vec<String> = Scorer::ALL
        .iter()
        .map(|s| {
            format!(
                "spec.pools[0].scheduling.weights.{}: must be a number >= 0",
                s.name()
            )
        })
        .collect();
    assert_eq!(reported, expected);
}

/// docs/config.md lists the weights a pool takes in one row:
/// `weights.queue` / `kvCache` / ... in the table's order.
#[test]
fn the_config_docs_list_every_weight() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");
    let docs = std::fs::read_to_string(path).unwrap();
    let row = docs
        .lines()
        .find(|line| line.starts_with("| `weights."))
        .expect("docs/config.md has a row for the weights");
    let first_cell = row.trim_start_matches('|').split(" | ").next().unwrap();
    let names: Vec<&str> = first_cell
        .split(" / ")
        .map(|name| name.trim().trim_matches('`').trim_start_matches("weights."))
        .collect();
    assert_eq!(names, Scorer::ALL.map(Scorer::name));
}
