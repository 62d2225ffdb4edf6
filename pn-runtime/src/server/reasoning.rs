//! Splitting a Qwen model's thinking (`<think>...</think>`) out of its answer, as
//! `reasoning_content` beside `content` (the llama-server / vLLM convention).
//!
//! Text arrives in arbitrary pieces (one token's text at a time), so a tag may be split across
//! pieces: the splitter holds back any tail that could still become a tag. The output does not
//! depend on how the text was cut, which is what makes a streamed reply concatenate to the
//! non-streamed one.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Whether a rendered prompt leaves the model inside a thinking block (templates that open
/// `<think>` in the generation prompt, so only `</think>` appears in the output).
pub fn prompt_opens_thinking(prompt: &str) -> bool {
    match (prompt.rfind(OPEN), prompt.rfind(CLOSE)) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet: an opening tag may still come.
    Start,
    /// Inside `<think>`.
    Thinking,
    /// The answer: no more tags are recognised.
    Content,
}

/// Text released by one [`ReasoningSplitter::push`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    /// Thinking text.
    pub reasoning: String,
    /// Answer text.
    pub content: String,
}

impl Split {
    /// Whether nothing was released.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

/// Streaming `<think>` splitter.
#[derive(Debug, Clone)]
pub struct ReasoningSplitter {
    state: State,
    held: String,
    /// Drop newlines right after a tag (templates write `</think>\n\n`).
    strip_newlines: bool,
}

impl ReasoningSplitter {
    /// A splitter for a generation that starts inside a thinking block (`true`) or not.
    pub fn new(starts_in_thinking: bool) -> Self {
        ReasoningSplitter {
            state: if starts_in_thinking {
                State::Thinking
            } else {
                State::Start
            },
            held: String::new(),
            strip_newlines: starts_in_thinking,
        }
    }

    /// Feeds a piece of generated text and returns what became final.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut out = Split::default();
        loop {
            if self.strip_newlines {
                let trimmed = self.held.trim_start_matches(['\n', '\r']);
                if trimmed.is_empty() {
                    self.held.clear();
                    return out;
                }
                self.held = trimmed.to_string();
                self.strip_newlines = false;
            }
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.state = State::Thinking;
                        self.strip_newlines = true;
                    } else if OPEN.starts_with(t) {
                        // Whitespace and maybe the start of the tag: wait for more.
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Thinking => {
                    if let Some(at) = self.held.find(CLOSE) {
                        out.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + CLOSE.len());
                        self.state = State::Content;
                        self.strip_newlines = true;
                    } else {
                        let keep = partial_tag_suffix(&self.held, CLOSE);
                        let cut = self.held.len() - keep;
                        out.reasoning.push_str(&self.held[..cut]);
                        self.held.drain(..cut);
                        return out;
                    }
                }
                State::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
            }
        }
    }

    /// Releases whatever is held at the end of the generation.
    pub fn finish(&mut self) -> Split {
        let rest = std::mem::take(&mut self.held);
        match self.state {
            State::Thinking => Split {
                reasoning: rest,
                content: String::new(),
            },
            State::Start | State::Content => Split {
                reasoning: String::new(),
                content: rest,
            },
        }
    }
}

/// Length of the longest proper suffix of `s` that is a prefix of `tag`.
fn partial_tag_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn split_all(starts: bool, pieces: &[&str]) -> Split {
        let mut s = ReasoningSplitter::new(starts);
        let mut out = Split::default();
        for p in pieces {
            let x = s.push(p);
            out.reasoning.push_str(&x.reasoning);
            out.content.push_str(&x.content);
        }
        let x = s.finish();
        out.reasoning.push_str(&x.reasoning);
        out.content.push_str(&x.content);
        out
    }

    #[test]
    fn splits_a_whole_reply() {
        let s = split_all(false, &["<think>\nplan it\n</think>\n\nThe answer."]);
        assert_eq!(s.reasoning, "plan it\n");
        assert_eq!(s.content, "The answer.");
    }

    #[test]
    fn tags_split_across_tokens() {
        let s = split_all(
            false,
            &["<", "thi", "nk>", "a", "b</", "thin", "k", ">", "\n", "c"],
        );
        assert_eq!(s.reasoning, "ab");
        assert_eq!(s.content, "c");
    }

    #[test]
    fn prompt_that_opens_thinking() {
        assert!(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
        assert!(!prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert!(!prompt_opens_thinking("<|im_start|>assistant\n"));
        let s = split_all(true, &["reason", "ing</th", "ink>\n\nanswer"]);
        assert_eq!(s.reasoning, "reasoning");
        assert_eq!(s.content, "answer");
    }

    #[test]
    fn no_tags_is_all_content() {
        let s = split_all(false, &["def f(x):", "\n    return x < y"]);
        assert_eq!(s.reasoning, "");
        assert_eq!(s.content, "def f(x):\n    return x < y");
        // A `<` that is not the tag is released as soon as it cannot be one.
        let mut sp = ReasoningSplitter::new(false);
        assert_eq!(sp.push("<").content, "");
        assert_eq!(sp.push("a").content, "<a");
    }

    #[test]
    fn late_open_tag_is_content() {
        let s = split_all(false, &["x <think> y"]);
        assert_eq!(s.content, "x <think> y");
    }

    #[test]
    fn unterminated_thinking_is_reasoning() {
        let s = split_all(false, &["<think>abc</thi"]);
        assert_eq!(s.reasoning, "abc</thi");
        assert_eq!(s.content, "");
    }

    #[test]
    fn partial_suffix_respects_char_boundaries() {
        assert_eq!(partial_tag_suffix("é</", CLOSE), 2);
        assert_eq!(partial_tag_suffix("abc", CLOSE), 0);
        assert_eq!(partial_tag_suffix("", CLOSE), 0);
    }

    proptest! {
        /// However the text is cut into pieces, the result is the same.
        #[test]
        fn result_does_not_depend_on_cuts(
            text in "(<think>|</think>|<|/|t|h|\n| |é|a){0,40}",
            cuts in proptest::collection::vec(0usize..200, 0..12),
            starts in any::<bool>(),
        ) {
            let whole = split_all(starts, &[&text]);
            let mut points: Vec<usize> = cuts
                .into_iter()
                .map(|c| c % (text.len() + 1))
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            points.sort_unstable();
            let mut pieces = Vec::new();
            let mut last = 0;
            for p in points {
                pieces.push(&text[last..p]);
                last = p;
            }
            pieces.push(&text[last..]);
            prop_assert_eq!(split_all(starts, &pieces), whole);
        }
    }
}
