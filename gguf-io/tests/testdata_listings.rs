//! Every GGUF under tests/data parses, and its metadata and tensor table equal the listing that
//! the producing tool (llama.cpp's converter / gguf-py) stored beside it.

use gguf_io::{Array, GgmlType, GgufFile, Value};
use pn_tests::data;

/// One tensor line of a `gguf_listing.txt`.
#[derive(Debug, PartialEq)]
struct ListedTensor {
    name: String,
    ty: String,
    dims: Vec<u64>,
    n_bytes: u64,
}

fn parse_dims(field: &str) -> Vec<u64> {
    let inner = field
        .trim_start_matches("ne=")
        .trim_start_matches('[')
        .trim_end_matches(']');
    inner
        .split(',')
        .map(|d| d.trim().parse().unwrap())
        .collect()
}

/// Splits a listing into `(key, optional type, value text)` metadata lines and tensor lines.
/// A metadata line: key, type (when the listing prints it), value text.
type ListedKv = (String, Option<String>, String);

fn parse_listing(text: &str) -> (Vec<ListedKv>, Vec<ListedTensor>) {
    let mut section = "";
    let mut meta = Vec::new();
    let mut tensors = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            section = if h.starts_with("metadata") {
                "meta"
            } else {
                "tensors"
            };
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        match section {
            "meta" => {
                let (lhs, value) = line.split_once(" = ").expect("metadata line has ' = '");
                let (key, ty) = match lhs.split_once(" (") {
                    Some((k, t)) => (k, Some(t.trim_end_matches(')').to_string())),
                    None => (lhs, None),
                };
                meta.push((key.to_string(), ty, value.to_string()));
            }
            "tensors" => {
                let f: Vec<&str> = line.split('\t').collect();
                tensors.push(ListedTensor {
                    name: f[0].to_string(),
                    ty: f[1].to_string(),
                    dims: parse_dims(f[2]),
                    n_bytes: f.last().unwrap().parse().unwrap(),
                });
            }
            _ => {}
        }
    }
    (meta, tensors)
}

fn type_label(v: &Value) -> String {
    v.type_description().to_string()
}

/// Compares a value with its gguf-py text rendering.
fn check_value(key: &str, v: &Value, text: &str) {
    match v {
        Value::String(s) => assert_eq!(s, text, "{key}"),
        Value::F32(x) => {
            let want: f64 = text.parse().unwrap();
            assert_eq!(f64::from(*x), want, "{key}");
        }
        Value::Array(a) if text.ends_with(" items]") || text.contains(" items] first:") => {
            let n: usize = text
                .trim_start_matches('[')
                .split_once(' ')
                .unwrap()
                .0
                .parse()
                .unwrap();
            assert_eq!(a.len(), n, "{key} length");
        }
        Value::Array(Array::Bool(b)) => {
            let rendered: Vec<&str> = b
                .iter()
                .map(|&x| if x { "True" } else { "False" })
                .collect();
            assert_eq!(format!("[{}]", rendered.join(", ")), text, "{key}");
        }
        Value::Array(a) => {
            let ints = a.integers().expect("integer array");
            let rendered: Vec<String> = ints.iter().map(|x| x.to_string()).collect();
            assert_eq!(format!("[{}]", rendered.join(", ")), text, "{key}");
        }
        other => {
            let i = other.as_integer().expect("integer scalar");
            assert_eq!(i.to_string(), text, "{key}");
        }
    }
}

fn check_against_listing(folder: &str) {
    let f = GgufFile::open(data(folder, "model-f16.gguf")).unwrap();
    let text = std::fs::read_to_string(data(folder, "gguf_listing.txt")).unwrap();
    let (meta, tensors) = parse_listing(&text);
    assert_eq!(f.version(), 3);

    let keys: Vec<&str> = f.metadata().iter().map(|e| e.key.as_str()).collect();
    let listed_keys: Vec<&str> = meta.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(keys, listed_keys, "{folder}: metadata keys in file order");
    for (key, ty, value) in &meta {
        let v = f.get(key).unwrap();
        if let Some(ty) = ty {
            assert_eq!(&type_label(v), ty, "{folder}: type of {key}");
        }
        check_value(key, v, value);
    }

    let got: Vec<ListedTensor> = f
        .tensor_infos()
        .iter()
        .map(|t| ListedTensor {
            name: t.name.clone(),
            ty: t.ty.gguf_py_name().to_string(),
            dims: t.dims.clone(),
            n_bytes: t.n_bytes,
        })
        .collect();
    assert!(!tensors.is_empty());
    assert_eq!(got, tensors, "{folder}: tensor table");
    // The data section is packed the way llama.cpp's writer packs it.
    let mut next = 0;
    for t in f.tensor_infos() {
        assert_eq!(t.offset, next, "{folder}: {}", t.name);
        next = (t.offset + t.n_bytes).div_ceil(f.alignment()) * f.alignment();
    }
    assert_eq!(f.data_offset() + next, f.file_len());
}

#[test]
fn tiny_qwen35_matches_listing() {
    check_against_listing("tiny-qwen35");
    let f = GgufFile::open(data("tiny-qwen35", "model-f16.gguf")).unwrap();
    assert_eq!(f.tensor_infos().len(), 124);
    assert_eq!(f.get_u32("qwen35.block_count").unwrap(), 9);
    assert_eq!(
        f.get_i64_array("qwen35.rope.dimension_sections").unwrap(),
        vec![11, 11, 10, 0]
    );
    let t = f.tensor("output.weight").unwrap();
    assert_eq!((t.ty, t.dims), (GgmlType::F16, &[320u64, 2048][..]));
}

#[test]
fn demo_code_model_matches_listing() {
    check_against_listing("demo-code-model");
}

#[test]
fn vocab_only_gguf_matches_readme() {
    // Values from qwen-tokenizer/README.md (gguf-py's reading of the file).
    let f = GgufFile::open(data("qwen-tokenizer", "vocab-qwen35.gguf")).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata().len(), 35);
    assert!(f.tensor_infos().is_empty());
    assert_eq!(f.get_str("general.architecture").unwrap(), "qwen35");
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "qwen35");
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 248_320);
    assert_eq!(tokens[248_077], "[PAD248077]");
    assert_eq!(
        f.get_i64_array("tokenizer.ggml.token_type").unwrap().len(),
        248_320
    );
    let merges = f.get_str_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges.len(), 500_709);
    assert!(merges.iter().all(|m| m.contains(' ')));
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 248_046);
    assert_eq!(
        f.get_u32("tokenizer.ggml.padding_token_id").unwrap(),
        248_044
    );
    assert!(!f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
    assert_eq!(f.get_u32("qwen35.block_count").unwrap(), 33);
    assert_eq!(f.get_f32("qwen35.rope.freq_base").unwrap(), 10000.0);
    assert_eq!(
        f.get_str("tokenizer.chat_template")
            .unwrap()
            .chars()
            .count(),
        7756
    );
    let rec = f.get_array("qwen35.attention.recurrent_layers").unwrap();
    assert_eq!(
        (rec.len(), rec.element_type()),
        (33, gguf_io::ValueType::Bool)
    );
    assert!(matches!(
        f.get_u32("tokenizer.ggml.bos_token_id"),
        Err(gguf_io::GgufError::MissingKey { .. })
    ));
}
