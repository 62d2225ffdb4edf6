//! A growable buffer of plain numbers whose storage starts on a 64-byte (cache-line) boundary.
//!
//! The SIMD kernels read activations 64 bytes at a time. A `Vec` of `i16` or `f32` is only as
//! aligned as the allocator makes it (16 bytes with glibc, page + 16 for large buffers), so
//! every such load then straddles two cache lines, and a Zen 5 core serves those at half the
//! rate (measured: 16 independent 64-byte `vpdpwssd` loads, 7.3 cycles aligned, 14.3 cycles at
//! 2 bytes past a line). The fused multi-vector kernel, which loads one activation vector per
//! `vpdpwssd`, was bound by exactly that.

use std::fmt;
use std::ops::{Deref, DerefMut};

/// One cache line of storage (the allocation unit).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Numbers for which every bit pattern is a value and all-zero bytes are zero: the buffer may
/// view its zero-initialised lines as them.
///
/// # Safety
/// Implementors must be plain-old-data with no padding, size dividing 64, alignment <= 64.
pub(crate) unsafe trait Plain: Copy + Default + 'static {}
// SAFETY: primitive integers and floats have no padding and accept every bit pattern.
unsafe impl Plain for i16 {}
// SAFETY: as above.
unsafe impl Plain for i8 {}
// SAFETY: as above.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}

/// `len` values of `T` stored in whole, 64-byte aligned cache lines (the unused tail of the last
/// line is zero).
#[derive(Clone)]
pub(crate) struct AlignedVec<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

impl<T: Plain> AlignedVec<T> {
    const PER_LINE: usize = 64 / std::mem::size_of::<T>();

    /// An empty buffer (no allocation).
    pub(crate) const fn new() -> Self {
        AlignedVec {
            lines: Vec::new(),
            len: 0,
            _t: std::marker::PhantomData,
        }
    }

    /// Sets the length to `len`, every value zero (the allocation is reused when large enough).
    pub(crate) fn reset_zeroed(&mut self, len: usize) {
        self.lines.clear();
        self.lines
            .resize(len.div_ceil(Self::PER_LINE), Line([0; 64]));
        self.len = len;
    }
}

impl<T: Plain> Default for AlignedVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Plain> Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values of `T` (`reset_zeroed`), are aligned for
        // `T` (64 >= align_of::<T>()), and every bit pattern is a `T` (`Plain`).
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }
}

impl<T: Plain> DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

impl<T: Plain + fmt::Debug> fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_on_a_cache_line_holds_len_zeros_and_keeps_writes() {
        let mut v: AlignedVec<i16> = AlignedVec::new();
        assert!(v.is_empty());
        for len in [1usize, 31, 32, 33, 5000] {
            v.reset_zeroed(len);
            assert_eq!(v.len(), len);
            assert_eq!(v.as_ptr() as usize % 64, 0, "len {len}");
            assert!(v.iter().all(|&q| q == 0), "len {len}: not zeroed");
            v[len - 1] = -7;
            v[0] = 3;
            assert_eq!((v[0], v[len - 1]), (3, if len == 1 { 3 } else { -7 }));
        }
        // Re-zeroed on reset, even when shrinking into the old allocation.
        v.reset_zeroed(40);
        assert!(v.iter().all(|&q| q == 0));
        let mut f: AlignedVec<f32> = AlignedVec::default();
        f.reset_zeroed(17);
        assert_eq!(f.as_ptr() as usize % 64, 0);
        f[16] = 1.5;
        let g = f.clone();
        assert_eq!(g[16], 1.5);
        assert_eq!(g.as_ptr() as usize % 64, 0);
    }

    #[test]
    fn prepared_activations_are_cache_line_aligned() {
        use crate::dot::{PreparedI16, TileActs, TilePrecision};
        use crate::PnType;
        for ty in PnType::ALL {
            let x: Vec<f32> = (0..3 * ty.weights_per_block()).map(|i| i as f32).collect();
            let a = PreparedI16::new(ty, &x).unwrap();
            assert_eq!(a.xq.as_ptr() as usize % 64, 0, "{ty} PreparedI16");
            for precision in [TilePrecision::I16, TilePrecision::I8] {
                let t = TileActs::with_precision(ty, precision, &x, 1).unwrap();
                assert_eq!(t.hi.as_ptr() as usize % 64, 0, "{ty} {precision:?} hi");
                if precision == TilePrecision::I16 {
                    assert_eq!(t.lo.as_ptr() as usize % 64, 0, "{ty} lo");
                }
            }
        }
    }
}
