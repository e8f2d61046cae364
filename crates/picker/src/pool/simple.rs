//! Policies that ignore scraped signals: round-robin, least-request and
//! random. They still skip unreachable, draining and excluded endpoints.
//! Least-request is also the scored policy's fallback when no replica has
//! fresh metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rand::Rng;

use crate::endpoint::Endpoint;

/// Reachable, not draining, and not already tried by this request. Every
/// policy and fallback picks among these only.
pub(super) fn is_candidate(endpoint: &Endpoint, exclude: &[usize]) -> bool {
    endpoint.is_reachable() && !endpoint.draining() && !exclude.contains(&endpoint.index)
}

fn candidates<'a, 'b>(
    snapshot: &'a [Arc<Endpoint>],
    exclude: &'b [usize],
) -> impl Iterator<Item = &'a Arc<Endpoint>> + Clone + use<'a, 'b> {
    snapshot.iter().filter(move |ep| is_candidate(ep, exclude))
}

/// The next candidate in turn. Turns are counted over the candidates, so an
/// excluded or unreachable replica does not give its neighbour a double share.
pub(super) fn round_robin<'a>(
    snapshot: &'a [Arc<Endpoint>],
    exclude: &[usize],
    turn: &AtomicUsize,
) -> Option<&'a Arc<Endpoint>> {
    let count = candidates(snapshot, exclude).count();
    if count == 0 {
        return None;
    }
    let nth = turn.fetch_add(1, Ordering::Relaxed) % count;
    candidates(snapshot, exclude).nth(nth)
}

/// The candidate with the fewest requests in flight from this gateway;
/// ties are broken uniformly at random.
pub(super) fn least_request<'a, R: Rng + ?Sized>(
    snapshot: &'a [Arc<Endpoint>],
    exclude: &[usize],
    rng: &mut R,
) -> Option<&'a Arc<Endpoint>> {
    let mut best: Option<&Arc<Endpoint>> = None;
    let mut best_load = u64::MAX;
    let mut ties = 0u32;
    for endpoint in candidates(snapshot, exclude) {
        let load = endpoint.load.requests();
        if load < best_load {
            best = Some(endpoint);
            best_load = load;
            ties = 1;
        } else if load == best_load {
            // Reservoir sampling: each of the tied candidates is kept with
            // equal probability, in one pass.
            ties += 1;
            if rng.gen_range(0..ties) == 0 {
                best = Some(endpoint);
            }
        }
    }
    best
}

/// A candidate chosen uniformly at random.
pub(super) fn random<'a, R: Rng + ?Sized>(
    snapshot: &'a [Arc<Endpoint>],
    exclude: &[usize],
    rng: &mut R,
) -> Option<&'a Arc<Endpoint>> {
    let count = candidates(snapshot, exclude).count();
    if count == 0 {
        return None;
    }
    candidates(snapshot, exclude).nth(rng.gen_range(0..count))
}
