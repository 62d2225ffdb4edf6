//! The stock K-quant side of `pn quantize` on the tiny-qwen35 model: the `q3k-m` mixes
//! (llama.cpp's Q3_K_M recipe, measured promotions up to a step count or a byte budget) and the
//! importance-weighted K-quant/Q8_0 encoding with `--imatrix` (lower weighted error than the
//! unweighted encoding, recorded in `pn.quantizer.kquant_method`); and the tools of a fair
//! same-size comparison: `--tensor-type` overrides that no climb moves, and `P0k@B`, the PN
//! mix climbing pn3t -> pn4t -> Q8_0 to the same byte budget.

use gguf_io::{GgmlType, GgufFile};
use pn_runtime::quantize::imatrix::{Entry, ImatrixData};
use pn_runtime::quantize::{
    no_progress, quantize_model, FallbackPolicy, Mix, QuantizeOptions, QuantizeSummary,
    KEY_QUANTIZER_KQUANT, KEY_QUANTIZER_KQUANT_TENSORS,
};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

fn tiny() -> PathBuf {
    pn_tests::tiny("model-f16.gguf")
}

fn quantize(out: &Path, mix: &str, imatrix: Option<&Path>) -> QuantizeSummary {
    let mut o = QuantizeOptions::new(tiny(), out);
    o.threads = 2;
    o.mix = Mix::parse(mix).unwrap();
    o.imatrix = imatrix.map(Path::to_path_buf);
    quantize_model(&o, &no_progress, &AtomicBool::new(false)).unwrap()
}

/// Bytes per weight over every 2-D tensor (nominal bytes for F32 stand-ins), as the budget
/// counts them.
fn bytes_per_weight(s: &QuantizeSummary, input: &GgufFile) -> f64 {
    let two_d = |name: &str| {
        input
            .tensor_infos()
            .iter()
            .any(|i| i.name == name && i.dims.len() == 2)
    };
    let (b, p) = s
        .tensors
        .iter()
        .filter(|t| two_d(&t.name))
        .fold((0u64, 0u64), |(b, p), t| {
            (b + t.nominal_bytes, p + t.params)
        });
    b as f64 / p as f64
}

fn ty_of<'a>(s: &'a QuantizeSummary, name: &str) -> &'a str {
    s.tensors.iter().find(|t| t.name == name).unwrap().ty
}

#[test]
fn q3k_m_follows_the_recipe_then_climbs_within_the_budget() {
    let d = pn_tests::scratch_dir("pnq-q3km");
    let input = GgufFile::open(tiny()).unwrap();
    let base = quantize(&d.join("base.gguf"), "q3k-m+0", None);
    assert_eq!(base.mix, "q3k-m+0");
    assert!(base.promoted.is_empty());
    // llama.cpp's Q3_K_M types (the tiny model's two attention layers take the Q5_K attn_v).
    assert_eq!(ty_of(&base, "output.weight"), "q6_K");
    assert_eq!(ty_of(&base, "token_embd.weight"), "q3_K");
    assert_eq!(ty_of(&base, "blk.0.attn_qkv.weight"), "q4_K");
    assert_eq!(ty_of(&base, "blk.0.ffn_down.weight"), "q4_K");
    assert_eq!(ty_of(&base, "blk.0.ffn_up.weight"), "q3_K");
    assert_eq!(ty_of(&base, "blk.0.ssm_out.weight"), "q3_K");
    assert_eq!(ty_of(&base, "blk.0.ssm_alpha.weight"), "q8_0");
    let v: Vec<&str> = base
        .tensors
        .iter()
        .filter(|t| t.name.ends_with("attn_v.weight"))
        .map(|t| t.ty)
        .collect();
    assert!(v.len() >= 2 && v[..2] == ["q5_K", "q5_K"], "{v:?}");
    // K = 320 is no multiple of 256: F32 stand-ins, counted at the K-quant's nominal size.
    let sim = base
        .tensors
        .iter()
        .find(|t| t.name == "output.weight")
        .unwrap();
    assert!(sim.simulated && sim.nominal_bytes == sim.params * 210 / 256);
    // K = 768 tiles: a real Q3_K tensor in the file.
    let f = GgufFile::open(d.join("base.gguf")).unwrap();
    let real = f
        .tensor_infos()
        .iter()
        .find(|i| i.name == "blk.0.ssm_out.weight")
        .unwrap();
    assert_eq!(real.ty, GgmlType::Q3K);

    let b0 = bytes_per_weight(&base, &input);
    let budget = b0 + 0.04;
    let mix = format!("q3k-m@{budget}");
    let up = quantize(&d.join("up.gguf"), &mix, None);
    let b1 = bytes_per_weight(&up, &input);
    assert!(
        b1 <= budget && b1 > b0 + 0.02,
        "{b0} -> {b1} (budget {budget})"
    );
    assert!(!up.promoted.is_empty());
    assert_eq!(up.mix, format!("q3k-m+{}", up.promoted.len()));
    // A step count gives the same tensors as the budget that took that many steps.
    let n = up.promoted.len();
    let same = quantize(&d.join("same.gguf"), &format!("q3k-m+{n}"), None);
    assert_eq!(same.promoted, up.promoted);
    // Every promoted tensor moved up; none moved down.
    let rank = |t: &str| {
        ["q3_K", "q4_K", "q5_K", "q6_K", "q8_0"]
            .iter()
            .position(|x| *x == t)
    };
    for t in &up.tensors {
        let was = ty_of(&base, &t.name);
        assert!(rank(t.ty) >= rank(was), "{} {} -> {}", t.name, was, t.ty);
        assert_eq!(t.ty != was, up.promoted.contains(&t.name), "{}", t.name);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// A skewed importance for every matrix of the tiny model: every 7th column 40x the others.
fn write_skewed_imatrix(path: &Path) -> ImatrixData {
    let input = GgufFile::open(tiny()).unwrap();
    let mut data = ImatrixData {
        datasets: vec!["synthetic".into()],
        chunk_count: 1,
        chunk_size: 1,
        ..Default::default()
    };
    for i in input.tensor_infos() {
        if i.dims.len() != 2 || i.dims[1] <= 1 || i.name.contains("conv1d") {
            continue;
        }
        let k = i.dims[0] as usize;
        let sums = (0..k)
            .map(|j| {
                if j % 7 == 3 {
                    40.0
                } else {
                    1.0 + (j % 5) as f32 * 0.1
                }
            })
            .collect();
        let e = Entry {
            sums,
            counts: vec![1.0],
        };
        data.entries.insert(i.name.clone(), e);
    }
    data.write(path).unwrap();
    data
}

/// `sum imp_j (w_ij - q_ij)^2` of one tensor of `out` against the F16 input.
fn weighted_error(out: &Path, name: &str, imp: &[f32]) -> f64 {
    let decode = |p: &Path| {
        let f = GgufFile::open(p).unwrap();
        let t = f.tensor(name).unwrap();
        let k = t.row_len() as usize;
        let mut v = vec![0f32; t.n_elements() as usize];
        for (r, dst) in v.chunks_exact_mut(k).enumerate() {
            gguf_io::quants::dequantize_row(t.ty, t.row(r).unwrap(), dst).unwrap();
        }
        v
    };
    let (w, q) = (decode(&tiny()), decode(out));
    w.iter()
        .zip(&q)
        .enumerate()
        .map(|(i, (&a, &b))| f64::from(imp[i % imp.len()]) * (f64::from(a) - f64::from(b)).powi(2))
        .sum()
}

#[test]
fn imatrix_weights_the_kquants_and_is_recorded() {
    let d = pn_tests::scratch_dir("pnq-kqw");
    let imat = d.join("imatrix.gguf");
    let data = write_skewed_imatrix(&imat);
    let imp = data.importance();
    let plain = d.join("plain.gguf");
    let weighted = d.join("weighted.gguf");
    quantize(&plain, "q3k-m+0", None);
    quantize(&weighted, "q3k-m+0", Some(&imat));
    let f = GgufFile::open(&weighted).unwrap();
    assert_eq!(f.get_str(KEY_QUANTIZER_KQUANT).unwrap(), "imatrix");
    let n = f.get_u32(KEY_QUANTIZER_KQUANT_TENSORS).unwrap();
    // Every K-quant matrix and the Q8_0 alpha/beta; token_embd is no matmul input but the
    // synthetic imatrix names it too.
    assert!(n >= 20, "{n}");
    let p = GgufFile::open(&plain).unwrap();
    assert!(p.get_str(KEY_QUANTIZER_KQUANT).is_err());
    // Real Q3_K, a Q6_K stand-in, a Q5_K stand-in, a Q4_K stand-in, Q8_0.
    for name in [
        "blk.0.ssm_out.weight",
        "output.weight",
        "blk.3.attn_v.weight",
        "blk.0.ffn_up.weight",
        "blk.0.attn_qkv.weight",
        "blk.0.ssm_alpha.weight",
    ] {
        let Some(v) = imp.get(name) else {
            panic!("{name} not in the imatrix")
        };
        let (ew, ep) = (
            weighted_error(&weighted, name, v),
            weighted_error(&plain, name, v),
        );
        assert!(
            ew < ep,
            "{name}: weighted {ew:e} not below unweighted {ep:e}"
        );
    }
    // The PN mix: its stock tensors (output's Q8_0 fallback, alpha/beta) are weighted too.
    let pn = d.join("pn.gguf");
    quantize(&pn, "P0k+2", Some(&imat));
    let f = GgufFile::open(&pn).unwrap();
    assert_eq!(f.get_str(KEY_QUANTIZER_KQUANT).unwrap(), "imatrix");
    assert!(f.get_u32(KEY_QUANTIZER_KQUANT_TENSORS).unwrap() >= 1);
    std::fs::remove_dir_all(&d).unwrap();
}

/// The same-size comparison on the tiny model: with `output` and `token_embd` fixed by
/// `--tensor-type` (Q6_K and Q4_K stand-ins, counted at their nominal size, as the K-quant mix
/// has them), `P0k@B` climbs pn3t -> pn4t -> Q8_0 by measured error up to the budget, and
/// neither it nor `q3k-m@B` moves the fixed tensors. Bad overrides are errors naming them.
#[test]
fn p0k_budget_climbs_the_pn_ladder_around_fixed_tensors() {
    let d = pn_tests::scratch_dir("pnq-p0kb");
    let input = GgufFile::open(tiny()).unwrap();
    let fixed = vec![
        ("output.weight".to_string(), GgmlType::Q6K),
        ("token_embd.weight".to_string(), GgmlType::Q4K),
    ];
    let opts = |out: &str, mix: &str, types: Vec<(String, GgmlType)>| {
        let mut o = QuantizeOptions::new(tiny(), d.join(out));
        o.threads = 2;
        o.mix = Mix::parse(mix).unwrap();
        o.fallback = Some(FallbackPolicy::Simulate);
        o.tensor_types = types;
        o
    };
    let run = |out: &str, mix: &str| {
        quantize_model(
            &opts(out, mix, fixed.clone()),
            &no_progress,
            &AtomicBool::new(false),
        )
        .unwrap()
    };
    let check_fixed = |s: &QuantizeSummary| {
        for (name, ty, block_bytes) in [
            ("output.weight", "q6_K", 210),
            ("token_embd.weight", "q4_K", 144),
        ] {
            let t = s.tensors.iter().find(|t| t.name == name).unwrap();
            assert_eq!(t.ty, ty, "{name} in {}", s.mix);
            assert!(
                t.simulated && t.nominal_bytes == t.params * block_bytes / 256,
                "{name}"
            );
            assert!(
                !s.promoted.iter().any(|p| p == name),
                "{name} climbed in {}",
                s.mix
            );
        }
    };
    let base = run("base.gguf", "P0k");
    check_fixed(&base);
    let all4 = run("all4.gguf", "pn4t");
    check_fixed(&all4);
    let (b0, b4) = (
        bytes_per_weight(&base, &input),
        bytes_per_weight(&all4, &input),
    );
    assert!(b4 > b0 + 0.02, "{b0} {b4}");
    // Past all-pn4t, so the climb has to take pn4t -> Q8_0 steps too.
    let budget = b4 + 0.03;
    let mix = Mix::parse(&format!("P0k@{budget}")).unwrap().to_string();
    let up = run("up.gguf", &mix);
    check_fixed(&up);
    assert_eq!(up.mix, mix);
    let b1 = bytes_per_weight(&up, &input);
    // (The budget is kept in millionths of a byte.)
    assert!(
        b1 <= budget + 1e-6 && b1 > b4,
        "{b0} {b4} -> {b1} (budget {budget})"
    );
    let ladder = ["pn3t", "pn4t", "q8_0"];
    let rank = |t: &str| ladder.iter().position(|x| *x == t);
    let mut q8 = 0;
    for t in &up.tensors {
        let was = ty_of(&base, &t.name);
        if t.ty == was {
            assert!(!up.promoted.contains(&t.name), "{}", t.name);
            continue;
        }
        // Only up the PN ladder, and every step is listed.
        assert!(
            rank(was).is_some() && rank(t.ty) > rank(was),
            "{} {was} -> {}",
            t.name,
            t.ty
        );
        let steps = up.promoted.iter().filter(|p| **p == t.name).count();
        assert_eq!(
            Some(steps),
            rank(t.ty).zip(rank(was)).map(|(a, b)| a - b),
            "{}",
            t.name
        );
        q8 += usize::from(t.ty == "q8_0");
    }
    assert!(q8 > 0, "no pn4t -> q8_0 step within {budget}");
    let f = GgufFile::open(d.join("up.gguf")).unwrap();
    assert_eq!(f.get_str("pn.mix").unwrap(), mix);
    // The K-quant mix with the same fixed tensors, at the same budget.
    let k = run("k.gguf", &format!("q3k-m@{budget}"));
    check_fixed(&k);
    assert!(bytes_per_weight(&k, &input) <= budget + 1e-6);
    // `P0kK@B`: the same climb with the K mix's rungs between pn4t and Q8_0, stand-ins (this
    // model's K is no multiple of 256) counted at their nominal size as the K mix counts them.
    let kmix = Mix::parse(&format!("P0kK@{budget}")).unwrap().to_string();
    let upk = run("upk.gguf", &kmix);
    check_fixed(&upk);
    assert_eq!(upk.mix, kmix);
    let bk = bytes_per_weight(&upk, &input);
    assert!(
        bk <= budget + 1e-6 && bk > b4,
        "{b4} -> {bk} (budget {budget})"
    );
    let kladder = ["pn3t", "pn4t", "q5_K", "q6_K", "q8_0"];
    let krank = |t: &str| kladder.iter().position(|x| *x == t);
    let mut kq = 0;
    for t in &upk.tensors {
        let was = ty_of(&base, &t.name);
        if t.ty == was {
            continue;
        }
        let steps = upk.promoted.iter().filter(|p| **p == t.name).count();
        assert_eq!(
            Some(steps),
            krank(t.ty).zip(krank(was)).map(|(a, b)| a - b),
            "{} {was} -> {}",
            t.name,
            t.ty
        );
        if matches!(t.ty, "q5_K" | "q6_K") {
            kq += 1;
            let bb = if t.ty == "q5_K" { 176 } else { 210 };
            // Real where the block tiles K, else a stand-in at the K-quant's nominal size.
            assert!(
                t.nominal_bytes == t.params * bb / 256
                    && (t.simulated || t.bytes == t.nominal_bytes),
                "{}",
                t.name
            );
        }
    }
    assert!(kq > 0, "no pn4t -> q5_K step within {budget}");
    // Overrides that cannot apply name the tensor and say why.
    for (name, ty, why) in [
        (
            "blk.0.nope.weight",
            GgmlType::Q8_0,
            "no tensor of that name",
        ),
        ("blk.0.attn_norm.weight", GgmlType::Q8_0, "only matrices"),
        ("blk.0.ffn_down.weight", GgmlType::Pn3t, "no multiple of 80"),
    ] {
        let o = opts("bad.gguf", "P0k", vec![(name.to_string(), ty)]);
        let e = quantize_model(&o, &no_progress, &AtomicBool::new(false)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(name) && msg.contains(why), "{msg}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}
