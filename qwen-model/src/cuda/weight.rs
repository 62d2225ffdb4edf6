//! Weight matrices resident on the device in their stored format, and the ops that read
//! them: upload, the embedding gather and the matrix products.

use super::error::CudaError;
use super::{lock, view, view_mut, CudaBackend, CudaBuf, PN_H2_MAX_K};
use crate::{ModelError, WeightSource};
use gguf_io::GgmlType;
use pn_kernels::cudarc::driver::CudaSlice;
use pn_kernels::launch::{self, PN_BATCH_MAX_T, PN_GROUP_MAX};
use pn_kernels::{Gpu, GroupMat, MatrixShape, PnPrecision, RowStrides, WeightType};

/// The kernel family's name for a stored type, or `None` when no kernel reads it.
pub fn device_type(ty: GgmlType) -> Option<WeightType> {
    Some(match ty {
        GgmlType::F32 => WeightType::F32,
        GgmlType::F16 => WeightType::F16,
        GgmlType::Q8_0 => WeightType::Q8_0,
        GgmlType::Q4K => WeightType::Q4K,
        GgmlType::Q3K => WeightType::Q3K,
        GgmlType::Pn3t => WeightType::Pn3t,
        GgmlType::Pn4t => WeightType::Pn4t,
        _ => return None,
    })
}

/// The load-time error of a weight whose type no device kernel reads.
fn refusal(tensor: &str, ty: GgmlType) -> CudaError {
    CudaError::MissingKernel {
        tensor: tensor.into(),
        op: "any matrix op",
        ty: ty.name().into(),
    }
}

/// A weight matrix on the device: the file's bytes, one allocation (256-byte aligned by the
/// driver, so every row-type alignment the kernels check holds).
pub struct CudaWeight {
    pub(crate) bytes: CudaSlice<u8>,
    pub(crate) ty: WeightType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) rotation_block: Option<usize>,
    pub(crate) name: String,
}

impl CudaWeight {
    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Storage type.
    pub fn weight_type(&self) -> WeightType {
        self.ty
    }
    /// Output rows.
    pub fn rows(&self) -> usize {
        self.rows
    }
    /// Reduction length K.
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Bytes on the device.
    pub fn device_bytes(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) fn missing(&self, op: &'static str) -> CudaError {
        CudaError::MissingKernel {
            tensor: self.name.clone(),
            op,
            ty: self.ty.name().into(),
        }
    }
}

impl CudaBackend {
    /// Uploads one weight in its stored format after checking its size.
    pub(super) fn try_load_weight(&self, src: &WeightSource<'_>) -> Result<CudaWeight, ModelError> {
        let ty = device_type(src.ty).ok_or_else(|| refusal(src.name, src.ty))?;
        let row_bytes = ty
            .row_bytes(src.cols)
            .ok_or_else(|| ModelError::BadTensorData {
                name: src.name.into(),
                reason: format!(
                    "row length {} is not a whole number of {} blocks",
                    src.cols,
                    ty.name()
                ),
            })?;
        if src.bytes.len() != row_bytes * src.rows {
            return Err(ModelError::BadTensorData {
                name: src.name.into(),
                reason: format!(
                    "{} bytes, expected {}",
                    src.bytes.len(),
                    row_bytes * src.rows
                ),
            });
        }
        let bytes = self
            .gpu
            .stream()
            .clone_htod(src.bytes)
            .map_err(|e| CudaError::driver(format!("uploading `{}`", src.name), e))?;
        Ok(CudaWeight {
            bytes,
            ty,
            rows: src.rows,
            cols: src.cols,
            rotation_block: src.rotated.then_some(src.rotation_block),
            name: src.name.into(),
        })
    }

    /// Gathers the rows of `tokens` from the embedding table into `out` (`[n, cols]`), undoing
    /// the table's rotation.
    pub(super) fn try_embed(
        &self,
        table: &CudaWeight,
        tokens: &[u32],
        out: &mut CudaBuf,
    ) -> Result<(), CudaError> {
        const OP: &str = "embed";
        if tokens.is_empty() {
            return Ok(());
        }
        match table.ty {
            WeightType::F32 | WeightType::F16 | WeightType::Q8_0 | WeightType::Q3K => {}
            _ => return Err(table.missing("embedding gather")),
        }
        let d = table.cols;
        let ids: Vec<i32> = tokens
            .iter()
            .map(|&t| i32::try_from(t).unwrap_or(i32::MAX))
            .collect();
        let mut sc = lock(&self.scratch);
        let dev_ids = self.grow(&mut sc.ids, ids.len(), "token ids")?;
        let mut idv = dev_ids.slice_mut(0..ids.len());
        self.gpu
            .stream()
            .memcpy_htod(&ids, &mut idv)
            .map_err(|e| CudaError::driver("uploading token ids", e))?;
        let idv = dev_ids.slice(0..ids.len());
        let n = tokens.len() * d;
        let mut o = view_mut(OP, out, 0, n)?;
        let m = MatrixShape {
            ty: table.ty,
            n: table.rows,
            k: d,
        };
        self.gpu
            .get_rows(m, &table.bytes.slice(..), &idv, &ids, &mut o)?;
        if let Some(r) = table.rotation_block {
            // Stored rows are W H; H is its own inverse.
            self.gpu.hadamard_inplace(&mut o, n, r)?;
        }
        Ok(())
    }

    /// `y = x W^T` for every `(W, y)` of `outs` over `rows` rows of `x` (one K for all):
    /// matrix-vector kernels for one row; for 2..=8 rows (the MTP verify, batched decode) the
    /// small-batch kernels (PN, Q4_K, Q8_0: each weight read once for all rows) or one
    /// matrix-vector call per row; the tiled matmul kernel for more.
    pub(super) fn try_matmul(
        &self,
        x: &CudaBuf,
        rows: usize,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
    ) -> Result<(), CudaError> {
        self.try_matmul_from(x, rows, outs, false)
    }

    /// Whether every matrix of `mats` reads the prepared fp16 input at `rows` rows (the
    /// single-row half2 kernels, or the small-batch kernel for 2..=8 rows), so a producer that
    /// writes that copy itself saves the conversion launch ([`CudaBackend::try_matmul_from`]).
    pub(crate) fn all_read_prepared(rows: usize, mats: &[MatDesc]) -> bool {
        let k = mats.first().map_or(0, |m| m.cols);
        !mats.is_empty()
            && (1..=PN_BATCH_MAX_T).contains(&rows)
            && mats.iter().all(|m| {
                m.cols == k
                    && (if rows == 1 {
                        m.reads_h2()
                    } else {
                        m.reads_batch(rows)
                    })
            })
    }

    /// [`CudaBackend::try_matmul`]; with `have_prepared`, the fp16 copy of `x` and its
    /// exponents are already in the scratch (written by a fused producer) and every matrix
    /// reads it ([`CudaBackend::all_read_prepared`]): no conversion launch.
    pub(super) fn try_matmul_from(
        &self,
        x: &CudaBuf,
        rows: usize,
        outs: &mut [(&CudaWeight, &mut CudaBuf)],
        have_prepared: bool,
    ) -> Result<(), CudaError> {
        const OP: &str = "matmul";
        if rows == 0 || outs.is_empty() {
            return Ok(());
        }
        let k = outs[0].0.cols;
        if let Some((w, _)) = outs.iter().find(|(w, _)| w.cols != k) {
            return Err(CudaError::Unsupported {
                op: OP,
                what: format!("`{}` has K = {}, the other outputs K = {k}", w.name, w.cols),
            });
        }
        let xv = view(OP, x, 0, rows * k)?;
        if rows == 1 && outs.len() > 1 && outs.iter().all(|(w, _)| w.ty == WeightType::Q8_0) {
            let all: Vec<MatDesc> = outs.iter().map(|(w, _)| w.desc()).collect();
            if super::quant_group::q8_grouped(rows, &all) {
                return self.try_q8_group(&xv, outs);
            }
        }
        let pn_h2 = |w: &CudaWeight| w.desc().reads_h2();
        let pn_batch = |w: &CudaWeight| w.desc().reads_batch(rows);
        // Decode: PN matrices share one fp16 conversion of x (same bits as converting per call);
        // a small batch converts its rows once (one launch of `rows` blocks) for every matrix.
        let mut guard = lock(&self.scratch);
        let sc = &mut *guard;
        let prepared = rows == 1 && outs.iter().any(|(w, _)| pn_h2(w));
        let batched = outs.iter().any(|(w, _)| pn_batch(w));
        if have_prepared
            && !outs
                .iter()
                .all(|(w, _)| Self::all_read_prepared(rows, &[w.desc()]))
        {
            return Err(CudaError::driver(
                OP,
                "a prepared input for matrices that do not read it",
            ));
        }
        if (prepared || batched) && !have_prepared {
            let xh = self.grow(&mut sc.xh, PN_H2_MAX_K.max(rows * k), "fp16 activations")?;
            let e = self.grow(&mut sc.e, PN_BATCH_MAX_T, "activation exponents")?;
            let mut xhm = xh.slice_mut(0..rows * k);
            let mut em = e.slice_mut(0..rows);
            if prepared {
                self.gpu.pn_prepare_x(&xv, k, &mut xhm, &mut em)?;
            } else {
                self.gpu
                    .pn_prepare_rows(&xv, (rows, k), &mut xhm, &mut em)?;
            }
        }
        let (descs, n_descs) = Descs::of(outs);
        if grouped(rows, &descs.0[..n_descs]) {
            // Every matrix reads the one prepared x: one grouped launch.
            let (Some(xh), Some(e)) = (sc.xh.as_ref(), sc.e.as_ref()) else {
                return Err(CudaError::driver(OP, "fp16 scratch missing"));
            };
            let (xh, e) = (xh.slice(0..k), e.slice(0..1));
            let ws: Vec<&CudaWeight> = outs.iter().map(|(w, _)| *w).collect();
            let wvs: Vec<_> = ws.iter().map(|w| w.bytes.slice(..)).collect();
            let mut yvs = outs
                .iter_mut()
                .map(|(w, y)| view_mut(OP, y, 0, w.rows))
                .collect::<Result<Vec<_>, _>>()?;
            let mut mats: Vec<GroupMat<'_, '_>> = ws
                .iter()
                .zip(&wvs)
                .zip(yvs.iter_mut())
                .map(|((w, wv), y)| GroupMat {
                    m: MatrixShape {
                        ty: w.ty,
                        n: w.rows,
                        k,
                    },
                    w: wv,
                    y,
                })
                .collect();
            return self
                .gpu
                .pn_gemv_group(&mut mats, (&xh, &e))
                .map_err(|e| CudaError::Driver {
                    op: format!(
                        "grouped matmul of `{}` and {} more",
                        ws[0].name,
                        ws.len() - 1
                    ),
                    msg: e.to_string(),
                });
        }
        for (w, y) in outs.iter_mut() {
            let n = w.rows;
            let mut yv = view_mut(OP, y, 0, rows * n)?;
            let wv = w.bytes.slice(..);
            let m = MatrixShape { ty: w.ty, n, k };
            let ctx = |e: pn_kernels::KernelError| CudaError::Driver {
                op: format!(
                    "matmul `{}` ({n} x {k} {}, {rows} rows)",
                    w.name,
                    w.ty.name()
                ),
                msg: e.to_string(),
            };
            if (prepared && pn_h2(w)) || (batched && pn_batch(w)) {
                let (Some(xh), Some(e)) = (sc.xh.as_ref(), sc.e.as_ref()) else {
                    return Err(CudaError::driver(OP, "fp16 scratch missing"));
                };
                let (xh, e) = (xh.slice(0..rows * k), e.slice(0..rows));
                if rows == 1 {
                    self.gpu.pn_gemv_prepared(m, &wv, &xh, &e, &mut yv)
                } else {
                    self.gpu.pn_gemv_batch(m, rows, &wv, (&xh, &e), &mut yv)
                }
                .map_err(ctx)?;
            } else if w.desc().reads_stock_batch(rows) {
                // The Q4_K head, the Q8_0 matrices: one launch for all rows, row r the bits of
                // the single-row kernel on row r (review finding 5).
                self.gpu
                    .gemv_batch(m, rows, &wv, &xv, &mut yv)
                    .map_err(ctx)?;
            } else if rows <= PN_BATCH_MAX_T && w.ty != WeightType::Q3K {
                // One matrix-vector call per row (odd PN block counts, K beyond the half2
                // kernels, stock types): still far fewer bytes than the 64-row tiles.
                for r in 0..rows {
                    let xr = view(OP, x, r * k, k)?;
                    let mut yr = view_mut(OP, y, r * n, n)?;
                    if pn_bits(w.ty).is_some() {
                        let p = if w.cols <= PN_H2_MAX_K {
                            PnPrecision::Half2
                        } else {
                            PnPrecision::F32
                        };
                        self.gpu.pn_gemv(m, p, &wv, &xr, &mut yr)
                    } else {
                        self.gpu.gemv(m, &wv, &xr, &mut yr)
                    }
                    .map_err(ctx)?;
                }
            } else {
                let strides = RowStrides {
                    rows,
                    x_stride: k,
                    y_stride: n,
                };
                self.gpu
                    .matmul(m, &wv, &xv, &mut yv, strides)
                    .map_err(ctx)?;
            }
        }
        Ok(())
    }
}

/// A matrix as the launch plan of [`CudaBackend::try_matmul_from`] sees it (also what
/// [`super::LaunchCounter`] counts with, so the counted plan is the one the backend runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatDesc {
    /// Storage type.
    pub ty: WeightType,
    /// Output rows.
    pub rows: usize,
    /// Reduction length K.
    pub cols: usize,
}

impl MatDesc {
    /// Read at one row by the prepared half2 PN kernels.
    pub(crate) fn reads_h2(&self) -> bool {
        pn_bits(self.ty).is_some() && self.cols <= PN_H2_MAX_K
    }
    /// Read at `rows` (2..=8) rows by the small-batch PN kernel.
    pub(crate) fn reads_batch(&self, rows: usize) -> bool {
        (2..=PN_BATCH_MAX_T).contains(&rows)
            && pn_bits(self.ty)
                .is_some_and(|b| launch::pn_batch(b, rows, self.rows, self.cols).is_some())
    }
    /// Read at `rows` (2..=8) rows by the small-batch Q4_K / Q8_0 kernels
    /// ([`Gpu::gemv_batch`]).
    pub(crate) fn reads_stock_batch(&self, rows: usize) -> bool {
        let m = MatrixShape {
            ty: self.ty,
            n: self.rows,
            k: self.cols,
        };
        Gpu::gemv_batchable(m, rows)
    }
}

impl CudaWeight {
    /// The launch plan's view of this matrix.
    pub(crate) fn desc(&self) -> MatDesc {
        MatDesc {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
        }
    }
}

/// Up to [`PN_GROUP_MAX`] descriptors without allocating (`.0[..n]` valid; `None` past it).
struct Descs([MatDesc; PN_GROUP_MAX]);

impl Descs {
    fn of(outs: &[(&CudaWeight, &mut CudaBuf)]) -> (Descs, usize) {
        let none = MatDesc {
            ty: WeightType::F32,
            rows: 0,
            cols: 0,
        };
        let mut d = Descs([none; PN_GROUP_MAX]);
        if outs.len() > PN_GROUP_MAX {
            return (d, 0);
        }
        for (slot, (w, _)) in d.0.iter_mut().zip(outs) {
            *slot = w.desc();
        }
        (d, outs.len())
    }
}

/// Whether [`CudaBackend::try_matmul_from`] runs `mats` in one grouped launch: one row, 2 to
/// [`PN_GROUP_MAX`] PN matrices of one K that all read the prepared x and share a block size
/// ([`Gpu::pn_groupable`]).
pub(crate) fn grouped(rows: usize, mats: &[MatDesc]) -> bool {
    if rows != 1 || !(2..=PN_GROUP_MAX).contains(&mats.len()) || !mats.iter().all(MatDesc::reads_h2)
    {
        return false;
    }
    let mut shapes = [MatrixShape {
        ty: WeightType::F32,
        n: 0,
        k: 0,
    }; PN_GROUP_MAX];
    for (s, m) in shapes.iter_mut().zip(mats) {
        *s = MatrixShape {
            ty: m.ty,
            n: m.rows,
            k: m.cols,
        };
    }
    Gpu::pn_groupable(&shapes[..mats.len()])
}

/// Launches of [`CudaBackend::try_matmul_from`] for `mats` (one K) at `rows` rows: the
/// conversion of x (unless a producer wrote it: `have_prepared`), then per matrix one launch
/// (prepared / small-batch PN or stock / tiled kernels) or one per row (the per-row GEMVs). The same
/// predicates as the backend's dispatch.
pub(crate) fn matmul_launches(rows: usize, mats: &[MatDesc], have_prepared: bool) -> u64 {
    if rows == 0 || mats.is_empty() {
        return 0;
    }
    let prepared = rows == 1 && mats.iter().any(MatDesc::reads_h2);
    let batched = mats.iter().any(|m| m.reads_batch(rows));
    let convert = u64::from((prepared || batched) && !have_prepared);
    if super::quant_group::q8_grouped(rows, mats) {
        return 1;
    }
    if grouped(rows, mats) {
        return convert + 1;
    }
    convert
        + mats
            .iter()
            .map(|m| {
                if (prepared && m.reads_h2())
                    || (batched && m.reads_batch(rows))
                    || m.reads_stock_batch(rows)
                {
                    1
                } else if rows <= PN_BATCH_MAX_T && m.ty != WeightType::Q3K {
                    rows as u64
                } else {
                    1
                }
            })
            .sum::<u64>()
}

/// Code width of a PN type (3 or 4), `None` for the others.
fn pn_bits(ty: WeightType) -> Option<u32> {
    match ty {
        WeightType::Pn3t => Some(3),
        WeightType::Pn4t => Some(4),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verify's stock matrices (the 27B Q4_K head, the GDN's q8_0 alpha/beta) take one
    /// small-batch launch for 2..=8 rows, not one GEMV per row; q3_K and one row do not.
    #[test]
    fn stock_matrices_take_one_batch_launch_for_2_to_8_rows() {
        let head = MatDesc {
            ty: WeightType::Q4K,
            rows: 248_320,
            cols: 5120,
        };
        let alpha = MatDesc {
            ty: WeightType::Q8_0,
            rows: 48,
            cols: 5120,
        };
        for rows in 2..=PN_BATCH_MAX_T {
            assert!(head.reads_stock_batch(rows) && alpha.reads_stock_batch(rows));
            assert_eq!(matmul_launches(rows, &[head], false), 1, "{rows} rows");
            assert_eq!(matmul_launches(rows, &[alpha, alpha], false), 2);
        }
        assert!(!head.reads_stock_batch(1) && !head.reads_stock_batch(PN_BATCH_MAX_T + 1));
        assert_eq!(matmul_launches(1, &[head], false), 1);
        let q3 = MatDesc {
            ty: WeightType::Q3K,
            rows: 64,
            cols: 256,
        };
        assert!(!q3.reads_stock_batch(3));
        // An f32 matrix still runs one GEMV per row.
        let f = MatDesc {
            ty: WeightType::F32,
            rows: 64,
            cols: 256,
        };
        assert_eq!(matmul_launches(3, &[f], false), 3);
    }

    /// The CPU reads every stock type `gguf_io::quants` decodes; the device only its kernels'
    /// types. Every other one is refused at load with tensor and type in the message (README,
    /// "Tensor types").
    #[test]
    fn types_without_a_kernel_are_refused_by_name() {
        let on_device = [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q3K,
            GgmlType::Pn3t,
            GgmlType::Pn4t,
        ];
        for &ty in GgmlType::ALL {
            assert_eq!(device_type(ty).is_some(), on_device.contains(&ty), "{ty}");
        }
        for &ty in gguf_io::quants::DECODABLE {
            if on_device.contains(&ty) {
                continue;
            }
            let msg = ModelError::from(refusal("blk.0.ffn_up.weight", ty)).to_string();
            assert!(
                msg.contains("blk.0.ffn_up.weight") && msg.contains(ty.name()),
                "{ty}: {msg}"
            );
        }
    }
}
