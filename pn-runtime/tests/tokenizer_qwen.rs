//! The tokenizer built from the real Qwen3.5 vocab-only GGUF against the reference
//! tokenizations in tests/data/qwen-tokenizer (tiktoken, HF tokenizers and llama.cpp).

mod common;

use common::{ids, jsonl, qwen};
use pn_runtime::tokenizer::{StreamDecoder, TokenType, TokenizerMetadata};
use proptest::prelude::*;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::{NormalizedString, Normalizer};

fn nfc(s: &str) -> String {
    let mut n = NormalizedString::from(s);
    NFC.normalize(&mut n).unwrap();
    n.get().to_string()
}

#[test]
fn gguf_metadata_is_read_as_documented() {
    let file = gguf_io::GgufFile::open(common::vocab_path()).unwrap();
    let meta = TokenizerMetadata::from_gguf(&file).unwrap();
    assert_eq!(meta.model, "gpt2");
    assert_eq!(meta.pre.as_deref(), Some("qwen35"));
    assert_eq!(meta.tokens.len(), 248_320);
    assert_eq!(meta.merges.len(), 500_709);
    assert_eq!(meta.eos_token_id, Some(248_046));
    assert_eq!(meta.padding_token_id, Some(248_044));
    assert_eq!(meta.bos_token_id, None);
    assert_eq!(meta.add_bos_token, Some(false));
    assert_eq!(meta.chat_template.as_ref().map(String::len), Some(7756));
    let types = meta.types().unwrap();
    let count = |t: TokenType| types.iter().filter(|&&x| x == t).count();
    assert_eq!(count(TokenType::Normal), 248_044);
    assert_eq!(count(TokenType::Control), 27);
    assert_eq!(count(TokenType::UserDefined), 6);
    assert_eq!(count(TokenType::Unused), 243);
}

#[test]
fn special_ids_and_end_of_generation_set() {
    let t = qwen();
    assert_eq!(t.n_vocab(), 248_320);
    assert!(!t.adds_bos());
    assert_eq!(t.eog_ids(), &[248_044, 248_046, 248_063, 248_064, 248_065]);
    for (text, id) in [
        ("<|endoftext|>", 248_044),
        ("<|im_start|>", 248_045),
        ("<|im_end|>", 248_046),
        ("<think>", 248_068),
        ("</think>", 248_069),
    ] {
        assert_eq!(t.encode(text).unwrap(), vec![id], "{text}");
        assert_eq!(t.token_id(text), Some(id));
        assert_eq!(t.decode(&[id]).unwrap(), text);
    }
    assert!(!t.is_sampleable(248_100));
    assert!(!t.is_sampleable(248_320));
    assert!(t.is_sampleable(248_046));
    assert_eq!(t.decode(&[248_100]).unwrap(), "");
    assert!(t.decode(&[248_320]).is_err());
}

#[test]
fn chat_prompt_matches_published_ids() {
    let ids = qwen()
        .encode("<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
        .unwrap();
    assert_eq!(
        ids,
        [248045, 846, 198, 9419, 248046, 198, 248045, 74455, 198, 248068, 271, 248069, 271]
    );
}

#[test]
fn every_reference_case_encodes_and_decodes_like_hf() {
    let t = qwen();
    let cases = jsonl(common::data("qwen-tokenizer", "tokenize-cases.jsonl"));
    assert_eq!(cases.len(), 358);
    let mut failures = Vec::new();
    for case in &cases {
        let id = case["id"].as_str().unwrap();
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids_hf"]);
        let got = t.encode(text).unwrap();
        if got != want {
            failures.push(format!("{id} encode {text:?}: got {got:?} want {want:?}"));
            continue;
        }
        let decoded = t.decode(&got).unwrap();
        if decoded != case["decoded_hf"].as_str().unwrap() {
            failures.push(format!("{id} decode: got {decoded:?}"));
        }
        // Streaming one token at a time gives the same text.
        let mut stream = StreamDecoder::new();
        let mut streamed = String::new();
        for &tok in &got {
            streamed.push_str(&t.decode_next(&mut stream, tok).unwrap());
        }
        streamed.push_str(&stream.finish());
        if streamed != decoded {
            failures.push(format!("{id} stream decode: got {streamed:?}"));
        }
        // llama.cpp's parse_special=false: control tokens are text, user-defined still match.
        // llama.cpp does not apply NFC, so only lines NFC leaves alone are comparable.
        if !case["nfc_changes_text"].as_bool().unwrap() {
            let plain = t.encode_plain(text).unwrap();
            let want = ids(&case["ids_llamacpp_parse_special_false"]);
            if plain != want {
                failures.push(format!(
                    "{id} encode_plain {text:?}: got {plain:?} want {want:?}"
                ));
            }
            let want = ids(&case["ids_llamacpp"]);
            if got != want {
                failures.push(format!("{id} differs from llama.cpp without NFC in play"));
            }
        }
        // llama.cpp's decode of its ids is the original text (its ids are of the raw text).
        let raw = t.decode(&ids(&case["ids_llamacpp"])).unwrap();
        if raw != case["decoded_llamacpp"].as_str().unwrap() {
            failures.push(format!("{id} decode of llama.cpp ids: got {raw:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn split_characters_are_held_back_while_streaming() {
    let t = qwen();
    let text = "🦀 Rust 🦀 and 漢字 with é and 👩‍👩‍👧";
    let ids = t.encode(text).unwrap();
    // Some tokens carry only part of a character: they are not valid UTF-8 on their own.
    let partial = ids
        .iter()
        .filter(|&&id| std::str::from_utf8(t.token_bytes(id).unwrap()).is_err())
        .count();
    assert!(
        partial > 0,
        "expected tokens with partial characters in {ids:?}"
    );
    let mut stream = StreamDecoder::new();
    let mut out = String::new();
    for &id in &ids {
        let piece = t.decode_next(&mut stream, id).unwrap();
        assert!(
            !piece.contains('\u{FFFD}'),
            "replacement character emitted for {id}"
        );
        out.push_str(&piece);
    }
    assert!(!stream.has_pending());
    assert_eq!(out, text);
}

/// Text built from the scripts that stress a byte-level BPE.
fn interesting_text() -> impl Strategy<Value = String> {
    let pieces = prop_oneof![
        "[a-zA-Z0-9 ,.'!?\\n\\t]{1,12}",
        "[\u{4e00}-\u{9fff}]{1,6}",                  // CJK
        "[\u{1f300}-\u{1faff}]{1,4}",                // emoji
        "[a-z][\u{0300}-\u{036f}]{1,3}",             // combining marks
        "[\u{0600}-\u{06ff}\u{0590}-\u{05ff}]{1,6}", // Arabic, Hebrew
        "[\u{1780}-\u{17ff}\u{0e00}-\u{0e7f}]{1,6}", // Khmer, Thai
        Just("\u{200d}".to_string()),                // ZWJ
        Just("\r\n".to_string()),
        Just("   ".to_string()),
        any::<char>().prop_map(|c| c.to_string()),
    ];
    prop::collection::vec(pieces, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip_is_nfc_of_input(text in interesting_text()) {
        let t = qwen();
        let ids = t.encode(&text).unwrap();
        prop_assert_eq!(t.decode(&ids).unwrap(), nfc(&text));
        let plain = t.encode_plain(&text).unwrap();
        prop_assert_eq!(t.decode(&plain).unwrap(), nfc(&text));
    }

    #[test]
    fn streaming_equals_whole_decode(text in interesting_text()) {
        let t = qwen();
        let ids = t.encode(&text).unwrap();
        let mut stream = StreamDecoder::new();
        let mut out = String::new();
        for &id in &ids {
            let piece = t.decode_next(&mut stream, id).unwrap();
            let clean = !piece.contains(char::REPLACEMENT_CHARACTER)
                || text.contains(char::REPLACEMENT_CHARACTER);
            prop_assert!(clean, "replacement character in {:?}", piece);
            out.push_str(&piece);
        }
        out.push_str(&stream.finish());
        prop_assert_eq!(out, t.decode(&ids).unwrap());
    }

    #[test]
    fn stream_decoder_equals_lossy_decode_of_any_bytes(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
        cuts in prop::collection::vec(0usize..64, 0..8),
    ) {
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(bytes.len())).collect();
        cuts.push(0);
        cuts.push(bytes.len());
        cuts.sort_unstable();
        let mut d = StreamDecoder::new();
        let mut out = String::new();
        for w in cuts.windows(2) {
            out.push_str(&d.push(&bytes[w[0]..w[1]]));
        }
        out.push_str(&d.finish());
        prop_assert_eq!(out, String::from_utf8_lossy(&bytes).into_owned());
    }
}
