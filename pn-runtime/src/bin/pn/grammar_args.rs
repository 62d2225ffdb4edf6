//! Structured-output flags of `pn run` / `pn chat` / `pn bench` (llama.cpp's spellings):
//! `--grammar`, `--grammar-file`, `-j/--json-schema` (text or `@FILE`), `--json-schema-file`.

use pn_runtime::constrain::{Constraint, ConstraintFactory, Grammar};
use pn_runtime::tokenizer::Tokenizer;
use std::path::PathBuf;

/// Constrained-output flags: at most one of them.
#[derive(clap::Args, Debug, Clone, Default)]
#[group(multiple = false)]
pub struct GrammarArgs {
    /// GBNF grammar (llama.cpp syntax, `root ::= ...`) the output must match.
    #[arg(long)]
    pub grammar: Option<String>,
    /// Read the GBNF grammar from a file.
    #[arg(long = "grammar-file")]
    pub grammar_file: Option<PathBuf>,
    /// JSON schema the output must follow (its text, or @FILE); `{}` is any JSON value.
    #[arg(short = 'j', long = "json-schema")]
    pub json_schema: Option<String>,
    /// Read the JSON schema from a file.
    #[arg(long = "json-schema-file")]
    pub json_schema_file: Option<PathBuf>,
}

fn read(path: &std::path::Path, flag: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

impl GrammarArgs {
    /// The grammar the flags ask for, if any.
    pub fn grammar(&self) -> Result<Option<Grammar>, String> {
        if let Some(g) = &self.grammar {
            return Ok(Some(Grammar::Gbnf(g.clone())));
        }
        if let Some(p) = &self.grammar_file {
            return Ok(Some(Grammar::Gbnf(read(p, "--grammar-file")?)));
        }
        let (text, flag) = match (&self.json_schema, &self.json_schema_file) {
            (Some(s), _) => match s.strip_prefix('@') {
                Some(path) => (read(path.as_ref(), "--json-schema")?, "--json-schema"),
                None => (s.clone(), "--json-schema"),
            },
            (None, Some(p)) => (read(p, "--json-schema-file")?, "--json-schema-file"),
            (None, None) => return Ok(None),
        };
        let schema =
            serde_json::from_str(&text).map_err(|e| format!("{flag}: not valid JSON: {e}"))?;
        Ok(Some(Grammar::JsonSchema(schema)))
    }

    /// The compiled constraint for `tok`'s vocabulary, if a flag asks for one.
    pub fn constraint(&self, tok: &Tokenizer) -> Result<Option<Constraint>, String> {
        let Some(grammar) = self.grammar()? else {
            return Ok(None);
        };
        let factory = ConstraintFactory::new(tok).map_err(|e| e.to_string())?;
        factory.compile(&grammar).map(Some).map_err(|e| {
            let flag = match grammar {
                Grammar::JsonSchema(_) => "--json-schema",
                _ => "--grammar",
            };
            format!("{flag}: {e}")
        })
    }
}
