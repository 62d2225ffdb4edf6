//! `prompt_precision.rs` on an AVX2-only host (Haswell and Broadwell Xeons: the usual P100
//! hosts): this test binary caps the instruction set with `PN_ISA=avx2` before anything reads
//! it (a process of its own, one test), so state-only prompt rows take the AVX2 int8 tile
//! kernel (`vpmaddubsw`) and the logits rows the AVX2 fused int16 kernels, as on such a host.
//! Skipped on a CPU without AVX2.

use pn_format::dot::{int8_kernel, tiles_available, TileKernel};
use pn_format::Isa;
use qwen_model::CpuBackend;

mod int8_prompt;

#[test]
fn avx2_int8_prompt_rows_stay_within_the_quantization_error() {
    // The only test of this process, before any ISA is detected (cached from then on).
    std::env::set_var(pn_format::ISA_ENV, "avx2");
    if !Isa::Avx2.is_available() {
        eprintln!("skipped: this CPU has no AVX2");
        return;
    }
    assert_eq!(Isa::detect(), Isa::Avx2);
    assert!(!tiles_available(), "no int16 tile kernel at AVX2");
    assert_eq!(int8_kernel(), TileKernel::Avx2);
    assert!(CpuBackend::state_rows_int8());
    int8_prompt::check();
}
