//! Embedding gathers (`kernels/get_rows.cu`: q3_K, q8_0, f16, f32 rows dequantized to f32).

use super::{drv, Gpu, MatrixShape};
use crate::error::{check, KernelError};
use crate::types::WeightType;
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

impl Gpu {
    /// Embedding gather: `out[t*k ..][..k] = W[ids[t]]` for `t < ids.len()` from a table of
    /// `m.n` rows of `m.k` (Q3_K, Q8_0, F16, F32). Every id is checked against `m.n` here
    /// (`ids_host` is the host copy of `ids`).
    pub fn get_rows(
        &self,
        m: MatrixShape,
        w: &CudaView<'_, u8>,
        ids: &CudaView<'_, i32>,
        ids_host: &[i32],
        out: &mut CudaViewMut<'_, f32>,
    ) -> Result<(), KernelError> {
        const OP: &str = "get_rows";
        let MatrixShape { ty, n: n_rows, k } = m;
        let name = match ty {
            WeightType::Q3K => "q3_k_get_rows",
            WeightType::Q8_0 => "q8_0_get_rows",
            WeightType::F16 => "f16_get_rows",
            WeightType::F32 => "f32_get_rows",
            other => {
                return Err(KernelError::Shape {
                    op: OP,
                    what: format!("no gather kernel for {}", other.name()),
                })
            }
        };
        let row_bytes = ty.row_bytes(k).ok_or_else(|| KernelError::Shape {
            op: OP,
            what: format!("k = {k} not a block multiple"),
        })?;
        check(
            ids.len() == ids_host.len() && !ids_host.is_empty(),
            OP,
            || "ids and ids_host differ or are empty".into(),
        )?;
        if let Some((t, id)) = ids_host
            .iter()
            .enumerate()
            .find(|(_, &id)| id < 0 || id as usize >= n_rows)
        {
            return Err(KernelError::Shape {
                op: OP,
                what: format!("token {t}: id {id} outside 0..{n_rows}"),
            });
        }
        check(w.len() >= n_rows * row_bytes, OP, || {
            format!("weight has {} bytes, needs {}", w.len(), n_rows * row_bytes)
        })?;
        check(out.len() >= ids.len() * k, OP, || {
            format!("out has {}, needs {}", out.len(), ids.len() * k)
        })?;
        let f = self.func("get_rows", name)?;
        let (k_i, n_i) = (k as i32, n_rows as i32);
        let mut b = self.stream.launch_builder(f);
        b.arg(w).arg(ids).arg(out).arg(&k_i).arg(&n_i);
        // SAFETY: (w, ids, out, K, n_rows) as declared; lengths and ids checked.
        unsafe { b.launch(Self::cfg((ids.len() as u32, 1, 1), 256, 0)) }.map_err(drv(name))?;
        Ok(())
    }
}
