//! `pn tokenize`: print the token ids of a text as a JSON array (a token file every `pn`
//! command that reads one takes: `pn logits --tokens`, `pn perplexity --tokens`).

use pn_runtime::tokenizer::Tokenizer;
use std::path::PathBuf;

/// Tokenize text with a model's tokenizer and print the ids as a JSON array.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model (a vocab-only file is enough). Without it: the demo model built into `pn`.
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Text to tokenize.
    #[arg(
        short = 'p',
        long = "prompt",
        conflicts_with = "file",
        required_unless_present = "file"
    )]
    pub prompt: Option<String>,
    /// File whose exact contents (UTF-8) are tokenized (`-` for stdin).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Treat control-token text such as `<|im_start|>` as plain characters.
    #[arg(long)]
    pub no_parse_special: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let text = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(path)) => crate::inputs::read_text(path)?,
        (None, None) => return Err("give the text with -p TEXT or -f FILE".into()),
    };
    let (file, name) = crate::demo::open_model(args.model.as_deref())?;
    let tok = Tokenizer::from_gguf(&file)
        .map_err(|e| format!("loading the tokenizer of {}: {e}", name.display()))?;
    let ids = if args.no_parse_special {
        tok.encode_plain(&text)?
    } else {
        tok.encode(&text)?
    };
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
