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
    /// Without -m or --chat-template-file: the demo model built into `pn`.
    #[arg(short = 'm', long = "model")]
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
    // No -m and no template file: the built-in demo model, as every other command.
    let meta = if args.model.is_some() || args.chat_template_file.is_none() {
        let (file, name) = crate::demo::open_model(args.model.as_deref())?;
        Some(
            TokenizerMetadata::from_gguf(&file)
                .map_err(|e| format!("reading the tokenizer of {}: {e}", name.display()))?,
        )
    } else {
        None
    };
    let source = match &args.chat_template_file {
        Some(path) => read(path)?,
        None => match meta.as_ref().and_then(|m| m.chat_template.clone()) {
            Some(t) => t,
            None => {
                // As `pn chat` and the server render for such a model.
                eprintln!(
                    "pn: the model has no chat template; using ChatML (<|im_start|>role ... <|im_end|>)"
                );
                pn_runtime::engine::FALLBACK_CHAT_TEMPLATE.to_string()
            }
        },
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
