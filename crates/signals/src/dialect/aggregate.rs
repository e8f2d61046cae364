//! How one engine field is folded from several series (one per engine
//! core, data-parallel rank or model) into a single replica value.
//! Every accumulator stays `None` until it sees a usable value: a family
//! that is absent is unknown, not zero.

/// Sum of a count over series (requests waiting on each data-parallel
/// engine add up to the replica's queue). Negative or non-finite values are
/// ignored as corrupt, and so is a value that would carry the sum to
/// infinity: the sum stays a number, so ratios of sums (used / max blocks)
/// are never `inf / inf`, which is NaN.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Total(Option<f64>);

impl Total {
    pub(super) fn add(&mut self, value: f64) {
        let sum = self.0.unwrap_or(0.0) + value;
        if value >= 0.0 && sum.is_finite() {
            self.0 = Some(sum);
        }
    }

    pub(super) fn add_label(&mut self, label: Option<&str>) {
        if let Some(value) = label.and_then(parse_label_number) {
            self.add(value);
        }
    }

    pub(super) fn count(self) -> Option<u64> {
        self.0.map(|sum| sum.round() as u64)
    }

    pub(super) fn get(self) -> Option<f64> {
        self.0
    }
}

/// Mean of a usage fraction over series. Data-parallel engines of one
/// replica have equal caches, so the mean is the replica's overall usage.
/// Kept within 0..=1 because scorers rely on that range.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Mean {
    sum: f64,
    count: u32,
}

impl Mean {
    pub(super) fn add(&mut self, value: f64) {
        if value.is_finite() {
            self.sum += value.clamp(0.0, 1.0);
            self.count += 1;
        }
    }

    pub(super) fn fraction(self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / f64::from(self.count))
    }
}

/// Largest value over series, for settings every engine shares (block
/// size), so duplicates do not add up.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Largest(Option<f64>);

impl Largest {
    pub(super) fn add(&mut self, value: f64) {
        if value.is_finite() && value >= 0.0 {
            self.0 = Some(self.0.map_or(value, |old| old.max(value)));
        }
    }

    pub(super) fn add_label(&mut self, label: Option<&str>) {
        if let Some(value) = label.and_then(parse_label_number) {
            self.add(value);
        }
    }

    pub(super) fn get(self) -> Option<f64> {
        self.0
    }

    pub(super) fn as_u32(self) -> Option<u32> {
        self.0
            .map(f64::round)
            .filter(|v| *v <= f64::from(u32::MAX))
            .map(|v| v as u32)
    }
}

/// A number carried as a label value, e.g. `num_gpu_blocks="74272"`;
/// `"None"` and other words are unknown.
pub(super) fn parse_label_number(value: &str) -> Option<f64> {
    value.trim().parse::<f64>().ok().filter(|v| v.is_finite())
}

/// `a,b, c` to `["a", "b", "c"]`; an empty string is an empty list.
pub(super) fn split_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `1 - free / capacity`, for engines that report blocks but no fraction.
pub(super) fn usage_from_free(free: Option<f64>, capacity: Option<f64>) -> Option<f64> {
    match (free, capacity) {
        (Some(free), Some(capacity)) if capacity > 0.0 => {
            Some((1.0 - free / capacity).clamp(0.0, 1.0))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_is_unknown_until_a_value_arrives() {
        let mut total = Total::default();
        assert_eq!(total.count(), None);
        total.add(f64::NAN);
        total.add(-1.0);
        assert_eq!(total.count(), None);
        total.add(0.0);
        assert_eq!(total.count(), Some(0));
        total.add(2.0);
        total.add(3.0);
        assert_eq!(total.count(), Some(5));
    }

    #[test]
    fn total_ignores_a_value_that_would_overflow_it() {
        // Found by fuzzing (fuzz/fuzz_targets/prometheus.rs): two `used`
        // and two `max` block counts of 1e308 summed to infinity, and
        // Triton's used / max gave a NaN KV usage.
        let mut total = Total::default();
        total.add(f64::INFINITY);
        assert_eq!(total.get(), None);
        total.add(1e308);
        total.add(1e308);
        assert_eq!(total.get(), Some(1e308));
        assert_eq!(total.count(), Some(u64::MAX));
    }

    #[test]
    fn mean_clamps_and_skips_nan() {
        let mut mean = Mean::default();
        assert_eq!(mean.fraction(), None);
        mean.add(0.2);
        mean.add(f64::NAN);
        mean.add(1.4);
        assert_eq!(mean.fraction(), Some(0.6));
    }

    #[test]
    fn label_numbers_and_lists() {
        assert_eq!(parse_label_number("74272"), Some(74272.0));
        assert_eq!(parse_label_number("16.0"), Some(16.0));
        assert_eq!(parse_label_number("None"), None);
        assert_eq!(parse_label_number("NaN"), None);
        assert_eq!(split_list(""), Vec::<String>::new());
        assert_eq!(split_list("a, b,,c"), ["a", "b", "c"]);
    }

    #[test]
    fn largest_keeps_the_max_and_fits_u32() {
        let mut largest = Largest::default();
        assert_eq!(largest.as_u32(), None);
        largest.add(16.0);
        largest.add(8.0);
        assert_eq!(largest.as_u32(), Some(16));
        largest.add(1e12);
        assert_eq!(largest.as_u32(), None);
    }

    #[test]
    fn usage_from_free_blocks() {
        assert_eq!(usage_from_free(Some(25.0), Some(100.0)), Some(0.75));
        assert_eq!(usage_from_free(Some(1.0), Some(0.0)), None);
        assert_eq!(usage_from_free(None, Some(100.0)), None);
    }
}
