//! The fused rotation producers (`Backend::rms_norm_hadamard`, `Backend::swiglu_hadamard`):
//! the CPU defaults against the separate ops, and the forward graph of the rotated PN3 demo model
//! calling them wherever a rotation directly follows a norm or SwiGLU (and nowhere the unrotated
//! value is still needed).

mod common;

use common::{read_tokens, tiny};
use qwen_model::cpu::{CpuKv, CpuWeight};
use qwen_model::weights::Mixer;
use qwen_model::{
    AttnLayout, Backend, CpuBackend, GdnDims, KvType, Model, ModelError, Outputs, RopeLayout,
    WeightSource,
};
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use std::sync::Mutex;

fn rnd(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.random_range(-scale..scale)).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

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
        be.rms_norm_hadamard(&x, &w, &mut fused, rows, n, 1e-6, block);
        let mut sep = vec![0.0; rows * n];
        be.rms_norm(&x, &w, &mut sep, rows, n, 1e-6);
        be.hadamard(&mut sep, rows * n, block);
        assert_eq!(
            bits(&fused),
            bits(&sep),
            "rms_norm_hadamard {rows}x{n} R={block}"
        );
        assert!(fused[..n].iter().all(|v| *v == 0.0), "zero row stays zero");

        let len = rows * n;
        let (gate, up) = (rnd(11, len, 6.0), rnd(12, len, 3.0));
        let mut out = vec![f32::NAN; len];
        be.swiglu_hadamard(&gate, &up, &mut out, len, block);
        let mut sep = gate.clone();
        be.swiglu(&mut sep, &up, len);
        be.hadamard(&mut sep, len, block);
        assert_eq!(bits(&out), bits(&sep), "swiglu_hadamard {len} R={block}");
    }
}

/// One call the model made that rotates activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rot {
    /// A separate `hadamard` of `len` floats.
    Plain { len: usize, block: usize },
    /// `rms_norm_hadamard` of `rows` rows of `n`.
    Norm { rows: usize, n: usize, block: usize },
    /// `swiglu_hadamard` of `len` floats.
    Swiglu { len: usize, block: usize },
}

/// The CPU backend, logging every rotation the graph asks for.
struct Recording {
    inner: CpuBackend,
    log: Mutex<Vec<Rot>>,
}

impl Recording {
    fn take(&self) -> Vec<Rot> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }
    fn push(&self, r: Rot) {
        self.log.lock().unwrap().push(r);
    }
}

impl Backend for Recording {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;
    type KvBuf = CpuKv;

    fn name(&self) -> String {
        format!("recording {}", self.inner.name())
    }
    fn alloc(&self, len: usize) -> Result<Vec<f32>, ModelError> {
        self.inner.alloc(len)
    }
    fn upload(&self, src: &[f32], dst: &mut Vec<f32>, offset: usize) {
        self.inner.upload(src, dst, offset)
    }
    fn download(&self, src: &Vec<f32>, offset: usize, dst: &mut [f32]) {
        self.inner.download(src, offset, dst)
    }
    fn copy(&self, src: &Vec<f32>, so: usize, dst: &mut Vec<f32>, d_o: usize, len: usize) {
        self.inner.copy(src, so, dst, d_o, len)
    }
    fn zero(&self, buf: &mut Vec<f32>, len: usize) {
        self.inner.zero(buf, len)
    }
    fn alloc_kv(&self, len: usize, ty: KvType) -> Result<CpuKv, ModelError> {
        self.inner.alloc_kv(len, ty)
    }
    fn kv_write(&self, src: &Vec<f32>, dst: &mut CpuKv, dst_off: usize, len: usize) {
        self.inner.kv_write(src, dst, dst_off, len)
    }
    fn load_weight(&self, src: &WeightSource<'_>) -> Result<CpuWeight, ModelError> {
        self.inner.load_weight(src)
    }
    fn embed(&self, t: &CpuWeight, tokens: &[u32], out: &mut Vec<f32>) -> Result<(), ModelError> {
        self.inner.embed(t, tokens, out)
    }
    fn matmul(
        &self,
        x: &Vec<f32>,
        rows: usize,
        outs: &mut [(&CpuWeight, &mut Vec<f32>)],
    ) -> Result<(), ModelError> {
        self.inner.matmul(x, rows, outs)
    }
    fn hadamard(&self, x: &mut Vec<f32>, len: usize, block: usize) {
        self.push(Rot::Plain { len, block });
        self.inner.hadamard(x, len, block)
    }
    fn rms_norm(&self, x: &Vec<f32>, w: &Vec<f32>, o: &mut Vec<f32>, r: usize, n: usize, e: f32) {
        self.inner.rms_norm(x, w, o, r, n, e)
    }
    fn rms_norm_strided(
        &self,
        x: &mut Vec<f32>,
        w: &Vec<f32>,
        n: usize,
        s: usize,
        c: usize,
        e: f32,
    ) {
        self.inner.rms_norm_strided(x, w, n, s, c, e)
    }
    fn gated_rms_norm(
        &self,
        x: &mut Vec<f32>,
        z: &Vec<f32>,
        w: &Vec<f32>,
        l: usize,
        n: usize,
        e: f32,
    ) {
        self.inner.gated_rms_norm(x, z, w, l, n, e)
    }
    fn rope(&self, x: &mut Vec<f32>, l: &RopeLayout, n: usize, pos0: usize, theta: f32) {
        self.inner.rope(x, l, n, pos0, theta)
    }
    fn attention(
        &self,
        q: &Vec<f32>,
        k: &CpuKv,
        v: &CpuKv,
        out: &mut Vec<f32>,
        layout: &AttnLayout,
        n_tokens: usize,
        pos0: usize,
    ) {
        self.inner.attention(q, k, v, out, layout, n_tokens, pos0)
    }
    fn sigmoid_gate(
        &self,
        x: &mut Vec<f32>,
        gate: &Vec<f32>,
        n_tokens: usize,
        n_heads: usize,
        head_dim: usize,
        off: usize,
        ts: usize,
        hs: usize,
    ) {
        self.inner
            .sigmoid_gate(x, gate, n_tokens, n_heads, head_dim, off, ts, hs)
    }
    fn conv1d_silu(
        &self,
        u: &Vec<f32>,
        w: &Vec<f32>,
        state: &mut Vec<f32>,
        y: &mut Vec<f32>,
        n_tokens: usize,
        channels: usize,
        kernel: usize,
    ) {
        self.inner
            .conv1d_silu(u, w, state, y, n_tokens, channels, kernel)
    }
    fn gated_delta_rule(
        &self,
        y: &mut Vec<f32>,
        b: &mut Vec<f32>,
        alpha: &mut Vec<f32>,
        a: &Vec<f32>,
        dt_bias: &Vec<f32>,
        state: &mut Vec<f32>,
        out: &mut Vec<f32>,
        dims: &GdnDims,
        n_tokens: usize,
    ) {
        self.inner
            .gated_delta_rule(y, b, alpha, a, dt_bias, state, out, dims, n_tokens)
    }
    fn swiglu(&self, gate: &mut Vec<f32>, up: &Vec<f32>, len: usize) {
        self.inner.swiglu(gate, up, len)
    }
    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, len: usize) {
        self.inner.add(x, y, len)
    }
    fn rms_norm_hadamard(
        &self,
        x: &Vec<f32>,
        w: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
        n: usize,
        eps: f32,
        block: usize,
    ) {
        self.push(Rot::Norm { rows, n, block });
        self.inner.rms_norm_hadamard(x, w, out, rows, n, eps, block)
    }
    fn swiglu_hadamard(
        &self,
        gate: &Vec<f32>,
        up: &Vec<f32>,
        out: &mut Vec<f32>,
        len: usize,
        block: usize,
    ) {
        self.push(Rot::Swiglu { len, block });
        self.inner.swiglu_hadamard(gate, up, out, len, block)
    }
}

fn demo(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/demo-code-model")
        .join(name)
}

/// The rotations one trunk forward of `rows` tokens must ask for, from the weights' `rotated`
/// flags: fused after the attention norm when any mixer input matrix is rotated (GDN mixes PN
/// and unquantized ones), after the FFN norm when gate or up is, after SwiGLU when down is;
/// separate where the input is no norm or SwiGLU output (attention/GDN output projections).
fn expected(m: &Model<Recording>, rows: usize, head_rows: usize, hidden: bool) -> Vec<Rot> {
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
    let be = Recording {
        inner: CpuBackend::new(2),
        log: Mutex::new(Vec::new()),
    };
    let m = Model::load(demo("model-pn3.gguf"), be).expect("demo PN3 model");
    let (d, v) = (m.config.hidden, m.config.vocab);
    let tokens = read_tokens(&demo("tokens_val.json"));
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
    assert!(diff <= 1e-4, "all-rows head vs last-row head: {diff}");
}

/// An unrotated model (tiny-qwen35, F16) asks for no rotation at all.
#[test]
fn unrotated_model_rotates_nothing() {
    let be = Recording {
        inner: CpuBackend::new(2),
        log: Mutex::new(Vec::new()),
    };
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
