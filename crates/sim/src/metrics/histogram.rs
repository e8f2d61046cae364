//! A fixed-bucket histogram, the Prometheus kind (cumulative `le` buckets).

/// Counts observations into buckets with fixed upper bounds, plus `+Inf`.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: Vec<f64>,
    /// Observations per bucket (not cumulative); the last entry is `+Inf`.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// A histogram with these upper bounds, which must be increasing.
    pub fn new(bounds: impl Into<Vec<f64>>) -> Self {
        let bounds = bounds.into();
        debug_assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "bounds must increase"
        );
        let counts = vec![0; bounds.len() + 1];
        Self {
            bounds,
            counts,
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        // Prometheus buckets are inclusive upper bounds (`le`).
        let bucket = self.bounds.partition_point(|&bound| bound < value);
        self.counts[bucket] += 1;
        self.sum += value;
        self.count += 1;
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }

    /// `(upper bound, cumulative count)` per bucket, ending with `+Inf`.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let bounds = self
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY));
        bounds.zip(self.counts.iter().scan(0, |total, &n| {
            *total += n;
            Some(*total)
        }))
    }
}

/// vLLM's `build_1_2_5_buckets`: 1, 2, 5, 10, 20, 50, ... up to `max_value`.
pub fn one_two_five_buckets(max_value: u64) -> Vec<f64> {
    let mut buckets = Vec::new();
    let mut scale = 1u64;
    loop {
        for mantissa in [1, 2, 5] {
            let value = mantissa * scale;
            if value > max_value {
                return buckets;
            }
            buckets.push(value as f64);
        }
        scale *= 10;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_inclusive_and_cumulative() {
        let mut h = Histogram::new([0.1, 1.0]);
        for v in [0.05, 0.1, 0.5, 1.0, 7.0] {
            h.observe(v);
        }
        let buckets: Vec<_> = h.cumulative().collect();
        assert_eq!(buckets, [(0.1, 2), (1.0, 4), (f64::INFINITY, 5)]);
        assert_eq!(h.count(), 5);
        assert!((h.sum() - 8.65).abs() < 1e-12);
        assert!((h.mean().unwrap() - 1.73).abs() < 1e-12);
        assert_eq!(Histogram::new([1.0]).mean(), None);
    }

    #[test]
    fn one_two_five_buckets_follow_vllm() {
        assert_eq!(
            one_two_five_buckets(100),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        assert_eq!(one_two_five_buckets(131_072).last(), Some(&100_000.0));
    }
}
