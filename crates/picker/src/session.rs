//! Session affinity: the requests of one session (a chat, an agent loop)
//! go to the same replica, so each turn reuses the KV cache the earlier
//! turns left there.
//!
//! Each session has a home among the candidates by rendezvous hashing
//! (highest `hash(session, replica address)` wins), bounded by load: a
//! replica already carrying [`LOAD_FACTOR`] times the average in-flight
//! requests of the candidates, plus [`LOAD_SLACK`], is passed over for
//! the next one in the session's order (consistent hashing with bounded loads,
//! Mirrokni, Thorup and Zadimoghaddam, 2018). Candidates are the healthy,
//! unsaturated replicas, so a session moves when its replica is saturated,
//! stale, overloaded or gone; when one replica leaves, only the sessions
//! whose home it was move, because every other session's highest hash is
//! unchanged. Addresses, not endpoint ids, are hashed, so every gateway
//! replica agrees on a session's home.
//!
//! The session scorer (`scorers::session`) gives the home 1 and every
//! other candidate 0; its weight
//! ([`crate::Weights::session`]) sets how much load difference it
//! outweighs.

use serde::Serialize;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// A replica's in-flight requests may exceed the candidates' average by
/// this factor (plus the request itself) before its sessions are sent to
/// their next replica. 1.5: sessions stay put through ordinary imbalance
/// (a pool of equal replicas under steady load rarely has one at 1.5×
/// the mean), yet a session-heavy replica sheds its newest turns before
/// its queue builds; the paper's analysis gives at most about
/// `1 / (factor - 1)²` = 4 moves per replica change at this factor.
pub const LOAD_FACTOR: f64 = 1.5;
/// Requests a replica may carry beyond that bound before its sessions
/// move: at low load the bound alone is a request or two, and a session
/// must not leave its cache over a one-request difference.
pub const LOAD_SLACK: u64 = 2;

/// A candidate's place for the request's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SessionFit {
    /// The request has no session: every candidate scores alike.
    #[default]
    NoSession,
    /// The session's replica.
    Home,
    /// Another replica.
    Away,
}

/// A session key (a header value, a `user`, a token claim) as the picker
/// takes it.
pub fn session_key(key: &[u8]) -> u64 {
    xxh3_64(key)
}

/// The session's rank of the replica at `addr`: higher is preferred.
pub fn rendezvous(session: u64, addr: &str) -> u64 {
    xxh3_64_with_seed(addr.as_bytes(), session)
}

/// Mark the home of `session` among candidates with these addresses and
/// in-flight requests (`fits[i]` for candidate `i`): the highest-ranked
/// candidate within the load bound.
pub fn assign<'a>(
    session: u64,
    addrs: impl Iterator<Item = &'a str>,
    inflight: &[u64],
    fits: &mut [SessionFit],
) {
    let n = inflight.len();
    if n == 0 {
        return;
    }
    let total: u64 = inflight.iter().sum();
    let bound = (LOAD_FACTOR * (total + 1) as f64 / n as f64).ceil() as u64 + LOAD_SLACK;
    let mut best: Option<(u64, usize)> = None;
    let mut best_any: Option<(u64, usize)> = None;
    for (i, addr) in addrs.enumerate().take(n) {
        fits[i] = SessionFit::Away;
        let rank = rendezvous(session, addr);
        if best_any.is_none_or(|(r, _)| rank > r) {
            best_any = Some((rank, i));
        }
        if inflight[i] < bound && best.is_none_or(|(r, _)| rank > r) {
            best = Some((rank, i));
        }
    }
    // Someone is always at or under the average, hence under the bound;
    // the fallback only guards against arithmetic surprises.
    if let Some((_, home)) = best.or(best_any) {
        fits[home] = SessionFit::Home;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn home(session: u64, addrs: &[&str], inflight: &[u64]) -> Option<usize> {
        let mut fits = vec![SessionFit::NoSession; addrs.len()];
        assign(session, addrs.iter().copied(), inflight, &mut fits);
        assert_eq!(
            fits.iter().filter(|f| **f == SessionFit::Home).count(),
            1,
            "one home among {fits:?}"
        );
        fits.iter().position(|f| *f == SessionFit::Home)
    }

    const ADDRS: [&str; 5] = [
        "10.0.0.1:8000",
        "10.0.0.2:8000",
        "10.0.0.3:8000",
        "10.0.0.4:8000",
        "10.0.0.5:8000",
    ];

    #[test]
    fn a_removed_replica_moves_only_its_own_sessions() {
        let idle = [0; 5];
        let before: Vec<&str> = (0..2000u64)
            .map(|s| ADDRS[home(session_key(&s.to_le_bytes()), &ADDRS, &idle).unwrap()])
            .collect();
        // Every replica is home to some sessions (the hash spreads them).
        for addr in ADDRS {
            let n = before.iter().filter(|a| **a == addr).count();
            assert!((250..=550).contains(&n), "{addr} is home to {n} of 2000");
        }
        let removed = ADDRS[2];
        let remaining: Vec<&str> = ADDRS.iter().copied().filter(|a| *a != removed).collect();
        let mut moved = 0;
        for (s, was) in (0..2000u64).zip(&before) {
            let now = remaining[home(session_key(&s.to_le_bytes()), &remaining, &[0; 4]).unwrap()];
            if *was == removed {
                moved += 1;
                assert_ne!(now, removed);
            } else {
                assert_eq!(now, *was, "session {s} moved though its replica stayed");
            }
        }
        assert!(moved > 0);
    }

    #[test]
    fn an_overloaded_home_passes_the_session_to_its_next_replica() {
        let session = session_key(b"chat-42");
        let first = home(session, &ADDRS, &[0; 5]).unwrap();
        // Its home carries far more than the average: the bound is
        // ceil(1.5 * 11 / 5) + 2 = 6, and the home has 10.
        let mut inflight = [0; 5];
        inflight[first] = 10;
        let second = home(session, &ADDRS, &inflight).unwrap();
        assert_ne!(second, first);
        // Within the bound it stays, even well above the others.
        inflight[first] = 3;
        assert_eq!(home(session, &ADDRS, &inflight), Some(first));
    }
}
