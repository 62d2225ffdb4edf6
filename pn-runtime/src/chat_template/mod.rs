//! Chat templates: rendering a model's `tokenizer.chat_template` (Jinja) into the prompt text,
//! the way HF transformers' `apply_chat_template` does.
//!
//! The template text comes from a model file anyone may have made, so it runs sandboxed:
//! minijinja has no file system access here (no loader, no `include`/`import`/`extends`), and
//! every render has a fuel budget (bounding both time and the memory it can allocate), a
//! recursion limit and an output size limit ([`TemplateLimits`]).
//!
//! One thing fuel cannot bound: minijinja 3.1 materialises a list concatenation nested more
//! than 32 deep (`{% set ns.l = ns.l + ns.l %}` repeated 33 times) without charging fuel, and
//! offers no hook to stop that allocation. Strings, repetition (`*`), output, `tojson`,
//! `|string`, `format` and loops are bounded by fuel. For templates one did not write, render
//! in a child process instead ([`TemplateIsolation::Subprocess`], set with
//! [`ChatTemplate::with_isolation`]): the worker runs under an address-space limit and a
//! timeout, so that template only costs a failed child and comes back as
//! [`ChatTemplateError::SandboxMemory`]. The `pn` binary does this by default (it is its own
//! worker, `pn __template-worker`); the library default, [`TemplateIsolation::InProcess`],
//! keeps the gap.
//!
//! Compatibility with Jinja2 as transformers sets it up: `trim_blocks` and `lstrip_blocks`,
//! loop controls, Python string/dict methods (`startswith`, `split`, `rstrip`, `items`, ...),
//! `raise_exception`, `strftime_now`, `namespace`; values print as Python prints them (`True`,
//! `None`, `0.001`), and `tojson` is `json.dumps` with Python's separators and
//! `ensure_ascii=False`. Variables not given stay undefined (`enable_thinking is defined`).

mod prompt;
mod python;
mod sandbox;
mod strftime;
mod values;

pub use prompt::ChatPrompt;
pub use sandbox::{run_worker, SubprocessSandbox, TemplateIsolation, LIMITS_ENV, WORKER_ARG};

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use python::{JsonOptions, Sink};
use serde::Serialize;
use std::sync::Arc;

/// Name the template is registered under (appears in error messages).
const TEMPLATE_NAME: &str = "chat_template";

/// Resource limits of one render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    /// minijinja fuel: about one unit per instruction or per 64 bytes created, so it bounds
    /// time and memory (about `fuel * 64` bytes).
    pub fuel: u64,
    /// Largest rendered prompt, in bytes.
    pub max_output_bytes: usize,
    /// Deepest nesting of macro calls, loops and blocks.
    pub recursion_limit: usize,
}

impl Default for TemplateLimits {
    /// 4,000,000 fuel (at most ~256 MB, well under a second), 8 MiB output, recursion 100:
    /// real templates rendering a 100k-token conversation use a few percent of that.
    fn default() -> Self {
        TemplateLimits {
            fuel: 4_000_000,
            max_output_bytes: 8 << 20,
            recursion_limit: 100,
        }
    }
}

/// Why a template could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    /// The model file has no template and none was given.
    #[error("the model has no chat template (tokenizer.chat_template); give one with EngineOptions::chat_template or ChatTemplate::new")]
    Missing,
    /// The template text is not valid Jinja (or uses a disabled feature such as `include`).
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)`.
    #[error("chat template raised an error: {message}")]
    Raised {
        /// The template's message.
        message: String,
    },
    /// The render did more work or allocated more than the fuel budget allows.
    #[error("chat template exceeded its fuel budget of {fuel} (too much work or memory)")]
    OutOfFuel {
        /// The budget.
        fuel: u64,
    },
    /// The rendered text grew past the output limit.
    #[error("chat template output exceeds the limit of {limit} bytes")]
    OutputTooLarge {
        /// The limit.
        limit: usize,
    },
    /// Any other failure while rendering (message includes the template line).
    #[error("chat template failed to render: {0}")]
    Render(String),
    /// Invalid JSON given for a template variable.
    #[error("invalid JSON for {what}: {reason}")]
    Json {
        /// Which input.
        what: String,
        /// The parser's message.
        reason: String,
    },
    /// The sandboxed render needed more memory than the worker's address-space limit.
    #[error(
        "chat template rendering exceeded the sandbox memory limit of {} MiB ({limit} bytes)",
        .limit >> 20
    )]
    SandboxMemory {
        /// The limit, in bytes.
        limit: u64,
    },
    /// The sandboxed render ran past its time limit; the worker was killed.
    #[error("chat template rendering exceeded the sandbox time limit of {secs} s")]
    SandboxTimeout {
        /// The limit, in seconds.
        secs: f64,
    },
    /// Tokenizing the rendered prompt failed ([`ChatTemplate::render_prompt`]).
    #[error("tokenizing the rendered prompt: {0}")]
    Tokenize(#[from] crate::tokenizer::TokenizerError),
    /// The sandbox worker could not be started or failed without a verdict on the template.
    #[error("chat template sandbox failed: {reason}")]
    SandboxFailed {
        /// What went wrong, with the worker's stderr.
        reason: String,
    },
}

/// The source of an error raised by the template's own `raise_exception`.
#[derive(Debug)]
struct RaisedByTemplate(String);

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedByTemplate {}

/// One chat message in the OpenAI shape. Richer messages (tool calls, content parts) can be
/// passed to [`TemplateContext::set`] or as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant turn's reasoning, rendered inside `<think>` by Qwen templates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            reasoning_content: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// The variables of one render: `messages`, `tools`, `add_generation_prompt` and any template
/// keyword arguments (`enable_thinking`, `reasoning_effort`, ...). Like transformers,
/// `add_generation_prompt` defaults to false and `tools` to none; anything else not set is
/// undefined.
#[derive(Debug, Clone)]
pub struct TemplateContext {
    vars: Vec<(String, Value)>,
}

impl Default for TemplateContext {
    fn default() -> Self {
        TemplateContext {
            vars: vec![
                ("messages".into(), Value::from(Vec::<Value>::new())),
                ("tools".into(), Value::from(())),
                ("add_generation_prompt".into(), Value::from(false)),
            ],
        }
    }
}

impl TemplateContext {
    /// An empty conversation without tools or generation prompt.
    pub fn new() -> Self {
        Self::default()
    }

    /// A context holding `messages`.
    pub fn with_messages(messages: &[ChatMessage]) -> Self {
        let mut ctx = Self::default();
        ctx.set("messages", messages);
        ctx
    }

    /// Parses an OpenAI-style request, `{"messages": [...], "tools": [...]}` (`tools`
    /// optional) or a bare array of messages. Object key order is kept (it shows in `tojson`).
    pub fn from_request_json(json: &str) -> Result<Self, ChatTemplateError> {
        let value = parse_json("the messages file", json)?;
        let mut ctx = Self::default();
        match value.kind() {
            ValueKind::Seq => ctx.set_value("messages", value),
            ValueKind::Map => {
                let messages = value.get_attr("messages").unwrap_or_default();
                if messages.kind() != ValueKind::Seq {
                    return Err(ChatTemplateError::Json {
                        what: "the messages file".into(),
                        reason: "expected a `messages` array".into(),
                    });
                }
                ctx.set_value("messages", messages);
                if let Ok(tools) = value.get_attr("tools") {
                    if !tools.is_undefined() {
                        ctx.set_value("tools", tools);
                    }
                }
            }
            _ => {
                return Err(ChatTemplateError::Json {
                    what: "the messages file".into(),
                    reason: "expected an object with `messages` or an array of messages".into(),
                })
            }
        }
        Ok(ctx)
    }

    /// Sets variable `name` to any serialisable value.
    pub fn set<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> &mut Self {
        self.set_value(name, Value::from(minijinja::value::Serde(value)));
        self
    }

    /// Sets variable `name` from JSON text (key order kept).
    pub fn set_json(&mut self, name: &str, json: &str) -> Result<&mut Self, ChatTemplateError> {
        let v = parse_json(&format!("`{name}`"), json)?;
        self.set_value(name, v);
        Ok(self)
    }

    /// Sets every key of a JSON object as a variable (`{"enable_thinking": false}`).
    pub fn set_kwargs_json(&mut self, json: &str) -> Result<&mut Self, ChatTemplateError> {
        let v = parse_json("the template kwargs", json)?;
        if v.kind() != ValueKind::Map {
            return Err(ChatTemplateError::Json {
                what: "the template kwargs".into(),
                reason: "expected a JSON object".into(),
            });
        }
        for key in v.try_iter().map_err(|e| render_error(e, 0, 0))? {
            let item = v.get_item(&key).unwrap_or_default();
            self.set_value(&key.to_string(), item);
        }
        Ok(self)
    }

    /// Whether to end with the assistant turn's opening (`<|im_start|>assistant\n...`).
    pub fn add_generation_prompt(&mut self, yes: bool) -> &mut Self {
        self.set_value("add_generation_prompt", Value::from(yes));
        self
    }

    /// The current value of variable `name`, as JSON text (for inspection and tests).
    pub fn get_json(&self, name: &str) -> Option<String> {
        let v = self.vars.iter().find(|(k, _)| k == name)?;
        let mut sink = Sink::new(None, usize::MAX);
        python::json_dumps(&v.1, &JsonOptions::default(), &mut sink).ok()?;
        Some(sink.buf)
    }

    fn set_value(&mut self, name: &str, value: Value) {
        match self.vars.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value,
            None => self.vars.push((name.to_string(), value)),
        }
    }
}

fn parse_json(what: &str, json: &str) -> Result<Value, ChatTemplateError> {
    serde_json::from_str::<Value>(json).map_err(|e| ChatTemplateError::Json {
        what: what.into(),
        reason: e.to_string(),
    })
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    limits: TemplateLimits,
    special_tokens: Vec<(String, String)>,
    isolation: TemplateIsolation,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("limits", &self.limits)
            .field("special_tokens", &self.special_tokens)
            .field("isolation", &self.isolation)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` with the default limits.
    pub fn new(source: &str) -> Result<ChatTemplate, ChatTemplateError> {
        Self::with_limits(source, TemplateLimits::default())
    }

    /// Compiles `source` with the given limits.
    pub fn with_limits(
        source: &str,
        limits: TemplateLimits,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .keep_trailing_newline(false)
                .build()
                .map_err(|e| ChatTemplateError::Syntax(error_text(&e)))?,
        );
        env.set_fuel(Some(limits.fuel));
        env.set_recursion_limit(limits.recursion_limit);
        env.set_unknown_method_callback(|state, value, method, args| {
            // `'{:>999999999}'.format(x)` would allocate before any fuel is charged.
            if method == "format" {
                if let Some(fmt) = value.as_str() {
                    check_format_widths(fmt, '{', '}')?;
                }
            }
            minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
        });
        install_python_compat(&mut env, limits.max_output_bytes);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatTemplateError::Syntax(error_text(&e)))?;
        Ok(ChatTemplate {
            env,
            limits,
            special_tokens: Vec::new(),
            isolation: TemplateIsolation::InProcess,
        })
    }

    /// The model's template (`tokenizer.chat_template`) with its special-token texts
    /// (`eos_token`, `bos_token`, `pad_token`) as variables, as transformers passes them.
    pub fn from_tokenizer(
        tok: &crate::tokenizer::Tokenizer,
    ) -> Result<ChatTemplate, ChatTemplateError> {
        let source = tok.chat_template().ok_or(ChatTemplateError::Missing)?;
        Ok(Self::new(source)?.with_special_tokens_of(tok))
    }

    /// Makes the texts of the tokenizer's bos/eos/pad tokens available as `bos_token`,
    /// `eos_token` and `pad_token`.
    pub fn with_special_tokens_of(mut self, tok: &crate::tokenizer::Tokenizer) -> Self {
        let s = tok.specials();
        for (name, id) in [
            ("bos_token", s.bos),
            ("eos_token", s.eos),
            ("pad_token", s.pad),
        ] {
            if let Some(text) = id.and_then(|id| tok.token_bytes(id).ok()) {
                self.special_tokens
                    .push((name.to_string(), String::from_utf8_lossy(text).into_owned()));
            }
        }
        self
    }

    /// Like [`with_special_tokens_of`](Self::with_special_tokens_of), from raw metadata (the
    /// special tokens are added tokens, stored as plain text).
    pub fn with_special_tokens_of_metadata(
        mut self,
        meta: &crate::tokenizer::TokenizerMetadata,
    ) -> Self {
        for (name, id) in [
            ("bos_token", meta.bos_token_id),
            ("eos_token", meta.eos_token_id),
            ("pad_token", meta.padding_token_id),
        ] {
            if let Some(text) = id.and_then(|id| meta.tokens.get(id as usize)) {
                self.special_tokens.push((name.to_string(), text.clone()));
            }
        }
        self
    }

    /// The limits in force.
    pub fn limits(&self) -> TemplateLimits {
        self.limits
    }

    /// Renders in a child process (or back in this one): see [`TemplateIsolation`].
    pub fn with_isolation(mut self, isolation: TemplateIsolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// Where renders run.
    pub fn isolation(&self) -> &TemplateIsolation {
        &self.isolation
    }

    /// Renders the prompt, in this process or in the sandbox worker; both give the same text
    /// and the same errors for the same template, limits and context.
    ///
    /// Tool calls in `messages` whose `function.arguments` is a JSON object in a string (what
    /// OpenAI clients send) reach the template as that object, as transformers users pass
    /// them; other strings stay strings.
    pub fn render(&self, ctx: &TemplateContext) -> Result<String, ChatTemplateError> {
        let parsed;
        let ctx = match ctx.vars.iter().find(|(k, _)| k == "messages") {
            Some((_, messages)) => match values::parse_tool_arguments(messages) {
                Some(messages) => {
                    let mut c = ctx.clone();
                    c.set_value("messages", messages);
                    parsed = c;
                    &parsed
                }
                None => ctx,
            },
            None => ctx,
        };
        match &self.isolation {
            TemplateIsolation::InProcess => self.render_in_process(ctx),
            TemplateIsolation::Subprocess(sandbox) => sandbox.render(self, ctx),
        }
    }

    fn render_in_process(&self, ctx: &TemplateContext) -> Result<String, ChatTemplateError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Syntax(error_text(&e)))?;
        let mut vars: Vec<(String, Value)> = self
            .special_tokens
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        vars.extend(ctx.vars.iter().cloned());
        let root = Value::from_pairs(vars);
        let mut out = CappedWriter {
            buf: Vec::new(),
            limit: self.limits.max_output_bytes,
            exceeded: false,
        };
        let result = template.render_captured_to(root, &mut out);
        if out.exceeded {
            return Err(ChatTemplateError::OutputTooLarge {
                limit: self.limits.max_output_bytes,
            });
        }
        result.map_err(|e| render_error(e, self.limits.fuel, self.limits.max_output_bytes))?;
        String::from_utf8(out.buf)
            .map_err(|e| ChatTemplateError::Render(format!("output is not UTF-8: {e}")))
    }

    /// Renders `messages` with the generation prompt, the usual call before generating.
    pub fn render_messages(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let mut ctx = TemplateContext::with_messages(messages);
        ctx.add_generation_prompt(add_generation_prompt);
        self.render(&ctx)
    }
}

/// Collects the output and refuses to grow past the limit.
struct CappedWriter {
    buf: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.limit {
            self.exceeded = true;
            return Err(std::io::Error::other("chat template output limit reached"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Maps a minijinja error to ours, recognising the template's own `raise_exception`.
fn render_error(e: Error, fuel: u64, limit: usize) -> ChatTemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if let Some(raised) = err.downcast_ref::<RaisedByTemplate>() {
            return ChatTemplateError::Raised {
                message: raised.0.clone(),
            };
        }
        source = err.source();
    }
    match e.kind() {
        ErrorKind::OutOfFuel => ChatTemplateError::OutOfFuel { fuel },
        ErrorKind::WriteFailure => ChatTemplateError::OutputTooLarge { limit },
        _ => ChatTemplateError::Render(error_text(&e)),
    }
}

/// The error with its cause chain on one line.
fn error_text(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Largest field width or precision a format string may ask for.
const MAX_FORMAT_WIDTH: u64 = 65_536;

/// Refuses format strings whose placeholders (between `open` and `close`) ask for huge widths
/// or precisions: formatting allocates them before fuel is charged.
fn check_format_widths(fmt: &str, open: char, close: char) -> Result<(), Error> {
    let mut inside = false;
    let mut number: u64 = 0;
    for c in fmt.chars() {
        if !inside {
            inside = c == open;
            number = 0;
            continue;
        }
        if let Some(d) = c.to_digit(10) {
            number = number.saturating_mul(10).saturating_add(u64::from(d));
            if number > MAX_FORMAT_WIDTH {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("format width or precision above {MAX_FORMAT_WIDTH}"),
                ));
            }
        } else {
            number = 0;
            if c == close || (close == '\0' && c.is_ascii_alphabetic()) {
                inside = false;
            }
        }
    }
    Ok(())
}

/// The filters, functions and printing rules that make minijinja render like Jinja2 under
/// transformers.
fn install_python_compat(env: &mut Environment<'static>, max_output: usize) {
    let limit = Arc::new(max_output);

    // Printing `{{ value }}`: Python's str() for everything but strings.
    let l = limit.clone();
    env.set_formatter(move |out, state, value| match value.kind() {
        ValueKind::String | ValueKind::Undefined => minijinja::escape_formatter(out, state, value),
        _ => {
            let mut sink = Sink::new(Some(state), *l);
            python::py_str(value, &mut sink)?;
            out.write_str(&sink.buf).map_err(Error::from)
        }
    });

    let l = limit.clone();
    env.add_filter(
        "string",
        move |state: &State, value: Value| -> Result<Value, Error> {
            if value.kind() == ValueKind::String {
                return Ok(value);
            }
            let mut sink = Sink::new(Some(state), *l);
            python::py_str(&value, &mut sink)?;
            Ok(Value::from(sink.buf))
        },
    );

    let l = limit.clone();
    env.add_filter(
        "tojson",
        move |state: &State, value: Value, kwargs: Kwargs| -> Result<Value, Error> {
            let mut opts = JsonOptions {
                ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
                sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
                ..JsonOptions::default()
            };
            if let Some(indent) = kwargs.get::<Option<Value>>("indent")? {
                opts.indent = match indent.kind() {
                    ValueKind::None | ValueKind::Undefined => None,
                    ValueKind::String => Some(indent.as_str().unwrap_or_default().to_string()),
                    _ => {
                        let n = i64::try_from(indent)?.clamp(0, 64);
                        Some(" ".repeat(n as usize))
                    }
                };
            }
            if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
                if let [a, b] = seps.as_slice() {
                    opts.separators = Some((a.clone(), b.clone()));
                } else {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson separators must be two strings",
                    ));
                }
            }
            kwargs.assert_all_used()?;
            let mut sink = Sink::new(Some(state), *l);
            python::json_dumps(&value, &opts, &mut sink)?;
            Ok(Value::from_safe_string(sink.buf))
        },
    );

    // `join` builds its result before the engine charges for it: build it in a paying sink.
    let l = limit.clone();
    env.add_filter(
        "join",
        move |state: &State, value: Value, sep: Option<String>| -> Result<Value, Error> {
            let mut sink = Sink::new(Some(state), *l);
            if let Some(s) = value.as_str() {
                // Joining a string joins its characters.
                let sep = sep.unwrap_or_default();
                for (i, c) in s.chars().enumerate() {
                    if i > 0 {
                        sink.push(&sep)?;
                    }
                    sink.push(c.encode_utf8(&mut [0; 4]))?;
                }
                return Ok(Value::from(sink.buf));
            }
            let sep = sep.unwrap_or_default();
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    sink.push(&sep)?;
                }
                python::py_str(&item, &mut sink)?;
            }
            Ok(Value::from(sink.buf))
        },
    );

    // printf-style `"%999999999s"|format(x)`: same guard as `str.format`.
    env.add_filter(
        "format",
        |state: &mut State,
         fmt: &Value,
         args: minijinja::value::Rest<minijinja::value::ValueOrKwargs>|
         -> Result<Value, Error> {
            if let Some(text) = fmt.as_str() {
                check_format_widths(text, '%', '\0')?;
            }
            minijinja::filters::format(state, fmt, args)
        },
    );

    env.add_function(
        "raise_exception",
        |message: Value| -> Result<Value, Error> {
            let text = message
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| message.to_string());
            Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("raise_exception: {text}"),
            )
            .with_source(RaisedByTemplate(text)))
        },
    );

    env.add_function("strftime_now", |format: String| -> Result<Value, Error> {
        Ok(Value::from(strftime::DateTime::now().format(&format)))
    });
}
