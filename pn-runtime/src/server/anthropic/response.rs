//! Anthropic responses: content blocks built from the generation's pieces, whole or as the
//! Messages API's server-sent events.

use super::super::tools::{Piece, ToolCall};
use crate::engine::FinishReason;
use serde_json::{json, Value};

/// An opaque signature for a thinking block (clients send it back with the block; pn does not
/// verify it): `pn-` and a 64-bit FNV-1a hash of the text.
pub fn signature(thinking: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in thinking.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("pn-{h:016x}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking,
    Text,
}

/// Turns pieces into content blocks and their stream events, in order.
#[derive(Debug)]
pub struct BlockStream {
    /// The finished blocks (the whole response's `content`).
    pub blocks: Vec<Value>,
    open: Open,
    /// Text of the open block.
    text: String,
    /// Whether a call was made.
    pub tool_use: bool,
}

/// One server-sent event: its `event:` name and `data:`.
pub type SseOut = (&'static str, Value);

impl Default for BlockStream {
    fn default() -> Self {
        BlockStream {
            blocks: Vec::new(),
            open: Open::None,
            text: String::new(),
            tool_use: false,
        }
    }
}

impl BlockStream {
    fn close(&mut self, out: &mut Vec<SseOut>) {
        let index = self.blocks.len();
        let text = std::mem::take(&mut self.text);
        match self.open {
            Open::None => return,
            Open::Thinking => {
                let sig = signature(&text);
                out.push(delta(
                    index,
                    json!({"type": "signature_delta", "signature": sig}),
                ));
                self.blocks
                    .push(json!({"type": "thinking", "thinking": text, "signature": sig}));
            }
            Open::Text => self.blocks.push(json!({"type": "text", "text": text})),
        }
        out.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        self.open = Open::None;
    }

    fn text_piece(&mut self, kind: Open, t: &str, out: &mut Vec<SseOut>) {
        if t.is_empty() {
            return;
        }
        let index = self.blocks.len();
        if self.open != kind {
            self.close(out);
            let block = match kind {
                Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            out.push(start(self.blocks.len(), block));
            self.open = kind;
        }
        self.text.push_str(t);
        out.push(delta(
            index,
            match kind {
                Open::Thinking => json!({"type": "thinking_delta", "thinking": t}),
                _ => json!({"type": "text_delta", "text": t}),
            },
        ));
    }

    fn call(&mut self, c: &ToolCall, out: &mut Vec<SseOut>) {
        self.close(out);
        let index = self.blocks.len();
        out.push(start(
            index,
            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}}),
        ));
        out.push(delta(
            index,
            json!({"type": "input_json_delta", "partial_json": c.arguments_json()}),
        ));
        out.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
        self.blocks
            .push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}));
        self.tool_use = true;
    }

    /// The events of `pieces`.
    pub fn push(&mut self, pieces: Vec<Piece>) -> Vec<SseOut> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Text(s) => {
                    self.text_piece(Open::Thinking, &s.reasoning, &mut out);
                    self.text_piece(Open::Text, &s.content, &mut out);
                }
                Piece::Call(c) => self.call(&c, &mut out),
            }
        }
        out
    }

    /// Closes the last block.
    pub fn finish(&mut self) -> Vec<SseOut> {
        let mut out = Vec::new();
        self.close(&mut out);
        out
    }

    /// `stop_reason` and `stop_sequence`.
    pub fn stop(&self, finish: &FinishReason) -> (&'static str, Value) {
        if self.tool_use {
            return ("tool_use", Value::Null);
        }
        match finish {
            FinishReason::StopString(s) => ("stop_sequence", s.clone().into()),
            FinishReason::MaxTokens | FinishReason::ContextFull => ("max_tokens", Value::Null),
            _ => ("end_turn", Value::Null),
        }
    }
}

fn start(index: usize, block: Value) -> SseOut {
    (
        "content_block_start",
        json!({"type": "content_block_start", "index": index, "content_block": block}),
    )
}

fn delta(index: usize, d: Value) -> SseOut {
    (
        "content_block_delta",
        json!({"type": "content_block_delta", "index": index, "delta": d}),
    )
}

/// `usage`: Anthropic counts cache reads apart from `input_tokens`.
pub fn usage(prompt: usize, processed: usize, output: usize) -> Value {
    json!({
        "input_tokens": processed.min(prompt),
        "cache_read_input_tokens": prompt.saturating_sub(processed),
        "cache_creation_input_tokens": 0,
        "output_tokens": output,
    })
}
