//! The CPU matmul: each output's rows split across the pool, with the per-type dot products
//! (fused multi-row kernels for a few input rows, weight rows decoded once for many, PN rows
//! against activations prepared once per call). On a CPU with AMX or AVX-512 VNNI, PN rows for
//! many input rows go through the tiled product (`pn_format::dot::matmul_tiled`: 16 x 16 AMX
//! tiles, or 16 inputs in the lanes of a VNNI vector) instead of the fused kernels, on int16
//! activations (AMX: decode's numerics) or int8 ones (VNNI without AMX:
//! `pn_format::dot::default_tile_precision`); on AVX2 CPUs the rows that only feed the state
//! take the AVX2 int8 tiles, the others the fused kernels.

use super::weight::RowKind;
use super::{block_dot, kernels, split_range, CpuBackend, CpuWeight, SyncPtr};
use crate::error::ModelError;
use pn_format::dot::tiled_pass_rows;
use pn_format::dot::{PreparedI16, TileActs, TilePrecision};
use pn_format::PnType;
use std::sync::Mutex;

/// Input rows at or above which a quantized matrix row is decoded to f32 once and reused for
/// every input row (PN rows with AMX or AVX-512 VNNI: multiplied in tiles instead). Below it,
/// the fused multi-vector dot products (`pn_format::dot::matvec_multi`,
/// `gguf_io::quants::vec_dot_f32_multi`) unpack each weight block once for all input rows, so a
/// pass for a few tokens (MTP verification of 2..5 rows, small batches) streams the weights once.
pub(super) const DECODE_ROWS_MIN: usize = 9;

/// Input rows one fused multi-vector call takes (the kernels' register budget).
const MULTI_ROWS: usize = 8;

/// Weight bytes of one row tile of a PN matrix when the fused path takes more than
/// [`MULTI_ROWS`] input rows (a raised `set_decode_rows_min`): every group of input rows passes
/// over the same tile, so it must stay in the 2..4 MiB L2 of one core.
const PN_TILE_BYTES: usize = 1 << 20;

/// The activation precisions of the tiled paths, in the order of [`CpuBackend::pn_row_sets`]
/// (after the fused one).
const TILE_PRECISIONS: [TilePrecision; 2] = [TilePrecision::I16, TilePrecision::I8];

fn pn_index(ty: PnType) -> usize {
    match ty {
        PnType::Pn3t => 0,
        PnType::Pn4t => 1,
    }
}

fn first_error(slot: &Mutex<Option<ModelError>>, e: ModelError) {
    let mut s = slot.lock().unwrap_or_else(|e| e.into_inner());
    if s.is_none() {
        *s = Some(e);
    }
}

impl CpuBackend {
    /// The input rows of a product of `rows` rows that PN weights take on each path: `[fused
    /// kernels, int16 tiles, int8 tiles]` (ascending), written into `sets`. The fused kernels
    /// take decode's grid ([`pn_format::dot::decode_precision`]); where that is int8, rows that
    /// would take int16 tiles take int8 ones. Rows that only feed the
    /// sequences' states ([`Backend::set_state_rows`]) take int8 tiles where that is the tile
    /// precision ([`CpuBackend::state_rows_int8`]), however few; the others take int16 tiles from
    /// [`TILED_ROWS_MIN`](pn_format::dot::TILED_ROWS_MIN) rows (and the decode-once threshold)
    /// where the CPU has a tile kernel, else the fused kernels. So a row's precision follows
    /// its own role, not the rows it shares a pass with.
    ///
    /// [`Backend::set_state_rows`]: crate::Backend::set_state_rows
    fn pn_row_sets(&self, rows: usize, sets: &mut [Vec<usize>; 3]) {
        let tiles = pn_format::dot::tiles_available();
        sets.iter_mut().for_each(Vec::clear);
        let [int16, int16_tiles, int8] = sets;
        super::STATE_ROWS.with(|s| {
            let (id, state_rows) = &*s.borrow();
            let declared = *id == self.id && state_rows.len() == rows;
            if declared && Self::state_rows_int8() {
                for (t, &state_only) in state_rows.iter().enumerate() {
                    if state_only { &mut *int8 } else { &mut *int16 }.push(t);
                }
            } else {
                int16.extend(0..rows);
            }
        });
        let n = int16.len();
        if tiles && n >= self.decode_rows_min && n >= pn_format::dot::TILED_ROWS_MIN {
            if pn_format::dot::decode_precision() == TilePrecision::I8 && Self::state_rows_int8() {
                // Rows whose outputs are read take decode's int8 grid here too.
                int8.append(int16);
                int8.sort_unstable();
            } else {
                // The buffers trade places (capacities included): nothing is allocated once
                // both have grown.
                std::mem::swap(int16, int16_tiles);
            }
        }
    }

    /// [`Backend::matmul`](crate::Backend::matmul) on the CPU: for each `(w, y)`, `y[t] = w
    /// x[t]` for the first `rows` rows of `x`.
    pub(super) fn matmul_outputs(
        &self,
        x: &[f32],
        rows: usize,
        outs: &mut [(&CpuWeight, &mut Vec<f32>)],
    ) -> Result<(), ModelError> {
        for (w, y) in outs.iter() {
            if x.len() < rows * w.cols || y.len() < rows * w.rows {
                return Err(ModelError::BadArgument(format!(
                    "matmul `{}`: buffers too small for {rows} rows",
                    w.name()
                )));
            }
        }
        let err = Mutex::new(None);
        let n_threads = self.pool.n_threads();
        // Outputs as raw pointers: each thread writes a disjoint range of every output's rows.
        let mut targets = [(None::<&CpuWeight>, SyncPtr(std::ptr::null_mut())); 8];
        if outs.len() > targets.len() {
            for (w, y) in outs.iter_mut() {
                self.matmul_outputs(x, rows, &mut [(*w, &mut **y)])?;
            }
            return Ok(());
        }
        for (slot, (w, y)) in targets.iter_mut().zip(outs.iter_mut()) {
            *slot = (Some(*w), SyncPtr(y.as_mut_ptr()));
        }
        let targets = &targets[..outs.len()];
        let direct = rows < self.decode_rows_min;
        let has_pn = outs.iter().any(|(w, _)| matches!(w.kind, RowKind::Pn(_)));
        // PN input rows per path, `[fused int16, int16 tiles, int8 tiles]` (see
        // `pn_row_sets`); the other types take every row on one path.
        let mut pn_sets = self.pn_row_sets.lock().unwrap_or_else(|e| e.into_inner());
        if has_pn {
            self.pn_row_sets(rows, &mut pn_sets);
        } else {
            pn_sets.iter_mut().for_each(Vec::clear);
        }
        // PN rows multiply activations prepared once per input row (shared by all outputs).
        let mut pn_guard = None;
        let mut small_guard = None;
        let mut tile_guard = None;
        let fused = &pn_sets[0];
        if !fused.is_empty() {
            let mut g = self.pn_acts.lock().unwrap_or_else(|e| e.into_inner());
            for ty in PnType::ALL {
                let Some((w, _)) = outs.iter().find(|(w, _)| w.kind == RowKind::Pn(ty)) else {
                    continue;
                };
                let k = w.cols;
                let set = &mut g[pn_index(ty)];
                for (i, &t) in fused.iter().enumerate() {
                    let xt = &x[t * k..(t + 1) * k];
                    let r = if i < set.len() {
                        set[i].update(xt)
                    } else {
                        PreparedI16::with_precision(ty, pn_format::dot::decode_precision(), xt)
                            .map(|p| set.push(p))
                    };
                    r.map_err(|e| {
                        ModelError::BadArgument(format!("preparing PN activations: {e}"))
                    })?;
                }
            }
            if (2..=pn_format::dot::SMALL_MAX_ROWS).contains(&fused.len()) {
                // Arranged once per call for every thread's chunks.
                let mut sg = self.pn_small.lock().unwrap_or_else(|e| e.into_inner());
                for ty in PnType::ALL {
                    if small_rows_tiled(ty) && outs.iter().any(|(w, _)| w.kind == RowKind::Pn(ty)) {
                        sg[pn_index(ty)]
                            .update(&g[pn_index(ty)][..fused.len()])
                            .map_err(|e| {
                                ModelError::BadArgument(format!(
                                    "preparing PN activation tiles: {e}"
                                ))
                            })?;
                    }
                }
                small_guard = Some(sg);
            }
            pn_guard = Some(g);
        }
        if pn_sets[1..].iter().any(|s| !s.is_empty()) {
            let mut g = self.pn_tiles.lock().unwrap_or_else(|e| e.into_inner());
            // Every output shares the input rows (`[rows, cols]`); a subset's rows are copied
            // together once (`[set rows, cols]`) for every PN type.
            let cols = outs[0].0.cols;
            let mut gathered = Vec::new();
            let tiled = pn_sets[1..].iter().zip(&TILE_PRECISIONS).zip(&mut *g);
            for ((set, &precision), slots) in tiled {
                if set.is_empty() {
                    continue;
                }
                let xs = if set.len() == rows {
                    &x[..rows * cols]
                } else {
                    gathered.clear();
                    for &t in set {
                        gathered.extend_from_slice(&x[t * cols..(t + 1) * cols]);
                    }
                    &gathered[..]
                };
                for ty in PnType::ALL {
                    if !outs.iter().any(|(w, _)| w.kind == RowKind::Pn(ty)) {
                        continue;
                    }
                    let slot = &mut slots[pn_index(ty)];
                    // Quantized on every thread: a few parts per thread, claimed dynamically.
                    let run = |n: usize, f: &(dyn Fn(usize) + Sync)| self.pool.run(n, &|_, c| f(c));
                    let parts = 4 * n_threads;
                    let r = match slot {
                        Some(t) => t.update_with(xs, set.len(), parts, &run),
                        None => TileActs::with_precision(ty, precision, &xs[..cols], 1).and_then(
                            |mut t| {
                                t.update_with(xs, set.len(), parts, &run)?;
                                *slot = Some(t);
                                Ok(())
                            },
                        ),
                    };
                    r.map_err(|e| {
                        ModelError::BadArgument(format!("preparing PN activation tiles: {e}"))
                    })?;
                }
            }
            tile_guard = Some(g);
        }
        let pn_acts = pn_guard.as_deref();
        let pn_small = small_guard.as_deref();
        let pn_tiles = tile_guard.as_deref();
        let total_rows: usize = targets.iter().map(|(w, _)| w.map_or(0, |w| w.rows)).sum();
        let single = n_threads == 1 || total_rows * rows < 64;
        let mut tiled = [TilePrecision::I16; 2];
        let mut n_tiled = 0;
        for (set, &precision) in pn_sets[1..].iter().zip(&TILE_PRECISIONS) {
            if !set.is_empty() {
                tiled[n_tiled] = precision;
                n_tiled += 1;
            }
        }
        let plan = ChunkPlan::new(targets, n_threads, single, &tiled[..n_tiled]);
        let (first_chunk, n_chunks_of, step_of) = (plan.first, plan.count, plan.step);
        let n_chunks = first_chunk[targets.len()];
        let work = |p: usize, c: usize| {
            let o = (0..targets.len())
                .rfind(|&o| first_chunk[o] <= c)
                .unwrap_or(0);
            let (w, y) = &targets[o];
            let Some(w) = *w else { return };
            let range = step_range(w.rows, step_of[o], c - first_chunk[o], n_chunks_of[o]);
            if range.is_empty() {
                return;
            }
            let r = match w.kind {
                // PN rows: each path for its own input rows.
                RowKind::Pn(ty) => {
                    let i = pn_index(ty);
                    let fused = pn_acts.map(|a| &a[i][..pn_sets[0].len()]);
                    let small = pn_small.filter(|_| small_rows_tiled(ty)).map(|s| &s[i]);
                    let tiles = pn_tiles.map(|t| t.each_ref().map(|p| p[i].as_ref()));
                    matmul_pn_paths(w, ty, (fused, small), tiles, &pn_sets, *y, range)
                }
                kind if !direct && kind != RowKind::Stock(gguf_io::GgmlType::F32) => self
                    .with_scratch(p, block_dot::ROWS * w.cols, |buf| {
                        matmul_decoded(w, x, rows, *y, range, buf)
                    }),
                _ => matmul_direct(w, x, rows, *y, range),
            };
            if let Err(e) = r {
                first_error(&err, e);
            }
        };
        if single {
            for c in 0..n_chunks {
                work(0, c);
            }
        } else {
            self.pool.run(n_chunks, &work);
        }
        match err.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Whether PN passes of 2..[`DECODE_ROWS_MIN`] rows (the MTP verify) of type `ty` take the
/// few-row AMX kernel (`pn_format::dot::matvec_small`) where the CPU has AMX, instead of the
/// fused int16 kernels. Both types do by default: with one unsigned tile product per block and
/// K step for all inputs, the result tiles alternating by block, the blocks software-pipelined
/// and the next row tile prefetched (pn3t), 3 rows cost 1.08-1.14x one row for pn3t and
/// 0.95-1.01x for pn4t (against 1.43x and 1.46x for the fused kernel; `pn_verify` bench, 27B
/// `ffn_up`/`ffn_down`, DRAM, 1 and 2 threads, wall clock, quiet machine).
/// `PN_SMALL_TILES=0` turns it off, `pn4t` keeps it for pn4t only (A/B runs). Cached.
fn small_rows_tiled(ty: PnType) -> bool {
    static MODE: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    let mode = *MODE.get_or_init(|| {
        if !pn_format::dot::amx_available() {
            return 0;
        }
        match std::env::var("PN_SMALL_TILES").as_deref() {
            Ok("0") => 0,
            Ok("pn4t") => 1,
            _ => 2,
        }
    });
    mode == 2 || (mode == 1 && ty == PnType::Pn4t)
}

/// `y[t, r] = w_r . x_t` with the fused per-type dot product, each weight row multiplied with up
/// to [`MULTI_ROWS`] input rows per call (fastest for a few input rows, and for f32 weights).
fn matmul_direct(
    w: &CpuWeight,
    x: &[f32],
    rows: usize,
    y: SyncPtr,
    range: std::ops::Range<usize>,
) -> Result<(), ModelError> {
    let k = w.cols;
    if rows == 1 && w.i16_decode() {
        // Decode of Q4_K / Q8_0: int16 activations, quantized once for this chunk.
        // SAFETY: row `r` of the output belongs to this thread only.
        return w.dot_range_i16(range, &x[..k], |r, v| unsafe { *y.get().add(r) = v });
    }
    if rows == 1 {
        // Decode: the single-vector kernel straight away (no per-row grouping overhead, which
        // shows on small matrices).
        for r in range {
            let v = w.dot_row(r, &x[..k])?;
            // SAFETY: row `r` of the output belongs to this thread only.
            unsafe { *y.get().add(r) = v };
        }
        return Ok(());
    }
    if w.i16_decode() {
        // A few rows of Q4_K / Q8_0 (the MTP verify's head): int16 activations as in decode,
        // each weight block unpacked once for every input row.
        // SAFETY: row `r` of every output row `t` belongs to this thread only.
        return w.dot_range_i16_multi(range, &x[..rows * k], rows, |t, r, v| unsafe {
            *y.get().add(t * w.rows + r) = v
        });
    }
    let mut vals = [0f32; MULTI_ROWS];
    for r in range {
        for t0 in (0..rows).step_by(MULTI_ROWS) {
            let n = (rows - t0).min(MULTI_ROWS);
            let xs: [&[f32]; MULTI_ROWS] = std::array::from_fn(|j| {
                let t = t0 + j.min(n - 1);
                &x[t * k..(t + 1) * k]
            });
            w.dot_rows(r, &xs[..n], &mut vals[..n])?;
            for (j, &v) in vals[..n].iter().enumerate() {
                // SAFETY: row `r` of every output row `t` belongs to this thread only.
                unsafe { *y.get().add((t0 + j) * w.rows + r) = v };
            }
        }
    }
    Ok(())
}

/// As [`matmul_direct`], but decodes each weight row to f32 once and reuses it for all inputs:
/// [`block_dot::ROWS`] rows at a time (`buf` holds them, `ROWS x k`), against
/// [`block_dot::INPUTS`] inputs per pass (each activation load serves every decoded row). The
/// inputs in whole groups of 4 get `kernels::dot4`'s exact arithmetic (as before the blocking),
/// the last `rows % 4` `kernels::dot`'s.
fn matmul_decoded(
    w: &CpuWeight,
    x: &[f32],
    rows: usize,
    y: SyncPtr,
    range: std::ops::Range<usize>,
    buf: &mut [f32],
) -> Result<(), ModelError> {
    use block_dot::{INPUTS, ROWS};
    let k = w.cols;
    let grouped = rows / 4 * 4;
    let mut r0 = range.start;
    while r0 < range.end {
        let nr = (range.end - r0).min(ROWS);
        for i in 0..nr {
            w.decode_row(r0 + i, &mut buf[i * k..(i + 1) * k])?;
        }
        // Short blocks repeat their last row or input: pairs are independent, so the repeats
        // only cost time, and the full block keeps the fast kernel.
        let wr: [&[f32]; ROWS] = std::array::from_fn(|i| &buf[i.min(nr - 1) * k..][..k]);
        let mut out = [[0f32; INPUTS]; ROWS];
        for t0 in (0..grouped).step_by(INPUTS) {
            let nt = (grouped - t0).min(INPUTS);
            let xs: [&[f32]; INPUTS] = std::array::from_fn(|j| &x[(t0 + j.min(nt - 1)) * k..][..k]);
            block_dot::dot_block(&wr, &xs, &mut out);
            for (i, oi) in out.iter().enumerate().take(nr) {
                for (j, &v) in oi.iter().enumerate().take(nt) {
                    // SAFETY: as in `matmul_direct`.
                    unsafe { *y.get().add((t0 + j) * w.rows + r0 + i) = v };
                }
            }
        }
        for t in grouped..rows {
            for (i, wi) in wr.iter().enumerate().take(nr) {
                let v = kernels::dot(wi, &x[t * k..(t + 1) * k]);
                // SAFETY: as in `matmul_direct`.
                unsafe { *y.get().add(t * w.rows + r0 + i) = v };
            }
        }
        r0 += nr;
    }
    Ok(())
}

/// PN rows against prepared activations (one per input row), via
/// `pn_format::dot::matvec_multi`: every weight block is read once for all input rows; with
/// `small` (the same activations as AMX byte tiles, a few rows on a CPU with AMX) via
/// `pn_format::dot::matvec_small`, which does the multiply-adds in tiles.
fn matmul_pn(
    w: &CpuWeight,
    ty: PnType,
    acts: &[PreparedI16],
    rows_of: &[usize],
    small: Option<&pn_format::dot::SmallActs>,
    y: SyncPtr,
    range: std::ops::Range<usize>,
) -> Result<(), ModelError> {
    let rb = w.row_bytes;
    let bytes = &w.bytes()[range.start * rb..range.end * rb];
    let pn_err = |e: pn_format::PnError| ModelError::BadTensorData {
        name: w.name().into(),
        reason: format!("rows {range:?}: {e}"),
    };
    if acts.len() != rows_of.len() {
        return Err(ModelError::BadArgument(format!(
            "matmul `{}`: {} prepared rows for {} outputs",
            w.name(),
            acts.len(),
            rows_of.len()
        )));
    }
    if let ([a], [t]) = (acts, rows_of) {
        // SAFETY: as below, for the single output row.
        let out = unsafe {
            std::slice::from_raw_parts_mut(y.get().add(t * w.rows + range.start), range.len())
        };
        return pn_format::dot::matvec(ty, bytes, range.len(), a, out).map_err(pn_err);
    }
    if let Some(small) = small {
        let mut outs: Vec<&mut [f32]> = rows_of
            .iter()
            .map(|&t| {
                // SAFETY: rows `range` of output row `t` belong to this thread only (disjoint
                // from the other entries, which are other output rows); in bounds because the
                // output holds `rows * w.rows` floats (checked by `matmul`).
                unsafe {
                    std::slice::from_raw_parts_mut(
                        y.get().add(t * w.rows + range.start),
                        range.len(),
                    )
                }
            })
            .collect();
        if pn_format::dot::matvec_small(ty, bytes, range.len(), small, &mut outs).map_err(pn_err)? {
            return Ok(());
        }
    }
    // Row tiles that stay in L2 while every group of input rows passes over them (one tile
    // for a few input rows: the weights are then read once anyway).
    let tile_rows = if acts.len() <= MULTI_ROWS {
        range.len()
    } else {
        (PN_TILE_BYTES / rb.max(1)).max(16)
    };
    for r0 in (range.start..range.end).step_by(tile_rows.max(1)) {
        let r1 = (r0 + tile_rows).min(range.end);
        let tile = &w.bytes()[r0 * rb..r1 * rb];
        for (g, group) in acts.chunks(MULTI_ROWS).enumerate() {
            let mut outs: [&mut [f32]; MULTI_ROWS] = Default::default();
            for (j, o) in outs.iter_mut().enumerate().take(group.len()) {
                let t = rows_of[g * MULTI_ROWS + j];
                // SAFETY: rows `r0..r1` (inside `range`) of output row `t` belong to this
                // thread only (disjoint from every other `outs` entry, which are other output
                // rows); in bounds because the output holds `rows * w.rows` floats (checked by
                // `matmul`).
                *o = unsafe {
                    std::slice::from_raw_parts_mut(y.get().add(t * w.rows + r0), r1 - r0)
                };
            }
            pn_format::dot::matvec_multi(ty, tile, r1 - r0, group, &mut outs[..group.len()])
                .map_err(pn_err)?;
        }
    }
    Ok(())
}

/// Rows `range` of PN weight `w` for every input row, each set of rows on its own path
/// (`CpuBackend::pn_row_sets`): the fused kernels on `fused` (with the few-row tiles `small`
/// where they apply), then each tile precision on its `tiles`.
fn matmul_pn_paths(
    w: &CpuWeight,
    ty: PnType,
    (fused, small): (Option<&[PreparedI16]>, Option<&pn_format::dot::SmallActs>),
    tiles: Option<[Option<&TileActs>; 2]>,
    sets: &[Vec<usize>; 3],
    y: SyncPtr,
    range: std::ops::Range<usize>,
) -> Result<(), ModelError> {
    if let Some(acts) = fused.filter(|a| !a.is_empty()) {
        matmul_pn(w, ty, acts, &sets[0], small, y, range.clone())?;
    }
    for (t, set) in tiles.into_iter().flatten().zip(&sets[1..]) {
        if let Some(t) = t.filter(|_| !set.is_empty()) {
            matmul_pn_tiled(w, ty, t, set, y, range.clone())?;
        }
    }
    Ok(())
}

/// PN rows against activation tiles (`pn_format::dot::matmul_tiled`: 16 x 16 AMX tiles, or
/// AVX-512 VNNI vectors of 16 inputs) whose input `i` is row `rows_of[i]` of the call.
fn matmul_pn_tiled(
    w: &CpuWeight,
    ty: PnType,
    tiles: &TileActs,
    rows_of: &[usize],
    y: SyncPtr,
    range: std::ops::Range<usize>,
) -> Result<(), ModelError> {
    let rb = w.row_bytes;
    let bytes = &w.bytes()[range.start * rb..range.end * rb];
    // One output per entry of `rows_of` (a count that is not the tiles' is a typed error).
    let mut outs: Vec<&mut [f32]> = rows_of
        .iter()
        .map(|&t| {
            // SAFETY: rows `range` of output row `t` belong to this thread only (disjoint from
            // the other entries, which are other output rows); in bounds because the output
            // holds `rows * w.rows` floats (checked by `matmul`).
            unsafe {
                std::slice::from_raw_parts_mut(y.get().add(t * w.rows + range.start), range.len())
            }
        })
        .collect();
    pn_format::dot::matmul_tiled(ty, bytes, range.len(), tiles, &mut outs).map_err(|e| {
        ModelError::BadTensorData {
            name: w.name().into(),
            reason: format!("rows {range:?}: {e}"),
        }
    })
}

/// How [`CpuBackend::matmul_outputs`] cuts its outputs into chunks for the pool: by weight
/// bytes, not rows, so that chunks of a wide and a narrow (or a pn3t and a Q8_0) matrix cost
/// about the same and the threads finish together; each chunk in whole passes of the kernel
/// that runs it (`step` rows: the tiled kernel's row tiles), so no pass computes padding rows
/// except at a matrix's end.
struct ChunkPlan {
    /// Index of each output's first chunk (`first[i + 1] - first[i]` chunks for output `i`).
    first: [usize; 9],
    /// Chunks of each output.
    count: [usize; 8],
    /// Row granularity of each output's chunks.
    step: [usize; 8],
}

impl ChunkPlan {
    /// About 8 chunks per thread over all outputs (a late worker's share can then be absorbed
    /// by the others), at least 16 rows each; one chunk per output when `single`. `tiled`: the
    /// precisions PN outputs run on the tiled kernels at (their chunks in whole passes of
    /// each).
    fn new(
        targets: &[(Option<&CpuWeight>, SyncPtr)],
        n_threads: usize,
        single: bool,
        tiled: &[TilePrecision],
    ) -> ChunkPlan {
        let mut plan = ChunkPlan {
            first: [0; 9],
            count: [1; 8],
            step: [16; 8],
        };
        let bytes = |w: &CpuWeight| w.rows * w.row_bytes.max(1);
        let total: usize = targets.iter().filter_map(|(w, _)| w.map(bytes)).sum();
        let per_chunk = (total / (8 * n_threads)).max(1);
        for (i, (w, _)) in targets.iter().enumerate() {
            if let Some(w) = w {
                if let RowKind::Pn(ty) = w.kind {
                    let steps = tiled.iter().map(|&p| tiled_pass_rows(ty, p));
                    plan.step[i] = steps.max().unwrap_or(plan.step[i]);
                }
                let units = w.rows.div_ceil(plan.step[i]).max(1);
                if !single {
                    plan.count[i] = bytes(w).div_ceil(per_chunk).clamp(1, units);
                }
            }
            plan.first[i + 1] = plan.first[i] + plan.count[i];
        }
        plan
    }
}

/// Chunk `i` of `parts` of `0..rows` in whole `step`-row units (the last unit may be short).
fn step_range(rows: usize, step: usize, i: usize, parts: usize) -> std::ops::Range<usize> {
    let u = split_range(rows.div_ceil(step), i, parts);
    (u.start * step).min(rows)..(u.end * step).min(rows)
}
