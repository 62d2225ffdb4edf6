//! tokenizer.json + tokenizer_config.json (+ config.json's special ids) to the `tokenizer.*`
//! keys llama.cpp's converter writes for a GPT-2-style byte-level BPE (`tokenizer.ggml.model =
//! gpt2`): the token list padded to the model's vocabulary with `[PADn]`, token types, merges,
//! the special token ids, the add-BOS/EOS flags and the chat template.

use super::error::ConvertError;
use gguf_io::{Array, MetadataEntry, Value};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;

/// GGUF token types (gguf-py `TokenType`).
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The special-token kinds the converter looks up, in its order.
const SPECIAL_KINDS: &[&str] = &["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

fn tok_err(path: &Path, msg: impl Into<String>) -> ConvertError {
    ConvertError::Tokenizer {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn read_json(path: &Path) -> Result<Json, ConvertError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConvertError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| ConvertError::Json {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })
}

/// llama.cpp's guess that an added token not flagged special is a control token anyway.
fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<\u{ff5c}") && t.ends_with("\u{ff5c}>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

/// The tokenizer keys for the checkpoint in `dir` whose model has `vocab_size` embedding rows.
/// `pre` is the pre-tokenizer name (`qwen35` for this architecture).
pub fn metadata(
    dir: &Path,
    vocab_size: u64,
    pre: &str,
) -> Result<Vec<MetadataEntry>, ConvertError> {
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        return Err(tok_err(
            &tok_path,
            "missing (pn converts byte-level BPE tokenizers from tokenizer.json)",
        ));
    }
    let tok = read_json(&tok_path)?;
    let model = tok
        .get("model")
        .ok_or_else(|| tok_err(&tok_path, "no `model` object"))?;
    if model.get("type").and_then(|t| t.as_str()) != Some("BPE") {
        return Err(tok_err(&tok_path, "model.type is not BPE"));
    }
    let vocab = model
        .get("vocab")
        .and_then(|v| v.as_object())
        .ok_or_else(|| tok_err(&tok_path, "model.vocab is not an object"))?;

    // id -> (text, added?, special?)
    let mut by_id: HashMap<u64, (String, bool, bool)> = HashMap::new();
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| tok_err(&tok_path, format!("vocab[{text:?}] is not an id")))?;
        by_id.insert(id, (text.clone(), false, false));
    }
    let added = tok
        .get("added_tokens")
        .and_then(|a| a.as_array())
        .cloned()
        .unwrap_or_default();
    for a in &added {
        let (Some(id), Some(content)) = (
            a.get("id").and_then(|i| i.as_u64()),
            a.get("content").and_then(|c| c.as_str()),
        ) else {
            return Err(tok_err(
                &tok_path,
                format!("added token {a} lacks id or content"),
            ));
        };
        let special = a.get("special").and_then(|s| s.as_bool()).unwrap_or(false);
        by_id.insert(id, (content.to_string(), true, special));
    }
    if let Some(max) = by_id.keys().max() {
        if *max >= vocab_size {
            return Err(tok_err(
                &tok_path,
                format!("token id {max} is not below the model's vocab_size {vocab_size}"),
            ));
        }
    }
    let n = usize::try_from(vocab_size).map_err(|_| tok_err(&tok_path, "vocab_size too large"))?;
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..vocab_size {
        match by_id.get(&i) {
            None => {
                tokens.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
            Some((text, false, _)) => {
                tokens.push(text.clone());
                types.push(NORMAL);
            }
            Some((text, true, special)) => {
                if *special || looks_special(text) {
                    tokens.push(text.clone());
                    types.push(CONTROL);
                } else {
                    // User-defined tokens are stored pre-normalised: SentencePiece spaces.
                    tokens.push(text.replace('\u{2581}', " "));
                    types.push(USER_DEFINED);
                }
            }
        }
    }

    let merges = match model.get("merges").and_then(|m| m.as_array()) {
        None => Vec::new(),
        Some(list) => {
            let mut out = Vec::with_capacity(list.len());
            for m in list {
                match m {
                    Json::String(s) => out.push(s.clone()),
                    Json::Array(pair) if pair.len() == 2 => {
                        let (Some(a), Some(b)) = (pair[0].as_str(), pair[1].as_str()) else {
                            return Err(tok_err(
                                &tok_path,
                                format!("merge {m} is not two strings"),
                            ));
                        };
                        // A space inside a part is written as U+0120, as llama.cpp does.
                        let enc = |s: &str| s.replace(' ', "\u{120}");
                        out.push(format!("{} {}", enc(a), enc(b)));
                    }
                    _ => return Err(tok_err(&tok_path, format!("unknown merge format {m}"))),
                }
            }
            out
        }
    };

    let cfg_path = dir.join("tokenizer_config.json");
    let tcfg = if cfg_path.is_file() {
        read_json(&cfg_path)?
    } else {
        Json::Null
    };

    // Special ids: first from tokenizer_config.json's `<kind>_token` (matched against the
    // added tokens), then from config.json's `<kind>_token_id`; the first found wins.
    let mut special: Vec<(&str, u32)> = Vec::new();
    let mut add_flags: Vec<(&str, bool)> = Vec::new();
    if let Some(pp) = tok.get("post_processor").filter(|p| !p.is_null()) {
        let procs = match pp.get("processors").and_then(|p| p.as_array()) {
            Some(list) => list.clone(),
            None => vec![pp.clone()],
        };
        for p in procs {
            match p.get("type").and_then(|t| t.as_str()) {
                Some("ByteLevel") => {
                    for kind in ["bos", "eos"] {
                        if !add_flags.iter().any(|(k, _)| *k == kind) {
                            add_flags.push((kind, false));
                        }
                    }
                }
                other => {
                    return Err(tok_err(
                        &tok_path,
                        format!("post_processor type {other:?} is not supported (Qwen tokenizers use ByteLevel or none)"),
                    ))
                }
            }
        }
    }
    let mut set_special = |kind: &'static str, id: Option<u64>| {
        if let Some(id) = id.and_then(|i| u32::try_from(i).ok()) {
            if !special.iter().any(|(k, _)| *k == kind) {
                special.push((kind, id));
            }
        }
    };
    if let Json::Object(tc) = &tcfg {
        for &kind in SPECIAL_KINDS {
            if let Some(flag) = tc
                .get(&format!("add_{kind}_token"))
                .and_then(|b| b.as_bool())
            {
                if !add_flags.iter().any(|(k, _)| *k == kind) {
                    add_flags.push((kind, flag));
                }
            }
            let content = match tc.get(&format!("{kind}_token")) {
                Some(Json::String(s)) => Some(s.clone()),
                Some(Json::Object(o)) => o
                    .get("content")
                    .and_then(|c| c.as_str())
                    .map(str::to_string),
                _ => None,
            };
            if let Some(content) = content {
                let id = added.iter().find_map(|a| {
                    (a.get("content").and_then(|c| c.as_str()) == Some(content.as_str()))
                        .then(|| a.get("id").and_then(|i| i.as_u64()))
                        .flatten()
                });
                set_special(kind, id);
            }
        }
    }
    let config_path = dir.join("config.json");
    if config_path.is_file() {
        let cfg = read_json(&config_path)?;
        for &kind in SPECIAL_KINDS {
            let key = format!("{kind}_token_id");
            let id = cfg
                .get(&key)
                .filter(|v| !v.is_null())
                .or_else(|| cfg.get("text_config").and_then(|t| t.get(&key)))
                .and_then(|v| v.as_u64());
            set_special(kind, id);
        }
    }

    let chat_template = chat_template(dir, &tcfg, &cfg_path)?;

    let mut m = vec![
        MetadataEntry::new("tokenizer.ggml.model", Value::String("gpt2".into())),
        MetadataEntry::new("tokenizer.ggml.pre", Value::String(pre.into())),
        MetadataEntry::new("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        MetadataEntry::new("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
    ];
    if !merges.is_empty() {
        m.push(MetadataEntry::new(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(merges)),
        ));
    }
    for (kind, id) in special {
        let key = match kind {
            "pad" => "tokenizer.ggml.padding_token_id".to_string(),
            "unk" => "tokenizer.ggml.unknown_token_id".to_string(),
            "sep" => "tokenizer.ggml.seperator_token_id".to_string(),
            k => format!("tokenizer.ggml.{k}_token_id"),
        };
        m.push(MetadataEntry::new(key, Value::U32(id)));
    }
    for (kind, flag) in add_flags {
        m.push(MetadataEntry::new(
            format!("tokenizer.ggml.add_{kind}_token"),
            Value::Bool(flag),
        ));
    }
    if let Some(t) = chat_template {
        m.push(MetadataEntry::new(
            "tokenizer.chat_template",
            Value::String(t),
        ));
    }
    Ok(m)
}

/// The chat template: tokenizer_config.json's `chat_template`, else `chat_template.jinja`, else
/// `chat_template.json`'s `chat_template`.
fn chat_template(dir: &Path, tcfg: &Json, cfg_path: &Path) -> Result<Option<String>, ConvertError> {
    if tcfg.is_null() {
        return Ok(None);
    }
    match tcfg.get("chat_template") {
        Some(Json::String(s)) => return Ok(Some(s.clone())),
        Some(Json::Array(list)) => {
            // Named templates: the one named `default` is the model's template.
            let default = list.iter().find_map(|t| {
                (t.get("name").and_then(|n| n.as_str()) == Some("default"))
                    .then(|| {
                        t.get("template")
                            .and_then(|s| s.as_str())
                            .map(str::to_string)
                    })
                    .flatten()
            });
            return match default {
                Some(t) => Ok(Some(t)),
                None => Err(tok_err(
                    cfg_path,
                    "chat_template list has no `default` entry",
                )),
            };
        }
        Some(Json::Null) | None => {}
        Some(_) => {
            return Err(tok_err(
                cfg_path,
                "chat_template is neither a string nor a list",
            ))
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja)
            .map(Some)
            .map_err(|e| ConvertError::io(&jinja, e));
    }
    let json = dir.join("chat_template.json");
    if json.is_file() {
        return Ok(read_json(&json)?
            .get("chat_template")
            .and_then(|t| t.as_str())
            .map(str::to_string));
    }
    Ok(None)
}
