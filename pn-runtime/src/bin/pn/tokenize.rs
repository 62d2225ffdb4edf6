//! `pn tokenize`: print the token ids of a text as a JSON array.

use pn_runtime::tokenizer::Tokenizer;
use std::path::PathBuf;

/// Tokenize text with a model's tokenizer and print the ids as a JSON array.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model (a vocab-only file is enough).
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Text to tokenize.
    #[arg(
        short = 'p',
        long = "prompt",
        conflicts_with = "file",
        required_unless_present = "file"
    )]
    pub prompt: Option<String>,
    /// File whose exact contents (UTF-8) are tokenized.
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
        (None, Some(path)) => {
            let bytes =
                std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            String::from_utf8(bytes)
                .map_err(|e| format!("{} is not valid UTF-8: {e}", path.display()))?
        }
        (None, None) => return Err("give the text with -p TEXT or -f FILE".into()),
    };
    let tok = Tokenizer::open(&args.model)
        .map_err(|e| format!("loading the tokenizer of {}: {e}", args.model.display()))?;
    let ids = if args.no_parse_special {
        tok.encode_plain(&text)?
    } else {
        tok.encode(&text)?
    };
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
