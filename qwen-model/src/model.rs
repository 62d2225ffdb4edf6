//! The forward graph (trunk and MTP block), written once against [`Backend`]
//! (reference: `qwen38-architecture.md` sections 4 and 6).

use crate::backend::GdnRowScratch;
use crate::backend::{
    Backend, ConvShape, GateLayout, GdnArgs, GdnTrace, KvCacheType, Requirements, RopeLayout,
};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::state::{LayerState, State, StateTrace};
use crate::weights::{AttnWeights, GdnWeights, LayerWeights, Matrix, Mixer, Weights};
use gguf_io::GgufFile;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A loaded model: configuration, bound weights and the backend they live on.
pub struct Model<B: Backend> {
    /// Hyperparameters.
    pub config: ModelConfig,
    /// Bound weights.
    pub weights: Weights<B>,
    /// The backend.
    pub backend: B,
    file: Arc<GgufFile>,
    /// Trunk forward calls and rows since load (cost counters for tests and benchmarks).
    trunk_passes: AtomicU64,
    trunk_rows: AtomicU64,
}

/// Where one GDN layer of a traced pass records its states.
struct LayerTrace<'a, B: Backend> {
    conv: &'a mut B::Buf,
    ssm: &'a mut B::Buf,
    scratch: &'a mut GdnRowScratch<B::Buf>,
    /// Trace row of the first row of this chunk.
    row0: usize,
}

/// Scratch activations for up to `max_rows` tokens per call; reused across calls so decode
/// allocates nothing.
pub struct Workspace<B: Backend> {
    max_rows: usize,
    x: B::Buf,
    a: B::Buf,
    rot: B::Buf,
    qg: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    mix: B::Buf,
    u: B::Buf,
    y: B::Buf,
    z: B::Buf,
    b: B::Buf,
    al: B::Buf,
    o: B::Buf,
    gate: B::Buf,
    up: B::Buf,
    h: B::Buf,
    e: B::Buf,
    cat: B::Buf,
    logits: B::Buf,
}

impl<B: Backend> Workspace<B> {
    /// Tokens one internal step processes (longer inputs are split).
    pub fn max_rows(&self) -> usize {
        self.max_rows
    }
}

/// What a forward call returns to the host.
#[derive(Default)]
pub struct Outputs<'a> {
    /// Logits, `[n_out_rows, vocab]`.
    pub logits: Option<&'a mut [f32]>,
    /// Final normed hidden states (the LM-head input; the MTP block's `h`), `[n_out_rows, D]`.
    pub hidden: Option<&'a mut [f32]>,
    /// Every input token (`n_out_rows = n_tokens`) or only the last (`n_out_rows = 1`).
    pub all_rows: bool,
    /// Debugging: the residual stream of every input token before layer 0 (the embeddings) and
    /// after each trunk layer, `[n_layers + 1, n_tokens, D]` (the layout of the oracle's
    /// `hidden_a_layers.f32`); trunk forward only.
    pub layer_residuals: Option<&'a mut [f32]>,
}

impl<'a> Outputs<'a> {
    /// Logits of the last token only.
    pub fn last_logits(logits: &'a mut [f32]) -> Self {
        Outputs {
            logits: Some(logits),
            hidden: None,
            all_rows: false,
            layer_residuals: None,
        }
    }
    /// Logits of every token.
    pub fn all_logits(logits: &'a mut [f32]) -> Self {
        Outputs {
            logits: Some(logits),
            hidden: None,
            all_rows: true,
            layer_residuals: None,
        }
    }
}

/// `outs[i].1 = outs[i].0 x` for matrices sharing the input `x` (row length K), feeding rotated
/// matrices the Hadamard-rotated input (computed once into `rot`).
fn project<B: Backend, const N: usize>(
    be: &B,
    rot: &mut B::Buf,
    block: usize,
    x: &B::Buf,
    rows: usize,
    outs: [(&Matrix<B>, &mut B::Buf); N],
) -> Result<(), ModelError> {
    let k = outs[0].0.cols;
    let n_rot = outs.iter().filter(|(m, _)| m.rotated).count();
    if n_rot == 0 {
        let mut o = outs.map(|(m, b)| (&m.w, b));
        return be.matmul(x, rows, &mut o);
    }
    be.copy(x, 0, rot, 0, rows * k)?;
    be.hadamard(rot, rows * k, block)?;
    if n_rot == N {
        let mut o = outs.map(|(m, b)| (&m.w, b));
        return be.matmul(rot, rows, &mut o);
    }
    for (m, b) in outs {
        let src = if m.rotated { &*rot } else { x };
        be.matmul(src, rows, &mut [(&m.w, b)])?;
    }
    Ok(())
}

/// [`project`] of the RMSNorm of `x` (rows of `n`, weight `norm`), with the rotated input of the
/// rotated matrices produced by the fused [`Backend::rms_norm_hadamard`] straight from `x` into
/// `rot` (instead of a copy of the norm output rotated in place). The unrotated norm goes to
/// `normed` only when an unrotated matrix reads it.
#[allow(clippy::too_many_arguments)]
fn norm_project<B: Backend, const N: usize>(
    be: &B,
    x: &B::Buf,
    norm: &B::Buf,
    n: usize,
    eps: f32,
    normed: &mut B::Buf,
    rot: &mut B::Buf,
    block: usize,
    rows: usize,
    outs: [(&Matrix<B>, &mut B::Buf); N],
) -> Result<(), ModelError> {
    let n_rot = outs.iter().filter(|(m, _)| m.rotated).count();
    if n_rot == 0 {
        be.rms_norm(x, norm, normed, rows, n, eps)?;
        let mut o = outs.map(|(m, b)| (&m.w, b));
        return be.matmul(normed, rows, &mut o);
    }
    be.rms_norm_hadamard(x, norm, rot, rows, n, eps, block)?;
    if n_rot == N {
        let mut o = outs.map(|(m, b)| (&m.w, b));
        return be.matmul(rot, rows, &mut o);
    }
    // Mixed (GDN: PN qkv/gate, unquantized beta/alpha): the norm twice, both from `x`, costs
    // less than norm, copy and rotation, and gives the same bits.
    be.rms_norm(x, norm, normed, rows, n, eps)?;
    for (m, b) in outs {
        let src = if m.rotated { &*rot } else { &*normed };
        be.matmul(src, rows, &mut [(&m.w, b)])?;
    }
    Ok(())
}

impl<B: Backend> Model<B> {
    /// Opens and binds a GGUF file.
    pub fn load(path: impl AsRef<Path>, backend: B) -> Result<Model<B>, ModelError> {
        let file = Arc::new(GgufFile::open(path)?);
        Model::from_file(file, backend)
    }

    /// Binds an opened GGUF file.
    pub fn from_file(file: Arc<GgufFile>, backend: B) -> Result<Model<B>, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        // A head size the backend's kernels do not take fails here, before any upload.
        backend.supports(&Requirements::model(&config))?;
        let weights = Weights::load(&file, &config, &backend)?;
        Ok(Model {
            config,
            weights,
            backend,
            file,
            trunk_passes: AtomicU64::new(0),
            trunk_rows: AtomicU64::new(0),
        })
    }

    /// The GGUF file (metadata for tokenizer, chat template...).
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// Trunk forward calls ([`forward`](Self::forward), [`forward_traced`](Self::forward_traced))
    /// since the model was loaded.
    pub fn trunk_passes(&self) -> u64 {
        self.trunk_passes.load(Ordering::Relaxed)
    }

    /// Token rows the trunk has processed since the model was loaded.
    pub fn trunk_rows(&self) -> u64 {
        self.trunk_rows.load(Ordering::Relaxed)
    }

    /// A new empty sequence state holding up to `capacity` positions (f32 KV cache).
    pub fn new_state(&self, capacity: usize) -> Result<State<B>, ModelError> {
        State::new(&self.config, &self.backend, capacity)
    }

    /// A new empty sequence state with K and V caches of type `kv`.
    pub fn new_state_with_kv(
        &self,
        capacity: usize,
        kv: KvCacheType,
    ) -> Result<State<B>, ModelError> {
        State::with_kv_type(&self.config, &self.backend, capacity, kv)
    }

    /// A new empty sequence state with K and V caches of the given types (each f32, f16,
    /// q8_0 or q4_0; the quantized ones need a backend that supports them and a head dim that
    /// is a multiple of 32).
    pub fn new_state_with_kv_types(
        &self,
        capacity: usize,
        k: KvCacheType,
        v: KvCacheType,
    ) -> Result<State<B>, ModelError> {
        State::with_kv_types(&self.config, &self.backend, capacity, k, v)
    }

    /// A workspace for up to `max_rows` tokens per internal step (prefill chunk).
    pub fn new_workspace(&self, max_rows: usize) -> Result<Workspace<B>, ModelError> {
        let c = &self.config;
        let r = max_rows.max(1);
        let be = &self.backend;
        let d = c.hidden;
        let g = &c.gdn;
        let rot_k = [2 * d, c.ffn, c.attn_out_dim(), g.value_dim()]
            .into_iter()
            .max()
            .unwrap_or(d);
        Ok(Workspace {
            max_rows: r,
            x: be.alloc(r * d)?,
            a: be.alloc(r * d)?,
            rot: be.alloc(r * rot_k)?,
            qg: be.alloc(r * c.q_proj_dim())?,
            k: be.alloc(r * c.kv_dim())?,
            v: be.alloc(r * c.kv_dim())?,
            attn: be.alloc(r * c.attn_out_dim())?,
            mix: be.alloc(r * d)?,
            u: be.alloc(r * g.conv_dim())?,
            y: be.alloc(r * g.conv_dim())?,
            z: be.alloc(r * g.value_dim())?,
            b: be.alloc(r * g.n_v_heads)?,
            al: be.alloc(r * g.n_v_heads)?,
            o: be.alloc(r * g.value_dim())?,
            gate: be.alloc(r * c.ffn)?,
            up: be.alloc(r * c.ffn)?,
            h: be.alloc(r * d)?,
            e: be.alloc(r * d)?,
            cat: be.alloc(r * 2 * d)?,
            logits: be.alloc(r * c.vocab)?,
        })
    }

    fn rot_block(&self) -> usize {
        self.config.rotation.map_or(0, |r| r.block_size)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        let vocab = self.config.vocab;
        match tokens.iter().position(|&t| t as usize >= vocab) {
            Some(index) => Err(ModelError::TokenOutOfRange {
                token: tokens[index],
                index,
                vocab,
            }),
            None => Ok(()),
        }
    }

    fn check_outputs(&self, n_tokens: usize, out: &Outputs<'_>) -> Result<(), ModelError> {
        let rows = if out.all_rows { n_tokens } else { 1 };
        if let Some(l) = &out.logits {
            if l.len() != rows * self.config.vocab {
                return Err(ModelError::BadArgument(format!(
                    "logits buffer holds {} floats, expected {rows} x {}",
                    l.len(),
                    self.config.vocab
                )));
            }
        }
        if let Some(h) = &out.hidden {
            if h.len() != rows * self.config.hidden {
                return Err(ModelError::BadArgument(format!(
                    "hidden buffer holds {} floats, expected {rows} x {}",
                    h.len(),
                    self.config.hidden
                )));
            }
        }
        Ok(())
    }

    /// Runs the trunk over `tokens` (prefill when many, decode when one), appending them to
    /// `state`, and writes the requested outputs.
    pub fn forward(
        &self,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        tokens: &[u32],
        out: Outputs<'_>,
    ) -> Result<(), ModelError> {
        self.forward_impl(state, ws, tokens, out, None)
    }

    /// [`forward`](Self::forward) that also records the GDN state after every input row into
    /// `trace` (at most `trace.max_rows()` tokens), so [`State::restore_traced`] can roll the
    /// state back to any prefix of `tokens` without re-running it (speculative verification).
    ///
    /// Each recorded recurrent state has the bits of feeding the rows one at a time (see
    /// [`Backend::gated_delta_rule_traced`]), as plain decoding does; the conv states are
    /// copies of input rows and exact on every backend.
    pub fn forward_traced(
        &self,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        tokens: &[u32],
        out: Outputs<'_>,
        trace: &mut StateTrace<B>,
    ) -> Result<(), ModelError> {
        if tokens.len() > trace.max_rows() {
            return Err(ModelError::BadArgument(format!(
                "traced forward of {} tokens, the trace holds {}",
                tokens.len(),
                trace.max_rows()
            )));
        }
        if trace.layers.len() != self.config.n_layers {
            return Err(ModelError::BadArgument(
                "state trace does not match the model's layers".into(),
            ));
        }
        trace.rows = 0;
        trace.pos0 = state.pos;
        self.forward_impl(state, ws, tokens, out, Some(&mut *trace))?;
        trace.rows = tokens.len();
        Ok(())
    }

    fn forward_impl(
        &self,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        tokens: &[u32],
        mut out: Outputs<'_>,
        mut trace: Option<&mut StateTrace<B>>,
    ) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::BadArgument("no tokens".into()));
        }
        self.check_tokens(tokens)?;
        self.check_outputs(tokens.len(), &out)?;
        let needed = state.pos + tokens.len();
        if needed > state.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: state.capacity,
            });
        }
        let (d, v) = (self.config.hidden, self.config.vocab);
        let n_tok = tokens.len();
        if let Some(r) = &out.layer_residuals {
            if r.len() != (self.config.n_layers + 1) * n_tok * d {
                return Err(ModelError::BadArgument(format!(
                    "layer_residuals holds {} floats, expected ({} + 1) x {n_tok} x {d}",
                    r.len(),
                    self.config.n_layers
                )));
            }
        }
        self.trunk_passes.fetch_add(1, Ordering::Relaxed);
        self.trunk_rows
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        let mut done = 0;
        for chunk in tokens.chunks(ws.max_rows) {
            let rows = chunk.len();
            let pos0 = state.pos;
            self.backend
                .embed(&self.weights.token_embd.w, chunk, &mut ws.x)?;
            let mut save = |l: usize, x: &B::Buf| {
                if let Some(r) = out.layer_residuals.as_deref_mut() {
                    let at = (l * n_tok + done) * d;
                    self.backend.download(x, 0, &mut r[at..at + rows * d])?;
                }
                Ok::<(), ModelError>(())
            };
            save(0, &ws.x)?;
            for (l, (lw, ls)) in self
                .weights
                .layers
                .iter()
                .zip(state.layers.iter_mut())
                .enumerate()
            {
                let lt = trace.as_deref_mut().and_then(|t| {
                    let scratch = &mut t.scratch;
                    t.layers[l].as_mut().map(|(conv, ssm)| LayerTrace {
                        conv,
                        ssm,
                        scratch,
                        row0: done,
                    })
                });
                self.block(lw, ls, ws, rows, pos0, pos0, lt)?;
                save(l + 1, &ws.x)?;
            }
            state.pos += rows;
            let last = done + rows == tokens.len();
            if out.all_rows || last {
                let out_rows = if out.all_rows { rows } else { 1 };
                let first_out = if out.all_rows { done } else { 0 };
                self.head(
                    ws,
                    rows,
                    out.all_rows,
                    &self.weights.output_norm,
                    self.weights.lm_head(),
                    out.logits.is_some(),
                    out.hidden.is_some(),
                )?;
                if let Some(h) = out.hidden.as_deref_mut() {
                    self.backend.download(
                        &ws.h,
                        0,
                        &mut h[first_out * d..(first_out + out_rows) * d],
                    )?;
                }
                if let Some(l) = out.logits.as_deref_mut() {
                    self.backend.download(
                        &ws.logits,
                        0,
                        &mut l[first_out * v..(first_out + out_rows) * v],
                    )?;
                }
            }
            done += rows;
        }
        Ok(())
    }

    /// Final norm of the needed rows of `ws.x` into `ws.h` and (optionally) the LM head into
    /// `ws.logits`. Without `hidden` (the caller does not read `ws.h`) the norm and the LM head's
    /// input rotation may be fused, leaving `ws.h` unwritten.
    #[allow(clippy::too_many_arguments)]
    fn head(
        &self,
        ws: &mut Workspace<B>,
        rows: usize,
        all_rows: bool,
        norm: &B::Buf,
        head: &Matrix<B>,
        logits: bool,
        hidden: bool,
    ) -> Result<(), ModelError> {
        let (be, d, eps) = (&self.backend, self.config.hidden, self.config.rms_eps);
        let (src, n) = if all_rows {
            (&ws.x, rows)
        } else {
            be.copy(&ws.x, (rows - 1) * d, &mut ws.e, 0, d)?;
            (&ws.e, 1)
        };
        if logits && !hidden {
            return norm_project(
                be,
                src,
                norm,
                d,
                eps,
                &mut ws.h,
                &mut ws.rot,
                self.rot_block(),
                n,
                [(head, &mut ws.logits)],
            );
        }
        be.rms_norm(src, norm, &mut ws.h, n, d, eps)?;
        if logits {
            project(
                be,
                &mut ws.rot,
                self.rot_block(),
                &ws.h,
                n,
                [(head, &mut ws.logits)],
            )?;
        }
        Ok(())
    }

    /// One decoder block on the first `rows` rows of `ws.x` (a GDN layer records its states
    /// into `trace` when given one).
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        lw: &LayerWeights<B>,
        ls: &mut LayerState<B>,
        ws: &mut Workspace<B>,
        rows: usize,
        cache_pos0: usize,
        rope_pos0: usize,
        trace: Option<LayerTrace<'_, B>>,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let (d, eps, blk) = (c.hidden, c.rms_eps, self.rot_block());
        // The mixers start with their input projections of the attention norm of `ws.x`.
        let norm = &lw.attn_norm;
        match (&lw.mixer, ls) {
            (Mixer::Attention(aw), LayerState::Attention { k, v }) => {
                self.attention(aw, norm, k, v, ws, rows, cache_pos0, rope_pos0)?
            }
            (Mixer::DeltaNet(gw), LayerState::DeltaNet { conv, ssm }) => {
                self.deltanet(gw, norm, conv, ssm, ws, rows, trace)?
            }
            _ => {
                return Err(ModelError::BadArgument(
                    "state does not match the model's layers".into(),
                ))
            }
        }
        be.add(&mut ws.x, &ws.mix, rows * d)?;
        let f = &lw.ffn;
        norm_project(
            be,
            &ws.x,
            &lw.post_norm,
            d,
            eps,
            &mut ws.a,
            &mut ws.rot,
            blk,
            rows,
            [(&f.gate, &mut ws.gate), (&f.up, &mut ws.up)],
        )?;
        if f.down.rotated {
            // Nothing reads the unrotated SwiGLU output: one fused op straight into `rot`.
            be.swiglu_hadamard(&ws.gate, &ws.up, &mut ws.rot, rows * c.ffn, blk)?;
            be.matmul(&ws.rot, rows, &mut [(&f.down.w, &mut ws.mix)])?;
        } else {
            be.swiglu(&mut ws.gate, &ws.up, rows * c.ffn)?;
            project(
                be,
                &mut ws.rot,
                blk,
                &ws.gate,
                rows,
                [(&f.down, &mut ws.mix)],
            )?;
        }
        be.add(&mut ws.x, &ws.mix, rows * d)?;
        Ok(())
    }

    /// Gated full attention of `rms_norm(ws.x) * norm` -> `ws.mix`, appending K/V at
    /// `cache_pos0`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        aw: &AttnWeights<B>,
        norm: &B::Buf,
        kc: &mut B::KvBuf,
        vc: &mut B::KvBuf,
        ws: &mut Workspace<B>,
        rows: usize,
        cache_pos0: usize,
        rope_pos0: usize,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let (dh, eps, blk) = (c.head_dim, c.rms_eps, self.rot_block());
        let (hq, hkv, kv) = (c.n_q_heads, c.n_kv_heads, c.kv_dim());
        norm_project(
            be,
            &ws.x,
            norm,
            c.hidden,
            eps,
            &mut ws.a,
            &mut ws.rot,
            blk,
            rows,
            [(&aw.q, &mut ws.qg), (&aw.k, &mut ws.k), (&aw.v, &mut ws.v)],
        )?;
        // Per-head q/k RMSNorm, then RoPE on the first `rope_dims` dims (norm before rope).
        be.rms_norm_strided(&mut ws.qg, &aw.q_norm, dh, 2 * dh, rows * hq, eps)?;
        be.rms_norm_strided(&mut ws.k, &aw.k_norm, dh, dh, rows * hkv, eps)?;
        let q_rope = RopeLayout {
            n_heads: hq,
            head_stride: 2 * dh,
            token_stride: c.q_proj_dim(),
            n_rot: c.rope_dims,
        };
        let k_rope = RopeLayout {
            n_heads: hkv,
            head_stride: dh,
            token_stride: kv,
            n_rot: c.rope_dims,
        };
        be.rope(&mut ws.qg, &q_rope, rows, rope_pos0, c.rope_theta)?;
        be.rope(&mut ws.k, &k_rope, rows, rope_pos0, c.rope_theta)?;
        be.kv_write(&ws.k, kc, cache_pos0 * kv, rows * kv)?;
        be.kv_write(&ws.v, vc, cache_pos0 * kv, rows * kv)?;
        be.attention(
            &ws.qg,
            kc,
            vc,
            &mut ws.attn,
            &c.attn_layout(),
            cache_pos0..cache_pos0 + rows,
        )?;
        // Output gate: the second half of each head's q-projection slice, through a sigmoid.
        let gate = GateLayout {
            n_heads: hq,
            head_dim: dh,
            offset: dh,
            token_stride: c.q_proj_dim(),
            head_stride: 2 * dh,
        };
        be.sigmoid_gate(&mut ws.attn, &ws.qg, &gate, rows)?;
        project(be, &mut ws.rot, blk, &ws.attn, rows, [(&aw.o, &mut ws.mix)])
    }

    /// Gated DeltaNet of `rms_norm(ws.x) * norm` -> `ws.mix`, updating the conv and recurrent
    /// state.
    #[allow(clippy::too_many_arguments)]
    fn deltanet(
        &self,
        gw: &GdnWeights<B>,
        norm: &B::Buf,
        conv: &mut B::Buf,
        ssm: &mut B::Buf,
        ws: &mut Workspace<B>,
        rows: usize,
        mut trace: Option<LayerTrace<'_, B>>,
    ) -> Result<(), ModelError> {
        let (be, c) = (&self.backend, &self.config);
        let g = &c.gdn;
        let blk = self.rot_block();
        norm_project(
            be,
            &ws.x,
            norm,
            c.hidden,
            c.rms_eps,
            &mut ws.a,
            &mut ws.rot,
            blk,
            rows,
            [
                (&gw.qkv, &mut ws.u),
                (&gw.gate, &mut ws.z),
                (&gw.beta, &mut ws.b),
                (&gw.alpha, &mut ws.al),
            ],
        )?;
        if let Some(t) = &mut trace {
            // The conv state after row r is the last `kernel - 1` rows of [state ; u] up to
            // row r: copies taken before the conv shifts `u` into the state.
            let (cd, hist, cl) = (g.conv_dim(), g.conv_kernel - 1, g.conv_state_len());
            for r in 0..rows {
                let dst = (t.row0 + r) * cl;
                let from_old = hist.saturating_sub(r + 1);
                if from_old > 0 {
                    be.copy(conv, (r + 1) * cd, t.conv, dst, from_old * cd)?;
                }
                let first_u = (r + 1).saturating_sub(hist);
                be.copy(
                    &ws.u,
                    first_u * cd,
                    t.conv,
                    dst + from_old * cd,
                    (hist - from_old) * cd,
                )?;
            }
        }
        let shape = ConvShape {
            channels: g.conv_dim(),
            kernel: g.conv_kernel,
        };
        be.conv1d_silu(&ws.u, &gw.conv, conv, &mut ws.y, shape, rows)?;
        let args = GdnArgs {
            dims: g,
            n_tokens: rows,
            y: &mut ws.y,
            b: &mut ws.b,
            alpha: &mut ws.al,
            a: &gw.a,
            dt_bias: &gw.dt_bias,
            state: ssm,
            out: &mut ws.o,
        };
        match trace {
            None => be.gated_delta_rule(args)?,
            Some(t) => be.gated_delta_rule_traced(
                args,
                GdnTrace {
                    states: t.ssm,
                    row0: t.row0,
                    scratch: t.scratch,
                },
            )?,
        }
        be.gated_rms_norm(
            &mut ws.o,
            &ws.z,
            &gw.norm,
            rows * g.value_dim(),
            g.dv,
            c.rms_eps,
        )?;
        project(be, &mut ws.rot, blk, &ws.o, rows, [(&gw.out, &mut ws.mix)])
    }

    /// Runs the MTP block over rows `(tokens[i], hidden[i])`, appending them to the MTP KV cache
    /// (RoPE positions `rope_pos0..`), and writes its logits (and its own normed hidden state,
    /// the `h` of a chained draft step).
    ///
    /// Convention (vLLM / transformers): the row for token `x_{p+1}` takes the trunk's
    /// post-`output_norm` state `h_p` and sits at position `p + 1`; it predicts `x_{p+2}`.
    pub fn mtp_forward(
        &self,
        state: &mut State<B>,
        ws: &mut Workspace<B>,
        tokens: &[u32],
        hidden: &[f32],
        rope_pos0: usize,
        mut out: Outputs<'_>,
    ) -> Result<(), ModelError> {
        let mtp = self.weights.mtp.as_ref().ok_or(ModelError::NoMtp)?;
        let Some(mtp_state) = state.mtp.as_mut() else {
            return Err(ModelError::NoMtp);
        };
        let (be, c) = (&self.backend, &self.config);
        let (d, v, eps) = (c.hidden, c.vocab, c.rms_eps);
        if tokens.is_empty() || hidden.len() != tokens.len() * d {
            return Err(ModelError::BadArgument(format!(
                "MTP: {} tokens need {} hidden floats, got {}",
                tokens.len(),
                tokens.len() * d,
                hidden.len()
            )));
        }
        self.check_tokens(tokens)?;
        self.check_outputs(tokens.len(), &out)?;
        let needed = state.mtp_len + tokens.len();
        if needed > state.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: state.capacity,
            });
        }
        let embed = mtp.embed.as_ref().unwrap_or(&self.weights.token_embd);
        let head = mtp.head.as_ref().unwrap_or(self.weights.lm_head());
        let head_norm = mtp.head_norm.as_ref().unwrap_or(&self.weights.output_norm);
        let mut done = 0;
        for chunk in tokens.chunks(ws.max_rows) {
            let rows = chunk.len();
            be.embed(&embed.w, chunk, &mut ws.e)?;
            be.upload(&hidden[done * d..(done + rows) * d], &mut ws.h, 0)?;
            be.rms_norm(&ws.e, &mtp.enorm, &mut ws.a, rows, d, eps)?;
            be.rms_norm(&ws.h, &mtp.hnorm, &mut ws.mix, rows, d, eps)?;
            // eh_proj input: [enorm(embedding) ; hnorm(h)] per row (embedding first).
            for t in 0..rows {
                be.copy(&ws.a, t * d, &mut ws.cat, 2 * t * d, d)?;
                be.copy(&ws.mix, t * d, &mut ws.cat, 2 * t * d + d, d)?;
            }
            project(
                be,
                &mut ws.rot,
                self.rot_block(),
                &ws.cat,
                rows,
                [(&mtp.eh_proj, &mut ws.x)],
            )?;
            self.block(
                &mtp.block,
                mtp_state,
                ws,
                rows,
                state.mtp_len,
                rope_pos0 + done,
                None,
            )?;
            state.mtp_len += rows;
            let last = done + rows == tokens.len();
            if out.all_rows || last {
                let out_rows = if out.all_rows { rows } else { 1 };
                let first_out = if out.all_rows { done } else { 0 };
                self.head(
                    ws,
                    rows,
                    out.all_rows,
                    head_norm,
                    head,
                    out.logits.is_some(),
                    out.hidden.is_some(),
                )?;
                if let Some(h) = out.hidden.as_deref_mut() {
                    be.download(&ws.h, 0, &mut h[first_out * d..(first_out + out_rows) * d])?;
                }
                if let Some(l) = out.logits.as_deref_mut() {
                    be.download(
                        &ws.logits,
                        0,
                        &mut l[first_out * v..(first_out + out_rows) * v],
                    )?;
                }
            }
            done += rows;
        }
        Ok(())
    }
}
