//! The multi-threaded row quantizer: the reference quantizer, rows split across threads.
//! Output is byte-identical to quantizing every row with [`crate::quantize_row_ref`].

use crate::error::PnError;
use crate::quantize::quantize_row_into;
use crate::types::PnType;

/// Quantizes a row-major matrix of `x.len() / k` rows of `k` weights on `threads` threads
/// (0 = all available cores). Errors name the row and group (the first failing row in each
/// thread's range; which thread's error is returned is the one with the lowest row).
pub fn quantize_rows(ty: PnType, x: &[f32], k: usize, threads: usize) -> Result<Vec<u8>, PnError> {
    let bpw = ty.weights_per_block();
    if k == 0 || !k.is_multiple_of(bpw) {
        return Err(PnError::RaggedWeights {
            ty,
            len: k,
            block: bpw,
        });
    }
    if !x.len().is_multiple_of(k) {
        return Err(PnError::LengthMismatch {
            what: "quantize_rows input (a whole number of rows)",
            expected: x.len() / k * k,
            got: x.len(),
        });
    }
    let rows = x.len() / k;
    let rb = ty.row_bytes(k).unwrap_or(0);
    let mut out = vec![0u8; rows * rb];
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .clamp(1, rows.max(1));
    let rows_per = rows.div_ceil(threads).max(1);
    let results: Vec<Result<(), PnError>> = std::thread::scope(|s| {
        let handles: Vec<_> = out
            .chunks_mut(rows_per * rb)
            .zip(x.chunks(rows_per * k))
            .enumerate()
            .map(|(t, (dst, src))| {
                s.spawn(move || {
                    for (r, (d, w)) in dst
                        .chunks_exact_mut(rb)
                        .zip(src.chunks_exact(k))
                        .enumerate()
                    {
                        quantize_row_into(ty, w, d).map_err(|e| e.in_row(t * rows_per + r))?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    results.into_iter().collect::<Result<(), _>>()?;
    Ok(out)
}
