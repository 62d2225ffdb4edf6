//! Thinking control of chat requests: `chat_template_kwargs.enable_thinking` (passed to the
//! template, which then opens or skips the `<think>` block), and a per-request thinking budget:
//! `thinking_budget_tokens` (explicit) or `reasoning_effort` mapped to a budget. When the budget
//! runs out mid-reasoning the engine closes the block itself (`</think>` and the template's
//! newlines, [`ThinkingControl`]) and the answer follows.
//!
//! | `reasoning_effort` | budget |
//! |---|---|
//! | `none` | 0 (the block is closed at once) |
//! | `minimal` | 128 |
//! | `low` | 512 |
//! | `medium` | 2048 |
//! | `high` | 8192 |
//!
//! Reasoning tokens count toward `max_tokens` (OpenAI's convention), so a budget from
//! `reasoning_effort` is capped at half of `max_tokens` to leave the answer room; an explicit
//! `thinking_budget_tokens` is used as given (`thinking_budget_tokens` wins over
//! `reasoning_effort`). `usage.completion_tokens_details.reasoning_tokens` reports the tokens
//! inside the block (not the tags, nor the forced closing tokens).

use super::api::Usage;
use super::error::ApiError;
use serde::Serialize;

pub use crate::engine::ThinkingControl;

/// The budget of each `reasoning_effort` (see the module table).
pub const EFFORT_BUDGETS: &[(&str, usize)] = &[
    ("none", 0),
    ("minimal", 128),
    ("low", 512),
    ("medium", 2048),
    ("high", 8192),
];

/// The thinking budget of a request (`None`: unlimited).
pub fn budget(
    effort: Option<&str>,
    explicit: Option<i64>,
    max_tokens: Option<usize>,
) -> Result<Option<usize>, ApiError> {
    if let Some(n) = explicit {
        return usize::try_from(n).map(Some).map_err(|_| {
            ApiError::invalid_param(
                "thinking_budget_tokens",
                format!("'thinking_budget_tokens' must be 0 or more, got {n}"),
            )
        });
    }
    let Some(effort) = effort else {
        return Ok(None);
    };
    let Some(&(_, b)) = EFFORT_BUDGETS.iter().find(|(name, _)| *name == effort) else {
        let names: Vec<&str> = EFFORT_BUDGETS.iter().map(|e| e.0).collect();
        return Err(ApiError::invalid_param(
            "reasoning_effort",
            format!(
                "'reasoning_effort' must be one of {}, got '{effort}'",
                names.join(", ")
            ),
        ));
    };
    Ok(Some(max_tokens.map_or(b, |m| b.min(m / 2))))
}

/// `usage.completion_tokens_details`.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct CompletionTokensDetails {
    /// Generated tokens inside the thinking block.
    pub reasoning_tokens: usize,
}

impl Usage {
    /// The usage with `reasoning` of its completion tokens reported as reasoning.
    pub fn with_reasoning(mut self, reasoning: usize) -> Usage {
        self.completion_tokens_details = Some(CompletionTokensDetails {
            reasoning_tokens: reasoning,
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets() {
        assert_eq!(budget(None, None, Some(100)).unwrap(), None);
        assert_eq!(budget(Some("low"), None, None).unwrap(), Some(512));
        assert_eq!(budget(Some("high"), None, Some(1000)).unwrap(), Some(500));
        assert_eq!(budget(Some("none"), None, None).unwrap(), Some(0));
        assert_eq!(budget(Some("high"), Some(7), Some(4)).unwrap(), Some(7));
        let e = budget(Some("extreme"), None, None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
        let e = budget(None, Some(-1), None).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("thinking_budget_tokens"));
    }
}
