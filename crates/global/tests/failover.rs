//! A member dies and comes back, in virtual time: three equal members
//! publishing summaries every 500 ms, a request every 10 ms, member `b`
//! killed at 10 s and restarted at 20 s. Measures what the issue asks:
//! the time from the kill to the last request sent to `b`, that no
//! request is lost (one that fails before its first byte is retried on
//! the next member), and that `b`'s share ramps back rather than jumping.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use config::{GlobalWeights, Tier};
use global::health::Transition;
use global::pick::Demand;
use global::{Candidate, MemberHealth, ModelLoad, Verdict, pick};

const UNHEALTHY_AFTER: Duration = Duration::from_secs(2);
const RAMP_UP: Duration = Duration::from_secs(60);
const SUMMARY_EVERY: Duration = Duration::from_millis(500);
const REQUEST_EVERY: Duration = Duration::from_millis(10);
const KILLED_AT: Duration = Duration::from_secs(10);
const BACK_AT: Duration = Duration::from_secs(20);

/// Seeded uniform draws in [0, 1) (splitmix64).
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (((z ^ (z >> 31)) >> 11) as f64) / (1u64 << 53) as f64
    }
}

#[test]
fn a_killed_member_stops_getting_requests_within_unhealthy_after_and_ramps_back() {
    let t0 = Instant::now();
    let names = ["a", "b", "c"];
    let load = ModelLoad {
        pool: "p".into(),
        ready_replicas: 4,
        replicas: 4,
        kv_headroom: Some(0.5),
        queue_depth: 0,
        in_flight: 0,
        saturated: false,
        cold: false,
        error_rate: 0.0,
        throttle_rate: 0.0,
    };
    let mut health: Vec<MemberHealth> = names
        .iter()
        .map(|_| MemberHealth::new(t0, UNHEALTHY_AFTER, RAMP_UP, true))
        .collect();
    // Every member's first summary arrives with the router's start: all
    // up at once, none ramping.
    for h in &mut health {
        h.on_summary(t0);
        assert_eq!(h.peek(t0), Verdict::Healthy);
    }
    let b_alive = |t: Duration| t < KILLED_AT || t >= BACK_AT;
    let weights = GlobalWeights::default();
    let demand = Demand {
        residency: None,
        weights: &weights,
        farthest: 0.0,
        max_error_rate: 0.5,
    };
    let mut draws = Draws(42);
    let mut last_sent_to_b_while_dead = None;
    let mut lost = 0;
    let mut retried = 0;
    let mut transitions = Vec::new();
    // Requests each member answered, by whole second of the run.
    let mut answered: BTreeMap<u64, [u32; 3]> = BTreeMap::new();

    let end = BACK_AT + RAMP_UP + Duration::from_secs(10);
    let mut t = Duration::ZERO;
    let mut next_summary = SUMMARY_EVERY;
    while t < end {
        let now = t0 + t;
        if t >= next_summary {
            for (i, h) in health.iter_mut().enumerate() {
                if i != 1 || b_alive(t) {
                    // A member down for its failures is probed (a cheap
                    // request such as GET /v1/models) as often as
                    // summaries come; only a success brings it back.
                    if h.needs_probe()
                        && let Some(tr) = h.on_success(now)
                    {
                        transitions.push((names[i], t, tr));
                    }
                    if let Some(tr) = h.on_summary(now) {
                        transitions.push((names[i], t, tr));
                    }
                }
            }
            next_summary += SUMMARY_EVERY;
        }
        let verdicts: Vec<Verdict> = health
            .iter_mut()
            .enumerate()
            .map(|(i, h)| {
                let (verdict, tr) = h.verdict(now);
                if let Some(tr) = tr {
                    transitions.push((names[i], t, tr));
                }
                verdict
            })
            .collect();
        let candidates: Vec<Candidate<'_>> = names
            .iter()
            .zip(&verdicts)
            .map(|(name, verdict)| Candidate {
                name,
                tier: Tier::Primary,
                residency: &[],
                serves: true,
                verdict: *verdict,
                load: Some(&load),
                in_flight: 0,
                error_rate: 0.0,
                distance: Some(0.0),
                rtt: None,
                cost: None,
            })
            .collect();
        let chosen = pick(&candidates, &demand, || draws.next()).expect("a member");
        // The chosen member, then the others in order: a request that
        // fails before its first byte goes to the next.
        let mut served = false;
        for member in std::iter::once(chosen.index).chain(chosen.next.iter().copied()) {
            if member == 1 && !b_alive(t) {
                last_sent_to_b_while_dead = Some(t);
                if let Some(tr) = health[1].on_failure(now) {
                    transitions.push(("b", t, tr));
                }
                retried += 1;
                continue;
            }
            health[member].on_success(now);
            answered.entry(t.as_secs()).or_default()[member] += 1;
            served = true;
            break;
        }
        if !served {
            lost += 1;
        }
        t += REQUEST_EVERY;
    }

    // Failover: the last request sent to `b` after its death.
    let last = last_sent_to_b_while_dead.expect("b was tried after it died");
    let failover = last - KILLED_AT;
    println!("failover: {failover:?}; {retried} requests retried on the next member, {lost} lost");
    assert!(failover <= UNHEALTHY_AFTER, "failover took {failover:?}");
    assert_eq!(lost, 0);
    assert!(
        transitions.iter().any(|(m, at, tr)| *m == "b"
            && matches!(tr, Transition::WentDown(_))
            && *at <= KILLED_AT + UNHEALTHY_AFTER),
        "{transitions:?}"
    );

    // b's share, second by second: none while dead, a ramp after.
    let share_of_b = |from: Duration, to: Duration| {
        let (mut b, mut all) = (0u32, 0u32);
        for (_, counts) in answered.range(from.as_secs()..to.as_secs()) {
            b += counts[1];
            all += counts.iter().sum::<u32>();
        }
        f64::from(b) / f64::from(all)
    };
    let dead = share_of_b(KILLED_AT + UNHEALTHY_AFTER, BACK_AT);
    let early = share_of_b(BACK_AT, BACK_AT + Duration::from_secs(10));
    let late = share_of_b(BACK_AT + Duration::from_secs(50), BACK_AT + RAMP_UP);
    let after = share_of_b(BACK_AT + RAMP_UP, end);
    let before = share_of_b(Duration::ZERO, KILLED_AT);
    println!(
        "share of b: before {before:.3}, dead {dead:.3}, first 10 s back {early:.3}, last 10 s of the ramp {late:.3}, after {after:.3}"
    );
    assert_eq!(dead, 0.0);
    // Equal members split evenly; back, b rises from a few percent.
    assert!((0.28..0.39).contains(&before), "{before}");
    assert!(early < 0.08, "no herd on return: {early}");
    assert!(
        late > 0.2 && late > 3.0 * early,
        "ramped: {early} -> {late}"
    );
    assert!((0.28..0.39).contains(&after), "{after}");
}
