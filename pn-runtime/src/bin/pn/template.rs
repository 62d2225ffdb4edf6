//! `pn template`: render a conversation with the model's chat template and print the prompt
//! exactly (no newline added).

use pn_runtime::chat_template::{ChatTemplate, TemplateContext};
use pn_runtime::tokenizer::TokenizerMetadata;
use std::io::Write;
use std::path::PathBuf;

/// Render messages with a model's chat template and print the prompt exactly.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model (a vocab-only file is enough); gives the template and the special tokens.
    #[arg(
        short = 'm',
        long = "model",
        required_unless_present = "chat_template_file"
    )]
    pub model: Option<PathBuf>,
    /// JSON file: `{"messages": [...], "tools": [...]}` (OpenAI style, tools optional).
    #[arg(long = "messages")]
    pub messages: PathBuf,
    /// End with the opening of the assistant's turn.
    #[arg(long)]
    pub add_generation_prompt: bool,
    /// JSON object of extra template variables, e.g. '{"enable_thinking": false}'.
    #[arg(long = "kwargs")]
    pub kwargs: Option<String>,
    /// Jinja template file to use instead of the model's `tokenizer.chat_template`.
    #[arg(long = "chat-template-file")]
    pub chat_template_file: Option<PathBuf>,
    #[command(flatten)]
    pub sandbox: crate::engine_args::TemplateSandboxArgs,
}

/// Runs the subcommand.
pub fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let read = |path: &PathBuf| {
        std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
    };
    let meta = match &args.model {
        Some(path) => {
            let file = gguf_io::GgufFile::open(path)
                .map_err(|e| format!("opening {}: {e}", path.display()))?;
            Some(
                TokenizerMetadata::from_gguf(&file)
                    .map_err(|e| format!("reading the tokenizer of {}: {e}", path.display()))?,
            )
        }
        None => None,
    };
    let source = match (&args.chat_template_file, &meta) {
        (Some(path), _) => read(path)?,
        (None, Some(meta)) => meta.chat_template.clone().ok_or_else(|| {
            format!(
                "{} has no tokenizer.chat_template; pass --chat-template-file",
                args.model
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            )
        })?,
        (None, None) => return Err("pass -m MODEL or --chat-template-file FILE".into()),
    };
    let mut template = ChatTemplate::new(&source)?.with_isolation(args.sandbox.isolation()?);
    if let Some(meta) = &meta {
        template = template.with_special_tokens_of_metadata(meta);
    }
    let mut ctx = TemplateContext::from_request_json(&read(&args.messages)?)
        .map_err(|e| format!("{}: {e}", args.messages.display()))?;
    if args.add_generation_prompt {
        ctx.add_generation_prompt(true);
    }
    if let Some(kwargs) = &args.kwargs {
        ctx.set_kwargs_json(kwargs)?;
    }
    let prompt = template.render(&ctx)?;
    let mut out = std::io::stdout().lock();
    out.write_all(prompt.as_bytes())?;
    out.flush()?;
    Ok(())
}
