//! Load errors: GGUF files derived from the tiny model with one thing broken (written with
//! gguf-io's writer) each give their specific, named error.
#![allow(clippy::needless_range_loop)] // the naive references index like the formulas

use gguf_io::{GgmlType, GgufFile, MetadataEntry, Value};
use pn_tests::tiny;
use qwen_model::{CpuBackend, Model, ModelError};
use std::sync::Arc;

/// The tiny model's metadata and tensors, with `edit` applied, written and loaded back.
fn load_edited(
    edit_meta: impl Fn(&mut Vec<MetadataEntry>),
    edit_tensors: impl Fn(&mut Vec<(String, GgmlType, Vec<u64>, Vec<u8>)>),
) -> Result<Model<CpuBackend>, ModelError> {
    let src = GgufFile::open(tiny("model-f16.gguf")).expect("tiny model");
    let mut meta = src.metadata().to_vec();
    edit_meta(&mut meta);
    let mut tensors: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = src
        .tensors()
        .map(|t| (t.name.to_string(), t.ty, t.dims.to_vec(), t.bytes.to_vec()))
        .collect();
    edit_tensors(&mut tensors);
    let specs: Vec<gguf_io::TensorSpec<'_>> = tensors
        .iter()
        .map(|(n, ty, d, b)| (n.as_str(), *ty, d.as_slice(), b.as_slice()))
        .collect();
    let bytes = gguf_io::write_gguf_to_vec(&meta, &specs).expect("write gguf");
    let file = GgufFile::from_bytes(bytes).expect("parse written gguf");
    Model::from_file(Arc::new(file), CpuBackend::new(1))
}

fn set(meta: &mut [MetadataEntry], key: &str, v: Value) {
    meta.iter_mut()
        .find(|e| e.key == key)
        .unwrap_or_else(|| panic!("no key {key}"))
        .value = v;
}

#[test]
fn unmodified_copy_loads() {
    let m = load_edited(|_| {}, |_| {}).expect("round trip loads");
    assert_eq!(m.config.n_layers, 8);
}

#[test]
fn missing_tensor() {
    let err = load_edited(|_| {}, |t| t.retain(|x| x.0 != "blk.3.attn_k.weight"))
        .err()
        .unwrap();
    match &err {
        ModelError::MissingTensor { name, expected } => {
            assert_eq!(name, "blk.3.attn_k.weight");
            assert_eq!(expected, &vec![320, 512]);
        }
        e => panic!("unexpected error {e}"),
    }
    assert!(err.to_string().contains("blk.3.attn_k.weight"));
}

#[test]
fn wrong_shape() {
    let err = load_edited(
        |_| {},
        |t| {
            let x = t.iter_mut().find(|x| x.0 == "blk.0.ffn_up.weight").unwrap();
            x.2 = vec![320, 700];
            x.3.truncate(320 * 700 * 2);
        },
    )
    .err()
    .unwrap();
    match &err {
        ModelError::BadShape {
            name,
            expected,
            found,
        } => {
            assert_eq!(name, "blk.0.ffn_up.weight");
            assert_eq!(expected, &vec![320, 704]);
            assert_eq!(found, &vec![320, 700]);
        }
        e => panic!("unexpected error {e}"),
    }
}

#[test]
fn wrong_type() {
    // MXFP4 is a valid ggml type but not one pn decodes (every type llama.cpp writes for this
    // family is; Q4_1 was refused here before they were added).
    let err = load_edited(
        |_| {},
        |t| {
            let x = t.iter_mut().find(|x| x.0 == "output.weight").unwrap();
            x.1 = GgmlType::Mxfp4;
            x.3 = vec![0u8; 2048 * (320 / 32) * 17];
        },
    )
    .err()
    .unwrap();
    match &err {
        ModelError::BadType { name, found, .. } => {
            assert_eq!(name, "output.weight");
            assert_eq!(found, "mxfp4");
            let msg = err.to_string();
            assert!(
                msg.contains("output.weight") && msg.contains("mxfp4"),
                "{msg}"
            );
        }
        e => panic!("unexpected error {e}"),
    }
    // A norm vector stored quantized is refused too.
    let err = load_edited(
        |_| {},
        |t| {
            let x = t
                .iter_mut()
                .find(|x| x.0 == "blk.2.attn_norm.weight")
                .unwrap();
            x.1 = GgmlType::Q8_0;
            x.3 = vec![0u8; 10 * 34];
        },
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, ModelError::BadType { name, .. } if name == "blk.2.attn_norm.weight"),
        "{err}"
    );
}

#[test]
fn missing_key() {
    let err = load_edited(|m| m.retain(|e| e.key != "qwen35.ssm.state_size"), |_| {})
        .err()
        .unwrap();
    assert!(
        matches!(&err, ModelError::MissingKey { key } if key == "qwen35.ssm.state_size"),
        "{err}"
    );
    assert!(err.to_string().contains("qwen35.ssm.state_size"));
}

#[test]
fn inconsistent_keys() {
    let err = load_edited(
        |m| set(m, "qwen35.attention.value_length", Value::U32(128)),
        |_| {},
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, ModelError::BadKey { key, .. } if key == "qwen35.attention.value_length"),
        "{err}"
    );
    let err = load_edited(
        |m| set(m, "qwen35.ssm.time_step_rank", Value::U32(5)),
        |_| {},
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, ModelError::BadKey { key, .. } if key == "qwen35.ssm.time_step_rank"),
        "{err}"
    );
    let err = load_edited(
        |m| set(m, "general.architecture", Value::String("llama".into())),
        |_| {},
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, ModelError::UnsupportedArch { arch } if arch == "llama"),
        "{err}"
    );
    // A wrongly typed value names the key too (gguf-io's typed getter error).
    let err = load_edited(
        |m| set(m, "qwen35.embedding_length", Value::String("320".into())),
        |_| {},
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("qwen35.embedding_length"), "{err}");
}

#[test]
fn layer_schedule_from_interval_when_no_list() {
    let m = load_edited(
        |m| m.retain(|e| e.key != "qwen35.attention.recurrent_layers"),
        |_| {},
    )
    .unwrap();
    let attn: Vec<usize> = (0..8)
        .filter(|&i| m.config.layer_kinds[i] == qwen_model::LayerKind::FullAttention)
        .collect();
    assert_eq!(attn, vec![3, 7]);
    let err = load_edited(
        |m| {
            m.retain(|e| {
                e.key != "qwen35.attention.recurrent_layers"
                    && e.key != "qwen35.full_attention_interval"
            })
        },
        |_| {},
    )
    .err()
    .unwrap();
    assert!(
        matches!(&err, ModelError::MissingKey { key } if key.contains("full_attention_interval")),
        "{err}"
    );
}

#[test]
fn tied_output_falls_back_to_embedding() {
    let m = load_edited(|_| {}, |t| t.retain(|x| x.0 != "output.weight")).unwrap();
    assert!(m.weights.output.is_none());
    assert_eq!(m.weights.lm_head().name, "token_embd.weight");
}
