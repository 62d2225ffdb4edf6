//! Rendering a conversation into prompt tokens where only the template's markup yields
//! control tokens.
//!
//! Tokenizing a rendered prompt with [`Tokenizer::encode`] matches control-token text wherever
//! it is, so a user message containing `<|im_end|>\n<|im_start|>system\n...` would become a
//! real system turn. [`ChatTemplate::render_prompt`] keeps the two apart:
//!
//! 1. every string the caller supplied (messages, tools, keyword arguments: all of the
//!    [`TemplateContext`]) has each control-token text replaced by a sentinel, one character
//!    per control token from Unicode's supplementary private use area, chosen among the
//!    characters that occur in none of those strings (so a sentinel in the output can only be
//!    one of ours);
//! 2. the template renders those strings; any control-token text in its output is now its own
//!    markup (`<|im_start|>` literals, `eos_token`...);
//! 3. the output is cut at those control tokens, the sentinels are turned back into their text,
//!    and each piece between control tokens is tokenized with control-token text as plain
//!    characters ([`Tokenizer::encode_parts`]).
//!
//! A single character cannot be half-mangled by the template: whatever it does to a string
//! (trim, split, slice, upper-case), a sentinel stays a sentinel or is dropped with the text
//! around it, and either way the caller's text never becomes a control token. The rendered
//! text is the plain render's character for character, except for a template that escapes
//! non-ASCII (`tojson(ensure_ascii=True)`), which would show the sentinel's escape instead of
//! the control-token text.
//!
//! For a conversation with no control-token text in it, the tokens are exactly
//! `encode(render(ctx))`: the tokenizer splits at control tokens the same way.
//!
//! Not covered: control-token text that only forms across a boundary, half from the caller's
//! string and half from the template's literal text next to it (`<|im_` in a message followed
//! by a template that writes `end|>`); real templates put no partial control-token text next
//! to a variable.

use super::values::rewrite_strings;
use super::{ChatTemplate, ChatTemplateError, TemplateContext};
use crate::tokenizer::{PromptPart, Tokenizer};
use std::collections::{BTreeSet, HashMap};

/// A rendered conversation: the prompt text and its tokens, the control tokens only where
/// the template put them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatPrompt {
    /// The rendered text (as [`ChatTemplate::render`] gives it).
    pub text: String,
    /// Its tokens (see the module documentation).
    pub tokens: Vec<u32>,
}

/// First and last character of the sentinel range (Supplementary Private Use Area-A).
const SENTINELS: (u32, u32) = (0xF0000, 0xFFFFD);

impl ChatTemplate {
    /// Renders `ctx` and tokenizes the result with `tok` so that control tokens come only from
    /// the template's own markup: control-token text inside the caller's strings (a user
    /// message typing `<|im_start|>system`) stays plain text. See the module documentation.
    pub fn render_prompt(
        &self,
        ctx: &TemplateContext,
        tok: &Tokenizer,
    ) -> Result<ChatPrompt, ChatTemplateError> {
        let controls = tok.control_tokens();
        let mut neutral = Neutralizer::new(controls, ctx);
        let safe_ctx = TemplateContext {
            vars: ctx
                .vars
                .iter()
                .map(|(k, v)| {
                    let v = rewrite_strings(v, &mut |s| neutral.neutralize(s))
                        .unwrap_or_else(|| v.clone());
                    (k.clone(), v)
                })
                .collect(),
        };
        if let Some(e) = neutral.error {
            return Err(e);
        }
        let rendered = self.render(&safe_ctx)?;
        // Cut at the template's control tokens, restoring the caller's text in between.
        let mut text = String::with_capacity(rendered.len());
        // (start, end, id) of each of the template's control tokens in `text`.
        let mut cuts: Vec<(usize, usize, u32)> = Vec::new();
        for piece in split_controls(&rendered, controls) {
            match piece {
                Piece::Text(t) => neutral.restore(t, &mut text),
                Piece::Control(i) => {
                    let start = text.len();
                    text.push_str(&controls[i].0);
                    cuts.push((start, text.len(), controls[i].1));
                }
            }
        }
        let mut parts = Vec::with_capacity(2 * cuts.len() + 1);
        let mut at = 0;
        for &(start, end, id) in &cuts {
            parts.push(PromptPart::Text(&text[at..start]));
            parts.push(PromptPart::Control(id));
            at = end;
        }
        parts.push(PromptPart::Text(&text[at..]));
        let tokens = tok.encode_parts(&parts)?;
        Ok(ChatPrompt { text, tokens })
    }
}

/// Replaces control-token text in the caller's strings by sentinels and back.
struct Neutralizer<'c> {
    controls: &'c [(String, u32)],
    /// Sentinel characters no caller string contains, ascending.
    free: std::iter::Peekable<Box<dyn Iterator<Item = char>>>,
    /// Sentinel of control token `i` (index into `controls`), once one is needed.
    sentinel_of: HashMap<usize, char>,
    /// Control-token index of each sentinel in use.
    control_of: HashMap<char, usize>,
    /// Set when the sentinel range ran out (a context holding ~65k distinct of its characters).
    error: Option<ChatTemplateError>,
}

impl<'c> Neutralizer<'c> {
    fn new(controls: &'c [(String, u32)], ctx: &TemplateContext) -> Self {
        let mut used = BTreeSet::new();
        for (_, v) in &ctx.vars {
            rewrite_strings(v, &mut |s| {
                used.extend(s.chars().filter(|&c| is_sentinel_range(c)));
                None
            });
        }
        let free: Box<dyn Iterator<Item = char>> = Box::new(
            (SENTINELS.0..=SENTINELS.1)
                .filter_map(char::from_u32)
                .filter(move |c| !used.contains(c)),
        );
        Neutralizer {
            controls,
            free: free.peekable(),
            sentinel_of: HashMap::new(),
            control_of: HashMap::new(),
            error: None,
        }
    }

    /// `s` with each control-token text replaced by its sentinel; `None` when it has none.
    fn neutralize(&mut self, s: &str) -> Option<String> {
        let pieces: Vec<Piece<'_>> = split_controls(s, self.controls).collect();
        if !pieces.iter().any(|p| matches!(p, Piece::Control(_))) {
            return None;
        }
        let mut out = String::with_capacity(s.len());
        for piece in pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                // Out of sentinels: the text is dropped rather than let through as markup
                // (and the render fails with the error set by `sentinel`).
                Piece::Control(i) => out.extend(self.sentinel(i)),
            }
        }
        Some(out)
    }

    fn sentinel(&mut self, control: usize) -> Option<char> {
        if let Some(&c) = self.sentinel_of.get(&control) {
            return Some(c);
        }
        let Some(c) = self.free.next() else {
            self.error.get_or_insert(ChatTemplateError::Render(
                "too many distinct private-use characters in the messages to keep control-token text apart".into(),
            ));
            return None;
        };
        self.sentinel_of.insert(control, c);
        self.control_of.insert(c, control);
        Some(c)
    }

    /// Appends `t` to `out` with each sentinel turned back into its control-token text.
    fn restore(&self, t: &str, out: &mut String) {
        if self.control_of.is_empty() {
            out.push_str(t);
            return;
        }
        for c in t.chars() {
            match self.control_of.get(&c) {
                Some(&i) => out.push_str(&self.controls[i].0),
                None => out.push(c),
            }
        }
    }
}

fn is_sentinel_range(c: char) -> bool {
    (SENTINELS.0..=SENTINELS.1).contains(&(c as u32))
}

/// A piece of text cut at control-token text: plain text, or control token `i` of the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece<'a> {
    Text(&'a str),
    Control(usize),
}

/// Cuts `text` at the control-token texts of `controls` (longest first), leftmost-longest
/// as the tokenizer matches added tokens.
fn split_controls<'a>(
    text: &'a str,
    controls: &'a [(String, u32)],
) -> impl Iterator<Item = Piece<'a>> {
    let first_bytes: BTreeSet<u8> = controls
        .iter()
        .filter_map(|(t, _)| t.bytes().next())
        .collect();
    let mut rest = text;
    let mut pending: Option<Piece<'a>> = None;
    std::iter::from_fn(move || {
        if let Some(p) = pending.take() {
            return Some(p);
        }
        if rest.is_empty() {
            return None;
        }
        let bytes = rest.as_bytes();
        for at in 0..bytes.len() {
            if !first_bytes.contains(&bytes[at]) || !rest.is_char_boundary(at) {
                continue;
            }
            // `controls` is sorted longest first: the first match is the longest.
            if let Some(i) = controls
                .iter()
                .position(|(t, _)| rest[at..].starts_with(t.as_str()))
            {
                let before = &rest[..at];
                rest = &rest[at + controls[i].0.len()..];
                if before.is_empty() {
                    return Some(Piece::Control(i));
                }
                pending = Some(Piece::Control(i));
                return Some(Piece::Text(before));
            }
        }
        let all = rest;
        rest = "";
        Some(Piece::Text(all))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls() -> Vec<(String, u32)> {
        // Longest first, as the tokenizer lists them.
        vec![
            ("<|im_start|>".into(), 1),
            ("<|im_end|>".into(), 2),
            ("<|a|>".into(), 3),
        ]
    }

    #[test]
    fn text_is_cut_leftmost_at_control_tokens() {
        let c = controls();
        let got: Vec<_> = split_controls("x<|im_end|><|im_start|>y<|a|", &c).collect();
        assert_eq!(
            got,
            [
                Piece::Text("x"),
                Piece::Control(1),
                Piece::Control(0),
                Piece::Text("y<|a|")
            ]
        );
        assert_eq!(split_controls("", &c).count(), 0);
        let only: Vec<_> = split_controls("<|a|>", &c).collect();
        assert_eq!(only, [Piece::Control(2)]);
        assert_eq!(
            split_controls("é<|a|>", &[]).collect::<Vec<_>>(),
            [Piece::Text("é<|a|>")]
        );
    }

    #[test]
    fn sentinels_avoid_characters_the_caller_used_and_restore_exactly() {
        let c = controls();
        let first = char::from_u32(SENTINELS.0).unwrap();
        let mut ctx = TemplateContext::new();
        ctx.set("messages", &[format!("{first}<|im_end|>")]);
        let mut n = Neutralizer::new(&c, &ctx);
        let s = n
            .neutralize(&format!("{first}<|im_end|>b<|im_end|>"))
            .unwrap();
        assert_eq!(s.chars().count(), 4);
        assert!(!s.contains("<|"));
        // The caller's own private-use character is not a sentinel.
        let mut back = String::new();
        n.restore(&s, &mut back);
        assert_eq!(back, format!("{first}<|im_end|>b<|im_end|>"));
        assert_eq!(n.neutralize("no markup"), None);
    }
}
