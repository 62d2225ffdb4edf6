//! `pn quantize` on the tiny-qwen35 test model (random weights): the type of every tensor, the
//! metadata, validity and exact reference bytes of PN tensors, the gguf-io round trip, and the
//! error paths (nothing is ever left at the output path or as a temporary file).

use gguf_io::{Array, GgmlType, GgufFile, GgufWriter, MetadataEntry, Value};
use pn_runtime::quantize::{
    no_progress, quantize_model, Mix, Progress, QuantizeError, QuantizeOptions, RotationChoice,
};
use pn_tests::{f32_le_bytes, scratch_dir};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

fn tiny() -> PathBuf {
    pn_tests::tiny("model-f16.gguf")
}

/// A fresh empty directory per test.
fn scratch(name: &str) -> PathBuf {
    scratch_dir(&format!("pnq-{name}"))
}

fn dir_entries(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn quantize(
    input: &Path,
    out: &Path,
    f: impl FnOnce(&mut QuantizeOptions),
) -> Result<pn_runtime::quantize::QuantizeSummary, QuantizeError> {
    let mut o = QuantizeOptions::new(input, out);
    o.threads = 2;
    f(&mut o);
    quantize_model(&o, &no_progress, &AtomicBool::new(false))
}

/// The type the P0k+19 mix gives each tiny-model tensor, before promotion. token_embd and
/// output have K = 320, which no 256-weight superblock divides: their Q3_K / Q4_K fall back to
/// a measured real type (checked separately against `pn.fallback`; `None` here).
fn expected_type(name: &str) -> Option<GgmlType> {
    let base = name
        .strip_prefix("blk.")
        .map(|r| &r[r.find('.').unwrap() + 1..])
        .unwrap_or(name);
    let base = base.strip_suffix(".weight").unwrap_or(base);
    Some(match base {
        "attn_q" | "attn_qkv" | "attn_gate" | "ffn_gate" | "ffn_up" => GgmlType::Pn3t,
        "attn_k" | "attn_v" | "attn_output" | "ssm_out" | "ffn_down" | "nextn.eh_proj" => {
            GgmlType::Pn4t
        }
        "ssm_alpha" | "ssm_beta" => GgmlType::Q8_0,
        "token_embd" | "output" => return None,
        _ => GgmlType::F32, // norms, ssm_a, ssm_dt.bias, ssm_conv1d
    })
}

#[test]
fn p0k19_gives_every_tensor_its_type_and_valid_reference_bytes() {
    let d = scratch("table");
    let out = d.join("tiny-pn3.gguf");
    let s = quantize(&tiny(), &out, |_| {}).unwrap();
    assert_eq!(s.promoted.len(), 19);
    assert_eq!(s.rotation, Some(64));
    let input = GgufFile::open(tiny()).unwrap();
    let f = GgufFile::open(&out).unwrap();

    // Metadata: every input key unchanged, plus the PN keys.
    for m in input.metadata() {
        assert_eq!(f.get(&m.key), Some(&m.value), "key {}", m.key);
    }
    assert_eq!(f.get_str("pn.rotation.kind").unwrap(), "hadamard");
    assert_eq!(f.get_u32("pn.rotation.block_size").unwrap(), 64);
    assert_eq!(f.get_str("pn.mix").unwrap(), "P0k+19");
    let promoted = f.get_str_array("pn.promoted").unwrap();
    assert_eq!(promoted.len(), 19);
    assert!(f.get("pn.simulated").is_none());
    // K = 320: Q3_K/Q4_K cannot tile it; each gets a real type, recorded in pn.fallback and
    // the summary, never the F32 stand-in.
    let fallback = f.get_str_array("pn.fallback").unwrap();
    assert_eq!(fallback.len(), 2, "{fallback:?}");
    for (name, intended) in [("token_embd.weight", "q3_K"), ("output.weight", "q4_K")] {
        let ty = f.tensor_info(name).unwrap().ty;
        assert!(
            matches!(
                ty,
                GgmlType::Pn3t | GgmlType::Pn4t | GgmlType::Q8_0 | GgmlType::F16
            ),
            "{name}: {ty:?}"
        );
        let entry = format!("{name}={intended}->{}", ty.name());
        assert!(
            fallback.contains(&entry.as_str()),
            "{entry} not in {fallback:?}"
        );
        let r = s.tensors.iter().find(|t| t.name == name).unwrap();
        let fb = r.fallback.as_ref().unwrap();
        assert_eq!(fb.chosen.ggml(), ty);
        // The chosen type's error is within the "similar" factor of the K-quant's.
        let chosen_rel = fb.tried.last().unwrap().1;
        assert!(
            ty == GgmlType::F16
                || chosen_rel <= fb.intended_rel * pn_runtime::quantize::fallback::SIMILAR,
            "{fb:?}"
        );
    }

    // The type table.
    assert_eq!(f.tensor_infos().len(), input.tensor_infos().len());
    let mut n_pn3 = 0;
    for (a, b) in input.tensor_infos().iter().zip(f.tensor_infos()) {
        assert_eq!(a.name, b.name);
        assert_eq!(a.dims, b.dims, "{}", a.name);
        let Some(mut want) = expected_type(&a.name) else {
            continue;
        };
        if promoted.contains(&a.name.as_str()) {
            assert_eq!(
                want,
                GgmlType::Pn3t,
                "only pn3t tensors are promoted: {}",
                a.name
            );
            want = GgmlType::Pn4t;
        }
        assert_eq!(b.ty, want, "{}", a.name);
        n_pn3 += usize::from(b.ty == GgmlType::Pn3t);
    }
    // 6 GDN layers x 4 + 3 attention blocks (2 + MTP) x 3 = 33 candidates, 19 promoted.
    assert_eq!(n_pn3, 33 - 19);

    // Every PN tensor validates, and sampled rows are exactly the reference quantizer's output
    // for the rotated input row.
    for info in f.tensor_infos().iter().filter(|t| t.ty.is_pn()) {
        let pn = if info.ty == GgmlType::Pn3t {
            pn_format::PnType::Pn3t
        } else {
            pn_format::PnType::Pn4t
        };
        let t = f.tensor(&info.name).unwrap();
        let k = info.dims[0] as usize;
        let rows = info.dims[1] as usize;
        let rb = t.bytes.len() / rows;
        for r in 0..rows {
            pn_format::validate_row(pn, &t.bytes[r * rb..(r + 1) * rb])
                .unwrap_or_else(|e| panic!("{} row {r}: {e}", info.name));
        }
        let src = input.tensor(&info.name).unwrap();
        let srb = src.bytes.len() / rows;
        for r in [0, rows / 2, rows - 1] {
            let mut w = vec![0f32; k];
            gguf_io::quants::dequantize_row(src.ty, &src.bytes[r * srb..(r + 1) * srb], &mut w)
                .unwrap();
            pn_format::hadamard::fwht_blocks_inplace(&mut w, 64).unwrap();
            let expect = pn_format::quantize_row_ref(pn, &w).unwrap();
            assert_eq!(
                &t.bytes[r * rb..(r + 1) * rb],
                &expect[..],
                "{} row {r}",
                info.name
            );
        }
    }

    // Round trip: re-writing what gguf-io read gives the same bytes.
    let mut w = GgufWriter::new(std::io::Cursor::new(Vec::new()));
    for m in f.metadata() {
        w.add_metadata(m.key.clone(), m.value.clone()).unwrap();
    }
    for t in f.tensor_infos() {
        w.add_tensor_info(t.name.clone(), t.ty, &t.dims).unwrap();
    }
    w.write_header().unwrap();
    for t in f.tensor_infos() {
        w.write_tensor_data(&t.name, f.tensor(&t.name).unwrap().bytes)
            .unwrap();
    }
    let again = w.finish().unwrap().into_inner();
    assert_eq!(again, std::fs::read(&out).unwrap());

    // Size summary is consistent with the file.
    assert_eq!(s.out_bytes, std::fs::metadata(&out).unwrap().len());
    assert!(s.bpw() > 3.4 && s.bpw() < 8.0, "{}", s.bpw());
    assert_eq!(dir_entries(&d), vec!["tiny-pn3.gguf"]);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn other_mixes_and_no_rotation() {
    let d = scratch("mixes");
    let out = d.join("a.gguf");
    let s = quantize(&tiny(), &out, |o| {
        o.mix = Mix::parse("pn4t").unwrap();
        o.rotation = RotationChoice::None;
        o.report = true;
    })
    .unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert!(f.get("pn.rotation.kind").is_none());
    assert_eq!(f.get_str("pn.mix").unwrap(), "pn4t");
    assert!(f.tensor_infos().iter().all(|t| t.ty != GgmlType::Pn3t));
    assert!(s.promoted.is_empty());
    // Without rotation the "rotated" and unrotated errors are the same measurement.
    for t in s.tensors.iter().filter(|t| t.ty == "pn4t") {
        assert!(
            (t.stats.rel() - t.stats.rel_unrotated()).abs() < 1e-12,
            "{}",
            t.name
        );
        assert!(
            t.stats.rel() > 0.0 && t.stats.rel() < 0.05,
            "{} {}",
            t.name,
            t.stats.rel()
        );
    }
    let out2 = d.join("b.gguf");
    quantize(&tiny(), &out2, |o| o.mix = Mix::parse("P0k").unwrap()).unwrap();
    let f = GgufFile::open(&out2).unwrap();
    assert_eq!(f.get_str("pn.mix").unwrap(), "P0k");
    assert!(f.get_str_array("pn.promoted").unwrap().is_empty());
    let out3 = d.join("c.gguf");
    quantize(&tiny(), &out3, |o| o.mix = Mix::parse("all-q8_0").unwrap()).unwrap();
    let f = GgufFile::open(&out3).unwrap();
    assert!(f
        .tensor_infos()
        .iter()
        .all(|t| t.ty == GgmlType::Q8_0 || t.ty == GgmlType::F32));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn kquant_fallback_policies() {
    use pn_runtime::quantize::FallbackPolicy;
    let d = scratch("fallback");
    // The stock baselines keep the K-quant as an F32 stand-in by default (they measure what the
    // K-quant would do); P0k can ask for that too.
    for (mix, policy) in [("q3k-like", None), ("P0k", Some(FallbackPolicy::Simulate))] {
        let out = d.join(format!("{mix}.gguf"));
        let s = quantize(&tiny(), &out, |o| {
            o.mix = Mix::parse(mix).unwrap();
            o.fallback = policy;
        })
        .unwrap();
        let f = GgufFile::open(&out).unwrap();
        assert!(f.get("pn.fallback").is_none(), "{mix}");
        let sim = f.get_str_array("pn.simulated").unwrap();
        assert!(sim.contains(&"token_embd.weight"), "{mix}: {sim:?}");
        assert_eq!(
            f.tensor_info("token_embd.weight").unwrap().ty,
            GgmlType::F32
        );
        // Sizes count the K-quant's nominal bytes, not the F32 stand-in.
        let t = s
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .unwrap();
        assert!(t.simulated && t.nominal_bytes * 8 < t.bytes, "{mix}");
    }
    // And a baseline can be made real: every K-quant that cannot tile K gets a real type.
    let out = d.join("real.gguf");
    quantize(&tiny(), &out, |o| {
        o.mix = Mix::parse("all-q3_K").unwrap();
        o.fallback = Some(FallbackPolicy::Real);
    })
    .unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert!(f.get("pn.simulated").is_none());
    assert!(!f.get_str_array("pn.fallback").unwrap().is_empty());
    for t in f.tensor_infos() {
        let k = t.dims[0];
        if t.ty == GgmlType::Q3K {
            assert_eq!(k % 256, 0, "{}", t.name);
        }
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn interrupted_quantize_leaves_no_output() {
    let d = scratch("interrupt");
    let out = d.join("m.gguf");
    let cancel = AtomicBool::new(false);
    let tensors = AtomicUsize::new(0);
    let progress = |p: Progress<'_>| {
        if let Progress::Tensor { .. } = p {
            // Interrupt in the middle of writing.
            if tensors.fetch_add(1, Ordering::SeqCst) == 60 {
                cancel.store(true, Ordering::SeqCst);
            }
        }
    };
    let mut o = QuantizeOptions::new(tiny(), &out);
    o.promote = Some(0);
    let e = quantize_model(&o, &progress, &cancel).unwrap_err();
    assert!(matches!(e, QuantizeError::Interrupted), "{e}");
    assert!(dir_entries(&d).is_empty(), "{:?}", dir_entries(&d));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn existing_output_and_bad_rotation_block_are_refused() {
    let d = scratch("refuse");
    let out = d.join("m.gguf");
    std::fs::write(&out, b"keep me").unwrap();
    let e = quantize(&tiny(), &out, |_| {}).unwrap_err();
    assert!(matches!(e, QuantizeError::OutputExists(_)), "{e}");
    assert_eq!(std::fs::read(&out).unwrap(), b"keep me");
    // The hidden size 320 = 5 x 64 (and ffn_down's 704 = 11 x 64): a 128 block divides neither.
    let e = quantize(&tiny(), &out, |o| {
        o.force = true;
        o.rotation = RotationChoice::Block(128);
    })
    .unwrap_err();
    assert!(
        matches!(e, QuantizeError::RotationBlock { r: 128, .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("blk.0.attn_qkv.weight: K = 320"),
        "{e}"
    );
    assert_eq!(dir_entries(&d), vec!["m.gguf"]);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A minimal qwen35-like file: hidden 160, a norm and one matrix `name` [160 x 4] of type `ty`
/// holding `data` (raw bytes).
fn mini(path: &Path, arch: &str, name: &str, ty: GgmlType, data: &[u8]) {
    let meta = vec![
        MetadataEntry::new("general.architecture", Value::String(arch.into())),
        MetadataEntry::new("qwen35.embedding_length", Value::U32(160)),
        MetadataEntry::new(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["a".into(), "b".into()])),
        ),
    ];
    let norm: Vec<u8> = [1.0f32; 160].iter().flat_map(|v| v.to_le_bytes()).collect();
    gguf_io::write_gguf(
        path,
        &meta,
        &[
            ("blk.0.attn_norm.weight", GgmlType::F32, &[160], &norm),
            (name, ty, &[160, 4], data),
        ],
    )
    .unwrap();
}

#[test]
fn bad_inputs_give_named_errors_and_no_output() {
    let d = scratch("bad");
    let up: Vec<f32> = (0..640).map(|i| ((i % 13) as f32 - 6.0) * 0.01).collect();
    let out = d.join("out.gguf");
    let up_name = "blk.0.ffn_up.weight";

    let p = d.join("llama.gguf");
    mini(&p, "llama", up_name, GgmlType::F32, &f32_le_bytes(&up));
    let e = quantize(&p, &out, |_| {}).unwrap_err();
    assert!(matches!(e, QuantizeError::NotQwen35 { .. }), "{e}");
    assert!(e.to_string().contains("llama"), "{e}");

    let p = d.join("nan.gguf");
    let mut bad = up.clone();
    bad[2 * 160 + 7] = f32::NAN;
    mini(&p, "qwen35", up_name, GgmlType::F32, &f32_le_bytes(&bad));
    let e = quantize(&p, &out, |_| {}).unwrap_err();
    let s = e.to_string();
    assert!(
        s.contains(up_name) && s.contains("row 2") && s.contains("column 7"),
        "{s}"
    );

    let p = d.join("q4_0.gguf");
    mini(
        &p,
        "qwen35",
        up_name,
        GgmlType::Q4_0,
        &vec![0u8; 18 * 160 * 4 / 32],
    );
    let e = quantize(&p, &out, |_| {}).unwrap_err();
    assert!(
        matches!(e, QuantizeError::UnsupportedInputType { .. }),
        "{e}"
    );
    assert!(e.to_string().contains(up_name), "{e}");

    let p = d.join("mystery.gguf");
    mini(
        &p,
        "qwen35",
        "blk.0.mystery.weight",
        GgmlType::F32,
        &f32_le_bytes(&up),
    );
    let e = quantize(&p, &out, |_| {}).unwrap_err();
    assert!(matches!(e, QuantizeError::NoRule { .. }), "{e}");
    assert!(e.to_string().contains("blk.0.mystery.weight"), "{e}");

    // The same file with good data works and gives pn3t.
    let p = d.join("good.gguf");
    mini(&p, "qwen35", up_name, GgmlType::F32, &f32_le_bytes(&up));
    let s = quantize(&p, &out, |o| o.promote = Some(0)).unwrap();
    assert_eq!(s.tensors[1].ty, "pn3t");
    std::fs::remove_file(&out).unwrap();

    let files: Vec<String> = dir_entries(&d);
    assert!(
        !files
            .iter()
            .any(|f| f.contains("partial") || f == "out.gguf"),
        "{files:?}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// Ctrl-C on the real binary: `pn quantize` is interrupted while its scratch/temporary files
/// exist, exits with an error, and leaves nothing behind (no output, no temporary, no spill).
#[cfg(unix)]
#[test]
fn sigint_during_pn_quantize_leaves_no_file() {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let d = scratch("sigint");
    let out = d.join("m.gguf");
    // The demo model (35 MB) on one thread: long enough to be caught mid-run.
    let demo = pn_tests::data(pn_tests::DEMO, "model-f16.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pn"))
        .args(["quantize", "--threads", "1", "--quiet"])
        .arg(&demo)
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the run has created its first file in the folder (the ranking spill), then
    // give it a moment to be inside the work.
    let t0 = Instant::now();
    while dir_entries(&d).is_empty() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "pn quantize created no file"
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!("pn quantize ended before it could be interrupted: {status}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "finished despite SIGINT: {stderr}"
    );
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(
        dir_entries(&d).is_empty(),
        "left behind: {:?}",
        dir_entries(&d)
    );
    std::fs::remove_dir_all(&d).unwrap();
}
