//! KV caches on the device: [`CudaKv`] (one variant per storage type), the one element-type
//! dispatch over it ([`with_kv!`], [`with_kv_pair!`]), and the cache writes and reads.

use super::{range_err, view, CudaBackend, CudaBuf, CudaError, HEAD_DIM};
use crate::KvCacheType;
use half::f16;
use pn_kernels::cudarc::driver::{CudaSlice, CudaView, DeviceRepr, ValidAsZeroBits};
use pn_kernels::{KvElem, KvLayout, KvStoreRows, Q4KvByte, Q8KvByte};

/// A KV cache buffer on the device (token-major rows of 256 values, as on the CPU); the `usize`
/// is the number of values it holds.
pub enum CudaKv {
    /// f32 elements.
    F32(CudaSlice<f32>, usize),
    /// f16 elements.
    F16(CudaSlice<f16>, usize),
    /// q8_0 blocks (34 bytes per 32 values), the CPU backend's q8_0 cache bit for bit.
    Q8_0(CudaSlice<Q8KvByte>, usize),
    /// q4_0 blocks (18 bytes per 32 values), the CPU backend's q4_0 cache bit for bit.
    Q4_0(CudaSlice<Q4KvByte>, usize),
}

/// Runs `$body` with `$s` bound to the typed device slice of the [`CudaKv`] `$kv` (and `$n` to
/// its value count): the one place the element types are matched, so a body generic over
/// [`KvStore`] is written once for every cache type.
macro_rules! with_kv {
    ($kv:expr, |$s:ident, $n:pat_param| $body:expr) => {
        match $kv {
            $crate::cuda::CudaKv::F32($s, $n) => $body,
            $crate::cuda::CudaKv::F16($s, $n) => $body,
            $crate::cuda::CudaKv::Q8_0($s, $n) => $body,
            $crate::cuda::CudaKv::Q4_0($s, $n) => $body,
        }
    };
}

/// [`with_kv!`] over a K and a V cache of one element type (`$kc`, `$vc`); caches of two
/// types evaluate `$mixed` with `$k`, `$v` bound to them instead.
macro_rules! with_kv_pair {
    ($kcache:expr, $vcache:expr, |$kc:ident, $vc:ident| $body:expr, |$k:ident, $v:ident| $mixed:expr) => {
        match ($kcache, $vcache) {
            ($crate::cuda::CudaKv::F32($kc, _), $crate::cuda::CudaKv::F32($vc, _)) => $body,
            ($crate::cuda::CudaKv::F16($kc, _), $crate::cuda::CudaKv::F16($vc, _)) => $body,
            ($crate::cuda::CudaKv::Q8_0($kc, _), $crate::cuda::CudaKv::Q8_0($vc, _)) => $body,
            ($crate::cuda::CudaKv::Q4_0($kc, _), $crate::cuda::CudaKv::Q4_0($vc, _)) => $body,
            ($k, $v) => $mixed,
        }
    };
}
pub(super) use with_kv_pair;

/// An element type of a device KV cache: a kernel element ([`KvElem`]) the backend can
/// allocate and read back as the CPU cache's bytes.
pub(super) trait KvStore: KvElem + DeviceRepr + ValidAsZeroBits + Sized {
    /// The cache type whose storage this element is.
    const TYPE: KvCacheType;
    /// The stored bytes of `v` (little-endian f32/f16 elements, or the q8_0/q4_0 block bytes).
    fn bytes(v: &[Self]) -> Vec<u8>;
}
impl KvStore for f32 {
    const TYPE: KvCacheType = KvCacheType::F32;
    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}
impl KvStore for f16 {
    const TYPE: KvCacheType = KvCacheType::F16;
    fn bytes(v: &[f16]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
}
impl KvStore for Q8KvByte {
    const TYPE: KvCacheType = KvCacheType::Q8_0;
    fn bytes(v: &[Q8KvByte]) -> Vec<u8> {
        v.iter().map(|b| b.0).collect()
    }
}
impl KvStore for Q4KvByte {
    const TYPE: KvCacheType = KvCacheType::Q4_0;
    fn bytes(v: &[Q4KvByte]) -> Vec<u8> {
        v.iter().map(|b| b.0).collect()
    }
}

/// Whether [`CudaBackend::try_kv_write_pair`] writes `len` values of K and of V at `dst_off`
/// into caches of `(values, type)` `k` and `v` in one launch: whole rows of [`HEAD_DIM`] that
/// fit both caches, of one storage type (else two writes). The launch counter asks the same.
pub(crate) fn kv_pair_fuses(
    dst_off: usize,
    len: usize,
    k: (usize, KvCacheType),
    v: (usize, KvCacheType),
) -> bool {
    let rows_ok = dst_off.is_multiple_of(HEAD_DIM) && len.is_multiple_of(HEAD_DIM);
    let fits = |values: usize| dst_off.checked_add(len).is_some_and(|e| e <= values);
    rows_ok && fits(k.0) && fits(v.0) && k.1 == v.1
}

/// The storage type of a typed cache slice (for [`with_kv!`] bodies).
fn type_of<T: KvStore>(_: &CudaSlice<T>) -> KvCacheType {
    T::TYPE
}

impl CudaKv {
    pub(super) fn len(&self) -> usize {
        with_kv!(self, |_s, n| *n)
    }

    /// Storage type.
    pub fn kv_type(&self) -> KvCacheType {
        with_kv!(self, |s, _| type_of(s))
    }

    /// Device bytes the cache's values occupy.
    pub fn bytes(&self) -> usize {
        self.kv_type().bytes_for(self.len())
    }
}

impl CudaBackend {
    /// A zeroed cache of `len` values stored as `ty` (`len` whole blocks of the type).
    pub(super) fn try_alloc_kv(&self, len: usize, ty: KvCacheType) -> Result<CudaKv, CudaError> {
        let bytes = ty.bytes_for(len);
        Ok(match ty {
            KvCacheType::F32 => CudaKv::F32(self.alloc_zeros(len, "f32 KV cache")?, len),
            KvCacheType::F16 => CudaKv::F16(self.alloc_zeros(len, "f16 KV cache")?, len),
            KvCacheType::Q8_0 => CudaKv::Q8_0(self.alloc_zeros(bytes, "q8_0 KV cache")?, len),
            KvCacheType::Q4_0 => CudaKv::Q4_0(self.alloc_zeros(bytes, "q4_0 KV cache")?, len),
        })
    }

    /// Writes `len` values of `src` into the cache at value `dst_off`: f32 caches by a copy,
    /// the others by their store kernel.
    pub(super) fn try_kv_write(
        &self,
        src: &CudaBuf,
        dst: &mut CudaKv,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "kv_write";
        if len == 0 {
            return Ok(());
        }
        let cap = dst.len();
        if dst_off.checked_add(len).is_none_or(|e| e > cap) {
            return Err(range_err(OP, dst_off, len, cap));
        }
        let s = view(OP, src, 0, len)?;
        if let CudaKv::F32(d, _) = dst {
            // f32 rows are the values themselves: a copy, at any offset.
            let mut d = d
                .try_slice_mut(dst_off..dst_off + len)
                .ok_or_else(|| range_err(OP, dst_off, len, cap))?;
            return self
                .gpu
                .stream()
                .memcpy_dtod(&s, &mut d)
                .map_err(|e| CudaError::driver(OP, e));
        }
        with_kv!(dst, |d, _| self.kv_store_rows(&s, d, cap, dst_off, len))
    }

    /// [`crate::Backend::kv_write_pair`]: K into `kc` and V into `vc` at value `dst_off` by one
    /// store kernel (also for f32 caches); caches of two types, or writes not of whole rows of
    /// 256, take the two [`CudaBackend::try_kv_write`]s.
    pub(super) fn try_kv_write_pair(
        &self,
        (k, v): (&CudaBuf, &CudaBuf),
        (kc, vc): (&mut CudaKv, &mut CudaKv),
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "kv_write";
        if len == 0 {
            return Ok(());
        }
        let (k_at, v_at) = ((kc.len(), kc.kv_type()), (vc.len(), vc.kv_type()));
        if !kv_pair_fuses(dst_off, len, k_at, v_at) {
            self.try_kv_write(k, kc, dst_off, len)?;
            return self.try_kv_write(v, vc, dst_off, len);
        }
        let (ks, vs) = (view(OP, k, 0, len)?, view(OP, v, 0, len)?);
        with_kv_pair!(
            kc,
            vc,
            |kd, vd| self.kv_store_pair_rows(&ks, &vs, (kd, vd), dst_off, len),
            |_k, _v| unreachable!("the types were compared above")
        )
    }

    /// [`CudaBackend::kv_store_rows`] of K and V into their caches by one launch (the whole
    /// rows `dst_off / 256 ..` of both; checked by the caller to fit).
    fn kv_store_pair_rows<T: KvStore>(
        &self,
        k: &CudaView<'_, f32>,
        v: &CudaView<'_, f32>,
        (kc, vc): (&mut CudaSlice<T>, &mut CudaSlice<T>),
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "kv_write";
        let rows = len / HEAD_DIM;
        let (e0, n) = (dst_off / HEAD_DIM * T::ROW_ELEMS, rows * T::ROW_ELEMS);
        let (kn, vn) = (kc.len(), vc.len());
        let mut kd = kc
            .try_slice_mut(e0..e0 + n)
            .ok_or_else(|| range_err(OP, e0, n, kn))?;
        let mut vd = vc
            .try_slice_mut(e0..e0 + n)
            .ok_or_else(|| range_err(OP, e0, n, vn))?;
        let layout = KvLayout::token_major::<T>(1, rows);
        let store = KvStoreRows {
            tok_stride: HEAD_DIM,
            p0: 0,
            t_len: rows,
        };
        self.gpu.kv_store(k, v, &mut kd, &mut vd, layout, store)?;
        Ok(())
    }

    /// Converts `len` values of `src` into `dst` (a cache of `cap` values) at value `dst_off`
    /// with the store kernel of `T`. The kernel writes rows of 256 values (one head at one
    /// position); a contiguous range of whole rows is `len / 256` one-head "positions", stored
    /// into this one cache (nothing else is written).
    fn kv_store_rows<T: KvStore>(
        &self,
        src: &CudaView<'_, f32>,
        dst: &mut CudaSlice<T>,
        cap: usize,
        dst_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        const OP: &str = "kv_write";
        if !dst_off.is_multiple_of(HEAD_DIM) || !len.is_multiple_of(HEAD_DIM) {
            return Err(CudaError::Unsupported {
                op: OP,
                what: format!(
                    "{} cache writes need whole rows of {HEAD_DIM} (offset {dst_off}, \
                     length {len})",
                    T::TYPE
                ),
            });
        }
        let rows = len / HEAD_DIM;
        let (e0, n) = (dst_off / HEAD_DIM * T::ROW_ELEMS, rows * T::ROW_ELEMS);
        let mut d = dst
            .try_slice_mut(e0..e0 + n)
            .ok_or_else(|| range_err(OP, dst_off, len, cap))?;
        let layout = KvLayout::token_major::<T>(1, rows);
        let store = KvStoreRows {
            tok_stride: HEAD_DIM,
            p0: 0,
            t_len: rows,
        };
        self.gpu.kv_store_one(src, &mut d, layout, store)?;
        Ok(())
    }

    /// The stored bytes of a KV cache (little-endian f32/f16 elements, or the q8_0/q4_0 blocks,
    /// token-major as on the CPU), after every enqueued op; for tests and debugging.
    pub fn download_kv(&self, kv: &CudaKv) -> Result<Vec<u8>, CudaError> {
        const OP: &str = "download KV cache";
        let st = self.gpu.stream();
        let bytes = with_kv!(kv, |d, _| st.clone_dtoh(d).map(|v| KvStore::bytes(&v)));
        let mut bytes: Vec<u8> = bytes.map_err(|e| CudaError::driver(OP, e))?;
        self.synchronize()?;
        // Allocations keep at least one element; report exactly the cache's bytes.
        bytes.truncate(kv.bytes());
        Ok(bytes)
    }
}
