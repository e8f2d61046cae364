//! The generic cell rate algorithm over several limits at once, all or
//! nothing. Each limit keeps one number, its theoretical arrival time
//! (TAT): the moment its bucket would be full again. A cost of `n` moves
//! the TAT `n × interval` later, where `interval = period / limit`; the
//! cost fits while the TAT stays within one `period` of now. So a limit
//! of 60,000 tokens per minute lets 60,000 through at once, then refills
//! at 1,000 a second: no window edges to burst across, and the exact
//! moment there is room again is known (`Retry-After`).
//!
//! The Redis backend runs the same steps in a Lua script (`redis.rs`);
//! `tests` in that module hold both to the same answers.

/// Overshoot ignored, in milliseconds: `(now + x) - now` is not exactly
/// `x` in floating point, and a cost that exactly fits must not be refused
/// "for 1 ms" by a rounding error.
pub const SLACK_MS: f64 = 0.01;

/// One limit as the algorithm sees it. Times in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    /// `period / limit`: how much later one unit moves the TAT.
    pub interval: f64,
    /// The period: how far ahead of now the TAT may run.
    pub tolerance: f64,
}

/// What one limit says of a charge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Units left after the charge (or now, when refused).
    pub remaining: u64,
    /// Until the bucket is full again.
    pub reset_ms: f64,
    /// Until this cost would fit; 0 when it fits now, infinite when it
    /// never can (it is larger than the whole limit).
    pub retry_ms: f64,
}

/// Charge `costs[i]` to every cell whose TAT is `tats[i]` (`None`: never
/// charged, or long expired), at `now`. Returns the new TATs when every
/// cost fits, else `None`, and each cell's verdict either way.
pub fn charge(
    cells: &[Cell],
    tats: &[Option<f64>],
    costs: &[f64],
    now: f64,
) -> (Option<Vec<f64>>, Vec<Verdict>) {
    let mut fits = true;
    let mut new_tats = Vec::with_capacity(cells.len());
    let mut verdicts = Vec::with_capacity(cells.len());
    for ((cell, tat), cost) in cells.iter().zip(tats).zip(costs) {
        let tat = tat.unwrap_or(now).max(now);
        let increment = cost * cell.interval;
        let new_tat = tat + increment;
        let over = new_tat - now - cell.tolerance;
        if increment > cell.tolerance + SLACK_MS {
            fits = false;
            verdicts.push(Verdict {
                remaining: remaining(cell, tat - now),
                reset_ms: tat - now,
                retry_ms: f64::INFINITY,
            });
        } else if over > SLACK_MS {
            fits = false;
            verdicts.push(Verdict {
                remaining: remaining(cell, tat - now),
                reset_ms: tat - now,
                retry_ms: over,
            });
        } else {
            verdicts.push(Verdict {
                remaining: remaining(cell, new_tat - now),
                reset_ms: new_tat - now,
                retry_ms: 0.0,
            });
        }
        new_tats.push(new_tat);
    }
    (fits.then_some(new_tats), verdicts)
}

/// A cell's TAT after `delta` units are added (a request used more than
/// it reserved) or taken back (less, or it never ran). Taking back never
/// fills a bucket beyond full.
pub fn adjust(cell: &Cell, tat: Option<f64>, delta: f64, now: f64) -> f64 {
    let tat = tat.unwrap_or(now);
    if delta >= 0.0 {
        tat.max(now) + delta * cell.interval
    } else {
        (tat + delta * cell.interval).max(now)
    }
}

/// Whole units that still fit when the TAT is `ahead` ms past now.
fn remaining(cell: &Cell, ahead: f64) -> u64 {
    ((cell.tolerance - ahead.max(0.0)) / cell.interval)
        .floor()
        .max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 per second.
    const CELL: Cell = Cell {
        interval: 100.0,
        tolerance: 1000.0,
    };

    #[test]
    fn a_full_limit_passes_at_once_then_refills_evenly() {
        let mut tat = None;
        for i in 0..10 {
            let (ok, v) = charge(&[CELL], &[tat], &[1.0], 0.0);
            tat = Some(ok.expect("within the limit")[0]);
            assert_eq!(v[0].remaining, 9 - i);
        }
        let (ok, v) = charge(&[CELL], &[tat], &[1.0], 0.0);
        assert!(ok.is_none());
        assert_eq!(v[0].retry_ms, 100.0);
        assert_eq!(v[0].reset_ms, 1000.0);
        // One interval later, exactly one more fits.
        let (ok, _) = charge(&[CELL], &[tat], &[1.0], 100.0);
        assert!(ok.is_some());
    }

    #[test]
    fn a_cost_that_exactly_fits_is_not_refused_by_rounding() {
        // At this `now`, (now + 1000) - now is not exactly 1000.
        let now = 130_201.535_346_479_37;
        assert!((now + 1000.0) - now > 1000.0);
        let one_a_second = Cell {
            interval: 1000.0,
            tolerance: 1000.0,
        };
        let (ok, _) = charge(&[one_a_second], &[None], &[1.0], now);
        assert!(ok.is_some());
    }

    #[test]
    fn all_or_nothing_across_cells() {
        let roomy = Cell {
            interval: 1.0,
            tolerance: 1000.0,
        };
        let (ok, v) = charge(&[roomy, CELL], &[None, Some(1000.0)], &[1.0, 1.0], 0.0);
        assert!(ok.is_none(), "the full cell refuses for both");
        assert_eq!(v[0].retry_ms, 0.0);
        assert_eq!(v[1].retry_ms, 100.0);
    }

    #[test]
    fn a_cost_larger_than_the_limit_never_fits() {
        let (ok, v) = charge(&[CELL], &[None], &[11.0], 0.0);
        assert!(ok.is_none());
        assert!(v[0].retry_ms.is_infinite());
        assert_eq!(v[0].remaining, 10);
    }

    #[test]
    fn settling_moves_the_tat_both_ways_but_never_past_full() {
        // Reserved 5, used 2: three come back.
        assert_eq!(adjust(&CELL, Some(500.0), -3.0, 0.0), 200.0);
        // Used 4 more than reserved.
        assert_eq!(adjust(&CELL, Some(500.0), 4.0, 0.0), 900.0);
        // A refund on a bucket that refilled meanwhile does not overfill it.
        assert_eq!(adjust(&CELL, Some(500.0), -10.0, 300.0), 300.0);
        assert_eq!(adjust(&CELL, None, 2.0, 50.0), 250.0);
    }
}
