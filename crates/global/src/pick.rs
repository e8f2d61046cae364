//! Which member a request goes to.
//!
//! 1. **Filter**: members that serve the model and that the request may go
//!    to (residency). None left: the request cannot be served here, and
//!    says why.
//! 2. **Sort into tiers of preference**: a member with room (healthy or
//!    ramping, not saturated, not refusing) of the primary tier; else one
//!    of the fallback tier; else a saturated or refusing primary (its own
//!    flow control queues or refuses the request with a reason), else such
//!    a fallback. Unhealthy members never get a request.
//! 3. **Ramp**: a ramping member stays a candidate only for its share of
//!    the draws, unless it is the only one left.
//! 4. **Score** the candidates of the first non-empty tier by the weighted
//!    mean of their signals and take the best; ties go to the member the
//!    caller's random draw favours.
//!
//! Scores, each in `[0, 1]`, 1 best:
//! - `kvHeadroom`: the member's free KV share (0.5 when it does not say);
//! - `queueDepth`: half for a short queue per ready replica (0 at
//!   [`config::defaults::GLOBAL_QUEUE_DEPTH_SCALE`] or deeper), half for
//!   few requests in flight from this router relative to the busiest
//!   candidate, which moves at once as requests are sent, between two
//!   summaries;
//! - `regionProximity`: from the region-distance table when it names the
//!   member's region: 1 in the router's region, falling linearly to 0 at
//!   the farthest distance of the table; else from the round trip the
//!   router measured: 1 at 0 ms, falling linearly to 0 at
//!   [`config::defaults::GLOBAL_RTT_FAR`]; before a measurement, 1 in
//!   the router's region and 0 elsewhere;
//! - `errorRate`: 1 minus the share of recent answers that failed or were
//!   throttled (the worse of the member's word and the router's view);
//! - `cost`: 1 for the cheapest candidate, 0 for the dearest.

use std::time::Duration;

use config::defaults::{GLOBAL_QUEUE_DEPTH_SCALE, GLOBAL_RTT_FAR};
use config::{GlobalWeights, Tier};

use crate::health::Verdict;
use crate::summary::ModelLoad;

/// One member, as the router sees it for one request's model.
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub tier: Tier,
    /// Residency tags the member carries.
    pub residency: &'a [String],
    /// The member serves the request's model (under whatever name).
    pub serves: bool,
    pub verdict: Verdict,
    /// The model's load in the member's latest summary; `None` for a
    /// member that publishes none.
    pub load: Option<&'a ModelLoad>,
    /// Requests this router has in flight at the member.
    pub in_flight: u64,
    /// Share of this router's recent requests to the member that failed
    /// (5xx, refused connection) or were throttled (429).
    pub error_rate: f64,
    /// Distance from the router's region; `None` when unknown.
    pub distance: Option<f64>,
    /// The round trip to the member as the router measured it.
    pub rtt: Option<Duration>,
    pub cost: Option<f64>,
}

/// What the request asks of its member, and how members are compared.
#[derive(Debug, Clone, Copy)]
pub struct Demand<'a> {
    /// The member must carry one of these tags; anywhere when `None`.
    pub residency: Option<&'a [String]>,
    pub weights: &'a GlobalWeights,
    /// The largest distance in the region table (0: none given).
    pub farthest: f64,
    /// Above this error rate a member counts as refusing.
    pub max_error_rate: f64,
}

/// The member chosen, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberPick {
    /// Index into the candidates.
    pub index: usize,
    pub score: f64,
    /// It is a fallback member (the request spilled to another tier).
    pub fallback: bool,
    /// Every member with room was passed over: it is saturated or refusing.
    pub overloaded: bool,
    /// The other members in the same preference tier, best first, for a
    /// retry before the first response byte.
    pub next: Vec<usize>,
}

/// Why no member can take the request (a 503 with this reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoMember {
    /// No member serves the model.
    NoneServes,
    /// Members serve it, but none in the residency the request is held to.
    Residency,
    /// The members that may take it are all unhealthy.
    AllUnhealthy,
}

impl NoMember {
    pub fn message(&self, model: &str) -> String {
        match self {
            NoMember::NoneServes => format!("no member serves the model {model:?}"),
            NoMember::Residency => {
                format!("no member serving {model:?} is in the residency this request is held to")
            }
            NoMember::AllUnhealthy => format!(
                "every member that may serve {model:?} is unhealthy; the request was not sent elsewhere"
            ),
        }
    }
}

/// Pick a member for one request. `draw` yields uniform numbers in
/// `[0, 1)`: one per ramping member considered, and one per tie.
pub fn pick(
    candidates: &[Candidate<'_>],
    demand: &Demand<'_>,
    mut draw: impl FnMut() -> f64,
) -> Result<MemberPick, NoMember> {
    let serving: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].serves)
        .collect();
    if serving.is_empty() {
        return Err(NoMember::NoneServes);
    }
    let allowed: Vec<usize> = serving
        .into_iter()
        .filter(|&i| may_go_to(&candidates[i], demand.residency))
        .collect();
    if allowed.is_empty() {
        return Err(NoMember::Residency);
    }
    let usable: Vec<usize> = allowed
        .into_iter()
        .filter(|&i| !matches!(candidates[i].verdict, Verdict::Unhealthy { .. }))
        .collect();
    // In order of preference; the first with a candidate is used.
    let preference = [
        (Tier::Primary, true),
        (Tier::Fallback, true),
        (Tier::Primary, false),
        (Tier::Fallback, false),
    ];
    for (tier, with_room) in preference {
        let group: Vec<usize> = usable
            .iter()
            .copied()
            .filter(|&i| {
                let c = &candidates[i];
                c.tier == tier && has_room(c, demand.max_error_rate) == with_room
            })
            .collect();
        if group.is_empty() {
            continue;
        }
        let drawn: Vec<usize> = group
            .iter()
            .copied()
            .filter(|&i| match candidates[i].verdict {
                Verdict::Ramping { share } => draw() < share,
                _ => true,
            })
            .collect();
        // A ramping member left alone still beats sending nothing.
        let group = if drawn.is_empty() { group } else { drawn };
        let mut scored: Vec<(usize, f64, f64)> = group
            .iter()
            .map(|&i| (i, score(candidates, &group, i, demand), draw()))
            .collect();
        scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(b.2.total_cmp(&a.2)));
        let (index, best, _) = scored[0];
        return Ok(MemberPick {
            index,
            score: best,
            fallback: tier == Tier::Fallback,
            overloaded: !with_room,
            next: scored[1..].iter().map(|s| s.0).collect(),
        });
    }
    Err(NoMember::AllUnhealthy)
}

/// A member restricted by tags may be used when it carries one of them.
fn may_go_to(c: &Candidate<'_>, residency: Option<&[String]>) -> bool {
    residency.is_none_or(|tags| c.residency.iter().any(|t| tags.contains(t)))
}

/// Not saturated (by its own word: every ready replica full, or none
/// ready: a cold pool, where a request would wait for a replica to start)
/// and not refusing (recent errors and 429s above the threshold).
fn has_room(c: &Candidate<'_>, max_error_rate: f64) -> bool {
    let saturated = c
        .load
        .is_some_and(|l| l.saturated || l.cold || l.ready_replicas == 0);
    !saturated && recent_failure_rate(c) <= max_error_rate
}

fn recent_failure_rate(c: &Candidate<'_>) -> f64 {
    let reported = c.load.map_or(0.0, |l| l.error_rate + l.throttle_rate);
    reported.max(c.error_rate).clamp(0.0, 1.0)
}

/// The weighted mean of the member's scores among `group`.
fn score(candidates: &[Candidate<'_>], group: &[usize], i: usize, demand: &Demand<'_>) -> f64 {
    let c = &candidates[i];
    let w = demand.weights;
    let kv = c
        .load
        .and_then(|l| l.kv_headroom)
        .unwrap_or(0.5)
        .clamp(0.0, 1.0);
    let busiest = group
        .iter()
        .map(|&j| candidates[j].in_flight)
        .max()
        .unwrap_or(0);
    let own = 1.0 - c.in_flight as f64 / (busiest as f64 + 1.0);
    let queue = match c.load {
        Some(l) => {
            let depth = 1.0 - (l.queue_per_replica() / GLOBAL_QUEUE_DEPTH_SCALE).min(1.0);
            0.5 * depth + 0.5 * own
        }
        None => own,
    };
    // The table is the operator's word; without it, what the router
    // measured; before that, its own region is near and every other far.
    let proximity = match (c.distance, c.rtt) {
        (Some(d), _) if demand.farthest > 0.0 => 1.0 - (d / demand.farthest).min(1.0),
        (_, Some(rtt)) => 1.0 - (rtt.as_secs_f64() / GLOBAL_RTT_FAR.as_secs_f64()).min(1.0),
        (d, None) => f64::from(u8::from(d == Some(0.0))),
    };
    let errors = 1.0 - recent_failure_rate(c);
    let costs = group.iter().map(|&j| candidates[j].cost.unwrap_or(0.0));
    let (cheapest, dearest) = costs.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    let cost = if dearest > cheapest {
        1.0 - (c.cost.unwrap_or(0.0) - cheapest) / (dearest - cheapest)
    } else {
        1.0
    };
    let parts = [
        (w.kv_headroom(), kv),
        (w.queue_depth(), queue),
        (w.region_proximity(), proximity),
        (w.error_rate(), errors),
        (w.cost(), cost),
    ];
    let total: f64 = parts.iter().map(|(w, _)| w).sum();
    if total <= 0.0 {
        return 0.0;
    }
    parts.iter().map(|(w, s)| w * s).sum::<f64>() / total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::DownReason;

    fn load(kv: f64, queue: u64, saturated: bool) -> ModelLoad {
        ModelLoad {
            pool: "p".into(),
            ready_replicas: 2,
            replicas: 2,
            kv_headroom: Some(kv),
            queue_depth: queue,
            in_flight: 0,
            saturated,
            cold: false,
            error_rate: 0.0,
            throttle_rate: 0.0,
        }
    }

    fn member<'a>(name: &'a str, load: Option<&'a ModelLoad>) -> Candidate<'a> {
        Candidate {
            name,
            tier: Tier::Primary,
            residency: &[],
            serves: true,
            verdict: Verdict::Healthy,
            load,
            in_flight: 0,
            error_rate: 0.0,
            distance: Some(0.0),
            rtt: None,
            cost: None,
        }
    }

    fn demand(weights: &GlobalWeights) -> Demand<'_> {
        Demand {
            residency: None,
            weights,
            farthest: 100.0,
            max_error_rate: 0.5,
        }
    }

    fn names<'a>(c: &[Candidate<'a>], p: &MemberPick) -> (&'a str, Vec<&'a str>) {
        (c[p.index].name, p.next.iter().map(|&i| c[i].name).collect())
    }

    fn half() -> f64 {
        0.5
    }

    #[test]
    fn the_member_with_room_wins_and_the_rest_follow_in_order() {
        let w = GlobalWeights::default();
        let (busy, idle, mid) = (
            load(0.1, 10, false),
            load(0.9, 0, false),
            load(0.5, 2, false),
        );
        let c = [
            member("busy", Some(&busy)),
            member("idle", Some(&idle)),
            member("mid", Some(&mid)),
        ];
        let p = pick(&c, &demand(&w), half).unwrap();
        assert_eq!(names(&c, &p), ("idle", vec!["mid", "busy"]));
        assert!(!p.fallback && !p.overloaded);
    }

    #[test]
    fn proximity_and_cost_count_by_their_weights() {
        let same = load(0.5, 0, false);
        let mut near = member("near", Some(&same));
        let mut far = member("far", Some(&same));
        far.distance = Some(80.0);
        near.cost = Some(0.20);
        far.cost = Some(0.15);
        let by_default = GlobalWeights::default();
        let p = pick(&[near.clone(), far.clone()], &demand(&by_default), half).unwrap();
        assert_eq!(p.index, 0, "closer wins when cost does not count");
        let thrifty = GlobalWeights {
            cost: Some(1.0),
            ..Default::default()
        };
        let p = pick(&[near, far], &demand(&thrifty), half).unwrap();
        assert_eq!(p.index, 1, "cheaper wins when cost outweighs proximity");
    }

    #[test]
    fn without_a_table_the_measured_round_trip_is_the_proximity() {
        let same = load(0.5, 0, false);
        let w = GlobalWeights::default();
        let no_table = Demand {
            farthest: 0.0,
            ..demand(&w)
        };
        let mut near = member("near", Some(&same));
        let mut far = member("far", Some(&same));
        near.rtt = Some(Duration::from_millis(2));
        far.rtt = Some(Duration::from_millis(90));
        let p = pick(&[far.clone(), near.clone()], &no_table, half).unwrap();
        assert_eq!(names(&[far.clone(), near.clone()], &p).0, "near");
        // The proximity part alone: 1 − rtt / GLOBAL_RTT_FAR.
        let only_proximity = GlobalWeights {
            kv_headroom: Some(0.0),
            queue_depth: Some(0.0),
            region_proximity: Some(1.0),
            error_rate: Some(0.0),
            cost: Some(0.0),
        };
        let alone = Demand {
            farthest: 0.0,
            ..demand(&only_proximity)
        };
        let p = pick(std::slice::from_ref(&far), &alone, half).unwrap();
        let expected = 1.0 - 90.0 / GLOBAL_RTT_FAR.as_secs_f64() / 1e3;
        assert!((p.score - expected).abs() < 1e-9, "{}", p.score);
        // A table, when given, is the operator's word over a measurement.
        far.distance = Some(0.0);
        near.distance = Some(80.0);
        let p = pick(&[far, near], &demand(&w), half).unwrap();
        assert_eq!(p.index, 0, "the table says `far` is in the router's region");
    }

    #[test]
    fn requests_in_flight_spread_load_between_two_summaries() {
        let w = GlobalWeights::default();
        let same = load(0.5, 0, false);
        let mut a = member("a", Some(&same));
        let b = member("b", Some(&same));
        a.in_flight = 3;
        let p = pick(&[a, b], &demand(&w), half).unwrap();
        assert_eq!(p.index, 1);
    }

    #[test]
    fn fallback_only_when_every_primary_is_saturated_unhealthy_or_refusing() {
        let w = GlobalWeights::default();
        let full = load(0.0, 40, true);
        let fine = load(0.9, 0, false);
        let mut refusing = load(0.9, 0, false);
        refusing.throttle_rate = 0.8;
        let mut down = member("down", Some(&fine));
        down.verdict = Verdict::Unhealthy {
            reason: DownReason::Silent,
        };
        let mut hosted = member("hosted", None);
        hosted.tier = Tier::Fallback;
        let mut c = vec![
            member("full", Some(&full)),
            member("refusing", Some(&refusing)),
            down,
            hosted,
        ];
        let p = pick(&c, &demand(&w), half).unwrap();
        assert_eq!(c[p.index].name, "hosted");
        assert!(p.fallback && !p.overloaded);

        // One primary with room: no spill.
        c.push(member("roomy", Some(&fine)));
        let p = pick(&c, &demand(&w), half).unwrap();
        assert_eq!(c[p.index].name, "roomy");
        assert!(!p.fallback);
    }

    #[test]
    fn with_no_member_with_room_an_overloaded_primary_takes_it_not_an_unhealthy_one() {
        let w = GlobalWeights::default();
        let full = load(0.0, 40, true);
        let fine = load(0.9, 0, false);
        let mut down = member("down", Some(&fine));
        down.verdict = Verdict::Unhealthy {
            reason: DownReason::Failing,
        };
        let c = [down, member("full", Some(&full))];
        let p = pick(&c, &demand(&w), half).unwrap();
        assert_eq!(c[p.index].name, "full");
        assert!(p.overloaded && !p.fallback);
        let only_down = [c[0].clone()];
        assert_eq!(
            pick(&only_down, &demand(&w), half),
            Err(NoMember::AllUnhealthy)
        );
    }

    /// A member whose pool is cold (no replica ready, its requests would
    /// wait for one to start) gets the model's requests only when no warm
    /// member has room, or when residency pins them to it; even an idle
    /// cold member loses to a busier warm one.
    #[test]
    fn a_cold_member_is_passed_over_for_a_warm_one_unless_pinned() {
        let w = GlobalWeights::default();
        let mut cold = load(1.0, 0, false);
        cold.cold = true;
        cold.ready_replicas = 0;
        let busy = load(0.2, 6, false);
        let eu = ["eu".to_owned()];
        let mut euw1 = member("euw1", Some(&cold));
        euw1.residency = &eu;
        let use1 = member("use1", Some(&busy));
        let c = [euw1.clone(), use1.clone()];
        let p = pick(&c, &demand(&w), half).unwrap();
        assert_eq!(names(&c, &p), ("use1", vec![]));
        assert!(!p.overloaded);
        let pinned = Demand {
            residency: Some(&eu),
            ..demand(&w)
        };
        let p = pick(&c, &pinned, half).unwrap();
        assert_eq!(names(&c, &p), ("euw1", vec![]));
        // The warm member saturated too: both lack room, and the cold
        // member, which queues and wakes, is a candidate again.
        let full = load(0.0, 40, true);
        let use1 = member("use1", Some(&full));
        let c = [euw1, use1];
        let p = pick(&c, &demand(&w), half).unwrap();
        assert!(p.overloaded);
        assert_eq!(p.next.len(), 1);
    }

    #[test]
    fn a_residency_pinned_request_never_leaves_its_members() {
        let w = GlobalWeights::default();
        let eu = ["eu".to_owned()];
        let fine = load(0.9, 0, false);
        let mut euw1 = member("euw1", Some(&fine));
        euw1.residency = &eu;
        let mut hosted = member("hosted", None);
        hosted.tier = Tier::Fallback;
        let use1 = member("use1", Some(&fine));
        let pinned = Demand {
            residency: Some(&eu),
            ..demand(&w)
        };
        let c = [use1.clone(), euw1.clone(), hosted.clone()];
        let p = pick(&c, &pinned, half).unwrap();
        assert_eq!(names(&c, &p), ("euw1", vec![]));

        euw1.verdict = Verdict::Unhealthy {
            reason: DownReason::Silent,
        };
        let c = [use1.clone(), euw1, hosted];
        assert_eq!(pick(&c, &pinned, half), Err(NoMember::AllUnhealthy));
        let c = [use1];
        assert_eq!(pick(&c, &pinned, half), Err(NoMember::Residency));
        assert!(NoMember::Residency.message("m").contains("residency"));
    }

    #[test]
    fn members_that_do_not_serve_the_model_are_never_picked() {
        let w = GlobalWeights::default();
        let mut other = member("other", None);
        other.serves = false;
        assert_eq!(pick(&[other], &demand(&w), half), Err(NoMember::NoneServes));
    }

    #[test]
    fn a_ramping_member_gets_its_share_of_the_draws() {
        let w = GlobalWeights::default();
        let idle = load(1.0, 0, false);
        let busy = load(0.2, 4, false);
        let mut back = member("back", Some(&idle));
        back.verdict = Verdict::Ramping { share: 0.25 };
        let c = [back, member("steady", Some(&busy))];
        // Seeded draws (splitmix64), uniform over [0, 1).
        let mut state = 7u64;
        let mut draw = || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (((z ^ (z >> 31)) >> 11) as f64) / (1u64 << 53) as f64
        };
        let picks = 4000;
        let to_back = (0..picks)
            .filter(|_| pick(&c, &demand(&w), &mut draw).unwrap().index == 0)
            .count();
        let share = to_back as f64 / picks as f64;
        assert!((0.2..0.3).contains(&share), "share {share}");

        // Alone, it takes everything rather than nothing.
        let alone = [c[0].clone()];
        assert_eq!(pick(&alone, &demand(&w), || 0.99).unwrap().index, 0);
    }
}
