//! OpenAI's rate-limit headers: `x-ratelimit-{limit,remaining,reset}-
//! {requests,tokens}`. Where several limits apply, each family reports the
//! one closest to refusing (fewest units left), so a client that paces
//! itself by them stays under all of them.

use http::{HeaderMap, HeaderName, HeaderValue};

use super::gcra::Verdict;

/// What a limit counts, and so which family of headers reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Requests,
    Tokens,
}

/// One family's values.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Family {
    limit: u64,
    remaining: u64,
    reset_ms: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RateHeaders {
    requests: Option<Family>,
    tokens: Option<Family>,
}

impl RateHeaders {
    pub(super) fn from_verdicts<'a>(
        verdicts: impl Iterator<Item = (Kind, u64, &'a Verdict)>,
    ) -> Self {
        let mut headers = Self::default();
        for (kind, limit, v) in verdicts {
            let slot = match kind {
                Kind::Requests => &mut headers.requests,
                Kind::Tokens => &mut headers.tokens,
            };
            let candidate = Family {
                limit,
                remaining: v.remaining,
                reset_ms: v.reset_ms,
            };
            if slot.is_none_or(|f| candidate.remaining < f.remaining) {
                *slot = Some(candidate);
            }
        }
        headers
    }

    pub fn apply(&self, headers: &mut HeaderMap) {
        for (names, family) in [(&REQUESTS, &self.requests), (&TOKENS, &self.tokens)] {
            let Some(f) = family else { continue };
            let [limit, remaining, reset] = names;
            headers.insert(limit, HeaderValue::from(f.limit));
            headers.insert(remaining, HeaderValue::from(f.remaining));
            let reset_value = HeaderValue::from_str(&go_duration(f.reset_ms)).expect("ASCII");
            headers.insert(reset, reset_value);
        }
    }
}

/// Each family's names, made once: they go on every response.
static REQUESTS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];
static TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// A duration as Go prints one, which is what OpenAI sends: `20ms`, `1.5s`,
/// `6m0s`, `1h2m3s`. Rounded up to the millisecond.
pub fn go_duration(ms: f64) -> String {
    let ms = ms.max(0.0).ceil() as u64;
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, rest) = (ms / 3_600_000, ms % 3_600_000);
    let (m, rest) = (rest / 60_000, rest % 60_000);
    let (s, frac) = (rest / 1000, rest % 1000);
    let seconds = if frac == 0 {
        format!("{s}s")
    } else {
        let frac = format!("{frac:03}");
        format!("{s}.{}s", frac.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => seconds,
        (0, m) => format!("{m}m{seconds}"),
        (h, m) => format!("{h}h{m}m{seconds}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_prints_them() {
        assert_eq!(go_duration(0.0), "0ms");
        assert_eq!(go_duration(11.2), "12ms");
        assert_eq!(go_duration(1000.0), "1s");
        assert_eq!(go_duration(1574.0), "1.574s");
        assert_eq!(go_duration(1500.0), "1.5s");
        assert_eq!(go_duration(360_000.0), "6m0s");
        assert_eq!(go_duration(3_723_000.0), "1h2m3s");
    }

    #[test]
    fn each_family_reports_its_tightest_limit() {
        let roomy = Verdict {
            remaining: 90,
            reset_ms: 1000.0,
            retry_ms: 0.0,
        };
        let tight = Verdict {
            remaining: 3,
            reset_ms: 50_000.0,
            retry_ms: 0.0,
        };
        let h = RateHeaders::from_verdicts(
            [
                (Kind::Requests, 100, &roomy),
                (Kind::Requests, 10, &tight),
                (Kind::Tokens, 1000, &roomy),
            ]
            .into_iter(),
        );
        let mut map = HeaderMap::new();
        h.apply(&mut map);
        assert_eq!(map["x-ratelimit-limit-requests"], "10");
        assert_eq!(map["x-ratelimit-remaining-requests"], "3");
        assert_eq!(map["x-ratelimit-reset-requests"], "50s");
        assert_eq!(map["x-ratelimit-limit-tokens"], "1000");
        assert_eq!(map["x-ratelimit-remaining-tokens"], "90");
        assert_eq!(map["x-ratelimit-reset-tokens"], "1s");
    }
}
