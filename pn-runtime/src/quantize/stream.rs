//! Layer-by-layer calibration: the statistics of layer `i`'s matrix inputs come from running
//! the calibration tokens through layers `0..i` *as already quantized*, so each layer's GPTQ
//! compensates the error the layers before it made (the error the quantized model will really
//! see), instead of matching the float model's activations.
//!
//! How a layer is run without a second forward graph: the model is bound once, then reduced to
//! one trunk layer whose "embedding table" is the residual stream itself, `[tokens, D]` f32,
//! and whose tokens are the row indices `0..tokens`. A forward with `layer_residuals` returns the
//! layer's output rows; each calibration chunk runs from an empty state (KV cache, recurrent
//! state), as the one-pass collection does. Per layer there are two passes: the float layer with
//! the observer collecting its inputs' statistics, then (after its tensors are encoded) the
//! quantized layer, whose output becomes the next layer's input.
//!
//! Memory: the residual table twice (`[tokens, D]` f32 in and out, plus the backend's copy of
//! the table) and one layer's statistics. At the 27B shapes with 16384 calibration tokens the
//! table is 16384 x 5120 x 4 B = 335 MB (about 1 GB for the three copies); the Gram matrices of
//! one layer are K = 5120 (the attention/GDN input and the FFN input: 2 x 210 MB), the mixer
//! output (6144: 302 MB) and `ffn_down`'s 17408 (2.42 GB), f64, about 3.1 GB, plus the factor of
//! one of them at a time (up to 3 x 2.42 GB while `ffn_down`'s is built: the damped copy, its
//! triangular inverse and the factor).

use super::calib::{CalibConfig, CalibStats};
use super::error::QuantizeError;
use gguf_io::GgmlType;
use qwen_model::cpu::MatmulObserver;
use qwen_model::weights::{LayerWeights, Matrix, Mixer};
use qwen_model::{Backend, CpuBackend, LayerKind, Model, Outputs, Rotation, WeightSource};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Progress of a streamed calibration: `(layer passes done, layer passes in all)`.
pub type StreamProgress<'a> = &'a (dyn Fn(usize, usize) + Sync);

/// The calibration tokens' residual stream, advanced one quantized layer at a time.
pub struct LayerStream {
    /// The bound model, reduced to the one layer being run (see the module docs).
    model: Model<CpuBackend>,
    /// The float layers not yet run, by layer index.
    float_layers: Vec<Option<LayerWeights<CpuBackend>>>,
    /// The kind of every trunk layer.
    kinds: Vec<LayerKind>,
    /// Hidden size `D`.
    hidden: usize,
    /// The length of every calibration chunk, in order.
    chunks: Vec<usize>,
    /// The residual entering layer `layer` (or layer 0 before the first), `[tokens, D]`.
    resid: Vec<f32>,
    /// The layer whose statistics are current (its float weights are in `model`).
    layer: Option<usize>,
    /// The statistics of the current layer's inputs.
    stats: CalibStats,
    /// Encoded PN tensors of the current layer: name -> (type, bytes).
    encoded: HashMap<String, (GgmlType, Vec<u8>)>,
    /// Where the observer accumulates (`None`: not collecting).
    sink: Arc<Mutex<Option<CalibStats>>>,
    /// What to collect.
    cfg: CalibConfig,
    /// The rotation of the PN tensors swapped in.
    rotation: Option<usize>,
    /// The model file (for errors).
    path: PathBuf,
}

impl LayerStream {
    /// Binds the model at `model` on the CPU and embeds `tokens` (split into chunks as
    /// [`super::calib::collect`] does). `rotation` is the Hadamard block of the PN tensors that
    /// will be swapped in.
    pub fn open(
        model: &Path,
        tokens: &[u32],
        cfg: &CalibConfig,
        rotation: Option<usize>,
    ) -> Result<LayerStream, QuantizeError> {
        let err = |why: String| QuantizeError::Calibration {
            path: model.to_path_buf(),
            why,
        };
        let chunks = super::calib::split_chunks(tokens, cfg)
            .ok_or_else(|| err("no calibration tokens".into()))?;
        let threads = if cfg.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            cfg.threads
        };
        let sink: Arc<Mutex<Option<CalibStats>>> = Arc::new(Mutex::new(None));
        let s2 = Arc::clone(&sink);
        let observer: MatmulObserver =
            Arc::new(move |names: &[&str], x: &[f32], rows: usize, k: usize| {
                let mut s = s2.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(s) = s.as_mut() {
                    s.observe(names, x, rows, k, threads);
                }
            });
        let mut backend = CpuBackend::new(threads);
        backend.set_matmul_observer(Some(observer));
        let mut m = Model::load(model, backend).map_err(|e| err(e.to_string()))?;
        let d = m.config.hidden;
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        // Layer 0's input: the embeddings of every calibration token, `[total, D]`.
        let mut resid = vec![0f32; total * d];
        let mut at = 0;
        for c in &chunks {
            let mut rows = vec![0f32; c.len() * d];
            m.backend
                .embed(&m.weights.token_embd.w, c, &mut rows)
                .map_err(|e| err(e.to_string()))?;
            resid[at * d..(at + c.len()) * d].copy_from_slice(&rows);
            at += c.len();
        }
        let kinds = m.config.layer_kinds.clone();
        let float_layers = std::mem::take(&mut m.weights.layers)
            .into_iter()
            .map(Some)
            .collect();
        m.weights.mtp = None;
        m.config.n_mtp = 0;
        m.config.n_layers = 1;
        m.config.rotation = rotation.map(|block_size| Rotation { block_size });
        Ok(LayerStream {
            model: m,
            float_layers,
            kinds,
            hidden: d,
            chunks: chunks.iter().map(|c| c.len()).collect(),
            resid,
            layer: None,
            stats: CalibStats::empty(cfg),
            encoded: HashMap::new(),
            sink,
            cfg: cfg.clone(),
            rotation,
            path: model.to_path_buf(),
        })
    }

    /// Trunk layers of the model.
    pub fn n_layers(&self) -> usize {
        self.kinds.len()
    }

    /// Calibration tokens.
    pub fn tokens(&self) -> usize {
        self.chunks.iter().sum()
    }

    /// The statistics of layer `layer`'s inputs, with every earlier layer quantized as
    /// [`record`](Self::record)ed (a layer with nothing recorded runs as float). Layers only go
    /// forward: asking for an earlier layer than the current one is an error.
    pub fn stats_for(
        &mut self,
        layer: usize,
        progress: StreamProgress<'_>,
        cancel: &AtomicBool,
    ) -> Result<&CalibStats, QuantizeError> {
        if layer >= self.n_layers() {
            return Err(self.err(format!(
                "layer {layer} of a model with {} layers",
                self.n_layers()
            )));
        }
        if let Some(cur) = self.layer {
            if layer < cur {
                return Err(self.err(format!(
                    "layer {layer} asked for after layer {cur} (tensors must come in layer order)"
                )));
            }
        }
        let passes = 2 * self.n_layers();
        while self.layer != Some(layer) {
            if let Some(cur) = self.layer {
                // The current layer is done: its quantized output is the next layer's input.
                self.swap_in_encoded()?;
                self.run_layer(false, cancel)?;
                progress(2 * cur + 2, passes);
            }
            let next = self.layer.map_or(0, |c| c + 1);
            let lw = self.float_layers[next]
                .take()
                .ok_or_else(|| self.err(format!("layer {next} was already run")))?;
            self.model.weights.layers = vec![lw];
            self.model.config.layer_kinds = vec![self.kinds[next]];
            self.layer = Some(next);
            self.encoded.clear();
            self.run_layer(true, cancel)?;
            progress(2 * next + 1, passes);
        }
        Ok(&self.stats)
    }

    /// Records the encoded bytes of PN tensor `name` of the current layer, to be swapped in
    /// before the next layer's input is computed.
    pub fn record(&mut self, name: &str, ty: GgmlType, bytes: Vec<u8>) {
        self.encoded.insert(name.to_string(), (ty, bytes));
    }

    fn err(&self, why: String) -> QuantizeError {
        QuantizeError::Calibration {
            path: self.path.clone(),
            why,
        }
    }

    /// Replaces the current layer's matrices that were recorded with their encoded bytes.
    fn swap_in_encoded(&mut self) -> Result<(), QuantizeError> {
        let rotation = self.rotation;
        let Some(lw) = self.model.weights.layers.first_mut() else {
            return Ok(());
        };
        let backend = &self.model.backend;
        for m in matrices_mut(lw) {
            let Some((ty, bytes)) = self.encoded.get(&m.name) else {
                continue;
            };
            let rotated = rotation.is_some() && qwen_model::weights::is_pn(*ty);
            let src = WeightSource {
                name: &m.name,
                ty: *ty,
                rows: m.rows,
                cols: m.cols,
                bytes,
                rotated,
                rotation_block: rotation.unwrap_or(0),
                file: None,
            };
            m.w = backend
                .load_weight(&src)
                .map_err(|e| QuantizeError::Calibration {
                    path: self.path.clone(),
                    why: format!("{}: {e}", m.name),
                })?;
            m.ty = *ty;
            m.rotated = rotated;
        }
        self.encoded.clear();
        Ok(())
    }

    /// Runs the current layer over every chunk of the residual stream. `collect`: the observer
    /// accumulates the layer's input statistics into `self.stats` (the residual is left as is);
    /// otherwise the layer's output replaces the residual.
    fn run_layer(&mut self, collect: bool, cancel: &AtomicBool) -> Result<(), QuantizeError> {
        let d = self.hidden;
        let n = self.resid.len() / d.max(1);
        let path = self.path.clone();
        let err = move |e: qwen_model::ModelError| QuantizeError::Calibration {
            path: path.clone(),
            why: e.to_string(),
        };
        // The table's bytes (GGUF F32 is little-endian), `[n, D]`; the backend copies them.
        let table: Vec<u8> = self.resid.iter().flat_map(|v| v.to_le_bytes()).collect();
        let src = WeightSource {
            name: "calibration.residual",
            ty: GgmlType::F32,
            rows: n,
            cols: d,
            bytes: &table,
            rotated: false,
            rotation_block: 0,
            file: None,
        };
        self.model.weights.token_embd = Matrix {
            w: self.model.backend.load_weight(&src).map_err(&err)?,
            name: "calibration.residual".into(),
            ty: GgmlType::F32,
            rows: n,
            cols: d,
            rotated: false,
        };
        drop(table);
        self.model.config.vocab = n;
        if collect {
            *self.sink.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(CalibStats::empty(&self.cfg));
        }
        // The layer's output rows `[n, D]` (only kept when not collecting).
        let mut out = if collect {
            Vec::new()
        } else {
            vec![0f32; n * d]
        };
        let mut start = 0;
        for &len in &self.chunks {
            if cancel.load(Ordering::Relaxed) {
                *self.sink.lock().unwrap_or_else(|e| e.into_inner()) = None;
                return Err(QuantizeError::Interrupted);
            }
            let ids: Vec<u32> = (start as u32..(start + len) as u32).collect();
            let mut state = self.model.new_state(len).map_err(&err)?;
            let mut ws = self.model.new_workspace(len.clamp(1, 64)).map_err(&err)?;
            // The residual before and after the one layer, `[2, len, D]`.
            let mut res = vec![0f32; 2 * len * d];
            self.model
                .forward(
                    &mut state,
                    &mut ws,
                    &ids,
                    Outputs {
                        layer_residuals: Some(&mut res),
                        ..Outputs::default()
                    },
                )
                .map_err(&err)?;
            if !collect {
                out[start * d..(start + len) * d].copy_from_slice(&res[len * d..]);
            }
            start += len;
        }
        if collect {
            let mut s = self
                .sink
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .unwrap_or_else(|| CalibStats::empty(&self.cfg));
            s.tokens = n;
            s.chunks = self.chunks.len();
            s.finish();
            self.stats = s;
        } else {
            self.resid = out;
        }
        Ok(())
    }
}

/// Every weight matrix of a layer.
fn matrices_mut<B: Backend>(l: &mut LayerWeights<B>) -> Vec<&mut Matrix<B>> {
    let mut v: Vec<&mut Matrix<B>> = match &mut l.mixer {
        Mixer::Attention(a) => vec![&mut a.q, &mut a.k, &mut a.v, &mut a.o],
        Mixer::DeltaNet(g) => vec![
            &mut g.qkv,
            &mut g.gate,
            &mut g.beta,
            &mut g.alpha,
            &mut g.out,
        ],
    };
    v.extend([&mut l.ffn.gate, &mut l.ffn.up, &mut l.ffn.down]);
    v
}

/// The trunk layer index of tensor `name` (`blk.N.*`), if it is one.
pub fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Streamed calibration visits layers in order, so the trunk tensors (`blk.N.*`) must come in
/// non-decreasing `N`. A file that interleaves them is reordered by layer (a stable sort, every
/// other tensor before the trunk); a file already in order, as llama.cpp's converter and `pn
/// convert` write them, is left exactly as it is.
pub fn order_by_layer<T>(tensors: &mut [T], name: impl Fn(&T) -> &str) {
    let layers: Vec<usize> = tensors.iter().filter_map(|t| layer_of(name(t))).collect();
    if layers.windows(2).all(|w| w[0] <= w[1]) {
        return;
    }
    tensors.sort_by_key(|t| layer_of(name(t)).map_or(0, |l| l + 1));
}
