//! The mixers' output projections as one [`Backend`] op each (issue #23: launches per decode
//! token): the producer of a PN projection's rotated input (the attention merge with its gate,
//! the GDN gated norm) and the projection, so a backend can have the producer write the
//! matrix's converted input too; and the GDN's conv1d with its delta rule. Their argument
//! types and default implementations (the existing ops in sequence, so the CPU keeps its bits).

use super::mixer_ops::{AttnGateRot, GatedNormShape, RotatedOut};
use super::{Backend, ConvShape, GdnArgs};
use crate::error::ModelError;

/// The producer of a mixer's rotated output ([`Backend::mixer_out_matmul`]).
pub enum MixerOut<'a, B: Backend + ?Sized> {
    /// Attention of the query tokens, gated and rotated ([`Backend::attention_gate_hadamard`]).
    Attention(AttnGateRot<'a, B>),
    /// The GDN output norm of `x` gated by `z` (weights `w`), rotated
    /// ([`Backend::gated_rms_norm_hadamard`]; `x` unspecified afterwards).
    GatedNorm {
        /// Delta-rule output rows `[rows, Hv * dv]`.
        x: &'a mut B::Buf,
        /// Gate rows, alike.
        z: &'a B::Buf,
        /// Norm weights `[dv]`.
        w: &'a B::Buf,
        /// Shape of the norm and rotation.
        shape: GatedNormShape,
    },
}

/// The default [`Backend::mixer_out_matmul`]: the producer's op, then [`Backend::matmul`] of
/// its output.
pub(crate) fn mixer_out_matmul<B: Backend + ?Sized>(
    be: &B,
    src: MixerOut<'_, B>,
    o: RotatedOut<'_, B::Buf>,
    rows: usize,
    outs: &mut [(&B::Weight, &mut B::Buf)],
) -> Result<(), ModelError> {
    let out = match src {
        MixerOut::Attention(a) => {
            let RotatedOut { out, block } = o;
            be.attention_gate_hadamard(
                a,
                RotatedOut {
                    out: &mut *out,
                    block,
                },
            )?;
            out
        }
        MixerOut::GatedNorm { x, z, w, shape } => {
            be.gated_rms_norm_hadamard((x, z, w), &mut *o.out, shape)?;
            o.out
        }
    };
    be.matmul(out, rows, outs)
}

/// The conv1d input of one [`Backend::conv_gated_delta_rule`] call: `u` rows
/// `[n_tokens, channels]` through the causal conv (weights `w`, `[channels, kernel]`) + SiLU
/// over the rolling `state` (the last `kernel - 1` inputs, updated), into the delta rule's `y`.
pub struct ConvIn<'a, T> {
    /// Conv input rows.
    pub u: &'a T,
    /// Conv weights.
    pub w: &'a T,
    /// Conv state `[kernel - 1, channels]`, read and updated.
    pub state: &'a mut T,
    /// Channels and kernel length.
    pub shape: ConvShape,
}

/// The default [`Backend::conv_gated_delta_rule`]: [`Backend::conv1d_silu`] into `args.y`,
/// then [`Backend::gated_delta_rule`].
pub(crate) fn conv_gated_delta_rule<B: Backend + ?Sized>(
    be: &B,
    c: ConvIn<'_, B::Buf>,
    args: GdnArgs<'_, B::Buf>,
) -> Result<(), ModelError> {
    be.conv1d_silu(c.u, c.w, c.state, args.y, c.shape, args.n_tokens)?;
    be.gated_delta_rule(args)
}
