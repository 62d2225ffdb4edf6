//! Sessions: one sequence's state, prompt processing and streaming generation.
//!
//! [`request`] has what a generation is asked for and reports, [`core`] the sequence logic
//! (generic over the backend, behind the object-safe `CoreOps`), [`generation`] the streaming
//! iterator.

mod core;
mod generation;
mod request;
mod thinking;
mod token_stream;

pub use generation::Generation;
pub use request::{
    CancelToken, FinishReason, ProgressFn, Prompt, StopConditions, Timings, TokenEvent,
};
pub use thinking::ThinkingControl;
pub(crate) use token_stream::TokenStream;

pub use self::core::kept::candidate_rows;
pub(crate) use self::core::kept::count_candidate_row;
use self::core::CoreOps;
pub(crate) use self::core::{SessionCore, SpecRun};
use super::error::Result;
use super::{Engine, LoadedModel};
use crate::chat_template::{ChatMessage, TemplateContext};
use crate::sampling::SamplingParams;
use crate::speculative::{SpecControl, Speculation};
use std::sync::Arc;

/// One sequence: its KV cache and recurrent state, the tokens it holds, and the logits of its
/// last position. Sessions of one engine are independent of each other.
///
/// The same on every device: the sequence logic lives in a session core generic over the
/// backend, and this type picks the core of the engine's device.
pub struct Session {
    /// The `SessionCore<B>` of the engine's backend `B`, picked once in [`Session::new`].
    core: Box<dyn CoreOps>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("tokens", &self.len())
            .field("pending", &self.core.pending())
            .field("context", &self.context())
            .field("device", &self.engine().device())
            .finish_non_exhaustive()
    }
}

impl Session {
    pub(super) fn new(engine: Engine) -> Result<Session> {
        let core = match engine.loaded() {
            LoadedModel::Cpu(m) => {
                let m = Arc::clone(m);
                Box::new(SessionCore::new(engine, m)?) as Box<dyn CoreOps>
            }
            LoadedModel::Cuda(m) => {
                let m = Arc::clone(m);
                Box::new(SessionCore::new(engine, m)?)
            }
        };
        Ok(Session { core })
    }

    /// The engine this session runs on (clone it for a handle of your own).
    pub fn engine(&self) -> &Engine {
        self.core.engine()
    }

    /// Reports progress of long prompts (for a progress bar).
    pub fn set_progress(&mut self, f: Option<ProgressFn>) {
        self.core.set_progress(f);
    }

    /// Changes this session's speculative decoding (the engine's option is the default).
    /// Turning it on mid-sequence works; the MTP head lacks the earlier rows until then.
    pub fn set_speculation(&mut self, spec: Speculation) {
        self.core.set_speculation(spec);
    }

    /// The speculative decoder's controls, when speculation is on (statistics, draft count,
    /// and a custom drafter or acceptance rule for tests).
    pub fn speculation_mut(&mut self) -> Option<&mut dyn SpecControl> {
        self.core.speculation_mut()
    }

    /// Every token of the sequence (prompts and generated tokens).
    pub fn tokens(&self) -> Vec<u32> {
        self.core.tokens()
    }

    /// Positions in use.
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Whether the session holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions the session can hold.
    pub fn context(&self) -> usize {
        self.core.context()
    }

    /// Back to an empty sequence; the prompt cache is emptied too.
    pub fn reset(&mut self) -> Result<()> {
        self.core.reset()
    }

    /// Positions of the prompt cache's checkpoints (ascending): a new sequence that diverges
    /// from this session's tokens at position `p` is recomputed from the largest of them `<= p`.
    pub fn prompt_cache_positions(&self) -> Vec<usize> {
        self.core.prompt_cache_positions()
    }

    /// The logits after the last processed token, when no sampled token is waiting to be
    /// processed (after a prompt, before the generation samples).
    pub fn logits(&self) -> Option<&[f32]> {
        self.core.logits()
    }

    /// Bytes the prompt cache's checkpoints hold (recurrent states and logits).
    pub fn prompt_cache_bytes(&self) -> u64 {
        self.core.prompt_cache_bytes()
    }

    /// Appends `tokens` to the sequence and returns the logits after the last one.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.core.feed(tokens)
    }

    /// Appends `tokens` and returns the logits after each of them (`tokens.len() x vocab`,
    /// row `t` predicting the token after `tokens[t]`), for perplexity and KL measurements.
    pub fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.core.feed_all_logits(tokens)
    }

    fn tokenize(&self, prompt: Prompt) -> Result<Vec<u32>> {
        match prompt {
            Prompt::Text(s) => Ok(self.engine().tokenizer().encode(&s)?),
            Prompt::Tokens(t) => Ok(t),
        }
    }

    /// Appends `prompt` to the sequence and streams the continuation. The prompt is processed
    /// here (errors such as a prompt longer than the context come back now); each call of the
    /// iterator then samples one token.
    pub fn generate(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<Generation<'_>> {
        let tokens = self.tokenize(prompt.into())?;
        let run = self.core.start_append(&tokens)?;
        Ok(Generation::new(self, params, stop, run))
    }

    /// Makes the session hold exactly `prompt` (the whole sequence, not an addition to it) and
    /// streams the continuation. The longest prefix the session can reuse is kept and only the
    /// rest is processed; [`Timings::prompt_tokens`] counts the processed tokens. Servers use this
    /// for requests that each carry a whole conversation.
    pub fn generate_sequence(
        &mut self,
        prompt: impl Into<Prompt>,
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<Generation<'_>> {
        let full = self.tokenize(prompt.into())?;
        let run = self.core.start_sequence(&full)?;
        Ok(Generation::new(self, params, stop, run))
    }

    /// How many leading tokens of `tokens` this session would not process again if
    /// [`generate_sequence`](Self::generate_sequence) (or [`chat`](Self::chat)) got `tokens`
    /// now: the session's tokens when `tokens` extends them, else the position of the newest
    /// prompt-cache checkpoint within the common prefix, else 0. Servers use it to pick, among
    /// several sessions, the one that already holds a conversation.
    pub fn reusable_prefix(&self, tokens: &[u32]) -> usize {
        self.core.reusable_prefix(tokens)
    }

    /// Renders `messages` with the model's chat template (plus the assistant generation prompt)
    /// and streams the assistant's reply. Control tokens come only from the template: text in
    /// a message that looks like chat markup is tokenized as plain text
    /// ([`Engine::chat_prompt`](crate::engine::Engine::chat_prompt)). The session keeps the conversation: call again with
    /// the reply and the next user message appended, and only the tokens after the reusable
    /// prefix are processed (after the session's tokens when the rendering extends them, else
    /// after the prompt-cache checkpoint before the last turn's assistant reply, for templates
    /// that re-render earlier replies differently).
    pub fn chat(
        &mut self,
        messages: &[ChatMessage],
        params: SamplingParams,
        stop: StopConditions,
    ) -> Result<Generation<'_>> {
        let mut ctx = TemplateContext::with_messages(messages);
        ctx.add_generation_prompt(true);
        let prompt = self.engine().chat_prompt(&ctx)?;
        let run = self.core.start_sequence(&prompt.tokens)?;
        Ok(Generation::new(self, params, stop, run))
    }
}
