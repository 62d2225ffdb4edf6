//! The `k` best logits of a row in the sampler's order, on the host: the reference of the
//! device top-k (`kernels/topk.cu`) and what [`Backend::top_k`](crate::Backend::top_k) does by
//! default (download the row, select here).

/// The largest `k` the device top-k takes (`TK_MAX` in `pn-kernels` `kernels/topk.cu`;
/// `pn_kernels::launch::TOP_K_MAX`, checked equal where the CUDA backend is built): a larger
/// `k` downloads the whole row, so decoding asks for at most this many candidates.
pub const DEVICE_TOP_K_MAX: usize = 64;

/// The `k` best `(id, logit)` of `logits`, best first: finite values only (NaN and +-inf never
/// take part, as in the sampler), higher logit first, equal logits to the lower id. Fewer than
/// `k` when fewer values are finite.
pub fn top_k_row(logits: &[f32], k: usize) -> Vec<(u32, f32)> {
    let by = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    let mut c: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, &v)| (i as u32, v))
        .collect();
    if k == 0 {
        return Vec::new();
    }
    if k < c.len() {
        c.select_nth_unstable_by(k - 1, by);
        c.truncate(k);
    }
    c.sort_unstable_by(by);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ties_go_to_the_lower_id_and_non_finite_values_never_count() {
        let x = [
            1.0,
            f32::NAN,
            3.0,
            f32::INFINITY,
            3.0,
            f32::NEG_INFINITY,
            2.0,
        ];
        assert_eq!(top_k_row(&x, 1), vec![(2, 3.0)]);
        assert_eq!(top_k_row(&x, 3), vec![(2, 3.0), (4, 3.0), (6, 2.0)]);
        assert_eq!(top_k_row(&x, 10).len(), 4);
        assert!(top_k_row(&[f32::NAN, f32::INFINITY], 2).is_empty());
        assert!(top_k_row(&x, 0).is_empty());
    }
}
