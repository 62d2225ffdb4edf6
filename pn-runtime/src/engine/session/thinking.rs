//! A generation's thinking block (`<think> ... </think>`, Qwen's reasoning markup): counting
//! its tokens and, with a budget, closing it when the budget runs out.
//!
//! The block is followed on the generated text (the tags are single added tokens in Qwen's
//! vocabularies but several plain ones in others, such as the demo model's). When the
//! reasoning has used its budget, the generation emits the closing sequence itself instead of
//! sampling: `</think>` and `\n\n` (after a newline when the reasoning text does not already
//! end with one), the layout Qwen's chat template writes around an earlier turn's reasoning
//! (`<think>\nREASONING\n</think>\n\nANSWER`). The answer is sampled after that.
//!
//! Reasoning tokens are the tokens emitted inside the block before the one that completes
//! `</think>` (forced tokens are not counted; with a multi-token tag the model writes itself,
//! the tag's first pieces are).

use crate::tokenizer::Tokenizer;
use std::collections::VecDeque;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// How a generation treats its thinking block (see [`Generation::with_thinking`](super::Generation::with_thinking)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThinkingControl {
    /// Tokens emitted when the budget runs out after reasoning that ends in a newline:
    /// `</think>\n\n`.
    pub close_seq: Vec<u32>,
    /// The same after reasoning that does not: `\n</think>\n\n`.
    pub close_seq_nl: Vec<u32>,
    /// The prompt already opened the block (a template whose generation prompt ends in
    /// `<think>\n`): the generation starts inside it.
    pub starts_inside: bool,
    /// Most reasoning tokens (`None`: unlimited, only counted).
    pub budget: Option<usize>,
}

impl ThinkingControl {
    /// The control for `tok`'s vocabulary (`None` if the closing text does not tokenize).
    pub fn for_tokenizer(
        tok: &Tokenizer,
        starts_inside: bool,
        budget: Option<usize>,
    ) -> Option<ThinkingControl> {
        Some(ThinkingControl {
            close_seq: tok.encode("</think>\n\n").ok()?,
            close_seq_nl: tok.encode("\n</think>\n\n").ok()?,
            starts_inside,
            budget,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace (or the start of `<think>`) so far: the block may still open.
    Before,
    /// Inside the block.
    Inside,
    /// The answer (the block closed, or the output began without one).
    After,
}

/// The live state of a [`ThinkingControl`] during one generation.
#[derive(Debug, Clone)]
pub(super) struct ThinkState {
    ctl: ThinkingControl,
    phase: Phase,
    /// Reasoning tokens emitted.
    reasoning: usize,
    /// Forced tokens still to emit.
    forcing: VecDeque<u32>,
    /// The closing sequence was queued (it is forced once).
    forced: bool,
    /// The reasoning text emitted so far ends with a newline.
    ends_newline: bool,
    /// Recent text, where a tag split across tokens is recognised (before the block: all of
    /// it; inside: at most the last `CLOSE.len()` bytes).
    tail: String,
}

impl ThinkState {
    pub(super) fn new(ctl: ThinkingControl) -> Self {
        ThinkState {
            phase: if ctl.starts_inside {
                Phase::Inside
            } else {
                Phase::Before
            },
            ctl,
            reasoning: 0,
            forcing: VecDeque::new(),
            forced: false,
            // A generation prompt that opens the block ends it with `<think>\n`.
            ends_newline: true,
            tail: String::new(),
        }
    }

    /// Reasoning tokens so far.
    pub(super) fn reasoning_tokens(&self) -> usize {
        self.reasoning
    }

    /// The token to emit next without sampling, if the budget has run out.
    pub(super) fn next_forced(&mut self) -> Option<u32> {
        if self.phase == Phase::Inside
            && !self.forced
            && self.ctl.budget.is_some_and(|b| self.reasoning >= b)
        {
            self.forced = true;
            let seq = if self.ends_newline {
                &self.ctl.close_seq
            } else {
                &self.ctl.close_seq_nl
            };
            self.forcing.extend(seq.iter().copied());
        }
        self.forcing.pop_front()
    }

    /// Whether [`next_forced`](Self::next_forced) would give a token now.
    pub(super) fn forces_next(&self) -> bool {
        !self.forcing.is_empty()
            || (self.phase == Phase::Inside
                && !self.forced
                && self.ctl.budget.is_some_and(|b| self.reasoning >= b))
    }

    /// Most tokens one step may emit without overrunning the budget (`None`: no limit).
    pub(super) fn room(&self) -> Option<usize> {
        match (self.phase, self.ctl.budget) {
            (Phase::After, _) | (_, None) => None,
            (_, Some(b)) => Some(b.saturating_sub(self.reasoning)),
        }
    }

    /// Follows an emitted token's text (`forced`: it came from
    /// [`next_forced`](Self::next_forced)).
    pub(super) fn observe(&mut self, text: &str, forced: bool) {
        match self.phase {
            Phase::Before => {
                self.tail.push_str(text);
                let t = self.tail.trim_start();
                if let Some(rest) = t.strip_prefix(OPEN) {
                    self.tail = rest.to_string();
                    self.phase = Phase::Inside;
                } else if !t.is_empty() && !OPEN.starts_with(t) {
                    self.phase = Phase::After;
                }
            }
            Phase::Inside => {
                self.tail.push_str(text);
                if self.tail.contains(CLOSE) {
                    self.phase = Phase::After;
                    return;
                }
                let mut cut = self.tail.len().saturating_sub(CLOSE.len());
                while !self.tail.is_char_boundary(cut) {
                    cut -= 1;
                }
                self.tail.drain(..cut);
                if !forced {
                    self.reasoning += 1;
                    if !text.is_empty() {
                        self.ends_newline = text.ends_with('\n');
                    }
                }
            }
            Phase::After => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctl(starts_inside: bool, budget: Option<usize>) -> ThinkingControl {
        ThinkingControl {
            close_seq: vec![2, 3],
            close_seq_nl: vec![4, 2, 3],
            starts_inside,
            budget,
        }
    }

    /// Emits the forced tokens, with `texts` as their text.
    fn drain(t: &mut ThinkState, texts: &[&str]) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(f) = t.next_forced() {
            t.observe(texts.get(out.len()).copied().unwrap_or(""), true);
            out.push(f);
        }
        out
    }

    #[test]
    fn the_budget_closes_the_block_once() {
        let mut t = ThinkState::new(ctl(true, Some(2)));
        assert_eq!(t.room(), Some(2));
        assert_eq!(t.next_forced(), None);
        t.observe("a", false);
        assert_eq!(t.next_forced(), None);
        t.observe("b", false);
        assert_eq!(t.reasoning_tokens(), 2);
        // "b" does not end in a newline: the sequence with one.
        assert_eq!(drain(&mut t, &["\n</think>", "\n\n"]), vec![4, 2, 3]);
        assert_eq!(t.reasoning_tokens(), 2);
        assert_eq!(t.room(), None);
        t.observe("answer", false);
        assert_eq!(t.next_forced(), None);
    }

    #[test]
    fn tags_split_across_tokens() {
        let mut t = ThinkState::new(ctl(false, Some(5)));
        for piece in ["\n", "<", "think", ">\n", "x\n", "</", "think", ">"] {
            t.observe(piece, false);
        }
        // "x\n", "</" and "think" were inside; ">" closed the block.
        assert_eq!(t.reasoning_tokens(), 3);
        assert_eq!(t.room(), None);
        assert_eq!(t.next_forced(), None);
        // Output that starts with text has no block.
        let mut t = ThinkState::new(ctl(false, Some(0)));
        t.observe("hi", false);
        t.observe("<think>", false);
        assert_eq!(t.next_forced(), None);
        // Budget 0 with the block open: closed at once, no newline after `<think>\n`.
        let mut t = ThinkState::new(ctl(true, Some(0)));
        assert_eq!(drain(&mut t, &["</think>", "\n\n"]), vec![2, 3]);
    }
}
