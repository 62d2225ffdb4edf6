//! The window definition of llama-perplexity, against positions worked out by hand.

use super::*;

#[test]
fn windows_are_llama_perplexitys() {
    // 10 tokens, -c 4: windows [0..4) and [4..8), tokens 8 and 9 dropped; rows 2..3 scored
    // (first = 4/2 = 2, last row 3 predicts nothing inside the window): row 2 predicts token 3
    // of each window.
    let w = Windows::new(10, 4, None, false).unwrap();
    assert_eq!(w.scored().collect::<Vec<_>>(), [(0, 2, 3), (1, 2, 7)]);
    // 13 tokens, -c 6: first = 3; rows 3 and 4 predict tokens 4, 5 and 10, 11.
    let w = Windows::new(13, 6, None, false).unwrap();
    assert_eq!(
        w.scored().collect::<Vec<_>>(),
        [(0, 3, 4), (0, 4, 5), (1, 3, 10), (1, 4, 11)]
    );
    assert_eq!(w.rows_per_chunk(), 2);
    // An odd window: -c 5 gives first = 2, rows 2, 3.
    let w = Windows::new(5, 5, None, false).unwrap();
    assert_eq!(w.scored().collect::<Vec<_>>(), [(0, 2, 3), (0, 3, 4)]);
    // --chunks caps the windows; --all-positions scores rows from 0.
    let w = Windows::new(13, 4, Some(1), true).unwrap();
    assert_eq!(
        w.scored().collect::<Vec<_>>(),
        [(0, 0, 1), (0, 1, 2), (0, 2, 3)]
    );
    assert!(Windows::new(3, 4, None, false)
        .unwrap_err()
        .contains("less than one window"));
    assert!(Windows::new(3, 1, None, false).is_err());
}

/// llama-perplexity's error bar: the standard error of the mean NLL, scaled by PPL.
#[test]
fn ppl_error_bar_is_the_standard_error() {
    let nlls = [1.0f64, 2.0, 3.0, 2.0];
    let e = Eval {
        nll: nlls.iter().sum(),
        nll2: nlls.iter().map(|x| x * x).sum(),
        count: nlls.len(),
        ..Eval::default()
    };
    let (ppl, err) = e.ppl();
    assert!((ppl - 2.0f64.exp()).abs() < 1e-12);
    // Population variance 0.5; sqrt(0.5 / 3) * e^2.
    assert!(
        (err - (0.5f64 / 3.0).sqrt() * 2.0f64.exp()).abs() < 1e-12,
        "{err}"
    );
}
