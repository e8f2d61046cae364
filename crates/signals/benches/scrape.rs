//! CPU cost of turning one `/metrics` body into an `EngineState`: parsing
//! and extracting each real vLLM capture, plus the SGLang documentation
//! example (the largest fixture, mostly histogram lines the dialect skips).
//! Also the parser alone, asking for every sample and for none, to show
//! what materializing samples costs.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use signals::Dialect;
use signals::prom::{self, Metric, Sample, Visitor};

const FIXTURES: &[(&str, Dialect)] = &[
    ("vllm-v1-llmd-none.prom", Dialect::Vllm),
    ("vllm-v1-llmd-flag.prom", Dialect::Vllm),
    ("vllm-v1-llmd-conn.prom", Dialect::Vllm),
    ("sglang-docs-legacy.prom", Dialect::Sglang),
];

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/metrics")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()))
}

/// Counts samples, wanting all of them or none.
struct Count {
    want: bool,
    seen: usize,
}

impl<'a> Visitor<'a> for Count {
    fn wants(&mut self, _: &Metric<'a>) -> bool {
        self.want
    }
    fn sample(&mut self, sample: Sample<'a>) {
        black_box(sample);
        self.seen += 1;
    }
}

fn extract(c: &mut Criterion) {
    let mut group = c.benchmark_group("extract");
    for (name, dialect) in FIXTURES {
        let text = fixture(name);
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(*name, |b| {
            b.iter(|| dialect.extract(black_box(&text)).unwrap())
        });
    }
    group.finish();
}

fn parse_only(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse");
    let text = fixture("vllm-v1-llmd-flag.prom");
    group.throughput(Throughput::Bytes(text.len() as u64));
    for (label, want) in [("every-sample", true), ("no-sample", false)] {
        group.bench_function(label, |b| {
            b.iter(|| {
                let mut count = Count { want, seen: 0 };
                prom::parse(black_box(&text), &mut count).unwrap();
                count.seen
            })
        });
    }
    group.finish();
}

criterion_group!(benches, extract, parse_only);
criterion_main!(benches);
