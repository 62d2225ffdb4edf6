//! llama.cpp's command-line spellings: the one table of them, and the argv normaliser that lets
//! clap read them.
//!
//! clap reads `-c 512` and `--ctx-size 512` natively, but a multi-letter short flag such as
//! `-ngl 99` would be read as `-n gl 99`. Before clap sees the arguments, [`normalise`] rewrites
//! each multi-letter short spelling of [`FLAGS`] to its long flag, and refuses the llama.cpp
//! flags of [`UNSUPPORTED`] with a message that names the flag (instead of clap's guess at what
//! `-ts` could mean). The README's "Coming from llama.cpp" table is [`markdown_table`] of the
//! same rows, and a test checks that every spelling parses to what its long flag does.

use std::ffi::OsString;

/// One llama.cpp flag pn takes.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    /// Every llama.cpp spelling, short ones first (`-ngl`, `--gpu-layers`, `--n-gpu-layers`).
    pub spellings: &'static [&'static str],
    /// pn's own long flag the spellings mean; multi-letter short spellings are rewritten to it.
    pub long: &'static str,
    /// The subcommands that take it.
    pub commands: &'static [&'static str],
    /// A value to test it with (`None`: a switch, or a value that may be left out).
    pub example: Option<&'static str>,
    /// What pn does with it, where that differs from llama.cpp.
    pub note: &'static str,
}

/// One llama.cpp flag pn does not have.
#[derive(Debug, Clone, Copy)]
pub struct Unsupported {
    /// Its spellings.
    pub spellings: &'static [&'static str],
    /// Why, or what to use instead.
    pub why: &'static str,
}

const RUN: &[&str] = &["run"];
const RUN_CHAT: &[&str] = &["run", "chat"];
const MODEL_CMDS: &[&str] = &["run", "chat", "bench", "perplexity", "serve"];
const SAMPLING_CMDS: &[&str] = &["run", "chat"];

/// The llama.cpp flags pn takes, and how.
pub const FLAGS: &[Flag] = &[
    Flag {
        spellings: &["-m", "--model"],
        long: "--model",
        commands: &[
            "run",
            "chat",
            "bench",
            "perplexity",
            "serve",
            "tokenize",
            "logits",
            "template",
        ],
        example: Some("model.gguf"),
        note: "without it: the demo model built into `pn`",
    },
    Flag {
        spellings: &["-c", "--ctx-size"],
        long: "--ctx-size",
        commands: MODEL_CMDS,
        example: Some("2048"),
        note: "0: min(4096, the model's)",
    },
    Flag {
        spellings: &["-t", "--threads"],
        long: "--threads",
        commands: MODEL_CMDS,
        example: Some("4"),
        note: "default: the physical cores",
    },
    Flag {
        spellings: &["-ngl", "--gpu-layers", "--n-gpu-layers"],
        long: "--n-gpu-layers",
        commands: MODEL_CMDS,
        example: Some("99"),
        note:
            "accepted; pn runs on the CPU unless `--device cuda` (then every layer is on the GPU)",
    },
    Flag {
        spellings: &["-dev", "--device"],
        long: "--device",
        commands: MODEL_CMDS,
        example: Some("cuda"),
        note: "`cpu`, `cuda` or `cuda:N`",
    },
    Flag {
        spellings: &["-fa", "--flash-attn"],
        long: "--flash-attn",
        commands: MODEL_CMDS,
        example: None,
        note: "accepted (`on`/`off`/`auto`); pn's attention is always fused",
    },
    Flag {
        spellings: &["-ctk", "--cache-type-k"],
        long: "--cache-type-k",
        commands: MODEL_CMDS,
        example: Some("q8_0"),
        note: "f32, f16 (default), q8_0, q4_0",
    },
    Flag {
        spellings: &["-ctv", "--cache-type-v"],
        long: "--cache-type-v",
        commands: MODEL_CMDS,
        example: Some("q8_0"),
        note: "f32, f16 (default), q8_0, q4_0",
    },
    Flag {
        spellings: &["-b", "--batch-size"],
        long: "--batch-size",
        commands: MODEL_CMDS,
        example: Some("1024"),
        note: "caps the tokens per prefill step",
    },
    Flag {
        spellings: &["-ub", "--ubatch-size"],
        long: "--ubatch-size",
        commands: MODEL_CMDS,
        example: Some("128"),
        note: "tokens per prefill step (default 64; `pn bench` on the CPU 512, as llama-bench)",
    },
    Flag {
        spellings: &["--mlock"],
        long: "--mlock",
        commands: MODEL_CMDS,
        example: None,
        note: "locks the process's memory (mlockall)",
    },
    Flag {
        spellings: &["--no-mmap"],
        long: "--no-mmap",
        commands: MODEL_CMDS,
        example: None,
        note: "reads the model into memory instead of mapping it (immune to the file changing)",
    },
    Flag {
        spellings: &["-p", "--prompt"],
        long: "--prompt",
        commands: &["run", "chat", "tokenize"],
        example: Some("def f(x):"),
        note: "no -p/-f: the prompt is read from piped stdin",
    },
    Flag {
        spellings: &["-f", "--file"],
        long: "--file",
        commands: &["run", "tokenize", "perplexity"],
        example: Some("prompt.txt"),
        note: "`-f -` reads stdin",
    },
    Flag {
        spellings: &["-n", "--predict", "--n-predict"],
        long: "--n-predict",
        commands: RUN_CHAT,
        example: Some("64"),
        note: "-1: until an end token or the context is full",
    },
    Flag {
        spellings: &["-s", "--seed"],
        long: "--seed",
        commands: SAMPLING_CMDS,
        example: Some("42"),
        note: "default -1: a random seed (printed)",
    },
    Flag {
        spellings: &["--temp"],
        long: "--temp",
        commands: SAMPLING_CMDS,
        example: Some("0.5"),
        note: "default 0.8; 0: greedy",
    },
    Flag {
        spellings: &["--top-k"],
        long: "--top-k",
        commands: SAMPLING_CMDS,
        example: Some("20"),
        note: "default 40",
    },
    Flag {
        spellings: &["--top-p"],
        long: "--top-p",
        commands: SAMPLING_CMDS,
        example: Some("0.9"),
        note: "default 0.95",
    },
    Flag {
        spellings: &["--min-p"],
        long: "--min-p",
        commands: SAMPLING_CMDS,
        example: Some("0.1"),
        note: "default 0.05",
    },
    Flag {
        spellings: &["--repeat-penalty"],
        long: "--repeat-penalty",
        commands: SAMPLING_CMDS,
        example: Some("1.1"),
        note: "default 1 (off)",
    },
    Flag {
        spellings: &["--repeat-last-n"],
        long: "--repeat-last-n",
        commands: SAMPLING_CMDS,
        example: Some("32"),
        note: "default 64",
    },
    Flag {
        spellings: &["--presence-penalty"],
        long: "--presence-penalty",
        commands: SAMPLING_CMDS,
        example: Some("0.5"),
        note: "default 0",
    },
    Flag {
        spellings: &["--frequency-penalty"],
        long: "--frequency-penalty",
        commands: SAMPLING_CMDS,
        example: Some("0.5"),
        note: "default 0",
    },
    Flag {
        spellings: &["-r", "--reverse-prompt"],
        long: "--stop",
        commands: RUN,
        example: Some("User:"),
        note: "stops the output right before the text",
    },
    Flag {
        spellings: &["--ignore-eos"],
        long: "--ignore-eos",
        commands: RUN,
        example: None,
        note: "",
    },
    Flag {
        spellings: &["--no-display-prompt"],
        long: "--no-display-prompt",
        commands: RUN,
        example: None,
        note: "",
    },
    Flag {
        spellings: &["-cnv", "--conversation"],
        long: "--conversation",
        commands: RUN,
        example: None,
        note: "`pn run -cnv` is `pn chat`",
    },
    Flag {
        spellings: &["-no-cnv", "--no-conversation"],
        long: "--no-conversation",
        commands: RUN,
        example: None,
        note: "the default of `pn run`",
    },
    Flag {
        spellings: &["-sys", "--system-prompt"],
        long: "--system-prompt",
        commands: RUN_CHAT,
        example: Some("Be brief."),
        note: "with `pn run`: implies -cnv",
    },
    Flag {
        spellings: &["--jinja"],
        long: "--jinja",
        commands: RUN_CHAT,
        example: None,
        note: "accepted; pn always renders the Jinja template",
    },
    Flag {
        spellings: &["--chat-template-file"],
        long: "--chat-template-file",
        commands: &["run", "chat", "serve", "template"],
        example: Some("t.jinja"),
        note: "",
    },
    Flag {
        spellings: &["-np", "--parallel"],
        long: "--parallel",
        commands: &["serve", "bench"],
        example: Some("2"),
        note: "",
    },
    Flag {
        spellings: &["--host"],
        long: "--host",
        commands: &["serve"],
        example: Some("0.0.0.0"),
        note: "",
    },
    Flag {
        spellings: &["--port"],
        long: "--port",
        commands: &["serve"],
        example: Some("8081"),
        note: "",
    },
    Flag {
        spellings: &["--api-key"],
        long: "--api-key",
        commands: &["serve"],
        example: Some("k"),
        note: "",
    },
    Flag {
        spellings: &["--alias"],
        long: "--alias",
        commands: &["serve"],
        example: Some("qwen"),
        note: "",
    },
    Flag {
        spellings: &["--kl-divergence-base"],
        long: "--kl-divergence-base",
        commands: &["perplexity"],
        example: Some("base.kld"),
        note: "writes (or with --kl-divergence reads) pn's compact top-k file",
    },
    Flag {
        spellings: &["--kl-divergence"],
        long: "--kl-divergence",
        commands: &["perplexity"],
        example: None,
        note: "",
    },
    Flag {
        spellings: &["--chunks"],
        long: "--chunks",
        commands: &["perplexity"],
        example: Some("8"),
        note: "",
    },
];

/// llama.cpp flags pn does not have: refused with their name (exit status 2).
pub const UNSUPPORTED: &[Unsupported] = &[
    Unsupported {
        spellings: &["--lora", "--lora-scaled", "--lora-init-without-apply"],
        why: "no LoRA adapters",
    },
    Unsupported {
        spellings: &["--control-vector", "--control-vector-scaled"],
        why: "no control vectors",
    },
    Unsupported {
        spellings: &[
            "-md",
            "--model-draft",
            "-ngld",
            "--gpu-layers-draft",
            "-cd",
            "--ctx-size-draft",
            "--draft-max",
            "--draft-min",
        ],
        why: "no draft model: pn drafts with the model's own MTP head (--spec mtp --draft N)",
    },
    Unsupported {
        spellings: &["--mmproj", "--image"],
        why: "no vision input",
    },
    Unsupported {
        spellings: &[
            "-hf",
            "-hfr",
            "--hf-repo",
            "-hff",
            "--hf-file",
            "-mu",
            "--model-url",
        ],
        why: "no downloads: pass a local file with -m",
    },
    Unsupported {
        spellings: &[
            "-ts",
            "--tensor-split",
            "-sm",
            "--split-mode",
            "-mg",
            "--main-gpu",
        ],
        why: "one device per model",
    },
    Unsupported {
        spellings: &[
            "-ot",
            "--override-tensor",
            "--override-kv",
            "--cpu-moe",
            "-ncmoe",
            "--n-cpu-moe",
        ],
        why: "no per-tensor placement or metadata overrides",
    },
    Unsupported {
        spellings: &["--numa"],
        why: "no NUMA placement",
    },
    Unsupported {
        spellings: &["-tb", "--threads-batch"],
        why: "one thread pool: use -t",
    },
    Unsupported {
        spellings: &[
            "--rope-scaling",
            "--rope-scale",
            "--rope-freq-base",
            "--rope-freq-scale",
            "--yarn-orig-ctx",
            "--yarn-ext-factor",
        ],
        why: "the model's own RoPE settings only",
    },
    Unsupported {
        spellings: &[
            "--mirostat",
            "--mirostat-lr",
            "--mirostat-ent",
            "--typical",
            "--dynatemp-range",
            "--xtc-probability",
            "--dry-multiplier",
        ],
        why: "samplers: temperature, top-k, top-p, min-p and the penalties",
    },
    Unsupported {
        spellings: &[
            "--keep",
            "--prompt-cache",
            "--prompt-cache-all",
            "--prompt-cache-ro",
        ],
        why: "prompt caching is automatic (--ctx-checkpoints)",
    },
    Unsupported {
        spellings: &[
            "--hellaswag",
            "--winogrande",
            "--multiple-choice",
            "--ppl-stride",
        ],
        why: "pn perplexity measures perplexity and KL divergence only",
    },
    Unsupported {
        spellings: &[
            "--embedding",
            "--embeddings",
            "--rerank",
            "--reranking",
            "--pooling",
        ],
        why: "no embeddings",
    },
    Unsupported {
        spellings: &["-i", "--interactive", "-if", "--interactive-first"],
        why: "use `pn chat` (or `pn run -cnv`)",
    },
];

/// A llama.cpp flag that pn refuses by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("llama.cpp's `{flag}` is not supported by pn ({why})")]
pub struct UnsupportedFlag {
    /// The flag as given.
    pub flag: String,
    /// Why, or what to use instead.
    pub why: &'static str,
}

/// Flags whose value is free text: the argument after them is never rewritten (`-p -fa` is a
/// prompt of three characters).
const FREE_TEXT: &[&str] = &[
    "-p",
    "--prompt",
    "--system-prompt",
    "--system",
    "--stop",
    "-r",
    "--reverse-prompt",
    "--kwargs",
    "--api-key",
    "--alias",
];

/// Rewrites llama.cpp's multi-letter short flags to pn's long ones (`-ngl 99` and `-ngl=99` to
/// `--n-gpu-layers 99`), and refuses the flags of [`UNSUPPORTED`]. Arguments after `--` or
/// after a free-text flag such as `-p` are left alone; so is everything of `pn __template-worker`.
pub fn normalise<I>(args: I) -> Result<Vec<OsString>, UnsupportedFlag>
where
    I: IntoIterator<Item = OsString>,
{
    let mut out = Vec::new();
    let mut after_free_text = false;
    let mut rest_verbatim = false;
    for arg in args {
        let Some(s) = arg.to_str().filter(|_| !rest_verbatim && !after_free_text) else {
            after_free_text = false;
            out.push(arg);
            continue;
        };
        if s == "--" {
            rest_verbatim = true;
            out.push(arg);
            continue;
        }
        let (name, value) = match s.split_once('=') {
            Some((n, v)) if n.starts_with('-') => (n, Some(v)),
            _ => (s, None),
        };
        if let Some(u) = UNSUPPORTED.iter().find(|u| u.spellings.contains(&name)) {
            return Err(UnsupportedFlag {
                flag: name.to_string(),
                why: u.why,
            });
        }
        let multi_short = name.len() > 2 && name.starts_with('-') && !name.starts_with("--");
        let rewritten = FLAGS
            .iter()
            .find(|f| multi_short && f.spellings.contains(&name))
            .map(|f| f.long);
        let name = rewritten.unwrap_or(name);
        after_free_text = FREE_TEXT.contains(&name) && value.is_none();
        match (rewritten, value) {
            (Some(long), Some(v)) => out.push(format!("{long}={v}").into()),
            (Some(long), None) => out.push(long.into()),
            (None, _) => out.push(arg),
        }
    }
    Ok(out)
}

/// The README's "Coming from llama.cpp" table: one row per flag, then the refused ones.
pub fn markdown_table() -> String {
    let code = |xs: &[&str]| {
        xs.iter()
            .map(|x| format!("`{x}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut s = String::from("| llama.cpp | pn | commands | notes |\n| --- | --- | --- | --- |\n");
    for f in FLAGS {
        let pn = match f.example {
            Some(v) => format!("{} {v}", f.long),
            None => f.long.to_string(),
        };
        s.push_str(&format!(
            "| {} | `{pn}` | {} | {} |\n",
            code(f.spellings),
            f.commands.join(", "),
            f.note
        ));
    }
    s.push_str(
        "\nNot supported (refused by name, exit status 2):\n\n| llama.cpp | why |\n| --- | --- |\n",
    );
    for u in UNSUPPORTED {
        s.push_str(&format!("| {} | {} |\n", code(u.spellings), u.why));
    }
    s
}

#[cfg(test)]
#[path = "llama_flags_tests.rs"]
mod tests;
