//! Engine dialects: which metric families each model server exposes and how
//! they map to the picker's [`EngineState`].
//!
//! Each engine lives in its own file as a
//! [`prom::Visitor`](crate::prom::Visitor) that asks only for its families
//! and folds them into an `EngineState`. Fields an engine does not report
//! stay `None` (unknown), never 0.

mod aggregate;
mod extractor;
mod llamacpp;
mod sglang;
mod tgi;
mod triton;
mod trtllm;
mod vllm;

use std::fmt;
use std::str::FromStr;

use picker::EngineState;
use serde::{Deserialize, Serialize};

use self::extractor::run;
use crate::prom::ParseError;

/// The metrics dialect a replica speaks: a pool's `engine` in the gateway
/// config, and the `/metrics` names a simulated replica renders. The serde
/// names are the [`Dialect::as_str`] names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// vLLM (`vllm:*`), V0 and V1 engines. The default: the most common
    /// engine, and the one simulated replicas speak unless told otherwise.
    #[default]
    Vllm,
    /// SGLang (`sglang:*`).
    Sglang,
    /// Hugging Face Text Generation Inference (`tgi_*`).
    Tgi,
    /// TensorRT-LLM's `trtllm-serve` (`trtllm_*`).
    Trtllm,
    /// Triton Inference Server with the TensorRT-LLM backend (`nv_trt_llm_*`).
    Triton,
    /// llama.cpp's `llama-server --metrics` (`llamacpp:*`).
    Llamacpp,
    /// No metrics: only reachability is watched.
    None,
}

impl Dialect {
    pub const ALL: [Dialect; 7] = [
        Dialect::Vllm,
        Dialect::Sglang,
        Dialect::Tgi,
        Dialect::Trtllm,
        Dialect::Triton,
        Dialect::Llamacpp,
        Dialect::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Vllm => "vllm",
            Dialect::Sglang => "sglang",
            Dialect::Tgi => "tgi",
            Dialect::Trtllm => "trtllm",
            Dialect::Triton => "triton",
            Dialect::Llamacpp => "llamacpp",
            Dialect::None => "none",
        }
    }

    /// Whether replicas of this dialect list their context length in
    /// `/v1/models` (`max_model_len`).
    pub fn lists_context_length(self) -> bool {
        matches!(self, Dialect::Vllm | Dialect::Sglang)
    }

    /// Whether replicas of this dialect have a `/metrics` worth fetching.
    pub fn has_metrics(self) -> bool {
        self != Dialect::None
    }

    /// The engine state an exposition reports. An exposition without any of
    /// the dialect's families is valid and gives an all-unknown state (a
    /// replica can be up with no traffic); text that is not an exposition
    /// is an error. [`Dialect::None`] reads nothing and returns the
    /// all-unknown state.
    pub fn extract(self, text: &str) -> Result<EngineState, ParseError> {
        match self {
            Dialect::Vllm => run::<vllm::Vllm>(text),
            Dialect::Sglang => run::<sglang::Sglang>(text),
            Dialect::Tgi => run::<tgi::Tgi>(text),
            Dialect::Trtllm => run::<trtllm::Trtllm>(text),
            Dialect::Triton => run::<triton::Triton>(text),
            Dialect::Llamacpp => run::<llamacpp::Llamacpp>(text),
            Dialect::None => Ok(EngineState::default()),
        }
    }
}

impl fmt::Display for Dialect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A dialect name that is not one of [`Dialect::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown metrics dialect `{0}` (expected vllm, sglang, tgi, trtllm, triton, llamacpp or none)"
)]
pub struct UnknownDialect(pub String);

impl FromStr for Dialect {
    type Err = UnknownDialect;

    fn from_str(s: &str) -> Result<Self, UnknownDialect> {
        Dialect::ALL
            .into_iter()
            .find(|dialect| dialect.as_str() == s)
            .ok_or_else(|| UnknownDialect(s.to_owned()))
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    /// A fixture from `testdata/metrics/`.
    pub(crate) fn fixture(name: &str) -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/metrics")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prom::ParseErrorKind;

    #[test]
    fn names_round_trip() {
        for dialect in Dialect::ALL {
            assert_eq!(dialect.to_string().parse::<Dialect>(), Ok(dialect));
        }
        assert_eq!("llamacpp".parse(), Ok(Dialect::Llamacpp));
        assert_eq!(
            "VLLM".parse::<Dialect>(),
            Err(UnknownDialect("VLLM".to_owned()))
        );
    }

    #[test]
    fn serde_names_are_the_dialect_names() {
        for dialect in Dialect::ALL {
            let json = format!("\"{dialect}\"");
            assert_eq!(serde_json::to_string(&dialect).unwrap(), json);
            assert_eq!(serde_json::from_str::<Dialect>(&json).unwrap(), dialect);
        }
        assert_eq!(Dialect::default(), Dialect::Vllm);
    }

    #[test]
    fn a_valid_exposition_without_the_families_is_all_unknown() {
        let text = "# HELP process_cpu_seconds_total CPU.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n";
        for dialect in Dialect::ALL {
            assert_eq!(
                dialect.extract(text),
                Ok(EngineState::default()),
                "{dialect}"
            );
            assert_eq!(dialect.extract(""), Ok(EngineState::default()), "{dialect}");
        }
    }

    #[test]
    fn garbage_is_an_error_for_every_dialect_that_reads_metrics() {
        let html = "<html><head><title>502 Bad Gateway</title></head></html>";
        for dialect in Dialect::ALL.into_iter().filter(|d| d.has_metrics()) {
            let err = dialect.extract(html).unwrap_err();
            assert_eq!(err.kind, ParseErrorKind::InvalidMetricName, "{dialect}");
        }
    }

    #[test]
    fn none_reads_nothing() {
        assert_eq!(Dialect::None.extract("<html>"), Ok(EngineState::default()));
    }

    #[test]
    fn each_dialect_ignores_other_engines_families() {
        let vllm = test_support::fixture("vllm-v1-llmd-none.prom");
        assert_eq!(Dialect::Sglang.extract(&vllm), Ok(EngineState::default()));
        let sglang = test_support::fixture("sglang-docs-legacy.prom");
        assert_eq!(Dialect::Vllm.extract(&sglang), Ok(EngineState::default()));
    }
}
