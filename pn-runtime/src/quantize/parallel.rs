//! Encoding the rows of one tensor on several threads.
//!
//! Rows are split into one contiguous range per thread; each thread writes its own disjoint slice
//! of the output, so the bytes do not depend on the thread count.

use super::codec::{decode_row, ErrStats, RowEncoder};
use super::error::QuantizeError;
use gguf_io::GgmlType;
use std::sync::atomic::{AtomicBool, Ordering};

/// The input side of one tensor.
pub struct InputRows<'a> {
    /// The tensor's raw bytes.
    pub bytes: &'a [u8],
    /// Its type.
    pub ty: GgmlType,
    /// Bytes per input row.
    pub row_bytes: usize,
    /// Number of rows.
    pub rows: usize,
}

/// What to measure and keep while encoding.
pub struct EncodeJob<'a> {
    /// Keep the encoded bytes (false for the ranking pass, which only needs the error).
    pub keep_output: bool,
    /// Also measure the PN error without rotation (for `--report`).
    pub unrotated: bool,
    /// Column importances to weight the error with.
    pub importance: Option<&'a [f32]>,
    /// Worker threads.
    pub threads: usize,
    /// Set from outside (Ctrl-C) to stop early.
    pub cancel: &'a AtomicBool,
    /// Called with the number of input bytes finished, from worker threads.
    pub advance: &'a (dyn Fn(u64) + Sync),
}

/// Encodes every row; returns the output bytes (empty unless `keep_output`) and error sums.
pub fn encode_tensor(
    input: &InputRows<'_>,
    enc: &RowEncoder,
    job: &EncodeJob<'_>,
) -> Result<(Vec<u8>, ErrStats), QuantizeError> {
    let orb = enc.out_row_bytes();
    let rows = input.rows;
    let mut out = if job.keep_output {
        vec![0u8; rows * orb]
    } else {
        Vec::new()
    };
    let threads = job.threads.clamp(1, rows.max(1));
    let per = rows.div_ceil(threads).max(1);
    let total = std::thread::scope(|s| {
        let mut handles = Vec::new();
        let mut rest: &mut [u8] = &mut out;
        let mut start = 0;
        while start < rows {
            let end = (start + per).min(rows);
            let chunk: &mut [u8] = if job.keep_output {
                let (a, b) = std::mem::take(&mut rest).split_at_mut((end - start) * orb);
                rest = b;
                a
            } else {
                &mut []
            };
            handles.push(s.spawn(move || encode_range(input, enc, job, start, end, chunk)));
            start = end;
        }
        join_stats(handles, &enc.tensor)
    })?;
    Ok((out, total))
}

/// Joins the workers encoding tensor `tensor` and sums their error statistics (the first
/// error wins; a panicked worker is an error naming the tensor).
pub(super) fn join_stats(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<ErrStats, QuantizeError>>>,
    tensor: &str,
) -> Result<ErrStats, QuantizeError> {
    let mut total = ErrStats::default();
    for h in handles {
        let stats = h.join().unwrap_or_else(|_| {
            Err(QuantizeError::Codec {
                tensor: tensor.to_string(),
                msg: "worker thread panicked".into(),
            })
        })?;
        total.add(&stats);
    }
    Ok(total)
}

fn encode_range(
    input: &InputRows<'_>,
    enc: &RowEncoder,
    job: &EncodeJob<'_>,
    start: usize,
    end: usize,
    chunk: &mut [u8],
) -> Result<ErrStats, QuantizeError> {
    let orb = enc.out_row_bytes();
    let mut w = vec![0f32; enc.k];
    let mut scratch = vec![0u8; if job.keep_output { 0 } else { orb }];
    let mut stats = ErrStats::default();
    let mut pending = 0u64;
    for r in start..end {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(QuantizeError::Interrupted);
        }
        let src = &input.bytes[r * input.row_bytes..(r + 1) * input.row_bytes];
        decode_row(&enc.tensor, r as u64, input.ty, src, &mut w)?;
        let dst: &mut [u8] = if job.keep_output {
            &mut chunk[(r - start) * orb..(r - start + 1) * orb]
        } else {
            &mut scratch
        };
        enc.encode(
            r as u64,
            &mut w,
            dst,
            Some(&mut stats),
            job.unrotated,
            job.importance,
        )?;
        pending += input.row_bytes as u64;
        if pending >= 1 << 20 {
            (job.advance)(pending);
            pending = 0;
        }
    }
    (job.advance)(pending);
    Ok(stats)
}
