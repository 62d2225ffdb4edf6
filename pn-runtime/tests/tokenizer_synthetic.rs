//! A tokenizer built by hand from a tiny vocabulary: BPE merges, added tokens of each kind,
//! and the errors for malformed metadata.

use pn_runtime::tokenizer::{Tokenizer, TokenizerError, TokenizerMetadata};

/// The GPT-2 byte alphabet: bytes that print stand for themselves, the rest map to U+0100...
fn byte_chars() -> Vec<String> {
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
            let c = if printable {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap();
                next += 1;
                c
            };
            c.to_string()
        })
        .collect()
}

/// 256 byte tokens, merges for "Ġhello" and "lo", a control token, a user-defined token and an
/// unused padding entry.
fn tiny() -> TokenizerMetadata {
    let mut tokens = byte_chars();
    let mut types = vec![1i64; 256];
    for t in ["he", "ll", "llo", "hello", "Ġhello"] {
        tokens.push(t.into());
        types.push(1);
    }
    tokens.push("<|end|>".into()); // 261, control
    types.push(3);
    tokens.push("<x>".into()); // 262, user-defined
    types.push(4);
    tokens.push("[PAD263]".into()); // 263, unused
    types.push(5);
    TokenizerMetadata {
        model: "gpt2".into(),
        pre: Some("qwen35".into()),
        tokens,
        token_types: types,
        merges: ["h e", "l l", "ll o", "he llo", "Ġ hello"]
            .map(String::from)
            .to_vec(),
        eos_token_id: Some(261),
        ..TokenizerMetadata::default()
    }
}

#[test]
fn bpe_merges_and_added_tokens() {
    let t = Tokenizer::from_metadata(&tiny()).unwrap();
    let h = u32::from(b'h');
    assert_eq!(t.encode("hello").unwrap(), vec![259]);
    assert_eq!(t.encode(" hello").unwrap(), vec![260]);
    // "hel" cannot reach "hello": "he" + "l".
    assert_eq!(t.encode("hel").unwrap(), vec![256, u32::from(b'l')]);
    assert_eq!(t.encode("h<|end|>h").unwrap(), vec![h, 261, h]);
    assert_eq!(t.encode("h<x>h").unwrap(), vec![h, 262, h]);
    // Plain encoding splits the control token but still matches the user-defined one.
    let plain = t.encode_plain("<|end|><x>").unwrap();
    assert!(!plain.contains(&261) && plain.contains(&262), "{plain:?}");
    assert_eq!(t.decode(&plain).unwrap(), "<|end|><x>");
    // The unused entry is never produced.
    assert!(!t.encode("[PAD263]").unwrap().contains(&263));
    assert!(!t.is_sampleable(263));
    assert_eq!(t.eog_ids(), &[261]);
    assert_eq!(t.decode(&[260, 261]).unwrap(), " hello<|end|>");
    // Decomposed é (e + U+0301) is composed first (NFC) and comes back composed.
    assert_eq!(t.decode(&t.encode("e\u{301}").unwrap()).unwrap(), "\u{e9}");
}

#[test]
fn bos_is_added_only_when_asked_and_present() {
    let mut meta = tiny();
    meta.bos_token_id = Some(261);
    assert!(!Tokenizer::from_metadata(&meta).unwrap().adds_bos());
    meta.add_bos_token = Some(true);
    let t = Tokenizer::from_metadata(&meta).unwrap();
    assert_eq!(t.encode("hello").unwrap(), vec![261, 259]);
}

#[test]
fn malformed_metadata_is_rejected_with_the_key() {
    let err = |m: TokenizerMetadata| Tokenizer::from_metadata(&m).unwrap_err();

    let mut m = tiny();
    m.model = "llama".into();
    assert!(matches!(err(m), TokenizerError::UnsupportedModel(x) if x == "llama"));

    let mut m = tiny();
    m.pre = Some("mystery".into());
    let e = err(m);
    assert!(
        e.to_string().contains("mystery") && e.to_string().contains("qwen35"),
        "{e}"
    );

    let mut m = tiny();
    m.pre = None;
    assert!(err(m).to_string().contains("tokenizer.ggml.pre"));

    let mut m = tiny();
    m.merges.push("nospace".into());
    assert!(matches!(err(m), TokenizerError::BadMerge { index: 5, .. }));

    let mut m = tiny();
    m.merges.push("q zz".into()); // "zz" is not a token
    assert!(matches!(err(m), TokenizerError::Library(_)));

    let mut m = tiny();
    m.token_types.pop();
    assert!(err(m).to_string().contains("tokenizer.ggml.token_type"));

    let mut m = tiny();
    m.token_types[3] = 9;
    assert!(matches!(
        err(m),
        TokenizerError::BadTokenType { id: 3, ty: 9 }
    ));

    let mut m = tiny();
    m.eos_token_id = Some(5000);
    assert!(err(m).to_string().contains("tokenizer.ggml.eos_token_id"));

    let mut m = tiny();
    m.tokens.clear();
    m.token_types.clear();
    assert!(err(m).to_string().contains("tokenizer.ggml.tokens"));

    let t = Tokenizer::from_metadata(&tiny()).unwrap();
    assert!(matches!(
        t.decode(&[264]),
        Err(TokenizerError::IdOutOfRange {
            id: 264,
            n_vocab: 264
        })
    ));
}

#[test]
fn gguf_without_tokenizer_keys_names_the_missing_key() {
    let entries = vec![gguf_io::MetadataEntry {
        key: "general.architecture".into(),
        value: gguf_io::Value::String("qwen35".into()),
    }];
    let bytes = gguf_io::write_gguf_to_vec(&entries, &[]).unwrap();
    let file = gguf_io::GgufFile::from_bytes(bytes).unwrap();
    let e = Tokenizer::from_gguf(&file).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.model"), "{e}");
}

#[test]
fn a_written_gguf_round_trips_through_the_metadata_reader() {
    use gguf_io::{Array, MetadataEntry, Value};
    let m = tiny();
    let entry = |key: &str, value| MetadataEntry {
        key: key.into(),
        value,
    };
    let entries = vec![
        entry("tokenizer.ggml.model", Value::String(m.model.clone())),
        entry("tokenizer.ggml.pre", Value::String("qwen35".into())),
        entry(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(m.tokens.clone())),
        ),
        entry(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(
                m.token_types.iter().map(|&t| t as i32).collect(),
            )),
        ),
        entry(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(m.merges.clone())),
        ),
        entry("tokenizer.ggml.eos_token_id", Value::U32(261)),
        entry(
            "tokenizer.chat_template",
            Value::String("{{ messages|length }}".into()),
        ),
    ];
    let file =
        gguf_io::GgufFile::from_bytes(gguf_io::write_gguf_to_vec(&entries, &[]).unwrap()).unwrap();
    let read = TokenizerMetadata::from_gguf(&file).unwrap();
    assert_eq!(read.tokens, m.tokens);
    assert_eq!(read.token_types, m.token_types);
    assert_eq!(read.merges, m.merges);
    assert_eq!(read.eos_token_id, Some(261));
    assert_eq!(read.bos_token_id, None);
    let t = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(t.encode(" hello<|end|>").unwrap(), vec![260, 261]);
    assert_eq!(t.chat_template(), Some("{{ messages|length }}"));

    // A key of the wrong type is an error naming it, not a silent default.
    let mut bad = entries.clone();
    bad[5] = entry("tokenizer.ggml.eos_token_id", Value::String("x".into()));
    let file =
        gguf_io::GgufFile::from_bytes(gguf_io::write_gguf_to_vec(&bad, &[]).unwrap()).unwrap();
    let e = Tokenizer::from_gguf(&file).unwrap_err();
    assert!(e.to_string().contains("tokenizer.ggml.eos_token_id"), "{e}");
}
