//! The golden set. Each module turns one feature's outputs into snapshot fields; [`all`] lists
//! every case with its backend and tolerance (documented in `xtask/golden/README.md`).

mod engine;
mod format;
mod model;
mod stock;
mod text;

use super::case::{Backend, Case, CaseError, Ctx, Run, Tolerance};
use pn_format::PnType;
use pn_runtime::Device;

pub use model::ORACLE_TOL;

/// SplitMix64 plus Box-Muller: fixed here forever, so inputs never move with a dependency.
pub struct Rng(pub u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `n` normal values of standard deviation `sigma`.
    pub fn normals(&mut self, n: usize, sigma: f64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u1 = self.uniform().max(1e-300);
                let u2 = self.uniform();
                ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * sigma) as f32
            })
            .collect()
    }
}

/// Why no CUDA case can run here, or None when a device with kernels is present.
pub fn cuda_unavailable() -> Option<String> {
    if !pn_kernels::kernels_available() {
        return Some(format!(
            "no CUDA kernels in this build ({})",
            pn_kernels::build_info()
        ));
    }
    pn_kernels::gpu_or_reason(0).err()
}

fn case(
    name: &'static str,
    backend: Backend,
    tolerance: Tolerance,
    run: impl Fn(&Ctx) -> Result<Run, CaseError> + 'static,
) -> Case {
    Case {
        name,
        backend,
        tolerance,
        run: Box::new(run),
    }
}

/// Every golden case, in table order.
pub fn all() -> Vec<Case> {
    use Backend::{Cpu, Cuda};
    vec![
        case("format/pn3t-vectors", Cpu, Tolerance::Exact, |_| {
            format::run(PnType::Pn3t)
        }),
        case("format/pn4t-vectors", Cpu, Tolerance::Exact, |_| {
            format::run(PnType::Pn4t)
        }),
        case("gguf/stock-decoders", Cpu, Tolerance::Exact, stock::run),
        case(
            "text/tokenizer-qwen35",
            Cpu,
            Tolerance::Exact,
            text::tokenizer,
        ),
        case(
            "text/chat-template",
            Cpu,
            Tolerance::Exact,
            text::chat_template,
        ),
        case(
            "tiny/logits-f16",
            Cpu,
            Tolerance::Abs(2e-5),
            model::tiny_f16,
        ),
        case(
            "tiny/logits-f16",
            Cuda,
            Tolerance::Abs(ORACLE_TOL as f64),
            |c| match cuda_unavailable() {
                Some(reason) => Ok(Run::Skipped(reason)),
                None => model::tiny_f16_engine(c, Device::Cuda(0)),
            },
        ),
        case(
            "tiny/pn3-quantized",
            Cpu,
            // Prompt rows take decode's int16 activations (AMX tiles or the fused kernels):
            // 4.5e-4 from the snapshot's f32-precision prefill, machine-dependent in f32 order.
            Tolerance::Abs(2e-3),
            model::tiny_pn3,
        ),
        case("demo/transcripts", Cpu, Tolerance::Exact, |c| {
            engine::demo(c, Device::Cpu)
        }),
        case(
            "demo/transcripts",
            Cuda,
            Tolerance::Exact,
            |c| match cuda_unavailable() {
                Some(reason) => Ok(Run::Skipped(reason)),
                None => engine::demo(c, Device::Cuda(0)),
            },
        ),
    ]
}
