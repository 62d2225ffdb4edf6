//! Calibrated quantization on the demo model: `pn imatrix` (llama.cpp's two layouts, read back
//! identically; a wrong-model or damaged file is an error naming file and tensor), GPTQ's
//! Hessian-weighted error against the reference on held-out activations, and `pn quantize
//! --calib` output (valid, deterministic across thread counts, loads and runs, `pn.quantizer`
//! metadata; `--method ref` stays byte-identical to the default).
//!
//! Calibration text: `tests/data/demo-code-model/calib/` (training-split files, see its README).

use gguf_io::GgufFile;
use pn_format::gptq::{hessian_error, quantize_rows_gptq, GptqFactor};
use pn_runtime::quantize::calib::{collect, tokenize_file, CalibConfig, CalibStats};
use pn_runtime::quantize::imatrix::ImatrixData;
use pn_runtime::quantize::{plan, FallbackPolicy, Mix, RotationChoice};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

/// `pn quantize --damp`'s default. With a few thousand calibration tokens GPTQ's usual 0.01
/// overfits the calibration text on the demo (layer 0's `ffn_down` had more held-out error than
/// the reference at 4096 tokens; 0.1 wins on every tensor measured).
const CLI_DAMP: f64 = 0.1;

fn demo_f16() -> PathBuf {
    pn_tests::data(pn_tests::DEMO, "model-f16.gguf")
}

fn calib_text(name: &str) -> PathBuf {
    pn_tests::data_dir()
        .join(pn_tests::DEMO)
        .join("calib")
        .join(name)
}

fn pn(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(args)
        .output()
        .unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn imatrix_round_trips_in_both_layouts() {
    let d = pn_tests::scratch_dir("pn-imatrix-rt");
    let (g, l) = (d.join("demo.imatrix.gguf"), d.join("demo.imatrix.dat"));
    let text = calib_text("heapq.py.txt");
    for out in [&g, &l] {
        let o = pn(&[
            "imatrix",
            "-m",
            s(&demo_f16()),
            "-f",
            s(&text),
            "-o",
            s(out),
            "-c",
            "128",
            "--chunks",
            "3",
            "-t",
            "2",
            "--quiet",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(String::from_utf8_lossy(&o.stdout).contains("tokens/s"));
    }
    let gd = ImatrixData::read(&g).unwrap();
    // Every matrix input of the trunk, the LM head included, 3 chunks of 128 tokens.
    for name in [
        "blk.0.attn_qkv.weight",
        "blk.3.attn_q.weight",
        "blk.7.ffn_down.weight",
        "output.weight",
    ] {
        let e = &gd.entries[name];
        assert_eq!(e.counts, vec![384.0], "{name}");
        assert!(e.sums.iter().all(|&v| v >= 0.0) && e.sums.iter().any(|&v| v > 0.0));
    }
    assert_eq!(gd.entries["blk.0.ffn_down.weight"].k(), 896);
    assert_eq!((gd.chunk_count, gd.chunk_size), (3, 128));
    assert_eq!(gd.datasets, vec!["heapq.py.txt".to_string()]);
    // Exactly what the statistics were (written by pn, read back identically).
    let (tokens, _) = tokenize_file(&demo_f16(), &text, None).unwrap();
    let cfg = CalibConfig {
        ctx: 128,
        max_chunks: Some(3),
        threads: 2,
        rotation: None,
        gram: false,
        gram_only: None,
    };
    let st = collect(
        &demo_f16(),
        &tokens,
        &cfg,
        &|_, _| {},
        &AtomicBool::new(false),
    )
    .unwrap();
    assert_eq!(ImatrixData::from_stats(&st, "heapq.py.txt"), gd);
    // The legacy layout keeps the means.
    let ld = ImatrixData::read(&l).unwrap();
    let (gi, li) = (gd.importance(), ld.importance());
    assert_eq!(gi.len(), li.len());
    for (n, v) in &gi {
        for (a, b) in v.iter().zip(&li[n]) {
            assert!(
                (a - b).abs() <= 1e-6 * a.abs().max(1e-12),
                "{n}: {a} vs {b}"
            );
        }
    }

    // An imatrix of another model (tiny-qwen35: ffn_down K = 704) names file and tensor.
    let out = d.join("tiny.gguf");
    let o = pn(&[
        "quantize",
        "--imatrix",
        s(&g),
        "--quiet",
        s(&pn_tests::tiny("model-f16.gguf")),
        s(&out),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("demo.imatrix.gguf")
            && err.contains("blk.0.ffn_down.weight")
            && err.contains("704"),
        "{err}"
    );
    assert!(!out.exists());
    // A truncated file names the file.
    let bytes = std::fs::read(&g).unwrap();
    std::fs::write(&g, &bytes[..bytes.len() / 2]).unwrap();
    let e = ImatrixData::read(&g).unwrap_err().to_string();
    assert!(e.contains("demo.imatrix.gguf"), "{e}");
    let lb = std::fs::read(&l).unwrap();
    std::fs::write(&l, &lb[..lb.len() / 2]).unwrap();
    let e = ImatrixData::read(&l).unwrap_err().to_string();
    assert!(
        e.contains("demo.imatrix.dat") && e.contains("tensor "),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Rotated-basis statistics (with Gram matrices for `only`, or all) of `tokens` tokens of `text`.
fn rotated_stats(text: &str, tokens: usize, only: Option<Vec<String>>) -> CalibStats {
    let (t, _) = tokenize_file(&demo_f16(), &calib_text(text), Some(tokens)).unwrap();
    collect(
        &demo_f16(),
        &t,
        &rotated_cfg(only),
        &|_, _| {},
        &AtomicBool::new(false),
    )
    .unwrap()
}

/// Chunks of 256, two threads, Gram matrices (for `only`, or all) in the R = 64 rotated basis.
fn rotated_cfg(only: Option<Vec<String>>) -> CalibConfig {
    CalibConfig {
        ctx: 256,
        max_chunks: None,
        threads: 2,
        rotation: Some(64),
        gram: true,
        gram_only: only,
    }
}

/// For each named PN tensor (all of them with `names = None`): GPTQ (calibrated on heapq.py)
/// has less Hessian-weighted error than the reference on held-out activations (shlex.py).
fn gptq_beats_ref(names: Option<Vec<String>>, tokens: usize) -> usize {
    let f = GgufFile::open(demo_f16()).unwrap();
    let input = pn_runtime::quantize::source::InputModel::Gguf(Box::new(
        GgufFile::open(demo_f16()).unwrap(),
    ));
    let p = plan::make_plan(
        &input,
        &demo_f16(),
        &Mix::p0k19(),
        RotationChoice::Default,
        FallbackPolicy::Real,
    )
    .unwrap();
    assert_eq!(p.rotation, Some(64));
    let calib = rotated_stats("heapq.py.txt", tokens, names.clone());
    let held = rotated_stats("shlex.py.txt", tokens, names.clone());
    let mut checked = 0;
    for t in &p.tensors {
        let Some(ty) = t.encoder.target.pn() else {
            continue;
        };
        if names
            .as_ref()
            .is_some_and(|n| !n.iter().any(|x| x == t.name()))
        {
            continue;
        }
        let (Some(a), Some(b)) = (calib.get(t.name()), held.get(t.name())) else {
            continue; // token_embd: no matmul input
        };
        let k = t.encoder.k;
        let (ha, hb) = (a.gram.as_ref().unwrap(), b.gram.as_ref().unwrap());
        let rows = t.rows as usize;
        let view = f.tensor(t.name()).unwrap();
        let rb = view.bytes.len() / rows;
        let mut w = vec![0f32; rows * k];
        for (r, row) in w.chunks_exact_mut(k).enumerate() {
            gguf_io::quants::dequantize_row(t.in_ty, &view.bytes[r * rb..(r + 1) * rb], row)
                .unwrap();
            pn_format::fwht_blocks_inplace(row, 64).unwrap();
        }
        let decode = |q: &[u8]| {
            let orb = q.len() / rows;
            let mut d = vec![0f32; rows * k];
            for (src, dst) in q.chunks_exact(orb).zip(d.chunks_exact_mut(k)) {
                pn_format::validate_row(ty, src).unwrap();
                pn_format::dequantize_row(ty, src, dst).unwrap();
            }
            d
        };
        let qref: Vec<u8> = w
            .chunks_exact(k)
            .flat_map(|r| pn_format::quantize_row_ref(ty, r).unwrap())
            .collect();
        let fac = GptqFactor::new(ha, k, CLI_DAMP).unwrap();
        let mut qg = vec![0u8; qref.len()];
        quantize_rows_gptq(ty, &fac, &w, &mut qg).unwrap();
        let er = hessian_error(hb, k, &w, &decode(&qref));
        let eg = hessian_error(hb, k, &w, &decode(&qg));
        eprintln!(
            "{:<28} {ty} ref {er:.4e} gptq {eg:.4e} ({:.3})",
            t.name(),
            eg / er
        );
        assert!(eg < er, "{}: gptq {eg} >= ref {er}", t.name());
        checked += 1;
    }
    checked
}

#[test]
fn gptq_has_less_hessian_error_than_ref_on_held_out_activations() {
    let names: Vec<String> = [
        "blk.0.attn_qkv.weight",
        "blk.3.attn_output.weight",
        "blk.6.ffn_up.weight",
    ]
    .map(String::from)
    .to_vec();
    // 2048 tokens keeps this fast; layer 0's ffn_down needs more (see CLI_DAMP) and is in the
    // ignored every-tensor test.
    assert_eq!(gptq_beats_ref(Some(names), 2048), 3);
}

/// Every PN tensor of the demo model (slow: `cargo test --release -p pn-runtime --test
/// quantize_calib -- --ignored`).
#[test]
#[ignore]
fn gptq_beats_ref_on_every_pn_tensor() {
    let n = gptq_beats_ref(None, 4096);
    assert!(n >= 50, "{n} tensors checked");
}

/// `pn quantize --quiet --force EXTRA.. demo OUT`; returns its standard output.
fn quantize_demo(out: &Path, extra: &[&str]) -> String {
    let model = demo_f16();
    let mut args = vec!["quantize", "--quiet", "--force"];
    args.extend_from_slice(extra);
    args.push(s(&model));
    args.push(s(out));
    let o = pn(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn quantize_with_calibration_is_valid_deterministic_and_runs() {
    let d = pn_tests::scratch_dir("pn-calib-q");
    let text = calib_text("heapq.py.txt");
    let text_s = text.to_str().unwrap().to_string();
    let calib = [
        "--calib",
        text_s.as_str(),
        "--calib-tokens",
        "1024",
        "--calib-ctx",
        "256",
    ];
    let (a, b) = (d.join("g2.gguf"), d.join("g1.gguf"));
    quantize_demo(&a, &[&calib[..], &["--threads", "2"]].concat());
    quantize_demo(&b, &[&calib[..], &["--threads", "1"]].concat());
    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    assert!(ba == bb, "the thread count changed the output");

    let f = GgufFile::open(&a).unwrap();
    assert_eq!(f.get_str("pn.quantizer.method").unwrap(), "gptq");
    assert_eq!(f.get_u64("pn.quantizer.calib_tokens").unwrap(), 1024);
    let hash = pn_runtime::quantize::calib::sha256_hex(&std::fs::read(&text).unwrap());
    assert_eq!(f.get_str("pn.quantizer.calib_sha256").unwrap(), hash);
    let mut pn_tensors = 0;
    for info in f.tensor_infos() {
        let ty = match info.ty {
            gguf_io::GgmlType::Pn3t => pn_format::PnType::Pn3t,
            gguf_io::GgmlType::Pn4t => pn_format::PnType::Pn4t,
            _ => continue,
        };
        pn_format::validate_row(ty, f.tensor(&info.name).unwrap().bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", info.name));
        pn_tensors += 1;
    }
    assert!(pn_tensors >= 55, "{pn_tensors}");

    // It loads and runs: finite logits that mostly agree with F16 on the validation tokens.
    let tokens: Vec<u32> =
        pn_runtime::quantize::eval::read_tokens(&pn_tests::data(pn_tests::DEMO, "tokens_val.json"))
            .unwrap();
    let (lq, vocab) = pn_runtime::quantize::eval::model_logits(&a, &tokens, 2).unwrap();
    let (lf, _) = pn_runtime::quantize::eval::model_logits(&demo_f16(), &tokens, 2).unwrap();
    assert!(lq.iter().all(|v| v.is_finite()));
    let kl = pn_runtime::quantize::eval::compare_logits(&lf, &lq, vocab, Some(&tokens));
    assert!(kl.top1 > 0.85 && kl.mean_kl < 0.05, "{kl:?}");

    // `--method ref` with calibration text is the default output, byte for byte.
    let (r1, r2) = (d.join("r1.gguf"), d.join("r2.gguf"));
    quantize_demo(&r1, &["--threads", "2"]);
    quantize_demo(
        &r2,
        &[&calib[..], &["--method", "ref", "--threads", "2"]].concat(),
    );
    assert!(std::fs::read(&r1).unwrap() == std::fs::read(&r2).unwrap());
    assert!(GgufFile::open(&r1)
        .unwrap()
        .get_str("pn.quantizer.method")
        .is_err());
    std::fs::remove_dir_all(&d).unwrap();
}

/// The streamed calibration runs one layer at a time on the residual stream (the layer's
/// "embedding table" is the residual, see `quantize::stream`): with no layer quantized it must
/// see the same inputs as the one-pass collection over the whole float model, and once layer 0
/// is swapped for its reference-quantized bytes, layer 1's inputs must change (they come from the
/// quantized layer, not the float one).
#[test]
fn streamed_layers_match_one_pass_and_follow_the_quantized_layer() {
    use pn_runtime::quantize::stream::LayerStream;
    let (t, _) = tokenize_file(&demo_f16(), &calib_text("heapq.py.txt"), Some(512)).unwrap();
    let only: Vec<String> = ["blk.1.attn_qkv.weight", "blk.1.ffn_down.weight"]
        .map(String::from)
        .to_vec();
    let cfg = rotated_cfg(Some(only.clone()));
    let cancel = AtomicBool::new(false);
    let one = collect(&demo_f16(), &t, &cfg, &|_, _| {}, &cancel).unwrap();
    let rel = |a: &[f64], b: &[f64]| {
        let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
        let den: f64 = a.iter().map(|x| x * x).sum();
        (num / den).sqrt()
    };
    let gram = |s: &CalibStats, n: &str| s.get(n).unwrap().gram.clone().unwrap();

    let mut float = LayerStream::open(&demo_f16(), &t, &cfg, Some(64)).unwrap();
    assert_eq!((float.n_layers(), float.tokens()), (8, 512));
    let s1 = float.stats_for(1, &|_, _| {}, &cancel).unwrap();
    for n in &only {
        let e = rel(&gram(&one, n), &gram(s1, n));
        assert!(
            e < 1e-6,
            "{n}: streamed Gram differs from one pass by {e:e}"
        );
    }
    assert!(
        float.stats_for(0, &|_, _| {}, &cancel).is_err(),
        "layers only go forward"
    );

    // Layer 0's PN tensors as the reference quantizer writes them (rotated rows).
    let f = GgufFile::open(demo_f16()).unwrap();
    let mut quant = LayerStream::open(&demo_f16(), &t, &cfg, Some(64)).unwrap();
    quant.stats_for(0, &|_, _| {}, &cancel).unwrap();
    for (name, ty, g) in [
        (
            "blk.0.attn_qkv.weight",
            pn_format::PnType::Pn3t,
            gguf_io::GgmlType::Pn3t,
        ),
        (
            "blk.0.ffn_down.weight",
            pn_format::PnType::Pn4t,
            gguf_io::GgmlType::Pn4t,
        ),
    ] {
        let v = f.tensor(name).unwrap();
        let (k, rows) = (v.dims[0] as usize, v.dims[1] as usize);
        let rb = v.bytes.len() / rows;
        let mut bytes = Vec::new();
        let mut row = vec![0f32; k];
        for r in 0..rows {
            gguf_io::quants::dequantize_row(v.ty, &v.bytes[r * rb..(r + 1) * rb], &mut row)
                .unwrap();
            pn_format::fwht_blocks_inplace(&mut row, 64).unwrap();
            bytes.extend(pn_format::quantize_row_ref(ty, &row).unwrap());
        }
        quant.record(name, g, bytes);
    }
    let q1 = quant.stats_for(1, &|_, _| {}, &cancel).unwrap();
    let e = rel(&gram(&one, &only[0]), &gram(q1, &only[0]));
    // Quantization error shows, but it is a perturbation, not a different input.
    assert!(
        e > 1e-5 && e < 0.2,
        "layer 1 input after quantized layer 0: rel. change {e:e}"
    );
}

/// The byte budget of the same-size comparison, bytes per 2-D weight.
const SAME_SIZE_BUDGET: &str = "0.609";

/// The non-trunk tensors both mixes of the same-size comparison get: the K-quant mix's own
/// `output` (Q6_K) and `token_embd` (Q4_K), stored on the demo (K = 320) as F32 stand-ins
/// counted at the K-quant's nominal size in both files.
const SAME_SIZE_FIXED: [&str; 4] = [
    "--tensor-type",
    "output.weight=q6_K",
    "--tensor-type",
    "token_embd.weight=q4_K",
];

/// Model level, on the validation tokens (`tokens_val.json`, from `functools.py`, a validation
/// file; the calibration text is the training-split `heapq.py`), the same-size comparison made
/// fair: both mixes get the same `output` (Q6_K) and `token_embd` (Q4_K) stand-ins and the
/// same byte budget, nominal bytes for the stand-ins in both; the PN mix (`P0kK@B`) spends it up
/// pn3t -> pn4t -> Q5_K -> Q6_K -> Q8_0 (the K mix's upper rungs, stand-ins by the same rule),
/// the K-quant mix (`q3k-m@B`, llama.cpp's Q3_K_M recipe) up Q3_K ->
/// Q6_K, both ranked by the same imatrix-weighted error and every stock tensor
/// imatrix-weighted. PN with GPTQ beats PN with the reference quantizer and the K-quant mix on
/// mean KL against F16 and on top-1 agreement. Slow (an imatrix and three quantizations):
/// `cargo test --release -p pn-runtime --test quantize_calib -- --ignored --nocapture
/// model_level`.
#[test]
#[ignore]
fn gptq_beats_ref_and_same_size_q3k_m_imatrix_at_model_level() {
    let d = pn_tests::scratch_dir("pn-calib-kl");
    let text = calib_text("heapq.py.txt");
    let t = text.to_str().unwrap();
    let imat = d.join("imatrix.gguf");
    let o = pn(&[
        "imatrix",
        "-m",
        s(&demo_f16()),
        "-f",
        t,
        "-c",
        "512",
        "--chunks",
        "16",
        "-o",
        s(&imat),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pn_mix = format!("P0kK@{SAME_SIZE_BUDGET}");
    let k_mix = format!("q3k-m@{SAME_SIZE_BUDGET}");
    let mut pn_args = vec![
        "--mix",
        pn_mix.as_str(),
        "--kquant-fallback",
        "simulate",
        "--imatrix",
        s(&imat),
        "--threads",
        "2",
    ];
    pn_args.extend(SAME_SIZE_FIXED);
    let mut k_args = vec![
        "--mix",
        k_mix.as_str(),
        "--imatrix",
        s(&imat),
        "--threads",
        "2",
    ];
    k_args.extend(SAME_SIZE_FIXED);
    let runs: [(&str, Vec<&str>); 3] = [
        (
            "gptq",
            [&pn_args[..], &["--calib", t, "--calib-tokens", "8192"]].concat(),
        ),
        ("ref", pn_args.clone()),
        ("q3k", k_args),
    ];
    let tokens: Vec<u32> =
        pn_runtime::quantize::eval::read_tokens(&pn_tests::data(pn_tests::DEMO, "tokens_val.json"))
            .unwrap();
    let (lf, vocab) = pn_runtime::quantize::eval::model_logits(&demo_f16(), &tokens, 2).unwrap();
    let mut kl = Vec::new();
    for (name, extra) in &runs {
        let out = d.join(format!("{name}.gguf"));
        // Its size table counts the stand-ins at their nominal size.
        let table = quantize_demo(&out, extra);
        let (lq, _) = pn_runtime::quantize::eval::model_logits(&out, &tokens, 2).unwrap();
        let k = pn_runtime::quantize::eval::compare_logits(&lf, &lq, vocab, Some(&tokens));
        eprintln!(
            "{name}: mean KL {:.6} top-1 {:.4}\n{table}",
            k.mean_kl, k.top1
        );
        kl.push((out, k, table));
    }
    // Both sizes from each run's own size table (nominal bytes for the stand-ins).
    let size = |table: &str| -> f64 {
        let line = table
            .lines()
            .find(|l| l.starts_with("total (tensor data)"))
            .unwrap_or_else(|| panic!("no total line in {table}"));
        let nums: Vec<f64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        // n, weights, bytes, bpw: bytes per 2-D weight, with the vectors' few F32 bytes.
        nums[2] / nums[1]
    };
    let (sg, sq) = (size(&kl[0].2), size(&kl[2].2));
    let budget: f64 = SAME_SIZE_BUDGET.parse().unwrap();
    eprintln!("bytes per weight (all tensors, nominal): gptq {sg:.5} q3k {sq:.5}");
    assert!(
        (sg - sq).abs() < 0.005,
        "gptq {sg} q3k {sq}: not the same size"
    );
    assert!(sg < budget + 0.01 && sq < budget + 0.01, "{sg} {sq}");
    let (g, r, q) = (&kl[0].1, &kl[1].1, &kl[2].1);
    assert!(
        g.mean_kl < r.mean_kl && g.mean_kl < q.mean_kl,
        "gptq {g:?} ref {r:?} q3k-m {q:?}"
    );
    assert!(
        g.top1 >= r.top1 && g.top1 >= q.top1,
        "gptq {g:?} ref {r:?} q3k-m {q:?}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn layer_order_is_kept_when_sorted_and_restored_when_interleaved() {
    use pn_runtime::quantize::stream::{layer_of, order_by_layer};
    assert_eq!(layer_of("blk.12.ffn_up.weight"), Some(12));
    assert_eq!(layer_of("output.weight"), None);
    assert_eq!(layer_of("blk.x.ffn_up.weight"), None);
    // Already in layer order (llama.cpp's layout: head first, output_norm among the layers).
    let sorted = [
        "output.weight",
        "blk.0.a",
        "blk.0.b",
        "blk.1.a",
        "output_norm.weight",
        "blk.2.a",
    ];
    let mut v = sorted.to_vec();
    order_by_layer(&mut v, |s| s);
    assert_eq!(v, sorted);
    let mut v = vec![
        "blk.1.a",
        "token_embd.weight",
        "blk.0.b",
        "blk.1.b",
        "blk.0.a",
    ];
    order_by_layer(&mut v, |s| s);
    assert_eq!(
        v,
        [
            "token_embd.weight",
            "blk.0.b",
            "blk.0.a",
            "blk.1.a",
            "blk.1.b"
        ]
    );
}
