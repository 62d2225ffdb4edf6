//! Tokenizer ids and chat-template renders: exact, and checked against the references that
//! ship with the test data (HF tokenizers ids, transformers renders).

use super::super::case::{ids_text, CaseError, Ctx, Output, Run};
use super::super::snapshot::Field;
use pn_runtime::chat_template::{ChatTemplate, ChatTemplateError, TemplateContext};
use pn_runtime::tokenizer::Tokenizer;
use pn_tests::try_ids;

fn jsonl(
    ctx: &Ctx,
    folder: &str,
    name: &str,
) -> Result<Vec<(String, serde_json::Value)>, CaseError> {
    let path = ctx.file(folder, name);
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            let v = serde_json::from_str(l)
                .map_err(|e| format!("{}:{}: {e}", path.display(), i + 1))?;
            Ok((l.to_string(), v))
        })
        .collect()
}

fn qwen(ctx: &Ctx) -> Result<Tokenizer, CaseError> {
    Ok(Tokenizer::open(
        ctx.file("qwen-tokenizer", "vocab-qwen35.gguf"),
    )?)
}

/// Every text of `qwen-tokenizer/tokenize-cases.jsonl` through the Qwen3.5 tokenizer.
pub fn tokenizer(ctx: &Ctx) -> Result<Run, CaseError> {
    let tok = qwen(ctx)?;
    let mut out = Output::default();
    for (_, case) in jsonl(ctx, "qwen-tokenizer", "tokenize-cases.jsonl")? {
        let id = case["id"].as_str().ok_or("case without id")?;
        let text = case["text"].as_str().ok_or("case without text")?;
        let got = tok.encode(text).map_err(|e| format!("{id}: {e}"))?;
        let want = try_ids(&case["ids_hf"])?;
        out.check(got == want, || {
            format!("{id}: ids differ from HF tokenizers")
        });
        out.fields.push(Field::exact(id, ids_text(&got)));
    }
    Ok(Run::Done(out))
}

/// Every conversation of `chat-template/cases.jsonl`, rendered and tokenized.
pub fn chat_template(ctx: &Ctx) -> Result<Run, CaseError> {
    let tok = qwen(ctx)?;
    let mut out = Output::default();
    for (line, case) in jsonl(ctx, "chat-template", "cases.jsonl")? {
        let id = case["id"].as_str().ok_or("case without id")?;
        let file = case["template_file"]
            .as_str()
            .ok_or("case without template_file")?;
        let src = std::fs::read_to_string(ctx.file("chat-template", file))?;
        let template = ChatTemplate::new(&src)?;
        let mut tctx = TemplateContext::from_request_json(&line)?;
        tctx.set_kwargs_json(&case["kwargs"].to_string())?;
        match template.render(&tctx) {
            Ok(text) => {
                out.check(case["rendered"].as_str() == Some(text.as_str()), || {
                    format!("{id}: render differs from transformers")
                });
                let ids = tok.encode(&text).map_err(|e| format!("{id}: {e}"))?;
                out.fields
                    .push(Field::exact(format!("{id}.text"), format!("{text:?}")));
                out.fields
                    .push(Field::exact(format!("{id}.ids"), ids_text(&ids)));
            }
            Err(e) => {
                let raised = matches!(e, ChatTemplateError::Raised { .. });
                out.check(raised && case["error"].is_string(), || {
                    format!("{id}: unexpected error {e}")
                });
                out.fields
                    .push(Field::exact(format!("{id}.error"), e.to_string()));
            }
        }
    }
    Ok(Run::Done(out))
}
