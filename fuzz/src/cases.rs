//! The body of every fuzz target, shared by the libFuzzer binaries (`fuzz/fuzz_targets/*.rs`)
//! and by the corpus replay test (`pn-runtime/tests/fuzz_replay.rs`, which includes this file
//! with `#[path]`), so every input the fuzzer ever kept or crashed on is an ordinary
//! `cargo test` case without libFuzzer.
//!
//! Each function takes arbitrary bytes and panics only when a property fails: a typed error is
//! a pass. The files it needs (the Qwen vocabulary and chat template) come from `tests/data`,
//! found from the crate that includes this file (both crates sit one level below the root).

use std::path::PathBuf;
use std::sync::OnceLock;

use gguf_io::quants::{dequantize_row, DECODABLE};
use gguf_io::{write_gguf_to_vec, GgufFile, TensorSpec};
use pn_format::dot::dot_prepared_with;
use pn_format::{dequantize_row as pn_dequantize_row, dot_ref_f64, validate_row, Isa};
use pn_format::{PnType, PreparedF32, PreparedI16};
use pn_runtime::chat_template::{ChatTemplate, TemplateContext};
use pn_runtime::tokenizer::{TokenType, Tokenizer};

/// A target's body: arbitrary bytes in, a panic only when a property fails.
pub type Body = fn(&[u8]);

/// The targets, by name: what the replay test and `fuzz/run.sh` iterate over.
pub const TARGETS: &[(&str, Body)] = &[
    ("gguf_parse", gguf_parse),
    ("pn_validate", pn_validate),
    ("safetensors", safetensors),
    ("imatrix", imatrix),
    ("tokenizer", tokenizer),
    ("chat_template", chat_template),
    ("server_request", server_request),
];

/// `tests/data/<rel>` of the repository.
pub fn data_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data")
        .join(rel)
}

/// GGUF reader: any input gives Ok or a typed error. Inputs that parse are exercised further:
/// every tensor view, a decode of the first row of decodable tensors, and a write/re-read round
/// trip that must preserve the metadata and tensor bytes.
pub fn gguf_parse(data: &[u8]) {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for e in f.metadata() {
        let _ = f.get_u32(&e.key);
        let _ = f.get_f32(&e.key);
        let _ = f.get_str_array(&e.key);
        let _ = f.get_i64_array(&e.key);
    }
    let mut specs: Vec<TensorSpec<'_>> = Vec::new();
    for t in f.tensors() {
        assert_eq!(t.bytes.len() as u64, f.tensor_info(t.name).unwrap().n_bytes);
        if DECODABLE.contains(&t.ty) {
            if let Some(row) = t.row(0) {
                let n = t.row_len() as usize;
                if n <= 1 << 16 {
                    let mut out = vec![0f32; n];
                    dequantize_row(t.ty, row, &mut out).expect("validated row decodes");
                }
            }
        }
        specs.push((t.name, t.ty, t.dims, t.bytes));
    }
    // Huge (valid) alignments make the rewritten file gigabytes of padding: skip those.
    if f.alignment() > 1 << 16 {
        return;
    }
    let bytes = write_gguf_to_vec(f.metadata(), &specs).expect("a parsed file can be written");
    let g = GgufFile::from_bytes(bytes).expect("a written file parses");
    assert_eq!(g.metadata().len(), f.metadata().len());
    for (a, b) in g.metadata().iter().zip(f.metadata()) {
        assert_eq!(a.key, b.key);
        assert_eq!(format!("{:?}", a.value), format!("{:?}", b.value));
    }
    for (a, b) in g.tensors().zip(f.tensors()) {
        assert_eq!(
            (a.name, a.ty, a.dims, a.bytes),
            (b.name, b.ty, b.dims, b.bytes)
        );
    }
}

/// PN validation, decoding and dot products: a row that validates decodes to finite values
/// whose f64 dot product agrees with every fast path. Byte 0 selects pn3t or pn4t.
pub fn pn_validate(data: &[u8]) {
    let Some((&sel, bytes)) = data.split_first() else {
        return;
    };
    let ty = if sel & 1 == 0 {
        PnType::Pn3t
    } else {
        PnType::Pn4t
    };
    let valid = validate_row(ty, bytes).is_ok();
    let nb = bytes.len() / 34;
    let k = nb * ty.weights_per_block();
    let mut out = vec![0.0f32; k];
    let decoded = pn_dequantize_row(ty, bytes, &mut out);
    assert_eq!(decoded.is_ok(), bytes.len() % 34 == 0);
    if !valid {
        return;
    }
    assert!(
        out.iter().all(|v| v.is_finite()),
        "a valid row decodes to finite values"
    );
    // Activations derived from the selector byte: small integers, so the bound is loose.
    let x: Vec<f32> = (0..k)
        .map(|i| ((i as u32 ^ u32::from(sel)) % 7) as f32 - 3.0)
        .collect();
    let reference = dot_ref_f64(ty, bytes, &x).unwrap();
    // Scale of every partial sum either formulation forms: sum |d| (n + z) |x|.
    let mut mag = 0.0f64;
    for (b, blk) in pn_format::blocks(ty, bytes).unwrap().enumerate() {
        for e in 0..ty.weights_per_block() {
            let n = f64::from(blk.code(e)) + f64::from(ty.zero_point());
            let xe = f64::from(x[b * ty.weights_per_block() + e]).abs();
            mag += f64::from(blk.scale()).abs() * n * xe;
        }
    }
    let pf = PreparedF32::new(ty, &x).unwrap();
    let pq = PreparedI16::new(ty, &x).unwrap();
    for isa in Isa::available() {
        let f = f64::from(dot_prepared_with(isa, ty, bytes, &pf).unwrap());
        let q = f64::from(dot_prepared_with(isa, ty, bytes, &pq).unwrap());
        let bound = 1e-4 * mag + 1e-30;
        assert!(
            (f - reference).abs() <= bound,
            "{isa:?} f32 {f} vs {reference}"
        );
        assert!(
            (q - reference).abs() <= bound,
            "{isa:?} i16 {q} vs {reference}"
        );
    }
}

/// A scratch directory of this process (tmpfs when there is one: the file targets write
/// their input there once per execution).
fn scratch(name: &str) -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let dir = base.join(format!("pn-fuzz-{}-{thread}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// Safetensors shard and checkpoint reader (`pn convert`'s input). Byte 0: bit 0 set runs
/// the whole checkpoint reader (the tiny model's config and tokenizer + the shard) after the
/// shard reader. The rest
/// is the shard, written as `model.safetensors`. Every tensor the reader accepts must lie
/// inside the file with `shape x dtype size` bytes.
pub fn safetensors(data: &[u8]) {
    use pn_runtime::convert::{shards, Checkpoint, OpenOptions};
    let Some((&sel, shard)) = data.split_first() else {
        return;
    };
    let dir = scratch("st");
    std::fs::write(dir.join("model.safetensors"), shard).expect("write the shard");
    if let Ok(t) = shards::open(&dir) {
        for st in &t.tensors {
            let n: u64 = st.shape.iter().product();
            assert_eq!(
                t.bytes(st).len() as u64,
                n * st.dtype.size() as u64,
                "{}",
                st.name
            );
        }
    }
    if sel & 1 == 1 {
        // The tiny model's config and tokenizer (tests/data/tiny-qwen35/hf), which the
        // checkpoint reader accepts: the fuzzed shard decides whether the tensors match.
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            if !dir.join(f).is_file() {
                std::fs::copy(data_path(&format!("tiny-qwen35/hf/{f}")), dir.join(f))
                    .expect("copy the tiny model's checkpoint files");
            }
        }
        let opts = OpenOptions {
            outtype: None,
            model_name: Some("fuzz".into()),
        };
        if let Ok(c) = Checkpoint::open(&dir, &opts) {
            for i in 0..c.tensors.len() {
                let _ = c.tensor_bytes(i);
            }
        }
    }
}

/// Importance-matrix reader (`pn quantize --imatrix`): the GGUF layout (`GGUF` magic) or
/// llama.cpp's legacy `.dat`. Every entry read must have finite, non-negative means.
pub fn imatrix(data: &[u8]) {
    use pn_runtime::quantize::imatrix::ImatrixData;
    let path = scratch("imatrix").join("in.imatrix");
    std::fs::write(&path, data).expect("write the input");
    let Ok(m) = ImatrixData::read(&path) else {
        return;
    };
    for (name, means) in m.importance().iter() {
        assert!(
            means.iter().all(|v| v.is_finite() && *v >= 0.0),
            "{name}: means {means:?}"
        );
    }
}

fn qwen_tokenizer() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| {
        Tokenizer::open(data_path("qwen-tokenizer/vocab-qwen35.gguf")).expect("Qwen vocabulary")
    })
}

/// Tokenizer on arbitrary bytes (the Qwen 3.5 vocabulary). Properties: text that is not
/// UTF-8 is never tokenized silently as something else (`from_utf8_lossy` first, as the
/// server does); `encode_plain` never yields a control token (no chat-markup injection from
/// user text); decoding gives back the bytes of the tokens; a decoded text re-encodes and
/// decodes to itself (idempotent after the NFC normalization), and ASCII round-trips exactly;
/// decoding arbitrary ids is Ok below the vocabulary size and an error above.
pub fn tokenizer(data: &[u8]) {
    let tok = qwen_tokenizer();
    let text = String::from_utf8_lossy(data);
    let Ok(ids) = tok.encode_plain(&text) else {
        return;
    };
    for &id in &ids {
        assert_ne!(
            tok.token_type(id),
            Some(TokenType::Control),
            "encode_plain produced control token {id} from {text:?}"
        );
    }
    let bytes = tok.decode_bytes(&ids).expect("ids from encode decode");
    let mut joined = Vec::new();
    for &id in &ids {
        joined.extend_from_slice(tok.token_bytes(id).expect("token bytes"));
    }
    assert_eq!(bytes, joined, "decode_bytes is the tokens' bytes");
    let back = tok.decode(&ids).expect("ids from encode decode");
    if text.is_ascii() {
        assert_eq!(back, text, "ASCII round trip");
    }
    let again = tok
        .decode(&tok.encode_plain(&back).expect("re-encode"))
        .expect("re-decode");
    assert_eq!(again, back, "decode(encode(.)) is idempotent");
    // With special-token parsing on, the same text must still tokenize and decode.
    let special = tok.encode(&text).expect("encode with specials");
    let _ = tok.decode(&special).expect("decode with specials");
    // The input read as little-endian u32 ids.
    let n = tok.n_vocab() as u32;
    let raw: Vec<u32> = data
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let in_range: Vec<u32> = raw.iter().map(|id| id % n).collect();
    let _ = tok.decode(&in_range).expect("ids below n_vocab decode");
    if let Some(&big) = raw.iter().find(|&&id| id >= n) {
        assert!(tok.decode(&[big]).is_err(), "id {big} >= {n} is an error");
    }
}

fn qwen_template() -> &'static ChatTemplate {
    static T: OnceLock<ChatTemplate> = OnceLock::new();
    T.get_or_init(|| {
        let src = std::fs::read_to_string(data_path("chat-template/qwen3.5_chat_template.jinja"))
            .expect("Qwen chat template");
        ChatTemplate::new(&src).expect("the Qwen template compiles")
    })
}

/// Chat template renderer (the Qwen 3.5 template) on arbitrary message lists. Byte 0 bit 0:
/// the rest is a JSON request body (`messages`, `tools`, kwargs) read as the server reads it;
/// otherwise the rest is messages split at NUL bytes, each `role byte` + content. Any input
/// renders or gives a typed error (the fuel and output limits bound time and memory); a
/// rendered prompt of plain user/assistant turns contains every turn's content.
pub fn chat_template(data: &[u8]) {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let tmpl = qwen_template();
    if sel & 1 == 1 {
        let Ok(json) = std::str::from_utf8(rest) else {
            return;
        };
        if let Ok(mut ctx) = TemplateContext::from_request_json(json) {
            ctx.add_generation_prompt(sel & 2 == 2);
            let _ = tmpl.render(&ctx);
        }
        return;
    }
    const ROLES: [&str; 6] = ["system", "user", "assistant", "tool", "developer", ""];
    let mut messages = Vec::new();
    for part in rest.split(|&b| b == 0).take(64) {
        let Some((&r, content)) = part.split_first() else {
            continue;
        };
        let role = ROLES[usize::from(r) % ROLES.len()];
        let content = String::from_utf8_lossy(content).into_owned();
        let mut m = pn_runtime::chat_template::ChatMessage::new(role, content);
        if r & 0x80 != 0 && role == "assistant" {
            m.reasoning_content = Some(format!("r{r}"));
        }
        messages.push(m);
    }
    let Ok(out) = tmpl.render_messages(&messages, sel & 2 == 2) else {
        return;
    };
    // Only checked for a user-first conversation of user/assistant turns without
    // reasoning: the template may drop or move other turns (system first, tool grouping,
    // reasoning of old turns).
    let plain = messages.first().is_some_and(|m| m.role == "user")
        && messages
            .iter()
            .all(|m| (m.role == "user" || m.role == "assistant") && m.reasoning_content.is_none())
        // An assistant text with `</think>` is split into reasoning and answer by the template
        // (found by the fuzzer: fuzz/seeds/chat_template/think_split).
        && !messages.iter().any(|m| m.content.contains("think>"));
    if plain {
        for m in &messages {
            assert!(
                out.contains(m.content.trim()),
                "rendered prompt lacks {:?}",
                m.content
            );
        }
    }
}

/// The server's request parsing and validation for every endpoint with a body (byte 0 picks
/// it: chat completions, completions, messages, messages/count_tokens), run through the same
/// pure steps the handlers run before queueing (sampling settings, template messages, tools,
/// thinking budget), then the template render of the resulting messages. Any input gives Ok
/// or an `ApiError` that is a 4xx with a message; never a panic.
pub fn server_request(data: &[u8]) {
    use pn_runtime::server::{anthropic, api, thinking, tools::ToolConfig};
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    let defaults = api::SamplingDefaults::default();
    let check = |e: pn_runtime::server::error::ApiError| {
        let status = e.status.as_u16();
        assert!((400..500).contains(&status), "status {status} for {e:?}");
    };
    let messages = match sel % 4 {
        0 => (|| {
            let (req, fields, extras) = api::parse_chat(body)?;
            req.check_supported()?;
            let settings = fields.settings(req.max_completion_tokens, None, &extras, &defaults)?;
            let messages = req.template_messages()?;
            ToolConfig::from_openai(
                req.tools.as_deref(),
                req.tool_choice.as_ref(),
                req.parallel_tool_calls,
            )?;
            thinking::budget(
                req.reasoning_effort.as_deref(),
                req.thinking_budget_tokens,
                settings.max_tokens,
            )?;
            Ok(Some(messages))
        })(),
        1 => (|| {
            let (_req, fields, extras) = api::parse_completion(body)?;
            fields.settings(None, Some(16), &extras, &defaults)?;
            Ok(None)
        })(),
        n => (|| {
            let req = anthropic::request::parse(body)?;
            req.settings(&defaults, n == 3)?;
            let messages = req.template_messages()?;
            req.tools()?;
            req.kwargs()?;
            let _ = req.thinking_budget();
            Ok(Some(messages))
        })(),
    };
    match messages {
        Ok(Some(messages)) => {
            let mut ctx = TemplateContext::new();
            ctx.set("messages", &messages);
            ctx.add_generation_prompt(true);
            let _ = qwen_template().render(&ctx);
        }
        Ok(None) => {}
        Err(e) => check(e),
    }
}
