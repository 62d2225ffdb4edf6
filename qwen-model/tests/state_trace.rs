//! Traced multi-row forwards (`Model::forward_traced`, `State::restore_traced`): the GDN state
//! recorded after each row of one batched pass has the bits of feeding the rows one at a time,
//! and the traced pass gives the outputs of the plain one.

mod common;

use common::Wrapped;
// `bits(v)`: the kit's `f32_bits` under this file's short name.
use pn_tests::{argmax, data, f32_bits as bits, tiny, DEMO};
use qwen_model::{
    Backend, CpuBackend, GdnArgs, GdnDims, GdnRowScratch, GdnTrace, Model, Outputs, StateTrace,
};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

fn demo() -> PathBuf {
    data(DEMO, "model-pn3.gguf")
}

fn toks(n: usize, salt: u32, vocab: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 7919 + salt * 104_729 + 13) % vocab as u32)
        .collect()
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / (1.0 + x.abs().max(y.abs())))
        .fold(0.0, f32::max)
}

/// For a model file: prefill a prompt, run `batch` traced (workspace chunks of `ws_rows`), then
/// roll back to every prefix (longest first) and compare with a fresh state fed the prompt and
/// the prefix. Returns the restored states, `[k - 1]` for `k` rows kept.
///
/// The reference feeds the prefix in one call (the old rollback's replay) with the same
/// workspace. The CPU recurrence per row has the bits of the batched one, so the states are
/// bitwise equal wherever the last kept row went through a matmul of the same kind (one row or
/// several) in both: a one-row call rounds differently from a multi-row one, so a prefix whose
/// last chunk is a single row (k = 1 in one chunk) is only within rounding of the trace.
fn check_model(path: &PathBuf, ws_rows: usize) {
    // Every op delegated to the CPU backend (its traced delta rule included), with the
    // `embed` calls counted: one trunk pass embeds each of its workspace chunks once.
    let m = Model::load(path, Wrapped::delegating(CpuBackend::new(2))).expect("model");
    let (cfg, be, v) = (&m.config, &m.backend, m.config.vocab);
    let prompt = toks(9, 1, v);
    let batch = toks(6, 2, v);
    let m_rows = batch.len();
    let mut scratch = vec![0.0; v];
    // The prefix's rows ask for their logits, as the traced pass's do (rows nobody reads may
    // take the state-only rows' products, `Backend::set_state_rows`); the last row's are returned.
    let fresh = |ws: &mut qwen_model::Workspace<Wrapped>, k: usize| {
        let mut r = m.new_state(64).unwrap();
        let mut l = vec![0.0; k * v];
        m.forward(&mut r, ws, &prompt, Outputs::last_logits(&mut l[..v]))
            .unwrap();
        m.forward(&mut r, ws, &batch[..k], Outputs::all_logits(&mut l))
            .unwrap();
        (r, l[(k - 1) * v..].to_vec())
    };

    // Traced: the whole batch in one call.
    let mut ws = m.new_workspace(ws_rows).unwrap();
    let mut st = m.new_state(64).unwrap();
    m.forward(
        &mut st,
        &mut ws,
        &prompt,
        Outputs::last_logits(&mut scratch),
    )
    .unwrap();
    let mut trace = StateTrace::new(cfg, be, m_rows).unwrap();
    let mut got = vec![0.0; m_rows * v];
    let (passes, rows) = be.embeds();
    m.forward_traced(
        &mut st,
        &mut ws,
        &batch,
        Outputs::all_logits(&mut got),
        &mut trace,
    )
    .unwrap();
    let (passes_after, rows_after) = be.embeds();
    assert_eq!(
        passes_after,
        passes + m_rows.div_ceil(ws_rows) as u64,
        "one trunk pass (one embed per workspace chunk)"
    );
    assert_eq!(rows_after, rows + m_rows as u64);
    assert_eq!((trace.pos0(), trace.rows()), (prompt.len(), m_rows));

    // The untraced pass (same chunking) gives the same logits and final state.
    let mut plain = m.new_state(64).unwrap();
    m.forward(
        &mut plain,
        &mut ws,
        &prompt,
        Outputs::last_logits(&mut scratch),
    )
    .unwrap();
    let mut plain_logits = vec![0.0; m_rows * v];
    m.forward(
        &mut plain,
        &mut ws,
        &batch,
        Outputs::all_logits(&mut plain_logits),
    )
    .unwrap();
    assert_eq!(
        bits(&plain_logits),
        bits(&got),
        "{path:?}: traced vs plain logits"
    );
    assert_eq!(
        bits(&plain.recurrent_state(cfg, be).unwrap()),
        bits(&st.recurrent_state(cfg, be).unwrap()),
        "{path:?}: traced vs plain final state"
    );

    // Every prefix, longest first (a restore may only go back).
    for k in (1..=m_rows).rev() {
        st.restore_traced(cfg, be, &mut trace, k).unwrap();
        assert_eq!(st.pos(), prompt.len() + k);
        let s = st.recurrent_state(cfg, be).unwrap();
        let (want, _) = fresh(&mut ws, k);
        let want = want.recurrent_state(cfg, be).unwrap();
        // Whether row `row` of an `n`-row call sits alone in its workspace chunk.
        let single = |n: usize, row: usize| {
            ws_rows == 1 || (row / ws_rows == (n - 1) / ws_rows && n % ws_rows == 1)
        };
        if single(m_rows, k - 1) == single(k, k - 1) {
            assert_eq!(
                bits(&s),
                bits(&want),
                "{path:?}: state after {k} of {m_rows} rows"
            );
        } else {
            let d = max_rel_diff(&s, &want);
            assert!(d < 1e-3, "{path:?}: state after {k} rows off by {d}");
        }
    }
    // Going forward again, or to zero rows, is refused.
    assert!(st.restore_traced(cfg, be, &mut trace, 2).is_err());
    assert!(st.restore_traced(cfg, be, &mut trace, 0).is_err());

    // From the restored state (1 row kept) the next token's logits are those of a fresh state
    // fed the same 2 tokens, within rounding, with the same argmax.
    let mut l = vec![0.0; v];
    m.forward(&mut st, &mut ws, &batch[1..2], Outputs::last_logits(&mut l))
        .unwrap();
    let (_, want) = fresh(&mut ws, 2);
    assert!(max_rel_diff(&l, &want) < 1e-3, "{path:?}: after rollback");
    assert_eq!(argmax(&l), argmax(&want));

    // A batch longer than the trace is refused before anything runs.
    let pos = st.pos();
    let long = toks(m_rows + 1, 3, v);
    let mut out = vec![0.0; v];
    assert!(m
        .forward_traced(
            &mut st,
            &mut ws,
            &long,
            Outputs::last_logits(&mut out),
            &mut trace
        )
        .is_err());
    assert_eq!(st.pos(), pos);
}

#[test]
fn traced_rows_restore_to_the_prefix_states_tiny() {
    check_model(&tiny("model-f16.gguf"), 16);
    // Workspace chunks smaller than the batch: the trace rows continue across chunks.
    check_model(&tiny("model-f16.gguf"), 4);
}

#[test]
fn traced_rows_restore_to_the_prefix_states_demo() {
    check_model(&demo(), 16);
    check_model(&demo(), 3);
    check_model(&demo(), 1);
}

/// The CPU override of `gated_delta_rule_traced` gives what its trait default does: each row
/// through a one-row `gated_delta_rule` call, the state copied after it. 20 rows, where the
/// batched CPU call would take the chunked form (different bits).
#[test]
fn cpu_traced_delta_rule_equals_one_row_calls() {
    let d = GdnDims {
        n_k_heads: 2,
        n_v_heads: 4,
        dk: 16,
        dv: 8,
        conv_kernel: 4,
    };
    let n = 20;
    let mut r = rand::rngs::StdRng::seed_from_u64(5);
    let mut rnd =
        |len: usize, s: f32| -> Vec<f32> { (0..len).map(|_| r.random_range(-s..s)).collect() };
    let (y0, b0, al0) = (
        rnd(n * d.conv_dim(), 1.0),
        rnd(n * d.n_v_heads, 2.0),
        rnd(n * d.n_v_heads, 2.0),
    );
    let (a, dt) = (rnd(d.n_v_heads, 1.0), rnd(d.n_v_heads, 1.0));
    let s0 = rnd(d.state_len(), 0.5);
    let be = CpuBackend::new(2);

    let (mut y, mut b, mut al, mut s) = (y0.clone(), b0.clone(), al0.clone(), s0.clone());
    let mut out = vec![0.0; n * d.value_dim()];
    let mut trace = vec![f32::NAN; (n + 1) * d.state_len()];
    let mut scratch = GdnRowScratch::new(&be, &d).unwrap();
    be.gated_delta_rule_traced(
        GdnArgs {
            dims: &d,
            n_tokens: n,
            y: &mut y,
            b: &mut b,
            alpha: &mut al,
            a: &a,
            dt_bias: &dt,
            state: &mut s,
            out: &mut out,
        },
        GdnTrace {
            states: &mut trace,
            row0: 1,
            scratch: &mut scratch,
        },
    )
    .unwrap();

    let mut s1 = s0.clone();
    let (cd, hv, vd, sl) = (d.conv_dim(), d.n_v_heads, d.value_dim(), d.state_len());
    for t in 0..n {
        let mut yr = y0[t * cd..(t + 1) * cd].to_vec();
        let mut br = b0[t * hv..(t + 1) * hv].to_vec();
        let mut ar = al0[t * hv..(t + 1) * hv].to_vec();
        let mut o = vec![0.0; vd];
        be.gated_delta_rule(GdnArgs {
            dims: &d,
            n_tokens: 1,
            y: &mut yr,
            b: &mut br,
            alpha: &mut ar,
            a: &a,
            dt_bias: &dt,
            state: &mut s1,
            out: &mut o,
        })
        .unwrap();
        assert_eq!(bits(&out[t * vd..(t + 1) * vd]), bits(&o), "row {t} output");
        assert_eq!(
            bits(&trace[(t + 1) * sl..(t + 2) * sl]),
            bits(&s1),
            "row {t} state"
        );
    }
    assert_eq!(bits(&s), bits(&s1), "final state");
    assert!(
        trace[..sl].iter().all(|x| x.is_nan()),
        "rows before trace_row0 untouched"
    );
}

/// Prompt, then a traced batch of 5; returns the logits of the batch and the restored GDN
/// state of every prefix (longest first).
fn traced_states<B: Backend>(m: &Model<B>) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (cfg, be, v) = (&m.config, &m.backend, m.config.vocab);
    let (prompt, batch) = (toks(7, 4, v), toks(5, 5, v));
    let mut ws = m.new_workspace(16).unwrap();
    let mut st = m.new_state(32).unwrap();
    let mut l = vec![0.0; v];
    m.forward(&mut st, &mut ws, &prompt, Outputs::last_logits(&mut l))
        .unwrap();
    let mut trace = StateTrace::new(cfg, be, batch.len()).unwrap();
    let mut logits = vec![0.0; batch.len() * v];
    m.forward_traced(
        &mut st,
        &mut ws,
        &batch,
        Outputs::all_logits(&mut logits),
        &mut trace,
    )
    .unwrap();
    let states = (1..=batch.len())
        .rev()
        .map(|k| {
            st.restore_traced(cfg, be, &mut trace, k).unwrap();
            st.recurrent_state(cfg, be).unwrap()
        })
        .collect();
    (logits, states)
}

/// The trait default of `gated_delta_rule_traced` (row by row through the one-row op) and the
/// CPU override give the same logits and the same recorded states, bit for bit.
#[test]
fn trait_default_traced_pass_equals_the_cpu_override() {
    for path in [tiny("model-f16.gguf"), demo()] {
        let cpu = Model::load(&path, CpuBackend::new(2)).unwrap();
        let def = Model::load(&path, Wrapped::new(CpuBackend::new(2))).unwrap();
        let (l1, s1) = traced_states(&cpu);
        let (l2, s2) = traced_states(&def);
        assert_eq!(bits(&l1), bits(&l2), "{path:?}: logits");
        for (k, (a, b)) in s1.iter().zip(&s2).enumerate() {
            assert_eq!(bits(a), bits(b), "{path:?}: state {k}");
        }
    }
}
