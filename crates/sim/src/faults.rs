//! Fault injection: the failure modes a gateway must survive, switchable at
//! start (CLI flags) and at run time (`POST /admin/faults`).
//!
//! - `error_rate`: that fraction of inference requests gets an HTTP 500 with an
//!   OpenAI-shaped error body, before reaching the engine;
//! - `hang`: inference requests are accepted and never answered;
//! - `metrics`: `/metrics` is `ok`, `dead` (503), `hang` (never answers),
//!   `frozen` (keeps serving the text rendered when it froze: stale values)
//!   or `garbage` (200 with a body that is not Prometheus text);
//! - `slowdown`: every engine step takes this many times longer (thermal
//!   throttling, a noisy neighbour);
//! - `cut_after_tokens`: every answer longer than that many tokens dies after
//!   them, as if the server process had: a stream's connection is closed
//!   once the events of those tokens are written (no closing chunk, no
//!   `[DONE]`, no terminating zero-length chunk: the client sees a broken
//!   body); a non-streaming request's connection is closed without a
//!   response;
//! - `stall_after_tokens`: every answer longer than that many tokens stops
//!   after them and the connection stays open: a stream sends nothing more,
//!   a non-streaming request is never answered;
//! - `crash_after_tokens`: the first answer to get past that many tokens
//!   crashes the whole replica after them (as `POST /admin/crash`: it stops
//!   listening and drops every connection), once a stream's events for
//!   those tokens are written;
//! - crash (`POST /admin/crash`, not a state): the replica stops listening and
//!   drops every connection;
//! - graceful stop (`POST /admin/stop`, not a state): new inference requests
//!   get a 503 (`/health` too), the ones in flight run to their end, then the
//!   replica stops listening.
//!
//! The `*_after_tokens` faults count the tokens of each answer (an answer of
//! at most that many tokens is untouched; 0 strikes before the first token),
//! and apply to the requests that start while they are set. When several
//! would strike one answer, the one with the fewest tokens does (on a tie: a
//! crash, then a cut, then a stall). In the admin API they are numbers, or
//! `null` (off); `POST /admin/faults` with `null` turns one off.

use parking_lot::Mutex;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// How `/metrics` misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum MetricsFault {
    /// Serve live metrics.
    #[default]
    Ok,
    /// Answer 503 Service Unavailable.
    Dead,
    /// Accept the scrape and never answer.
    Hang,
    /// Serve the text rendered when the fault was set, forever.
    Frozen,
    /// Answer 200 with an HTML page instead of metrics, as a misrouted
    /// scrape or a captive proxy does.
    Garbage,
}

/// The faults in force on one replica. Serialized as the body of
/// `GET /admin/faults`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Fraction of inference requests answered with HTTP 500, in [0, 1].
    pub error_rate: f64,
    /// Accept inference requests and never answer them.
    pub hang: bool,
    pub metrics: MetricsFault,
    /// Engine slow-down factor: 1 is normal, 3 makes every step 3× longer.
    pub slowdown: f64,
    /// Close the connection of every answer after this many of its tokens.
    pub cut_after_tokens: Option<u32>,
    /// Stop sending every answer after this many of its tokens, keeping the
    /// connection open.
    pub stall_after_tokens: Option<u32>,
    /// Crash the replica after this many tokens of any answer.
    pub crash_after_tokens: Option<u32>,
}

impl Default for Faults {
    fn default() -> Self {
        Self {
            error_rate: 0.0,
            hang: false,
            metrics: MetricsFault::Ok,
            slowdown: 1.0,
            cut_after_tokens: None,
            stall_after_tokens: None,
            crash_after_tokens: None,
        }
    }
}

impl Faults {
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.error_rate) {
            return Err(format!(
                "error_rate must be within [0, 1], got {}",
                self.error_rate
            ));
        }
        if !(self.slowdown.is_finite() && self.slowdown > 0.0) {
            return Err(format!(
                "slowdown must be a positive number, got {}",
                self.slowdown
            ));
        }
        Ok(())
    }

    /// Whether any fault is active.
    pub fn any(&self) -> bool {
        *self != Faults::default()
    }

    /// The fault that strikes an answer of `planned` tokens, if any.
    pub fn token_fault(&self, planned: u32) -> Option<TokenFault> {
        // Ties go to the first listed.
        [
            (self.crash_after_tokens, TokenFaultKind::Crash),
            (self.cut_after_tokens, TokenFaultKind::Cut),
            (self.stall_after_tokens, TokenFaultKind::Stall),
        ]
        .into_iter()
        .filter_map(|(after, kind)| {
            Some(TokenFault {
                after: after?,
                kind,
            })
        })
        .filter(|fault| fault.after < planned)
        .min_by_key(|fault| fault.after)
    }
}

/// What happens to an answer after some of its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenFault {
    /// Tokens sent (or generated, without streaming) before it strikes.
    pub after: u32,
    pub kind: TokenFaultKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenFaultKind {
    /// Close the connection.
    Cut,
    /// Send nothing more, keep the connection.
    Stall,
    /// Crash the replica.
    Crash,
}

/// A partial change of faults: absent fields keep their current value.
/// The body of `POST /admin/faults`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsUpdate {
    pub error_rate: Option<f64>,
    pub hang: Option<bool>,
    pub metrics: Option<MetricsFault>,
    pub slowdown: Option<f64>,
    /// `Some(None)` (JSON `null`) turns the fault off.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub cut_after_tokens: Option<Option<u32>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub stall_after_tokens: Option<Option<u32>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub crash_after_tokens: Option<Option<u32>>,
}

/// A field that is present, `null` or not: absent fields stay `None` by
/// `#[serde(default)]`.
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

impl FaultsUpdate {
    fn applied_to(&self, faults: &Faults) -> Faults {
        Faults {
            error_rate: self.error_rate.unwrap_or(faults.error_rate),
            hang: self.hang.unwrap_or(faults.hang),
            metrics: self.metrics.unwrap_or(faults.metrics),
            slowdown: self.slowdown.unwrap_or(faults.slowdown),
            cut_after_tokens: self.cut_after_tokens.unwrap_or(faults.cut_after_tokens),
            stall_after_tokens: self.stall_after_tokens.unwrap_or(faults.stall_after_tokens),
            crash_after_tokens: self.crash_after_tokens.unwrap_or(faults.crash_after_tokens),
        }
    }
}

/// The live faults of one replica, shared by its request handlers.
#[derive(Debug)]
pub struct FaultState {
    current: Mutex<Faults>,
    /// Draws for `error_rate`; seeded so a run's error pattern is repeatable.
    rng: Mutex<SmallRng>,
}

impl FaultState {
    pub fn new(initial: Faults, seed: u64) -> Result<Self, String> {
        initial.validate()?;
        Ok(Self {
            current: Mutex::new(initial),
            rng: Mutex::new(SmallRng::seed_from_u64(seed)),
        })
    }

    pub fn current(&self) -> Faults {
        self.current.lock().clone()
    }

    /// Applies `update` if the result is valid; returns the faults now in force.
    pub fn update(&self, update: &FaultsUpdate) -> Result<Faults, String> {
        let mut current = self.current.lock();
        let next = update.applied_to(&current);
        next.validate()?;
        *current = next.clone();
        Ok(next)
    }

    /// Draws whether this inference request fails with an injected error.
    pub fn inject_error(&self) -> bool {
        let rate = self.current.lock().error_rate;
        rate > 0.0 && (rate >= 1.0 || self.rng.lock().gen_bool(rate))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_are_partial_and_validated() {
        let state = FaultState::new(Faults::default(), 1).unwrap();
        let update: FaultsUpdate =
            serde_json::from_str(r#"{"hang":true,"metrics":"frozen"}"#).unwrap();
        let now = state.update(&update).unwrap();
        assert!(now.hang);
        assert_eq!(now.metrics, MetricsFault::Frozen);
        assert_eq!(now.slowdown, 1.0);

        let bad: FaultsUpdate = serde_json::from_str(r#"{"error_rate":1.5}"#).unwrap();
        assert!(state.update(&bad).unwrap_err().contains("error_rate"));
        assert_eq!(state.current(), now, "a rejected update changes nothing");
        assert!(serde_json::from_str::<FaultsUpdate>(r#"{"slowness":2}"#).is_err());
        assert!(serde_json::from_str::<FaultsUpdate>(r#"{"metrics":"broken"}"#).is_err());
    }

    #[test]
    fn error_rate_is_honoured() {
        let always = FaultState::new(
            Faults {
                error_rate: 1.0,
                ..Faults::default()
            },
            1,
        )
        .unwrap();
        assert!((0..100).all(|_| always.inject_error()));
        let never = FaultState::new(Faults::default(), 1).unwrap();
        assert!((0..100).all(|_| !never.inject_error()));
        let half = FaultState::new(
            Faults {
                error_rate: 0.5,
                ..Faults::default()
            },
            7,
        )
        .unwrap();
        let failed = (0..1000).filter(|_| half.inject_error()).count();
        assert!((400..600).contains(&failed), "failed {failed} of 1000");
    }

    #[test]
    fn faults_serialize_as_the_admin_api_shows_them() {
        let json = serde_json::to_value(Faults::default()).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error_rate": 0.0, "hang": false, "metrics": "ok", "slowdown": 1.0,
                               "cut_after_tokens": null, "stall_after_tokens": null,
                               "crash_after_tokens": null})
        );
        assert!(!Faults::default().any());
        assert!(
            Faults {
                hang: true,
                ..Faults::default()
            }
            .any()
        );
        assert!(
            Faults {
                slowdown: 0.0,
                ..Faults::default()
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn token_faults_are_set_cleared_and_pick_the_earliest() {
        let state = FaultState::new(Faults::default(), 1).unwrap();
        let set: FaultsUpdate =
            serde_json::from_str(r#"{"cut_after_tokens":5,"stall_after_tokens":3}"#).unwrap();
        let now = state.update(&set).unwrap();
        assert_eq!(
            (now.cut_after_tokens, now.stall_after_tokens),
            (Some(5), Some(3))
        );
        let kept = state
            .update(&serde_json::from_str(r#"{"hang":false}"#).unwrap())
            .unwrap();
        assert_eq!(kept.cut_after_tokens, Some(5), "absent: kept");
        let cleared = state
            .update(&serde_json::from_str(r#"{"stall_after_tokens":null}"#).unwrap())
            .unwrap();
        assert_eq!(
            (cleared.cut_after_tokens, cleared.stall_after_tokens),
            (Some(5), None)
        );
        // An update serializes back to itself (an absent field stays absent).
        let json = serde_json::to_string(&set).unwrap();
        assert_eq!(serde_json::from_str::<FaultsUpdate>(&json).unwrap(), set);
        assert!(serde_json::from_str::<FaultsUpdate>(r#"{"cut_after_tokens":-1}"#).is_err());

        let faults = Faults {
            cut_after_tokens: Some(5),
            stall_after_tokens: Some(3),
            crash_after_tokens: Some(3),
            ..Faults::default()
        };
        let crash = TokenFault {
            after: 3,
            kind: TokenFaultKind::Crash,
        };
        assert_eq!(
            faults.token_fault(100),
            Some(crash),
            "earliest, crash on a tie"
        );
        assert_eq!(faults.token_fault(4), Some(crash));
        assert_eq!(
            faults.token_fault(3),
            None,
            "an answer of 3 tokens is untouched"
        );
        let cut = Faults {
            cut_after_tokens: Some(0),
            ..Faults::default()
        };
        assert_eq!(
            cut.token_fault(1),
            Some(TokenFault {
                after: 0,
                kind: TokenFaultKind::Cut
            })
        );
        assert_eq!(Faults::default().token_fault(1000), None);
    }
}
