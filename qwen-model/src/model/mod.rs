//! The forward graph (trunk and MTP block), written once against [`Backend`]
//! (reference: `qwen38-architecture.md` sections 4 and 6).
//!
//! Layout: this module holds [`Model`] (binding, states, the trunk pass and the LM head),
//! `layers` one decoder block (attention and Gated DeltaNet mixers, FFN), `mtp` the MTP block
//! and `workspace` the scratch activations.

mod batch;
mod kept;
mod layers;
mod mtp;
mod workspace;

pub use batch::BatchSeq;
pub use mtp::MtpSeq;
pub use workspace::Workspace;

use crate::backend::{Backend, KvCacheType, Requirements};
use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::fused::{NormDest, NormIn, NormRot};
use crate::state::{State, StateTrace};
use crate::weights::{Matrix, Weights};
use batch::Seg;
use gguf_io::GgufFile;
use layers::project;
use std::path::Path;
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
    /// Whether row `t` of a call of `n_tok` tokens only feeds the state: nothing reads its
    /// logits or its residual stream (its hidden state feeds the MTP cache, which is state
    /// too). Such rows may take reduced-precision products ([`Backend::set_state_rows`]).
    ///
    /// [`Backend::set_state_rows`]: crate::Backend::set_state_rows
    pub(crate) fn state_only(&self, t: usize, n_tok: usize) -> bool {
        let logits = self.logits.is_some() && (self.all_rows || t + 1 == n_tok);
        !logits && self.layer_residuals.is_none()
    }

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

/// The final norm and LM head a pass ends with (the trunk's, or the MTP block's own).
struct Head<'a, B: Backend> {
    /// Final RMSNorm weight `[D]`.
    norm: &'a B::Buf,
    /// LM head `[V, D]`.
    matrix: &'a Matrix<B>,
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
        })
    }

    /// The GGUF file (metadata for tokenizer, chat template...).
    pub fn file(&self) -> &GgufFile {
        &self.file
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
        Workspace::new(&self.config, &self.backend, max_rows)
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
        self.check_call(state, tokens, &out)?;
        let n_tok = tokens.len();
        let mut done = 0;
        // A lone sequence is the one-sequence case of the batched pass, chunk by chunk.
        for chunk in tokens.chunks(ws.max_rows) {
            let mut segs = [Seg {
                state: &mut *state,
                tokens: chunk,
                out: &mut out,
                done,
                n_tok,
                trace: trace.as_deref_mut(),
            }];
            self.trunk_pass(ws, &mut segs)?;
            done += chunk.len();
        }
        Ok(())
    }

    /// What every forward checks before it runs `tokens` on `state` with outputs `out`.
    fn check_call(
        &self,
        state: &State<B>,
        tokens: &[u32],
        out: &Outputs<'_>,
    ) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::BadArgument("no tokens".into()));
        }
        if state.layers.len() != self.config.n_layers {
            return Err(ModelError::BadArgument(
                "state does not match the model's layers".into(),
            ));
        }
        self.check_tokens(tokens)?;
        self.check_outputs(tokens.len(), out)?;
        let needed = state.pos + tokens.len();
        if needed > state.capacity {
            return Err(ModelError::ContextFull {
                needed,
                capacity: state.capacity,
            });
        }
        let (d, n_tok) = (self.config.hidden, tokens.len());
        if let Some(r) = &out.layer_residuals {
            if r.len() != (self.config.n_layers + 1) * n_tok * d {
                return Err(ModelError::BadArgument(format!(
                    "layer_residuals holds {} floats, expected ({} + 1) x {n_tok} x {d}",
                    r.len(),
                    self.config.n_layers
                )));
            }
        }
        Ok(())
    }

    /// After the last block of a pass over the sequences `segs`: for each whose `out` wants
    /// outputs of these rows (every row, or the last of its call), the final norm and LM head
    /// over all the rows wanted at once (one pass over the head's weights), downloaded into
    /// each sequence's `out`. With `pending`, the last block's FFN output (`ws.mixer_out`) is
    /// still to be added to `ws.resid`: the final norm does it (one fused op) where it reads
    /// the residual rows in place. The residual rows are not read after the pass.
    fn emit(
        &self,
        ws: &mut Workspace<B>,
        head: &Head<'_, B>,
        segs: &mut [Seg<'_, '_, B>],
        pending: bool,
    ) -> Result<(), ModelError> {
        let (be, d, v, eps) = (
            &self.backend,
            self.config.hidden,
            self.config.vocab,
            self.config.rms_eps,
        );
        // The rows wanted, contiguous: the residual itself when they are its first rows (one
        // sequence), else gathered into `embed_rows` (`[n, D]`, n <= max_rows), the rows of
        // sequences that want logits first (the head runs over those `n_logit` rows only: a
        // batched prefill chunk that wants hidden states alone does not pay for it).
        let (mut n, mut n_logit, mut picks, mut first_src) = (0, 0, 0, 0);
        let (mut logits, mut hidden) = (false, false);
        // `keep_next_logits` applies to this pass only, whether it writes logits or not.
        let keep_asked = std::mem::take(&mut ws.keep_logits);
        for i in 0..segs.len() {
            if let Some((src, k, _)) = pick(segs, i) {
                (n, picks) = (n + k, picks + 1);
                first_src = if picks == 1 { src } else { first_src };
                logits |= segs[i].out.logits.is_some();
                hidden |= segs[i].out.hidden.is_some();
                if segs[i].out.logits.is_some() {
                    n_logit += k;
                }
            }
        }
        if picks == 0 {
            return Ok(());
        }
        let direct = picks == 1 && first_src == 0;
        if !direct {
            if pending {
                // The rows are gathered from the residual: its add first.
                be.add(
                    &mut ws.resid,
                    &ws.mixer_out,
                    batch::row0(segs, segs.len()) * d,
                )?;
            }
            let mut at = 0;
            for with_logits in [true, false] {
                for i in 0..segs.len() {
                    if segs[i].out.logits.is_some() != with_logits {
                        continue;
                    }
                    if let Some((src, k, _)) = pick(segs, i) {
                        be.copy(&ws.resid, src * d, &mut ws.embed_rows, at * d, k * d)?;
                        at += k;
                    }
                }
            }
        }
        // The norm's input: the residual rows in place (taking the pending add) or gathered.
        let src = match (direct, pending) {
            (true, true) => NormIn::AddFirst {
                x: &mut ws.resid,
                add: &ws.mixer_out,
            },
            (true, false) => NormIn::Plain(&ws.resid),
            (false, _) => NormIn::Plain(&ws.embed_rows),
        };
        if logits && !hidden {
            // Nobody reads `final_normed`: the norm and the head's input rotation may fuse.
            self.norm_project(
                src,
                head.norm,
                &mut ws.final_normed,
                &mut ws.rotated,
                n,
                [(head.matrix, &mut ws.logits)],
            )?;
        } else {
            let nr = NormRot {
                w: head.norm,
                rows: n,
                n: d,
                eps,
                block: self.rot_block(),
            };
            let normed = NormDest {
                buf: &mut ws.final_normed,
                outs: &mut [],
            };
            be.norm_matmul(src, &nr, None, Some(normed))?;
            if logits {
                project(
                    be,
                    &mut ws.rotated,
                    self.rot_block(),
                    &ws.final_normed,
                    n_logit,
                    [(head.matrix, &mut ws.logits)],
                )?;
            }
        }
        // Logits kept on the backend (`Workspace::keep_next_logits`): where each sequence's
        // rows sit instead of a download. Any pass with logits ends the previous kept rows.
        // Only whole calls are kept (a call with every row's logits split over chunks is
        // downloaded as usual, and nothing is kept).
        let whole =
            |s: &Seg<'_, '_, B>| !s.out.all_rows || (s.done == 0 && s.tokens.len() == s.n_tok);
        let keep = logits && keep_asked && segs.iter().all(whole);
        if logits {
            ws.kept_rows.clear();
            if keep {
                ws.kept_rows.resize(segs.len(), (NO_ROW, 0));
            }
        }
        // The rows in the gathered order (those with logits first).
        let mut at = 0;
        for with_logits in [true, false] {
            for i in 0..segs.len() {
                if segs[i].out.logits.is_some() != with_logits {
                    continue;
                }
                let Some((_, k, first)) = pick(segs, i) else {
                    continue;
                };
                let out = &mut *segs[i].out;
                if let Some(h) = out.hidden.as_deref_mut() {
                    be.download(&ws.final_normed, at * d, &mut h[first * d..(first + k) * d])?;
                }
                if let Some(l) = out.logits.as_deref_mut() {
                    if keep {
                        ws.kept_rows[i] = (at, k);
                    } else {
                        be.download(&ws.logits, at * v, &mut l[first * v..(first + k) * v])?;
                    }
                }
                at += k;
            }
        }
        Ok(())
    }
}

/// A sequence of the last pass with kept logits that wanted none ([`Workspace`]'s `kept_rows`).
const NO_ROW: usize = usize::MAX;

/// The output rows sequence `i` of a pass wants: `(first workspace row, rows, first row of
/// its outputs)` (every row of the pass, or the last row of its call), `None` for none.
fn pick<B: Backend>(segs: &[Seg<'_, '_, B>], i: usize) -> Option<(usize, usize, usize)> {
    let s = &segs[i];
    if s.out.logits.is_none() && s.out.hidden.is_none() {
        return None;
    }
    let (r0, rows) = (batch::row0(segs, i), s.tokens.len());
    if s.out.all_rows {
        Some((r0, rows, s.done))
    } else if s.done + rows == s.n_tok {
        Some((r0 + rows - 1, 1, 0))
    } else {
        None
    }
}
