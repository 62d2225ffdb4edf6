//! Prompt rows whose logits nobody reads only feed the state (`Backend::set_state_rows`); on
//! CPUs without AMX (AVX-512 VNNI or AVX2 tile kernels) they take int8 activations
//! (`pn_format::dot::default_tile_precision`) instead of decode's int16. What that costs in
//! accuracy, on the trained demo model (PN3) and 128 held-out validation tokens: the logits
//! after a prompt fed with only the last row's logits asked for (every earlier row int8 where
//! available) against the same prompt with every row's logits asked for (every row int16), and
//! both against transformers' f32 logits of the unquantized model.
//!
//! Where int8 is not the tile precision (AMX, other architectures) both runs take the same
//! kernels and the comparison is exact up to f32 order. `prompt_precision_avx2.rs` runs the
//! same check on the AVX2 kernels.

mod int8_prompt;

#[test]
fn int8_prompt_rows_stay_within_the_quantization_error() {
    int8_prompt::check();
}
