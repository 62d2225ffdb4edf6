//! Stopping: token ids that end a generation, and stop strings matched across streamed text.

/// Ids that end a generation (for Qwen3.5: `<|im_end|>`, `<|endoftext|>` and the FIM markers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopTokens {
    ids: Vec<u32>,
}

impl StopTokens {
    /// A set of the given ids.
    pub fn new(ids: impl IntoIterator<Item = u32>) -> Self {
        let mut ids: Vec<u32> = ids.into_iter().collect();
        ids.sort_unstable();
        ids.dedup();
        StopTokens { ids }
    }

    /// The tokenizer's end-of-generation ids.
    pub fn from_tokenizer(tok: &crate::tokenizer::Tokenizer) -> Self {
        StopTokens::new(tok.eog_ids().iter().copied())
    }

    /// Adds more ids.
    pub fn with(mut self, ids: impl IntoIterator<Item = u32>) -> Self {
        self.ids.extend(ids);
        self.ids.sort_unstable();
        self.ids.dedup();
        self
    }

    /// Whether `id` stops the generation.
    pub fn contains(&self, id: u32) -> bool {
        self.ids.binary_search(&id).is_ok()
    }

    /// The ids, sorted.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

/// What [`StopStrings::push`] releases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopChunk {
    /// Text that is safe to show: it cannot be part of a stop string.
    pub text: String,
    /// The stop string that matched; `text` ends right before it and the generation is over.
    pub stop: Option<String>,
}

/// Finds stop strings in text that arrives in pieces, and cuts the output exactly before the
/// earliest match. Text that could still turn out to be the start of a stop string is held back
/// until the next piece decides it.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopStrings {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        StopStrings {
            stops: stops
                .into_iter()
                .map(Into::into)
                .filter(|s: &String| !s.is_empty())
                .collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string has matched.
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds the next piece of text. After a match everything is swallowed.
    ///
    /// The cut is independent of how the text is split into pieces: it is the earliest start of
    /// any stop string in the whole text. A match is therefore only reported once no earlier
    /// partial match could still complete.
    pub fn push(&mut self, text: &str) -> StopChunk {
        if self.stopped {
            return StopChunk::default();
        }
        self.held.push_str(text);
        let matched = self.earliest_match();
        let partial_start = self.held.len() - self.partial_suffix_len();
        match matched {
            Some((at, _)) if at <= partial_start => self.stop_at(matched),
            _ => {
                // Release everything before the earliest possible start of a stop string.
                let rest = self.held.split_off(partial_start);
                StopChunk {
                    text: std::mem::replace(&mut self.held, rest),
                    stop: None,
                }
            }
        }
    }

    /// Ends the stream: releases held-back text, cut at a stop string if one is complete.
    pub fn finish(&mut self) -> StopChunk {
        if self.stopped {
            return StopChunk::default();
        }
        let matched = self.earliest_match();
        self.stop_at(matched)
    }

    /// The earliest complete match in the held text; at equal starts the longest stop string.
    fn earliest_match(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| self.held.find(s.as_str()).map(|at| (at, i)))
            .min_by(|a, b| {
                a.0.cmp(&b.0)
                    .then(self.stops[b.1].len().cmp(&self.stops[a.1].len()))
            })
    }

    /// Releases the held text, cut before `matched` if there is a match.
    fn stop_at(&mut self, matched: Option<(usize, usize)>) -> StopChunk {
        let mut text = std::mem::take(&mut self.held);
        let stop = matched.map(|(at, i)| {
            text.truncate(at);
            self.stopped = true;
            self.stops[i].clone()
        });
        StopChunk { text, stop }
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn partial_suffix_len(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for len in (best + 1..=max).rev() {
                let start = h.len() - len;
                if h.is_char_boundary(start) && s.starts_with(&h[start..]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<String>) {
        let mut m = StopStrings::new(stops.iter().copied());
        let mut out = String::new();
        for p in pieces {
            let c = m.push(p);
            out.push_str(&c.text);
            if c.stop.is_some() {
                return (out, c.stop);
            }
        }
        let last = m.finish();
        out.push_str(&last.text);
        (out, last.stop)
    }

    #[test]
    fn cuts_exactly_before_a_stop_split_over_pieces() {
        assert_eq!(
            run(&["</s>"], &["hello <", "/", "s> world"]),
            ("hello ".to_string(), Some("</s>".to_string()))
        );
    }

    #[test]
    fn releases_a_false_start() {
        let mut m = StopStrings::new(["STOP"]);
        assert_eq!(m.push("abST").text, "ab");
        assert_eq!(m.push("x").text, "STx");
        assert_eq!(m.finish(), StopChunk::default());
        assert_eq!(
            run(&["STOP"], &["ST", "OR", "E"]),
            ("STORE".to_string(), None)
        );
    }

    #[test]
    fn earliest_match_wins() {
        assert_eq!(
            run(&["world", "lo w"], &["hello world"]),
            ("hel".to_string(), Some("lo w".to_string()))
        );
    }

    #[test]
    fn a_longer_stop_starting_earlier_wins_whatever_the_split() {
        for pieces in [&["abc", "d"][..], &["abcd"], &["a", "b", "c", "d"]] {
            assert_eq!(
                run(&["abcd", "bc"], pieces),
                (String::new(), Some("abcd".to_string()))
            );
        }
        assert_eq!(
            run(&["abcd", "bc"], &["abc", "x"]),
            ("a".to_string(), Some("bc".to_string()))
        );
        assert_eq!(
            run(&["abcd", "bc"], &["abc"]),
            ("a".to_string(), Some("bc".to_string()))
        );
    }

    #[test]
    fn multibyte_stop_strings() {
        assert_eq!(
            run(&["終わり"], &["これで終", "わり。"]),
            ("これで".to_string(), Some("終わり".to_string()))
        );
    }

    #[test]
    fn stop_tokens() {
        let s = StopTokens::new([5, 3, 5]).with([9]);
        assert_eq!(s.ids(), &[3, 5, 9]);
        assert!(s.contains(9) && !s.contains(4));
    }
}
