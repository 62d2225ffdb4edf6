//! Comparing float vectors and logit rows.

/// Largest `|a - b|` over the pairs; a NaN difference counts as infinite, so a NaN never hides
/// behind `f32::max`. Panics when the lengths differ.
pub fn max_abs(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).fold(0.0, |m, (x, y)| {
        let d = (x - y).abs();
        if d.is_nan() {
            f32::INFINITY
        } else {
            m.max(d)
        }
    })
}

/// Index of the largest value (the first one on ties; 0 for an empty row).
pub fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Gap between the largest and the second largest value of a row.
pub fn top2_gap(row: &[f32]) -> f32 {
    let b = argmax(row);
    let second = row
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != b)
        .map(|(_, &v)| v)
        .fold(f32::NEG_INFINITY, f32::max);
    row[b] - second
}

/// Asserts every `vocab`-long row's argmax of `got` matches `want`'s, except rows where the
/// reference's top-2 gap is below `tie` (a numerical near-tie a small error may flip). Returns
/// the rows that differ; `what` names the comparison in the panic message.
pub fn assert_argmax(got: &[f32], want: &[f32], vocab: usize, tie: f32, what: &str) -> Vec<usize> {
    let mut flips = Vec::new();
    for (r, (g, w)) in got
        .chunks_exact(vocab)
        .zip(want.chunks_exact(vocab))
        .enumerate()
    {
        if argmax(g) != argmax(w) {
            assert!(
                top2_gap(w) < tie,
                "{what}: argmax differs at row {r} (reference gap {})",
                top2_gap(w)
            );
            flips.push(r);
        }
    }
    flips
}

/// The bit patterns of `v` (bit-exact comparisons that print readably and treat NaNs as equal
/// to themselves).
pub fn f32_bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_abs_sees_nan() {
        assert_eq!(max_abs(&[1.0, 2.0], &[1.5, 2.0]), 0.5);
        assert_eq!(max_abs(&[f32::NAN, 0.0], &[0.0, 0.0]), f32::INFINITY);
    }

    #[test]
    fn argmax_takes_the_first_of_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(top2_gap(&[1.0, 3.0, 2.5]), 0.5);
    }
}
