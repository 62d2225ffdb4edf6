//! The blockwise Hadamard transform on the 27B activation widths, next to a plain read of the
//! same bytes (the vector is cache-resident, so the baseline is cache read bandwidth).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pn_format::hadamard::fwht_blocks_inplace_with;
use pn_format::Isa;
use std::hint::black_box;
use std::time::Duration;

fn read_sum(x: &[f32]) -> u64 {
    let mut acc = [0u64; 8];
    for c in x.chunks_exact(16) {
        for (a, p) in acc.iter_mut().zip(c.chunks_exact(2)) {
            *a = a.wrapping_add(u64::from(p[0].to_bits()) | u64::from(p[1].to_bits()) << 32);
        }
    }
    acc.iter().fold(0, |s, a| s.wrapping_add(*a))
}

fn hadamard(c: &mut Criterion) {
    for n in [5120usize, 6144, 17408] {
        let mut x: Vec<f32> = (0..n)
            .map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5)
            .collect();
        let mut g = c.benchmark_group(format!("hadamard_{n}"));
        g.throughput(Throughput::Bytes((n * 4) as u64));
        g.bench_function("read_baseline", |b| {
            b.iter(|| black_box(read_sum(black_box(&x))))
        });
        for r in [256usize, 1024] {
            for isa in [Isa::detect(), Isa::Avx2, Isa::Scalar] {
                if !isa.is_available() || (isa == Isa::Avx2 && Isa::detect() == Isa::Avx2) {
                    continue;
                }
                g.bench_function(
                    BenchmarkId::new(format!("fwht_r{r}"), format!("{isa:?}")),
                    |b| b.iter(|| fwht_blocks_inplace_with(isa, black_box(&mut x), r).unwrap()),
                );
            }
        }
        g.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
}

criterion_group! { name = benches; config = config(); targets = hadamard }
criterion_main!(benches);
