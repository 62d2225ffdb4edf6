//! The arguments of the fused producer-and-projection ops of [`Backend`]
//! ([`Backend::norm_matmul`], [`Backend::swiglu_hadamard_matmul`]) and their trait
//! defaults, composed of the unfused ops (so a backend that keeps the defaults, the CPU, gives the
//! bits it gave before). A backend overrides them to write the matrices' input and its
//! prepared copy in one kernel and run the matrices after it without a conversion launch.

use crate::{Backend, ModelError};

/// The input of a fused norm.
pub enum NormIn<'a, Buf> {
    /// Normalise these rows as they are.
    Plain(&'a Buf),
    /// First `x += add` (the residual stream: `x` keeps the sum), then normalise `x`.
    AddFirst {
        /// The residual rows (updated in place).
        x: &'a mut Buf,
        /// What is added to them (the mixer or FFN output).
        add: &'a Buf,
    },
}

impl<Buf> NormIn<'_, Buf> {
    /// The rows the norm reads (after the add).
    pub fn rows_buf(&self) -> &Buf {
        match self {
            NormIn::Plain(x) => x,
            NormIn::AddFirst { x, .. } => x,
        }
    }
}

/// The RMSNorm and rotation of a fused norm: `rows` rows of `n` floats, norm weight `w` (`n`
/// floats), rotation blocks of `block` (`n` a multiple of it).
#[derive(Clone, Copy)]
pub struct NormRot<'a, Buf> {
    /// Norm weight, `[n]`.
    pub w: &'a Buf,
    /// Rows.
    pub rows: usize,
    /// Row length.
    pub n: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Rotation block.
    pub block: usize,
}

/// One form of a fused norm's rows ([`Backend::norm_matmul`]) and the matrices that read it:
/// `buf` (`[rows, n]`), then `y = buf W^T` for every `(W, y)` of `outs` (none: the rows alone,
/// for a caller that reads them itself, as the final norm's hidden-state output).
pub struct NormDest<'a, 'b, Buf, W> {
    /// The normed rows, `[rows, n]`.
    pub buf: &'a mut Buf,
    /// The matrices reading them, each with its output rows.
    pub outs: &'a mut [(&'b W, &'b mut Buf)],
}

/// The SwiGLU and rotation of [`Backend::swiglu_hadamard_matmul`]: `rows` rows of `n` floats
/// of `gate` and `up` (`[rows, n]` each), rotation blocks of `block`.
#[derive(Clone, Copy)]
pub struct SwigluRot<'a, Buf> {
    /// Gate projection rows (left unchanged).
    pub gate: &'a Buf,
    /// Up projection rows.
    pub up: &'a Buf,
    /// Rows.
    pub rows: usize,
    /// Row length (the FFN width).
    pub n: usize,
    /// Rotation block.
    pub block: usize,
}

/// The trait default of [`Backend::norm_matmul`]: [`Backend::add`] (for
/// [`NormIn::AddFirst`]); for `rot`, [`Backend::rms_norm_hadamard`] into its rows and
/// [`Backend::matmul`] of them; for `plain`, [`Backend::rms_norm`] into its rows and
/// [`Backend::matmul`] of them (skipped without matrices). This is the order the graph ran
/// these ops in before they were one op, so a backend keeping the default keeps its bits.
pub fn norm_matmul_default<B: Backend + ?Sized>(
    be: &B,
    x: NormIn<'_, B::Buf>,
    norm: &NormRot<'_, B::Buf>,
    rot: Option<NormDest<'_, '_, B::Buf, B::Weight>>,
    plain: Option<NormDest<'_, '_, B::Buf, B::Weight>>,
) -> Result<(), ModelError> {
    let NormRot {
        w,
        rows,
        n,
        eps,
        block,
    } = *norm;
    let x: &B::Buf = match x {
        NormIn::Plain(x) => x,
        NormIn::AddFirst { x, add } => {
            be.add(x, add, rows * n)?;
            x
        }
    };
    if let Some(r) = rot {
        be.rms_norm_hadamard(x, w, r.buf, rows, n, eps, block)?;
        be.matmul(r.buf, rows, r.outs)?;
    }
    if let Some(p) = plain {
        be.rms_norm(x, w, p.buf, rows, n, eps)?;
        if !p.outs.is_empty() {
            be.matmul(p.buf, rows, p.outs)?;
        }
    }
    Ok(())
}

/// The trait default of [`Backend::swiglu_hadamard_matmul`]: [`Backend::swiglu_hadamard`]
/// into `out`, then [`Backend::matmul`] of `out` into `outs`.
pub fn swiglu_hadamard_matmul_default<B: Backend + ?Sized>(
    be: &B,
    s: &SwigluRot<'_, B::Buf>,
    out: &mut B::Buf,
    outs: &mut [(&B::Weight, &mut B::Buf)],
) -> Result<(), ModelError> {
    be.swiglu_hadamard(s.gate, s.up, out, s.rows * s.n, s.block)?;
    be.matmul(out, s.rows, outs)
}
