//! Replicas that cannot hold a request: in a pool that mixes context
//! lengths (an A10G serving 32k tokens beside H100s serving 128k), a long
//! prompt must go where it fits, never to a replica that will refuse it.

use std::sync::Arc;

use crate::endpoint::Endpoint;

/// `exclude` plus every replica known to be too small for `needed`
/// tokens (its own limit, else the pool's `configured` one), or `None` when that adds nothing (the common case, and no
/// allocation). When no candidate would remain, only those with the
/// largest context stay: the request is estimated, not counted, so the
/// largest replica decides, and its refusal is the answer.
pub fn exclude_too_small(
    snapshot: &[Arc<Endpoint>],
    exclude: &[usize],
    needed: u64,
    configured: Option<u64>,
) -> Option<Vec<usize>> {
    if needed == 0 {
        return None;
    }
    let limit = |ep: &Arc<Endpoint>| ep.context_limit().or(configured);
    // A draining replica is never picked, so its context decides nothing.
    let candidates = || {
        snapshot
            .iter()
            .filter(|ep| !exclude.contains(&ep.index) && !ep.draining())
    };
    let small = |ep: &Arc<Endpoint>| limit(ep).is_some_and(|limit| limit < needed);
    if !candidates().any(small) {
        return None;
    }
    let left_out: Vec<usize> = if candidates().all(small) {
        let largest = candidates().filter_map(limit).max();
        candidates()
            .filter(|ep| limit(ep) < largest)
            .map(|ep| ep.index)
            .collect()
    } else {
        candidates()
            .filter(|ep| small(ep))
            .map(|ep| ep.index)
            .collect()
    };
    if left_out.is_empty() {
        return None;
    }
    Some([exclude, &left_out].concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(limits: &[u64]) -> Vec<Arc<Endpoint>> {
        limits
            .iter()
            .enumerate()
            .map(|(i, &limit)| {
                let ep = Endpoint::new(i, format!("10.0.0.{i}:8000"));
                ep.set_context_limit(limit);
                ep
            })
            .collect()
    }

    #[test]
    fn replicas_too_small_are_left_out_while_another_fits() {
        // 32k, 128k, unknown.
        let p = pool(&[32_768, 131_072, 0]);
        assert_eq!(exclude_too_small(&p, &[], 40_000, None), Some(vec![0]));
        assert_eq!(exclude_too_small(&p, &[2], 40_000, None), Some(vec![2, 0]));
        assert_eq!(exclude_too_small(&p, &[], 1_000, None), None, "all fit");
        assert_eq!(
            exclude_too_small(&p, &[], 0, None),
            None,
            "nothing to check"
        );
        // An unknown limit is not a reason to leave a replica out...
        assert_eq!(exclude_too_small(&pool(&[0, 0]), &[], 1 << 40, None), None);
        // ...but the pool's configured one is.
        assert_eq!(
            exclude_too_small(&p, &[], 40_000, Some(8192)),
            Some(vec![0, 2])
        );
    }

    #[test]
    fn when_none_fits_the_largest_decides() {
        let p = pool(&[32_768, 131_072, 131_072]);
        assert_eq!(exclude_too_small(&p, &[], 200_000, None), Some(vec![0]));
        assert_eq!(exclude_too_small(&p, &[1, 2], 200_000, None), None);
    }
}
