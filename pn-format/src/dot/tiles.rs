//! The tiled matrix-matrix product for many input rows (prompt chunks): `out[t][r] = dot(row r,
//! acts[t])` for 16 weight rows x 16 input rows at a time, on AMX tiles where the CPU has them.
//!
//! Numerics are those of the int16 decode path ([`PreparedI16`]), exactly per block: each int16
//! activation `q` is split into a signed high byte and an unsigned low byte (`q = 256 hi + lo`),
//! the codes (unsigned 3/4-bit) are multiplied with both bytes (`tdpbusd` for `hi`, `tdpbuud`
//! for `lo`), and `256 sum(n hi) + sum(n lo) - z sum(q)` is the same exact int32 block sum the
//! decode kernels form. Only the order of the f32 sum over blocks differs (by rounding).
//!
//! [`TileActs`] rearranges a set of prepared vectors once per call into the AMX "B" layout;
//! [`matmul_tiled`] then runs any number of row ranges against it (one per thread).

use super::{PreparedI16, MAX_ACTS};
use crate::error::PnError;
use crate::types::{PnType, BLOCK_BYTES};

/// Weight rows (and input rows) per tile: the AMX tile height.
pub const TILE: usize = 16;

/// Input rows at or above which [`matmul_tiled`] beats the fused multi-vector kernels
/// ([`super::matvec_multi`]) when AMX is available: the codes of a 16-row tile are unpacked
/// once and a tile of 16 input rows is computed at once, so a few rows waste most of it.
pub const TILED_ROWS_MIN: usize = MAX_ACTS + 1;

/// Int16-prepared activations of several input rows, in AMX tile order: per group of 16 input
/// rows and per block, the high and low bytes of `q` as `2S x 64`-byte tiles (`S` code pairs per
/// word; row `kk / 4` holds byte `kk % 4` of each of the 16 inputs at `4 n + kk % 4`).
#[derive(Clone, Debug)]
pub struct TileActs {
    ty: PnType,
    k: usize,
    n: usize,
    /// `[group][block][kk / 4][input 16][kk % 4]`, signed high bytes of `q`.
    pub(super) hi: Vec<i8>,
    /// The same layout, low bytes of `q`.
    pub(super) lo: Vec<u8>,
    /// `[group][block][input 16]` activation scales (0 for padding inputs).
    pub(super) sx: Vec<f32>,
    /// `[group][block][input 16]` `z * sum(q)` of the block (exact).
    pub(super) zq: Vec<i32>,
}

impl TileActs {
    /// Rearranges `acts` (all prepared for `ty` with one length `k`) into tile order.
    pub fn new(ty: PnType, acts: &[PreparedI16]) -> Result<Self, PnError> {
        let mut t = TileActs {
            ty,
            k: 0,
            n: 0,
            hi: Vec::new(),
            lo: Vec::new(),
            sx: Vec::new(),
            zq: Vec::new(),
        };
        t.update(acts)?;
        Ok(t)
    }

    /// Re-arranges for new vectors, reusing the buffers.
    pub fn update(&mut self, acts: &[PreparedI16]) -> Result<(), PnError> {
        let ty = self.ty;
        let k = acts.first().map_or(0, |a| a.k);
        for a in acts {
            if a.ty != ty {
                return Err(PnError::TypeMismatch {
                    prepared: a.ty,
                    weights: ty,
                });
            }
            if a.k != k {
                return Err(PnError::LengthMismatch {
                    what: "tiled activation length",
                    expected: k,
                    got: a.k,
                });
            }
        }
        let nb = super::check_k(ty, k)?;
        let bpw = ty.weights_per_block();
        let s = ty.pairs_per_word();
        let groups = acts.len().div_ceil(TILE);
        self.k = k;
        self.n = acts.len();
        let values = groups * nb * bpw * TILE;
        self.hi.clear();
        self.hi.resize(values, 0);
        self.lo.clear();
        self.lo.resize(values, 0);
        self.sx.clear();
        self.sx.resize(groups * nb * TILE, 0.0);
        self.zq.clear();
        self.zq.resize(groups * nb * TILE, 0);
        for (t, a) in acts.iter().enumerate() {
            let (g, n) = (t / TILE, t % TILE);
            for b in 0..nb {
                let gb = g * nb + b;
                self.sx[gb * TILE + n] = a.sx[b];
                self.zq[gb * TILE + n] = a.zq[b] as i32;
                // Position `kk = 16 j + l` of the block holds the code the unpacked word gives
                // in 16-bit lane `l` of pair `j` (`layout::i16_index` order).
                let src = &a.xq[(b >> 1) * s * 32 + (b & 1) * 16..];
                let dst = gb * bpw * TILE;
                for kk in 0..bpw {
                    let q = src[(kk / 16) * 32 + kk % 16];
                    let at = dst + (kk / 4) * 4 * TILE + 4 * n + kk % 4;
                    self.hi[at] = (q >> 8) as i8;
                    self.lo[at] = q as u8;
                }
            }
        }
        Ok(())
    }

    /// Input rows held.
    pub fn n_rows(&self) -> usize {
        self.n
    }

    /// The weight type these activations are for.
    pub fn ty(&self) -> PnType {
        self.ty
    }

    /// Blocks per row.
    fn nb(&self) -> usize {
        self.k / self.ty.weights_per_block()
    }
}

/// Whether [`matmul_tiled`] runs on AMX here: the CPU has AMX-TILE and AMX-INT8, the OS grants
/// this process the tile state, AVX-512BW is available and not capped away by
/// [`crate::ISA_ENV`], and `PN_AMX` is not `0` (for A/B runs). Cached after the first call.
pub fn amx_available() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        if matches!(std::env::var("PN_AMX").as_deref(), Ok("0")) {
            return false;
        }
        #[cfg(target_arch = "x86_64")]
        {
            crate::Isa::detect() >= crate::Isa::Avx512 && super::amx::request()
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// `outs[t][r] = dot(row r, acts[t])` for `rows` consecutive rows of `weights`, in 16 x 16
/// tiles on AMX when [`amx_available`], else with the portable reference (same arithmetic, slow:
/// callers use [`super::matvec_multi`] where AMX is missing). Single-threaded: callers split the
/// rows into ranges.
pub fn matmul_tiled(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    matmul_tiled_with(amx_available(), ty, weights, rows, acts, outs)
}

/// [`matmul_tiled`] with the kernel chosen: `amx` (taken only if [`amx_available`]) or the
/// portable reference.
pub fn matmul_tiled_with(
    amx: bool,
    ty: PnType,
    weights: &[u8],
    rows: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) -> Result<(), PnError> {
    if acts.ty != ty {
        return Err(PnError::TypeMismatch {
            prepared: acts.ty,
            weights: ty,
        });
    }
    if outs.len() != acts.n {
        return Err(PnError::LengthMismatch {
            what: "tiled outputs (one per input row)",
            expected: acts.n,
            got: outs.len(),
        });
    }
    if let Some(o) = outs.iter().find(|o| o.len() != rows) {
        return Err(PnError::LengthMismatch {
            what: "tiled output",
            expected: rows,
            got: o.len(),
        });
    }
    let nb = acts.nb();
    let expected = rows
        .checked_mul(nb * BLOCK_BYTES)
        .ok_or(PnError::LengthMismatch {
            what: "tiled weight bytes",
            expected: usize::MAX,
            got: weights.len(),
        })?;
    if weights.len() != expected {
        return Err(PnError::LengthMismatch {
            what: "tiled weight bytes",
            expected,
            got: weights.len(),
        });
    }
    if acts.n == 0 || rows == 0 {
        return Ok(());
    }
    if nb == 0 {
        outs.iter_mut().for_each(|o| o.fill(0.0));
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if amx && amx_available() {
        // SAFETY: AMX and AVX-512BW are available and the tile state granted (`amx_available`);
        // `weights` holds `rows` rows of `nb` blocks and `acts` was built for `nb` blocks of `ty`
        // (both checked above), every output holds `rows` values.
        unsafe { super::amx::matmul(ty, weights, rows, nb, acts, outs) };
        return Ok(());
    }
    let _ = amx;
    reference(ty, weights, rows, nb, acts, outs);
    Ok(())
}

/// The portable form of the AMX kernel's arithmetic: per block the exact int32 sum
/// `256 sum(n hi) + sum(n lo) - z sum(q)`, times `sx * d` in f32, summed over blocks in order.
fn reference(
    ty: PnType,
    weights: &[u8],
    rows: usize,
    nb: usize,
    acts: &TileActs,
    outs: &mut [&mut [f32]],
) {
    let bpw = ty.weights_per_block();
    let cpw = ty.codes_per_word();
    let mask = u32::from(ty.max_code());
    let rb = nb * BLOCK_BYTES;
    let mut codes = vec![0u8; bpw];
    for r in 0..rows {
        let row = &weights[r * rb..(r + 1) * rb];
        for (t, out) in outs.iter_mut().enumerate() {
            let (g, n) = (t / TILE, t % TILE);
            let mut total = 0.0f32;
            for (b, blk) in crate::block::blocks(ty, row)
                .into_iter()
                .flatten()
                .enumerate()
            {
                // Tile position `kk = 16 j + l`: word `l / 2`, half `l % 2`, pair `j`.
                for (kk, c) in codes.iter_mut().enumerate() {
                    let (j, l) = (kk / 16, kk % 16);
                    let e = (l / 2) * cpw + 2 * j + l % 2;
                    *c = ((blk.word(e / cpw) >> ty.code_shift(e % cpw)) & mask) as u8;
                }
                let gb = g * nb + b;
                let base = gb * bpw * TILE;
                let mut acc = 0i32;
                for (kk, &c) in codes.iter().enumerate() {
                    let at = base + (kk / 4) * 4 * TILE + 4 * n + kk % 4;
                    let q = 256 * i32::from(acts.hi[at]) + i32::from(acts.lo[at]);
                    acc += i32::from(c) * q;
                }
                let acc = acc - acts.zq[gb * TILE + n];
                total += blk.scale() * acts.sx[gb * TILE + n] * acc as f32;
            }
            out[r] = total;
        }
    }
}
