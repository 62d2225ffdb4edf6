//! The grouped PN GEMV (`pn_gemv_h2p_group`) run by the SIMT emulator: matrices that share one
//! prepared x in one launch (the 27B FFN gate + up, attention q/k/v, GDN qkv + gate at K =
//! 5120, here with reduced row counts) give each matrix the bits of its own prepared launch,
//! with the single GEMV's costs: weight sectors 1.000x the minimum, every weight byte read once,
//! no shared-memory bank conflict.
mod common;

use common::*;
use pn_kernels::emu::{self, region, GroupMember, PnInput};
use pn_kernels::launch;

fn check_group(members: &[(u32, usize)], k: usize, rows_override: Option<usize>, seed: u64) {
    let mut r = rng(seed);
    let ws: Vec<Vec<u8>> = members
        .iter()
        .map(|&(bits, n)| random_pn_weights(&mut r, bits, n, k))
        .collect();
    let x = activation_like(&mut r, k);
    let (xh, e) = emu::pn_prepare_x(&x).unwrap();
    let g = launch::pn_group(members, k, rows_override).expect("groupable");
    let mut ys: Vec<Vec<f32>> = members.iter().map(|&(_, n)| vec![f32::NAN; n]).collect();
    let mut ms: Vec<GroupMember<'_>> = members
        .iter()
        .zip(&ws)
        .zip(ys.iter_mut())
        .map(|((&(bits, _), w), y)| GroupMember { bits, w, y })
        .collect();
    let s = emu::pn_gemv_group(&g, &mut ms, (&xh, e), k).unwrap();
    let what = format!("{members:?} k {k} rows/warp {rows_override:?}");
    for (i, &(bits, n)) in members.iter().enumerate() {
        let l = launch::pn_h2(bits, n, k, true, rows_override).unwrap();
        let mut want = vec![f32::NAN; n];
        emu::pn_gemv(&l, &ws[i], PnInput::Prepared(&xh, e), &mut want, n, k).unwrap();
        let bits_of = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits_of(&ys[i]),
            bits_of(&want),
            "{what}: member {i} ({})",
            l.kernel
        );
    }
    let total: usize = ws.iter().map(Vec::len).sum();
    assert_eq!(
        s.unique_bytes(region::WEIGHT),
        total as u64,
        "{what}: weight footprint"
    );
    assert_eq!(
        s.g_bytes[region::WEIGHT],
        total as u64,
        "{what}: weight bytes requested"
    );
    let ratio = s.sector_ratio(region::WEIGHT);
    assert!(
        ratio <= 1.1,
        "{what}: weight sectors {ratio:.3}x the minimum"
    );
    assert_eq!(s.smem_max_degree, 1.0, "{what}: bank conflict");
}

#[test]
fn grouped_gemv_equals_one_launch_per_matrix() {
    // pn3t gate + up (the FFN), pn4t/pn3t mixed (a promoted matrix), q/k/v-like row counts
    // that do not fill a block's rows.
    check_group(&[(3, 40), (3, 40)], 5120, None, 1);
    check_group(&[(4, 24), (3, 9), (3, 9)], 5120, None, 2);
    // Two rows per warp (the kernels of matrices from 4096 rows), four members.
    check_group(&[(3, 33), (4, 16), (3, 7), (4, 2)], 5120, Some(2), 3);
}

#[test]
fn grouping_refuses_what_one_launch_cannot_take() {
    // One member, five members, an odd block count (5120 + 80 = 65 pn3t blocks), mixed block
    // sizes (K where pn4t fits 8 warps but pn3t does not).
    assert!(launch::pn_group(&[(3, 8)], 5120, None).is_none());
    assert!(launch::pn_group(&[(3, 8); 5], 5120, None).is_none());
    assert!(launch::pn_group(&[(3, 8), (3, 8)], 5200, None).is_none());
    let g = launch::pn_group(&[(3, 8), (4, 8)], 5120, None).unwrap();
    assert_eq!(g.first, vec![0, 1, 2]);
    assert_eq!(g.kinds, vec![0, 2]);
}
