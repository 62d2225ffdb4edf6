//! The fused rotation producers (`Backend::rms_norm_hadamard`, `Backend::swiglu_hadamard`):
//! the CPU defaults against the separate ops, and the forward graph of the rotated PN3 demo model
//! calling them wherever a rotation directly follows a norm or SwiGLU (and nowhere the unrotated
//! value is still needed).

mod common;

use common::{Rot, Wrapped};
// `rnd(seed, n, scale)`, `bits(v)`: the kit's helpers under this file's short names.
use pn_tests::{argmax, data, f32_bits as bits, read_tokens, seeded_vec as rnd, tiny, DEMO};
use qwen_model::weights::Mixer;
use qwen_model::{Backend, CpuBackend, Model, Outputs};

/// The CPU backend's fused ops give the bits of the separate calls they replace, including rows
/// of zeros (the norm's `eps` path) and K a multiple of R larger than R.
#[test]
fn cpu_fused_ops_equal_the_separate_calls() {
    let be = CpuBackend::new(2);
    for (rows, n, block) in [(1, 64, 64), (3, 256, 2), (2, 2048, 1024), (5, 640, 128)] {
        let mut x = rnd(rows as u64, rows * n, 3.0);
        x[..n].fill(0.0);
        let w = rnd(7, n, 1.5);
        let mut fused = vec![f32::NAN; rows * n];
        be.rms_norm_hadamard(&x, &w, &mut fused, rows, n, 1e-6, block)
            .unwrap();
        let mut sep = vec![0.0; rows * n];
        be.rms_norm(&x, &w, &mut sep, rows, n, 1e-6).unwrap();
        be.hadamard(&mut sep, rows * n, block).unwrap();
        assert_eq!(
            bits(&fused),
            bits(&sep),
            "rms_norm_hadamard {rows}x{n} R={block}"
        );
        assert!(fused[..n].iter().all(|v| *v == 0.0), "zero row stays zero");

        let len = rows * n;
        let (gate, up) = (rnd(11, len, 6.0), rnd(12, len, 3.0));
        let mut out = vec![f32::NAN; len];
        be.swiglu_hadamard(&gate, &up, &mut out, len, block)
            .unwrap();
        let mut sep = gate.clone();
        be.swiglu(&mut sep, &up, len).unwrap();
        be.hadamard(&mut sep, len, block).unwrap();
        assert_eq!(bits(&out), bits(&sep), "swiglu_hadamard {len} R={block}");
    }
}

/// The rotations one trunk forward of `rows` tokens must ask for, from the weights' `rotated`
/// flags: fused after the attention norm when any mixer input matrix is rotated (GDN mixes PN
/// and unquantized ones), after the FFN norm when gate or up is, after SwiGLU when down is;
/// separate where the input is no norm or SwiGLU output (attention/GDN output projections).
fn expected(m: &Model<Wrapped>, rows: usize, head_rows: usize, hidden: bool) -> Vec<Rot> {
    let c = &m.config;
    let block = c.rotation.expect("rotated model").block_size;
    let (d, f) = (c.hidden, c.ffn);
    let norm = |r: usize| Rot::Norm {
        rows: r,
        n: d,
        block,
    };
    let mut want = Vec::new();
    for l in &m.weights.layers {
        let (ins, out) = match &l.mixer {
            Mixer::Attention(a) => (vec![&a.q, &a.k, &a.v], &a.o),
            Mixer::DeltaNet(g) => (vec![&g.qkv, &g.gate, &g.beta, &g.alpha], &g.out),
        };
        if ins.iter().any(|m| m.rotated) {
            want.push(norm(rows));
        }
        if out.rotated {
            want.push(Rot::Plain {
                len: rows * out.cols,
                block,
            });
        }
        if l.ffn.gate.rotated || l.ffn.up.rotated {
            want.push(norm(rows));
        }
        if l.ffn.down.rotated {
            want.push(Rot::Swiglu {
                len: rows * f,
                block,
            });
        }
    }
    if m.weights.lm_head().rotated {
        want.push(if hidden {
            Rot::Plain {
                len: head_rows * d,
                block,
            }
        } else {
            norm(head_rows)
        });
    }
    want
}

/// The PN3 demo model (rotated, R = 64): every rotation that follows a norm or SwiGLU is fused,
/// with the right shapes, in prefill and decode; the LM head fuses only when the caller does not
/// ask for the normed hidden state; and the logits do not depend on which path the head took.
#[test]
fn rotated_demo_model_uses_the_fused_ops() {
    let be = Wrapped::new(CpuBackend::new(2));
    let m = Model::load(data(DEMO, "model-pn3.gguf"), be).expect("demo PN3 model");
    let (d, v) = (m.config.hidden, m.config.vocab);
    let tokens = read_tokens(&data(DEMO, "tokens_val.json"));
    let (prompt, next) = (&tokens[..9], &tokens[9..10]);
    let mut ws = m.new_workspace(16).unwrap();
    m.backend.take();

    // Prefill without the hidden state, then one decode step.
    let mut st = m.new_state(32).unwrap();
    let mut fused_logits = vec![0.0; v];
    m.forward(
        &mut st,
        &mut ws,
        prompt,
        Outputs::last_logits(&mut fused_logits),
    )
    .unwrap();
    let got = m.backend.take();
    let want = expected(&m, prompt.len(), 1, false);
    assert_eq!(got, want, "prefill rotations");
    let fused = got
        .iter()
        .filter(|r| !matches!(r, Rot::Plain { .. }))
        .count();
    eprintln!(
        "prefill of {} tokens: {fused} fused rotations, {} separate: {got:?}",
        prompt.len(),
        got.len() - fused
    );
    assert!(
        fused == 3 * m.config.n_layers,
        "{fused} fused rotations: the demo model (PN everywhere but GDN beta/alpha and the \
         head) should fuse both norms and the SwiGLU of each layer"
    );
    let mut step = vec![0.0; v];
    m.forward(&mut st, &mut ws, next, Outputs::last_logits(&mut step))
        .unwrap();
    assert_eq!(
        m.backend.take(),
        expected(&m, 1, 1, false),
        "decode rotations"
    );

    // The same prefill asking for the hidden state: the head norm is kept, rotated separately.
    let mut st2 = m.new_state(32).unwrap();
    let (mut logits, mut hidden) = (vec![0.0; v], vec![0.0; d]);
    let out = Outputs {
        logits: Some(&mut logits),
        hidden: Some(&mut hidden),
        all_rows: false,
        layer_residuals: None,
    };
    m.forward(&mut st2, &mut ws, prompt, out).unwrap();
    assert_eq!(m.backend.take(), expected(&m, prompt.len(), 1, true));
    assert_eq!(
        bits(&logits),
        bits(&fused_logits),
        "head: fused vs separate"
    );
    assert!(hidden.iter().any(|x| *x != 0.0), "hidden state written");

    // All rows (the perplexity path) through the fused head.
    let mut st3 = m.new_state(32).unwrap();
    let mut all = vec![0.0; prompt.len() * v];
    m.forward(&mut st3, &mut ws, prompt, Outputs::all_logits(&mut all))
        .unwrap();
    assert_eq!(
        m.backend.take(),
        expected(&m, prompt.len(), prompt.len(), false)
    );
    // A 9-row LM head may group its dot products differently from a 1-row one: close, not equal.
    let last = &all[(prompt.len() - 1) * v..];
    let diff = last
        .iter()
        .zip(&fused_logits)
        .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    // And where the prompt's rows before the last take int8 activations in the last-row pass
    // (`Backend::set_state_rows`; rows whose logits are read keep int16), the last row sees
    // their int8 rounding: ~1e-2 on these logits (measured 1.0e-2).
    let tol = if qwen_model::CpuBackend::state_rows_int8() {
        3e-2
    } else {
        1e-4
    };
    assert!(diff <= tol, "all-rows head vs last-row head: {diff}");
    assert_eq!(argmax(last), argmax(&fused_logits));
}

/// An unrotated model (tiny-qwen35, F16) asks for no rotation at all.
#[test]
fn unrotated_model_rotates_nothing() {
    let be = Wrapped::new(CpuBackend::new(2));
    let m = Model::load(tiny("model-f16.gguf"), be).expect("tiny model");
    let tokens = read_tokens(&tiny("tokens_a.json"));
    let mut ws = m.new_workspace(8).unwrap();
    let mut st = m.new_state(tokens.len()).unwrap();
    let mut logits = vec![0.0; m.config.vocab];
    m.forward(&mut st, &mut ws, &tokens, Outputs::last_logits(&mut logits))
        .unwrap();
    assert_eq!(m.backend.take(), Vec::<Rot>::new());
    assert!(logits.iter().all(|x| x.is_finite()));
}
