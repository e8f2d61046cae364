//! A small writer for the Prometheus text exposition format (0.0.4), with the
//! per-exporter quirks (number spelling, histogram line order) as parameters.

use super::format::{escape_label_value, write_labels};
use super::histogram::Histogram;

/// The order in which an exporter writes a histogram's lines.
#[derive(Debug, Clone, Copy)]
pub(super) enum HistogramOrder {
    /// `_bucket`…, `_count`, `_sum` (vLLM captures, Rust exporters).
    BucketsCountSum,
    /// `_sum`, `_bucket`…, `_count` (SGLang, prometheus_client multiprocess).
    SumBucketsCount,
    /// `_bucket`…, `_sum`, `_count` (metrics-exporter-prometheus).
    BucketsSumCount,
}

pub(super) struct TextWriter {
    out: String,
    number: fn(f64) -> String,
}

impl TextWriter {
    /// A writer spelling numbers with `number` (see `format`).
    pub(super) fn new(number: fn(f64) -> String) -> Self {
        Self {
            out: String::with_capacity(16 * 1024),
            number,
        }
    }

    pub(super) fn finish(self) -> String {
        self.out
    }

    /// `# HELP` and `# TYPE` lines.
    pub(super) fn header(&mut self, name: &str, help: &str, kind: &str) {
        self.help(name, help);
        self.type_line(name, kind);
    }

    pub(super) fn help(&mut self, name: &str, help: &str) {
        self.out.push_str("# HELP ");
        self.out.push_str(name);
        self.out.push(' ');
        // HELP text escapes only backslash and newline.
        for c in help.chars() {
            match c {
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                c => self.out.push(c),
            }
        }
        self.out.push('\n');
    }

    pub(super) fn type_line(&mut self, name: &str, kind: &str) {
        self.out.push_str("# TYPE ");
        self.out.push_str(name);
        self.out.push(' ');
        self.out.push_str(kind);
        self.out.push('\n');
    }

    pub(super) fn blank_line(&mut self) {
        self.out.push('\n');
    }

    /// One sample line: `name{labels} value`.
    pub(super) fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let value = (self.number)(value);
        self.raw_sample(name, labels, &value);
    }

    /// One sample line with an already spelled value (integer counters).
    pub(super) fn raw_sample(&mut self, name: &str, labels: &[(&str, &str)], value: &str) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels);
        self.out.push(' ');
        self.out.push_str(value);
        self.out.push('\n');
    }

    /// A histogram's sample lines. `labels` must be sorted by key if the
    /// exporter sorts them: `le` is inserted at its sorted position.
    pub(super) fn histogram(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        histogram: &Histogram,
        order: HistogramOrder,
        le_number: fn(f64) -> String,
    ) {
        let count = histogram.count() as f64;
        match order {
            HistogramOrder::BucketsCountSum => {
                self.buckets(name, labels, histogram, le_number);
                self.sample(&format!("{name}_count"), labels, count);
                self.sample(&format!("{name}_sum"), labels, histogram.sum());
            }
            HistogramOrder::SumBucketsCount => {
                self.sample(&format!("{name}_sum"), labels, histogram.sum());
                self.buckets(name, labels, histogram, le_number);
                self.sample(&format!("{name}_count"), labels, count);
            }
            HistogramOrder::BucketsSumCount => {
                self.buckets(name, labels, histogram, le_number);
                self.sample(&format!("{name}_sum"), labels, histogram.sum());
                self.sample(&format!("{name}_count"), labels, count);
            }
        }
    }

    fn buckets(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        histogram: &Histogram,
        le_number: fn(f64) -> String,
    ) {
        let le_at = labels.partition_point(|(key, _)| *key < "le");
        for (bound, cumulative) in histogram.cumulative() {
            self.out.push_str(name);
            self.out.push_str("_bucket{");
            let le = le_number(bound);
            let with_le = labels[..le_at]
                .iter()
                .copied()
                .chain(std::iter::once(("le", le.as_str())))
                .chain(labels[le_at..].iter().copied());
            for (i, (key, value)) in with_le.enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                self.out.push_str(key);
                self.out.push_str("=\"");
                escape_label_value(value, &mut self.out);
                self.out.push('"');
            }
            self.out.push_str("} ");
            let value = (self.number)(cumulative as f64);
            self.out.push_str(&value);
            self.out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::format::prometheus_client;
    use super::*;

    #[test]
    fn le_is_placed_in_sorted_label_order() {
        let mut h = Histogram::new([0.5]);
        h.observe(0.25);
        let mut w = TextWriter::new(prometheus_client);
        w.histogram(
            "x",
            &[("engine", "0"), ("model_name", "m")],
            &h,
            HistogramOrder::BucketsCountSum,
            prometheus_client,
        );
        assert_eq!(
            w.finish(),
            "x_bucket{engine=\"0\",le=\"0.5\",model_name=\"m\"} 1.0\n\
             x_bucket{engine=\"0\",le=\"+Inf\",model_name=\"m\"} 1.0\n\
             x_count{engine=\"0\",model_name=\"m\"} 1.0\n\
             x_sum{engine=\"0\",model_name=\"m\"} 0.25\n"
        );
    }

    #[test]
    fn histogram_orders_follow_the_exporter() {
        let h = Histogram::new([1.0]);
        let names = |order| {
            let mut w = TextWriter::new(prometheus_client);
            w.histogram("h", &[], &h, order, prometheus_client);
            w.finish()
                .lines()
                .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(HistogramOrder::SumBucketsCount),
            ["h_sum", "h_bucket", "h_bucket", "h_count"]
        );
        assert_eq!(
            names(HistogramOrder::BucketsSumCount),
            ["h_bucket", "h_bucket", "h_sum", "h_count"]
        );
    }

    #[test]
    fn help_text_is_escaped() {
        let mut w = TextWriter::new(prometheus_client);
        w.header("m", "a\\b\nc", "gauge");
        assert_eq!(w.finish(), "# HELP m a\\\\b\\nc\n# TYPE m gauge\n");
    }
}
