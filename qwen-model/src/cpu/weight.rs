//! CPU-resident weight matrices and the per-type row operations (dot product, decode).
//!
//! PN types go to `pn-format`, every other type to `gguf_io::quants`.

use crate::backend::WeightSource;
use crate::error::ModelError;
use gguf_io::{GgmlType, GgufFile};
use pn_format::PnType;
use std::cell::RefCell;
use std::sync::Arc;

/// Where a weight's bytes live.
enum Storage {
    /// Borrowed from a memory-mapped (or owned) GGUF file that `_keep` keeps alive.
    Mapped {
        ptr: *const u8,
        len: usize,
        _keep: Arc<GgufFile>,
    },
    /// A private copy (weights built in memory without a file).
    Owned(Vec<u8>),
}

// SAFETY: `Mapped` points into the immutable data of a `GgufFile` that the `Arc` keeps alive; the
// bytes are never written, so sharing across threads is sound.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

/// How a row of this weight is multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowKind {
    /// A stock ggml type (gguf_io::quants).
    Stock(GgmlType),
    /// A PN type (pn_format).
    Pn(PnType),
}

/// A weight matrix on the CPU: the stored bytes, read in place.
pub struct CpuWeight {
    storage: Storage,
    pub(crate) kind: RowKind,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) rotation_block: Option<usize>,
    /// Single-row products go through int16 activations (`gguf_io::quants::vec_dot_i16`:
    /// Q4_K and Q8_0 rows of whole 256-groups on a CPU with the SIMD kernels).
    i16_decode: bool,
    name: String,
}

thread_local! {
    /// Each thread's int16 copy of the activation vector of its current chunk (`cols` values;
    /// grows to the widest matrix once, then reused without allocating).
    static ACTS_I16: RefCell<gguf_io::quants::ActsI16> = RefCell::new(Default::default());
    /// Each thread's int16 copies of the input rows of its current multi-row chunk (one set of
    /// `cols` values per input row; grown once, then reused).
    static ROWS_I16: RefCell<Vec<gguf_io::quants::ActsI16>> = const { RefCell::new(Vec::new()) };
}

impl CpuWeight {
    /// Binds `src` (zero copy when `keep` owns the bytes).
    pub(crate) fn new(
        src: &WeightSource<'_>,
        keep: Option<&Arc<GgufFile>>,
    ) -> Result<CpuWeight, ModelError> {
        let kind = match src.ty {
            GgmlType::Pn3t => RowKind::Pn(PnType::Pn3t),
            GgmlType::Pn4t => RowKind::Pn(PnType::Pn4t),
            ty if gguf_io::quants::DECODABLE.contains(&ty) => RowKind::Stock(ty),
            other => {
                let allowed: Vec<&str> = crate::weights::matrix_types()
                    .iter()
                    .map(|t| t.name())
                    .collect();
                return Err(ModelError::BadType {
                    name: src.name.into(),
                    found: other.name().into(),
                    allowed: allowed.join(", "),
                });
            }
        };
        let row_bytes =
            src.ty
                .row_bytes(src.cols as u64)
                .ok_or_else(|| ModelError::BadTensorData {
                    name: src.name.into(),
                    reason: format!(
                        "row length {} does not fit {} blocks",
                        src.cols,
                        src.ty.name()
                    ),
                })? as usize;
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
        let storage = match keep {
            Some(file) if owns(file, src.bytes) => Storage::Mapped {
                ptr: src.bytes.as_ptr(),
                len: src.bytes.len(),
                _keep: Arc::clone(file),
            },
            _ => Storage::Owned(src.bytes.to_vec()),
        };
        Ok(CpuWeight {
            storage,
            kind,
            rows: src.rows,
            cols: src.cols,
            row_bytes,
            rotation_block: src.rotated.then_some(src.rotation_block),
            i16_decode: matches!(kind, RowKind::Stock(ty) if gguf_io::quants::has_i16_kernel(ty))
                && src.cols.is_multiple_of(gguf_io::quants::I16_GROUP),
            name: src.name.into(),
        })
    }

    /// All bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.storage {
            // SAFETY: see `Storage`.
            Storage::Mapped { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Storage::Owned(v) => v,
        }
    }

    /// The bytes of row `r`.
    #[inline]
    pub(crate) fn row(&self, r: usize) -> &[u8] {
        &self.bytes()[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Tensor name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn err(&self, r: usize, e: impl std::fmt::Display) -> ModelError {
        ModelError::BadTensorData {
            name: self.name.clone(),
            reason: format!("row {r}: {e}"),
        }
    }

    /// `row(r) . x`.
    #[inline]
    pub(crate) fn dot_row(&self, r: usize, x: &[f32]) -> Result<f32, ModelError> {
        let row = self.row(r);
        match self.kind {
            RowKind::Stock(ty) => {
                gguf_io::quants::vec_dot_f32(ty, row, x).map_err(|e| self.err(r, e))
            }
            RowKind::Pn(ty) => pn_format::dot::dot_f32(ty, row, x).map_err(|e| self.err(r, e)),
        }
    }

    /// Whether [`CpuWeight::dot_range_i16`] serves this weight's single-row products.
    #[inline]
    pub(crate) fn i16_decode(&self) -> bool {
        self.i16_decode
    }

    /// `put(r, row(r) . x)` for every row of `range`, with `x` (`cols` floats) quantized once
    /// to int16 (at most 2^-16 of each 256-group's largest magnitude off, see
    /// `gguf_io::quants::ActsI16`) and exact integer block products. Only for weights with
    /// [`CpuWeight::i16_decode`].
    pub(crate) fn dot_range_i16(
        &self,
        range: std::ops::Range<usize>,
        x: &[f32],
        mut put: impl FnMut(usize, f32),
    ) -> Result<(), ModelError> {
        let RowKind::Stock(ty) = self.kind else {
            return Err(self.err(range.start, "int16 activations need a stock type"));
        };
        ACTS_I16.with_borrow_mut(|a| {
            a.update(x).map_err(|e| self.err(range.start, e))?;
            for r in range {
                let v =
                    gguf_io::quants::vec_dot_i16(ty, self.row(r), a).map_err(|e| self.err(r, e))?;
                put(r, v);
            }
            Ok(())
        })
    }

    /// `put(t, r, row(r) . x_t)` for every row of `range` and each of the `n` input rows of `x`
    /// (`n x cols`, row-major), each input row quantized once to int16 as in
    /// [`CpuWeight::dot_range_i16`] and every weight block unpacked once for all of them
    /// (`gguf_io::quants::vec_dot_i16_multi`): the MTP verify pass reads the Q4_K head once, and
    /// each of its rows gets the bits a single-row decode step would.
    pub(crate) fn dot_range_i16_multi(
        &self,
        range: std::ops::Range<usize>,
        x: &[f32],
        n: usize,
        mut put: impl FnMut(usize, usize, f32),
    ) -> Result<(), ModelError> {
        let RowKind::Stock(ty) = self.kind else {
            return Err(self.err(range.start, "int16 activations need a stock type"));
        };
        let k = self.cols;
        ROWS_I16.with_borrow_mut(|sets| {
            if sets.len() < n {
                sets.resize_with(n, Default::default);
            }
            for (t, a) in sets[..n].iter_mut().enumerate() {
                a.update(&x[t * k..(t + 1) * k])
                    .map_err(|e| self.err(range.start, e))?;
            }
            let refs: Vec<&gguf_io::quants::ActsI16> = sets[..n].iter().collect();
            let mut vals = vec![0f32; n];
            for r in range {
                gguf_io::quants::vec_dot_i16_multi(ty, self.row(r), &refs, &mut vals)
                    .map_err(|e| self.err(r, e))?;
                for (t, &v) in vals.iter().enumerate() {
                    put(t, r, v);
                }
            }
            Ok(())
        })
    }

    /// `out[j] = row(r) . xs[j]`, decoding the row once for all vectors (stock types; PN rows go
    /// through prepared activations in `matmul_pn`, and here fall back to one dot per vector).
    pub(crate) fn dot_rows(
        &self,
        r: usize,
        xs: &[&[f32]],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let row = self.row(r);
        match self.kind {
            RowKind::Stock(ty) => {
                gguf_io::quants::vec_dot_f32_multi(ty, row, xs, out).map_err(|e| self.err(r, e))
            }
            RowKind::Pn(_) => {
                for (o, x) in out.iter_mut().zip(xs) {
                    *o = self.dot_row(r, x)?;
                }
                Ok(())
            }
        }
    }

    /// Decodes row `r` to f32 into `dst` (`cols` floats).
    pub(crate) fn decode_row(&self, r: usize, dst: &mut [f32]) -> Result<(), ModelError> {
        let row = self.row(r);
        match self.kind {
            RowKind::Stock(ty) => {
                gguf_io::quants::dequantize_row(ty, row, dst).map_err(|e| self.err(r, e))
            }
            RowKind::Pn(ty) => pn_format::dequantize_row(ty, row, dst).map_err(|e| self.err(r, e)),
        }
    }
}

/// Whether `bytes` lies inside the file's own buffer.
fn owns(file: &GgufFile, bytes: &[u8]) -> bool {
    let all = file.as_bytes();
    let (s, e) = (all.as_ptr() as usize, all.as_ptr() as usize + all.len());
    let (bs, be) = (
        bytes.as_ptr() as usize,
        bytes.as_ptr() as usize + bytes.len(),
    );
    bs >= s && be <= e
}
