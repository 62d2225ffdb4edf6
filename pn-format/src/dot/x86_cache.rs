//! Which cache level the decode kernels prefetch weights into: L1, unless the activations they
//! reread for every row would then be evicted from it.
//!
//! A decode kernel reads each weight once but its activation vector once per row, so the
//! activations must stay in L1 while the weights stream past. Prefetching the weights into L1
//! (`prefetcht0`) is right while the activations and the prefetched window fit there together.
//! When they do not (the 27B `ffn_down`, K = 17408: 34.8 KB of int16 activations, on a core with
//! a 32 KB L1), every prefetched line evicts an activation line that the next row rereads from
//! L2, and each prefetch from DRAM also holds one of L1's few miss buffers for a whole DRAM
//! access. Prefetching into L2 instead (`prefetcht1`) leaves L1 to the activations (measured,
//! Zen 4, 32 KB L1, `pn_decode` DRAM ring, one thread, pn4t 5120 x 17408: AVX2 5.3-5.4 ms ->
//! 3.4-3.7, AVX-512 5.5 -> 4.5-4.9; pn3t 17408 x 5120, whose 10 KB of activations fit, was
//! slower with it: 2.77 -> 2.85-3.17).

use std::sync::OnceLock;

/// Where a kernel's weight prefetches go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PrefetchLevel {
    /// `prefetcht0`: the activations and the prefetch window fit in L1 together.
    L1,
    /// `prefetcht1`: they do not; L1 is left to the activations.
    L2,
}

/// The share of L1 that the activations and the prefetch window may fill before the prefetches
/// go to L2 (the rest holds the lines being multiplied, the stack and the per-block tables).
const L1_SHARE_NUM: usize = 7;
const L1_SHARE_DEN: usize = 8;

/// The level for a kernel that rereads `act_bytes` of activations per row and prefetches
/// `ahead` bytes ahead: `PN_PREFETCH_LEVEL=l1|l2` if set (for tuning on a new machine), else by
/// this CPU's L1 data cache size.
pub(super) fn prefetch_level(act_bytes: usize, ahead: usize) -> PrefetchLevel {
    forced_level().unwrap_or_else(|| level_for(l1d_bytes(), act_bytes, ahead))
}

/// `PN_PREFETCH_LEVEL` (read once).
fn forced_level() -> Option<PrefetchLevel> {
    static FORCED: OnceLock<Option<PrefetchLevel>> = OnceLock::new();
    *FORCED.get_or_init(|| match std::env::var("PN_PREFETCH_LEVEL").as_deref() {
        Ok("l1") => Some(PrefetchLevel::L1),
        Ok("l2") => Some(PrefetchLevel::L2),
        _ => None,
    })
}

/// The level for the int8 decode kernel (`x86_i8`): [`prefetch_level`]'s override if set, else
/// L2 on AMD cores whatever the activations' size, else [`prefetch_level`]'s rule. Its
/// activations (a third of the int16 ones, 6-14 KB at 27B shapes) fit in L1, yet on Zen 4 it
/// streamed weights from DRAM faster with `prefetcht1` (`pn_decode` DRAM ring, alternated: one
/// thread pn4t `ffn_down` 1.88-1.98 ms against 3.52-4.00, pn3t `ffn_up` 1.95-2.25 against
/// 2.10-2.42; two threads 1.35-1.94 against 1.92-2.63 and 1.01-1.29 against 1.11-1.73): the
/// faster kernel keeps more lines in flight than L1's miss buffers hold.
pub(super) fn int8_prefetch_level(act_bytes: usize, ahead: usize) -> PrefetchLevel {
    match forced_level() {
        Some(level) => level,
        None if super::x86::is_amd() => PrefetchLevel::L2,
        None => level_for(l1d_bytes(), act_bytes, ahead),
    }
}

/// The rule behind [`prefetch_level`], for an L1 data cache of `l1d` bytes.
fn level_for(l1d: usize, act_bytes: usize, ahead: usize) -> PrefetchLevel {
    if (act_bytes + ahead) * L1_SHARE_DEN <= l1d * L1_SHARE_NUM {
        PrefetchLevel::L1
    } else {
        PrefetchLevel::L2
    }
}

/// This core's L1 data cache in bytes, from CPUID (AMD's leaf 0x8000_0005, else the
/// deterministic cache parameters of leaf 4); 32 KiB if neither says.
pub(super) fn l1d_bytes() -> usize {
    static L1D: OnceLock<usize> = OnceLock::new();
    *L1D.get_or_init(|| amd_l1d().or_else(intel_l1d).unwrap_or(32 << 10))
}

fn amd_l1d() -> Option<usize> {
    use std::arch::x86_64::__cpuid;
    if !super::x86::is_amd() || __cpuid(0x8000_0000).eax < 0x8000_0005 {
        return None;
    }
    // ECX bits 31..24: the L1 data cache in KiB.
    let kib = (__cpuid(0x8000_0005).ecx >> 24) as usize;
    (kib > 0).then_some(kib << 10)
}

fn intel_l1d() -> Option<usize> {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    if __cpuid(0).eax < 4 {
        return None;
    }
    (0..16).find_map(|i| {
        let r = __cpuid_count(4, i);
        let (kind, level) = (r.eax & 0x1f, (r.eax >> 5) & 7);
        if kind == 0 {
            // No more caches: stop the search with nothing found.
            return Some(None);
        }
        (kind == 1 && level == 1).then(|| {
            let ways = (r.ebx >> 22) as usize + 1;
            let partitions = ((r.ebx >> 12) & 0x3ff) as usize + 1;
            let line = (r.ebx & 0xfff) as usize + 1;
            let sets = r.ecx as usize + 1;
            Some(ways * partitions * line * sets)
        })
    })?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_cpu_reports_a_plausible_l1() {
        let l1 = l1d_bytes();
        assert!((16 << 10..=256 << 10).contains(&l1), "L1d {l1} bytes");
    }

    #[test]
    fn activations_that_crowd_l1_send_prefetches_to_l2() {
        let k = 1 << 10;
        // The 27B shapes with AMD's 6 KiB window: pn3t's 10 KB of activations fit a 32 KB L1;
        // pn4t's `ffn_down` (34.8 KB) does not, but fits 7/8 of a 48 KB one (Zen 5), unless the
        // window grows.
        assert_eq!(level_for(32 * k, 10240, 6144), PrefetchLevel::L1);
        assert_eq!(level_for(32 * k, 34816, 6144), PrefetchLevel::L2);
        assert_eq!(level_for(48 * k, 34816, 6144), PrefetchLevel::L1);
        assert_eq!(level_for(48 * k, 34816, 12288), PrefetchLevel::L2);
        // The boundary itself is still L1.
        assert_eq!(level_for(32 * k, 28 * k - 2048, 2048), PrefetchLevel::L1);
        assert_eq!(level_for(32 * k, 28 * k - 2047, 2048), PrefetchLevel::L2);
    }
}
