//! `pn_runtime::convert` on the tiny Qwen3.5 checkpoint: what llama.cpp's converter wrote from
//! the same folder (`tests/data/tiny-qwen35/hf/expected-gguf.json`, and `model-f16.gguf` for F32
//! input), the logits of the result, sharded input, and one error per kind of damage.

mod convert_fixture;

use convert_fixture::{sha256_hex, to_f32, write_safetensors, write_tiny_checkpoint};
use gguf_io::{Array, GgufFile, Value};
use pn_runtime::convert::{convert_checkpoint, ConvertError, ConvertOptions, OutType};
use pn_runtime::quantize::no_progress;
use pn_tests::paths::{scratch_dir, tiny};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

fn convert(input: &Path, output: &Path, outtype: Option<OutType>) -> Result<(), ConvertError> {
    let mut opts = ConvertOptions::new(input, output);
    opts.outtype = outtype;
    // The oracle's converter run named the model (its folder had another name).
    opts.model_name = Some("tiny-qwen35".into());
    convert_checkpoint(&opts, &no_progress, &AtomicBool::new(false)).map(|_| ())
}

/// Python's `json.dumps(v, ensure_ascii=False)` (default separators), which the listing hashed.
fn py_json(v: &Json, out: &mut String) {
    match v {
        Json::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                py_json(x, out);
            }
            out.push(']');
        }
        Json::String(s) => {
            out.push('"');
            for c in s.chars() {
                match c {
                    '"' => out.push_str("\\\""),
                    '\\' => out.push_str("\\\\"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
        }
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => out.push_str(&n.to_string()),
        other => panic!("unexpected {other}"),
    }
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::String(s) => Json::String(s.clone()),
        Value::U32(x) => Json::from(*x),
        Value::I32(x) => Json::from(*x),
        Value::Bool(b) => Json::Bool(*b),
        Value::F32(x) => Json::from(f64::from(*x)),
        Value::Array(a) => match a {
            Array::String(v) => Json::Array(v.iter().map(|s| Json::String(s.clone())).collect()),
            Array::I32(v) => Json::Array(v.iter().map(|&x| Json::from(x)).collect()),
            Array::Bool(v) => Json::Array(v.iter().map(|&x| Json::Bool(x)).collect()),
            other => panic!("unexpected array {other:?}"),
        },
        other => panic!("unexpected value {other:?}"),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "STRING",
        Value::U32(_) => "UINT32",
        Value::I32(_) => "INT32",
        Value::F32(_) => "FLOAT32",
        Value::Bool(_) => "BOOL",
        Value::Array(_) => "ARRAY",
        _ => "OTHER",
    }
}

/// Checks `path` against expected-gguf.json: every metadata key (in order) with its type and
/// value, every tensor (in order) with type, dims and sha256 of its bytes, and the file's sha256.
fn check_against_listing(path: &Path) {
    let want = pn_tests::read_json(&convert_fixture::hf_data("expected-gguf.json"));
    let f = GgufFile::open(path).expect("converted file");
    let meta = f.metadata();
    let want_meta = want["metadata"].as_array().expect("metadata list");
    let got_keys: Vec<&str> = meta.iter().map(|m| m.key.as_str()).collect();
    let want_keys: Vec<&str> = want_meta
        .iter()
        .map(|m| m["key"].as_str().unwrap())
        .collect();
    assert_eq!(got_keys, want_keys, "metadata keys and their order");
    for (m, w) in meta.iter().zip(want_meta) {
        assert_eq!(type_name(&m.value), w["type"], "{}: type", m.key);
        let got = value_json(&m.value);
        if let Some(h) = w.get("sha256_of_json") {
            let mut s = String::new();
            py_json(&got, &mut s);
            assert_eq!(
                got.as_array().unwrap().len() as u64,
                w["len"].as_u64().unwrap(),
                "{}",
                m.key
            );
            assert_eq!(sha256_hex(s.as_bytes()), *h, "{}: array contents", m.key);
        } else if let Value::F32(x) = m.value {
            assert_eq!(f64::from(x), w["value"].as_f64().unwrap(), "{}", m.key);
        } else {
            assert_eq!(got, w["value"], "{}", m.key);
        }
    }
    let want_t = want["tensors"].as_array().expect("tensor list");
    assert_eq!(f.tensor_infos().len(), want_t.len());
    for (t, w) in f.tensors().zip(want_t) {
        assert_eq!(t.name, w["name"].as_str().unwrap());
        assert_eq!(
            t.ty.gguf_py_name(),
            w["type"].as_str().unwrap(),
            "{}: type",
            t.name
        );
        let dims: Vec<u64> = w["dims"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .collect();
        assert_eq!(t.dims, dims.as_slice(), "{}: dims", t.name);
        assert_eq!(
            sha256_hex(t.bytes),
            w["sha256"].as_str().unwrap(),
            "{}: data",
            t.name
        );
    }
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len() as u64, want["file_bytes"].as_u64().unwrap());
    assert_eq!(
        sha256_hex(&bytes),
        want["file_sha256"].as_str().unwrap(),
        "whole file"
    );
}

fn scratch(name: &str) -> PathBuf {
    scratch_dir(&format!("pn-convert-{name}"))
}

#[test]
fn f16_checkpoint_gives_exactly_what_llama_cpp_wrote() {
    let dir = scratch("f16");
    let ck = dir.join("hf");
    std::fs::create_dir_all(&ck).unwrap();
    write_tiny_checkpoint(&ck);
    let out = dir.join("out.gguf");
    convert(&ck, &out, Some(OutType::F16)).expect("convert");
    check_against_listing(&out);
    // `auto` on an F16 checkpoint is F16 too.
    let auto = dir.join("auto.gguf");
    convert(&ck, &auto, None).expect("convert auto");
    assert_eq!(std::fs::read(&auto).unwrap(), std::fs::read(&out).unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn f32_checkpoint_gives_model_f16_gguf_byte_for_byte() {
    let dir = scratch("f32");
    let ck = dir.join("hf");
    std::fs::create_dir_all(&ck).unwrap();
    let tensors = write_tiny_checkpoint(&ck);
    write_safetensors(&ck.join("model.safetensors"), &to_f32(&tensors));
    let out = dir.join("out.gguf");
    convert(&ck, &out, Some(OutType::F16)).expect("convert");
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(tiny("model-f16.gguf")).unwrap(),
        "the F32 route must reproduce tests/data/tiny-qwen35/model-f16.gguf"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// All positions' logits of `tokens` through the model in `path` (CPU, one prefill).
fn logits(path: &Path, tokens: &[u32]) -> Vec<f32> {
    use qwen_model::{CpuBackend, Model, Outputs};
    let m = Model::load(path, CpuBackend::new(2)).expect("load converted model");
    let v = m.config.vocab;
    let mut state = m.new_state(tokens.len()).unwrap();
    let mut ws = m.new_workspace(tokens.len()).unwrap();
    let mut out = vec![0.0; tokens.len() * v];
    let o = Outputs {
        logits: Some(&mut out),
        hidden: None,
        all_rows: true,
        layer_residuals: None,
    };
    m.forward(&mut state, &mut ws, tokens, o).unwrap();
    out
}

#[test]
fn converted_models_match_the_transformers_logits() {
    let dir = scratch("logits");
    let ck = dir.join("hf");
    std::fs::create_dir_all(&ck).unwrap();
    let tensors = write_tiny_checkpoint(&ck);
    let tokens = pn_tests::read_tokens(&tiny("tokens_a.json"));
    let want = pn_tests::read_f32(&tiny("logits_a.f32"));
    // F16 checkpoint: its norm weights `1 + w` are rounded to F16 by the converter (as for any
    // half-precision download), which moves the logits by ~1e-3 against the F32 oracle.
    let f16_out = dir.join("f16.gguf");
    convert(&ck, &f16_out, Some(OutType::F16)).unwrap();
    let d16 = pn_tests::max_abs(&logits(&f16_out, &tokens), &want);
    eprintln!("F16 checkpoint -> F16 GGUF: max abs logit diff {d16:.3e}");
    assert!(d16 <= 1e-2, "F16 route: {d16}");
    // F32 checkpoint to an F32 GGUF: the oracle's own precision; the oracle test's bound.
    write_safetensors(&ck.join("model.safetensors"), &to_f32(&tensors));
    let f32_out = dir.join("f32.gguf");
    convert(&ck, &f32_out, Some(OutType::F32)).unwrap();
    let got = logits(&f32_out, &tokens);
    let d32 = pn_tests::max_abs(&got, &want);
    eprintln!("F32 checkpoint -> F32 GGUF: max abs logit diff {d32:.3e}");
    assert!(d32 <= 1e-4, "F32 route: {d32}");
    assert!(pn_tests::assert_argmax(&got, &want, 2048, 0.0, "a").is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn sharded_checkpoint_with_index_converts_to_the_same_file() {
    let dir = scratch("shards");
    let one = dir.join("one");
    let many = dir.join("many");
    std::fs::create_dir_all(&one).unwrap();
    std::fs::create_dir_all(&many).unwrap();
    let tensors = write_tiny_checkpoint(&one);
    convert_fixture::copy_side_files(&many);
    // Three shards of consecutive names (how transformers splits by size).
    let names: Vec<&String> = tensors.keys().collect();
    let mut weight_map = serde_json::Map::new();
    for (k, part) in names.chunks(names.len().div_ceil(3)).enumerate() {
        let file = format!("model-{:05}-of-00003.safetensors", k + 1);
        let sub = part
            .iter()
            .map(|n| ((*n).clone(), tensors[*n].clone()))
            .collect();
        write_safetensors(&many.join(&file), &sub);
        for n in part {
            weight_map.insert((*n).clone(), Json::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(many.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let (a, b) = (dir.join("one.gguf"), dir.join("many.gguf"));
    convert(&one, &a, Some(OutType::F16)).unwrap();
    convert(&many, &b, Some(OutType::F16)).unwrap();
    assert!(std::fs::read(&a).unwrap() == std::fs::read(&b).unwrap());
    // The index is followed: a shard it names but that is gone is an error naming the file.
    std::fs::remove_file(many.join("model-00002-of-00003.safetensors")).unwrap();
    let out = dir.join("missing.gguf");
    match convert(&many, &out, None) {
        Err(ConvertError::MissingShard { shard, .. }) => {
            assert!(shard.ends_with("model-00002-of-00003.safetensors"))
        }
        other => panic!("expected MissingShard, got {other:?}"),
    }
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rewrites the JSON header of the safetensors file `path` (the data section is kept).
fn edit_header(path: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Json>)) {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut h: serde_json::Map<String, Json> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut h);
    let mut hj = Json::Object(h).to_string().into_bytes();
    while !hj.len().is_multiple_of(8) {
        hj.push(b' ');
    }
    let mut out = (hj.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&hj);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(path, out).unwrap();
}

/// A way to damage a checkpoint folder.
type Damage = Box<dyn Fn(&Path)>;

#[test]
fn each_kind_of_damaged_checkpoint_has_its_own_error_and_leaves_no_output() {
    let dir = scratch("hostile");
    let good = dir.join("good");
    std::fs::create_dir_all(&good).unwrap();
    write_tiny_checkpoint(&good);
    const ST: &str = "model.safetensors";
    let cases: Vec<(&str, Damage)> = vec![
        (
            "truncated",
            Box::new(|d: &Path| {
                let p = d.join(ST);
                let len = std::fs::metadata(&p).unwrap().len();
                let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
                f.set_len(len - 1000).unwrap();
            }),
        ),
        (
            "header past end",
            Box::new(|d: &Path| {
                let p = d.join(ST);
                let mut b = std::fs::read(&p).unwrap();
                b[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
                std::fs::write(&p, b).unwrap();
            }),
        ),
        (
            "overlapping offsets",
            Box::new(|d: &Path| {
                edit_header(&d.join(ST), |h| {
                    // Point one tensor's range 2 bytes into the one before it (same length).
                    let name = "model.layers.0.linear_attn.A_log";
                    let offs = h[name]["data_offsets"].as_array().unwrap().clone();
                    let (b, e) = (offs[0].as_u64().unwrap() - 2, offs[1].as_u64().unwrap() - 2);
                    h[name]["data_offsets"] = serde_json::json!([b, e]);
                })
            }),
        ),
        (
            "unknown dtype",
            Box::new(|d: &Path| {
                edit_header(&d.join(ST), |h| {
                    h["model.norm.weight"]["dtype"] = Json::String("F12".into());
                })
            }),
        ),
        (
            "shape against config",
            Box::new(|d: &Path| {
                edit_header(&d.join(ST), |h| {
                    // Same bytes, transposed: [320, 704] where config.json says [704, 320].
                    h["model.layers.0.mlp.up_proj.weight"]["shape"] = serde_json::json!([320, 704]);
                })
            }),
        ),
        (
            "other architecture",
            Box::new(|d: &Path| {
                let p = d.join("config.json");
                let mut c: Json = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
                c["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
                c["model_type"] = Json::String("llama".into());
                std::fs::write(&p, c.to_string()).unwrap();
            }),
        ),
    ];
    for (what, damage) in cases {
        let ck = dir.join(what.replace(' ', "-"));
        std::fs::create_dir_all(&ck).unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), ck.join(e.file_name())).unwrap();
        }
        damage(&ck);
        let out_dir = dir.join(format!("out-{}", what.replace(' ', "-")));
        std::fs::create_dir_all(&out_dir).unwrap();
        let out = out_dir.join("m.gguf");
        let err = convert(&ck, &out, None).expect_err(what);
        let msg = err.to_string();
        eprintln!("{what}: {msg}");
        let ok = match (what, &err) {
            ("truncated", ConvertError::Truncated { tensor, .. }) => !tensor.is_empty(),
            ("header past end", ConvertError::HeaderPastEnd { header_len, .. }) => {
                *header_len == 1 << 40
            }
            ("overlapping offsets", ConvertError::BadOffsets { tensor, .. }) => {
                tensor == "model.layers.0.linear_attn.A_log"
            }
            ("unknown dtype", ConvertError::UnknownDtype { tensor, dtype, .. }) => {
                tensor == "model.norm.weight" && dtype == "F12"
            }
            (
                "shape against config",
                ConvertError::ShapeMismatch {
                    tensor, expected, ..
                },
            ) => tensor == "model.layers.0.mlp.up_proj.weight" && expected == &[704, 320],
            ("other architecture", ConvertError::WrongArchitecture { found, .. }) => {
                found.contains("LlamaForCausalLM")
            }
            _ => false,
        };
        assert!(ok, "{what}: wrong error {err:?}");
        // The message names the file.
        assert!(msg.contains(&ck.display().to_string()), "{what}: {msg}");
        assert_eq!(
            std::fs::read_dir(&out_dir).unwrap().count(),
            0,
            "{what}: output left"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The rebuilt checkpoint is the shared one, tensor for tensor (skipped where the shared data
/// is absent, e.g. on a fresh clone).
#[test]
fn rebuilt_checkpoint_equals_the_shared_one() {
    let shared = std::env::var_os("PN_SHARED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| pn_tests::paths::repo_root().join("../shared"));
    let path = shared.join("testdata/tiny-qwen35/hf/model.safetensors");
    let Ok(bytes) = std::fs::read(&path) else {
        eprintln!("skipped: {} not present", path.display());
        return;
    };
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let rebuilt = convert_fixture::tiny_tensors();
    assert_eq!(st.len(), rebuilt.len());
    for (name, v) in st.tensors() {
        let (dt, shape, data) = &rebuilt[&name];
        assert_eq!((v.dtype(), v.shape()), (*dt, shape.as_slice()), "{name}");
        assert!(v.data() == data.as_slice(), "{name}: data");
    }
    // And the shared folder itself converts to the listing.
    let dir = scratch("shared");
    let out = dir.join("out.gguf");
    convert(path.parent().unwrap(), &out, Some(OutType::F16)).unwrap();
    check_against_listing(&out);
    std::fs::remove_dir_all(&dir).unwrap();
}
