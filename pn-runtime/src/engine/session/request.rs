//! What a generation is asked for and what it reports: the prompt, stop conditions and their
//! cancel flag, the events streamed back, why it ended, and its timings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What to generate from: text (tokenized without BOS, special-token text such as
/// `<|im_start|>` mapped to its id) or token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Text to tokenize.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

impl From<&str> for Prompt {
    fn from(s: &str) -> Prompt {
        Prompt::Text(s.to_string())
    }
}

impl From<String> for Prompt {
    fn from(s: String) -> Prompt {
        Prompt::Text(s)
    }
}

impl From<Vec<u32>> for Prompt {
    fn from(t: Vec<u32>) -> Prompt {
        Prompt::Tokens(t)
    }
}

impl From<&[u32]> for Prompt {
    fn from(t: &[u32]) -> Prompt {
        Prompt::Tokens(t.to_vec())
    }
}

/// A flag that stops a generation: clone it, hand it to another thread or a Ctrl-C handler, and
/// call [`cancel`](Self::cancel). The generation checks it before every token, so it stops
/// within one token.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token that is not cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the generation to stop.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether [`cancel`](Self::cancel) was called (since the last [`reset`](Self::reset)).
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Clears the flag so the token can be reused for the next generation.
    pub fn reset(&self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// When a generation ends (besides the end of the context).
#[derive(Debug, Clone, Default)]
pub struct StopConditions {
    /// Most tokens to generate; `None`: until an end token, a stop string or the context is full.
    pub max_tokens: Option<usize>,
    /// Stop strings: the output is cut exactly before the earliest match.
    pub strings: Vec<String>,
    /// Extra stop token ids (besides the model's end tokens).
    pub tokens: Vec<u32>,
    /// Keep generating past the model's end tokens (`<|im_end|>`, `<|endoftext|>`).
    pub ignore_eog: bool,
    /// Checked before every token.
    pub cancel: Option<CancelToken>,
}

impl StopConditions {
    /// At most `n` tokens, and the model's end tokens.
    pub fn max_tokens(n: usize) -> Self {
        StopConditions {
            max_tokens: Some(n),
            ..Self::default()
        }
    }

    /// Adds stop strings.
    pub fn with_strings<S: Into<String>>(mut self, strings: impl IntoIterator<Item = S>) -> Self {
        self.strings.extend(strings.into_iter().map(Into::into));
        self
    }

    /// Sets the cancellation flag.
    pub fn with_cancel(mut self, cancel: CancelToken) -> Self {
        self.cancel = Some(cancel);
        self
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end token (its id is the event's token), or the output completed
    /// its grammar constraint with nothing allowed after it (the event's token is the
    /// grammar's last).
    EndOfGeneration,
    /// A stop string matched (the event's text ends right before it).
    StopString(String),
    /// `max_tokens` were generated.
    MaxTokens,
    /// The session's context is full.
    ContextFull,
    /// The [`CancelToken`] was cancelled.
    Cancelled,
}

/// One step of a generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEvent {
    /// The sampled token; `None` only on a final event that samples nothing (cancelled, context
    /// full).
    pub token: Option<u32>,
    /// Text that became final with this step: valid UTF-8 (a character split across tokens is
    /// held back until complete), never part of a stop string, empty for end tokens.
    pub text: String,
    /// Set on the last event.
    pub finish: Option<FinishReason>,
}

/// Token counts and times of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Prompt tokens processed (not counting those reused from the session's state).
    pub prompt_tokens: usize,
    /// Tokens of the sequence reused from the session (its live state or a prompt-cache
    /// checkpoint) instead of being processed.
    pub prompt_reused: usize,
    /// Time spent on them.
    pub prompt_time: Duration,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Time spent generating (forward passes and sampling).
    pub generation_time: Duration,
    /// Of the generated tokens, those inside the thinking block (counted when the generation
    /// follows one: [`Generation::with_thinking`](super::Generation::with_thinking); the tags
    /// and a budget's forced closing tokens are not counted).
    pub reasoning_tokens: usize,
}

fn per_sec(n: usize, t: Duration) -> f64 {
    if t.is_zero() {
        0.0
    } else {
        n as f64 / t.as_secs_f64()
    }
}

impl Timings {
    /// Prompt tokens per second.
    pub fn prompt_tokens_per_sec(&self) -> f64 {
        per_sec(self.prompt_tokens, self.prompt_time)
    }

    /// Generated tokens per second.
    pub fn generation_tokens_per_sec(&self) -> f64 {
        per_sec(self.generated_tokens, self.generation_time)
    }
}

/// Called with `(tokens done, tokens total)` while a long prompt is processed.
pub type ProgressFn = Box<dyn FnMut(usize, usize) + Send>;
