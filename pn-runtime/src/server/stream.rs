//! Turning a slot's [`Event`]s into OpenAI responses: whole (`stream: false`) or as
//! server-sent events (`data: {chunk}` lines ending with `data: [DONE]`).

use super::api::{
    ChatChoice, ChatCompletion, Delta, GenSettings, TextChoice, TextCompletion, Usage, FINGERPRINT,
};
use super::error::ApiError;
use super::logprobs::LogprobQueue;
use super::metrics::Metrics;
use super::reasoning::{ReasoningSplitter, Split};
use super::scheduler::Event;
use super::tools::{take_calls, CallStream, Piece, ToolCall, ToolCallOut, ToolConfig};
use crate::engine::{CancelToken, FinishReason};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedReceiver;

/// Cancels the generation when dropped: the handler future or the response stream is dropped
/// when the client goes away, and the slot stops before its next token.
#[derive(Debug)]
pub struct CancelOnDrop(pub CancelToken);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Which endpoint a response is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`; `thinking`: the prompt opened a `<think>` block.
    Chat {
        /// Whether the generation starts inside the thinking block.
        thinking: bool,
    },
    /// `/v1/completions`.
    Completion,
}

/// Everything a response needs besides the events.
#[derive(Debug)]
pub struct Reply {
    /// The endpoint.
    pub endpoint: Endpoint,
    /// Response id.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Served model id.
    pub model: String,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// When the request arrived (for the time to first token).
    pub arrival: Instant,
    /// Metrics to update.
    pub metrics: Arc<Metrics>,
    /// The request's settings.
    pub settings: GenSettings,
    /// The tools whose calls are parsed out of the answer (chat only).
    pub tools: Option<ToolConfig>,
}

/// OpenAI's finish reason.
pub fn finish_reason(f: &FinishReason) -> &'static str {
    match f {
        FinishReason::MaxTokens | FinishReason::ContextFull => "length",
        _ => "stop",
    }
}

fn cancelled_error() -> ApiError {
    ApiError {
        code: Some("cancelled"),
        message: "the generation was cancelled because the server is shutting down".into(),
        ..ApiError::shutting_down()
    }
}

impl Reply {
    fn chat_chunk(&self, delta: Option<Delta>, finish: Option<&'static str>) -> ChatCompletion {
        ChatCompletion {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: FINGERPRINT,
            choices: vec![ChatChoice {
                index: 0,
                message: None,
                delta: Some(delta.unwrap_or_default()),
                logprobs: None,
                finish_reason: finish,
            }],
            usage: None,
        }
    }

    fn text_chunk(&self, text: String, finish: Option<&'static str>) -> TextCompletion {
        TextCompletion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: FINGERPRINT,
            choices: vec![TextChoice {
                index: 0,
                text,
                logprobs: None,
                finish_reason: finish,
            }],
            usage: None,
        }
    }

    /// Waits for the whole generation and answers with one JSON object.
    pub async fn whole(self, mut rx: UnboundedReceiver<Event>, _guard: CancelOnDrop) -> Response {
        let mut splitter = match self.endpoint {
            Endpoint::Chat { thinking } => Some(ReasoningSplitter::new(thinking)),
            Endpoint::Completion => None,
        };
        let mut split = Split::default();
        let mut processed = self.prompt_tokens;
        let mut first = true;
        let mut lps = LogprobQueue::new(self.settings.logprobs.is_some());
        while let Some(event) = rx.recv().await {
            match event {
                Event::Started { processed: p } => processed = p,
                Event::Logprob(t) => lps.push(t),
                Event::Text(t) => {
                    if first {
                        first = false;
                        self.metrics.record_ttft(self.arrival.elapsed());
                    }
                    match splitter.as_mut() {
                        Some(s) => append(&mut split, s.push(&t)),
                        None => split.content.push_str(&t),
                    }
                }
                Event::Failed(e) => return e.into_response(),
                Event::Done { finish, timings } => {
                    if finish == FinishReason::Cancelled {
                        return cancelled_error().into_response();
                    }
                    if let Some(s) = splitter.as_mut() {
                        append(&mut split, s.finish());
                    }
                    let usage = Usage::new(self.prompt_tokens, processed, timings.generated_tokens);
                    let (split, calls) = take_calls(self.tools.as_ref(), split, "call_");
                    let reason = Some(match calls.is_empty() {
                        true => finish_reason(&finish),
                        false => "tool_calls",
                    });
                    let reasoning = timings.reasoning_tokens;
                    return match self.endpoint {
                        Endpoint::Chat { .. } => {
                            let message = Delta {
                                role: Some("assistant"),
                                // OpenAI: null content beside calls when there is no text.
                                content: (calls.is_empty() || !split.content.is_empty())
                                    .then_some(split.content),
                                reasoning_content: (!split.reasoning.is_empty())
                                    .then_some(split.reasoning),
                                tool_calls: (!calls.is_empty())
                                    .then(|| calls.iter().map(ToolCallOut::whole).collect()),
                            };
                            let mut c = self.chat_chunk(None, reason);
                            c.object = "chat.completion";
                            c.choices[0].delta = None;
                            c.choices[0].message = Some(message);
                            c.choices[0].logprobs = lps.chat(true);
                            c.usage = Some(usage.with_reasoning(reasoning));
                            axum::Json(c).into_response()
                        }
                        Endpoint::Completion => {
                            let mut c = self.text_chunk(split.content, reason);
                            c.choices[0].logprobs = lps.text(true);
                            c.usage = Some(usage);
                            axum::Json(c).into_response()
                        }
                    };
                }
            }
        }
        ApiError::internal("the slot stopped without finishing the request").into_response()
    }

    /// Streams the generation as server-sent events.
    pub fn streamed(self, rx: UnboundedReceiver<Event>, guard: CancelOnDrop) -> Response {
        let mut state = StreamState {
            splitter: match self.endpoint {
                Endpoint::Chat { thinking } => Some(ReasoningSplitter::new(thinking)),
                Endpoint::Completion => None,
            },
            calls: self.tools.as_ref().map(|t| CallStream::new(t, "call_")),
            processed: self.prompt_tokens,
            first_token: true,
            lps: LogprobQueue::new(self.settings.logprobs.is_some()),
            out: VecDeque::new(),
            finished: false,
            rx,
            _guard: guard,
            reply: self,
        };
        if let Endpoint::Chat { .. } = state.reply.endpoint {
            // OpenAI opens a chat stream with the role and empty content.
            let delta = Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                reasoning_content: None,
                tool_calls: None,
            };
            state.push_json(&state.reply.chat_chunk(Some(delta), None));
        }
        let stream = futures_util::stream::unfold(state, |mut st| async move {
            loop {
                if let Some(data) = st.out.pop_front() {
                    return Some((Ok::<_, Infallible>(SseEvent::default().data(data)), st));
                }
                if st.finished {
                    return None;
                }
                match st.rx.recv().await {
                    Some(event) => st.handle(event),
                    None => {
                        st.push_json(
                            &ApiError::internal("the slot stopped without finishing").body(),
                        );
                        st.end();
                    }
                }
            }
        });
        Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response()
    }
}

fn append(to: &mut Split, s: Split) {
    to.reasoning.push_str(&s.reasoning);
    to.content.push_str(&s.content);
}

struct StreamState {
    reply: Reply,
    splitter: Option<ReasoningSplitter>,
    calls: Option<CallStream>,
    processed: usize,
    first_token: bool,
    /// Log probabilities for the next chunk.
    lps: LogprobQueue,
    /// SSE payloads ready to send.
    out: VecDeque<String>,
    finished: bool,
    rx: UnboundedReceiver<Event>,
    _guard: CancelOnDrop,
}

impl StreamState {
    fn push_json<T: serde::Serialize>(&mut self, v: &T) {
        // Serialising plain structs of strings and numbers cannot fail.
        self.out
            .push_back(serde_json::to_string(v).unwrap_or_else(|_| "{}".into()));
    }

    fn end(&mut self) {
        self.out.push_back("[DONE]".into());
        self.finished = true;
    }

    fn push_text(&mut self, split: Split, finish: Option<&'static str>) {
        if split.is_empty() && finish.is_none() {
            return;
        }
        match self.reply.endpoint {
            Endpoint::Chat { .. } => {
                let delta = (!split.is_empty()).then(|| Delta {
                    role: None,
                    content: (!split.content.is_empty()).then_some(split.content),
                    reasoning_content: (!split.reasoning.is_empty()).then_some(split.reasoning),
                    tool_calls: None,
                });
                let mut c = self.reply.chat_chunk(delta, finish);
                c.choices[0].logprobs = self.lps.chat(false);
                self.push_json(&c);
            }
            Endpoint::Completion => {
                let mut c = self.reply.text_chunk(split.content, finish);
                c.choices[0].logprobs = self.lps.text(false);
                self.push_json(&c);
            }
        }
    }

    /// Text, with the calls parsed out of it when tools are on.
    fn push_pieces(&mut self, split: Split, finish: bool) {
        let Some(calls) = self.calls.as_mut() else {
            return self.push_text(split, None);
        };
        let mut pieces = calls.push(split);
        if finish {
            pieces.extend(calls.finish());
        }
        for p in pieces {
            match p {
                Piece::Text(t) => self.push_text(t, None),
                Piece::Call(c) => self.push_call(&c),
            }
        }
    }

    fn push_call(&mut self, c: &ToolCall) {
        for d in ToolCallOut::deltas(c) {
            let delta = Delta {
                tool_calls: Some(vec![d]),
                ..Delta::default()
            };
            let chunk = self.reply.chat_chunk(Some(delta), None);
            self.push_json(&chunk);
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Started { processed } => self.processed = processed,
            Event::Logprob(t) => self.lps.push(t),
            Event::Text(t) => {
                if self.first_token {
                    self.first_token = false;
                    self.reply.metrics.record_ttft(self.reply.arrival.elapsed());
                }
                let split = match self.splitter.as_mut() {
                    Some(s) => s.push(&t),
                    None => Split {
                        reasoning: String::new(),
                        content: t,
                    },
                };
                self.push_pieces(split, false);
            }
            Event::Failed(e) => {
                self.push_json(&e.body());
                self.end();
            }
            Event::Done { finish, timings } => {
                if finish == FinishReason::Cancelled {
                    self.push_json(&cancelled_error().body());
                    self.end();
                    return;
                }
                let rest = self.splitter.as_mut().map(ReasoningSplitter::finish);
                self.push_pieces(rest.unwrap_or_default(), true);
                let usage = Usage::new(
                    self.reply.prompt_tokens,
                    self.processed,
                    timings.generated_tokens,
                );
                let reason = Some(match self.calls.as_ref().map_or(0, CallStream::calls) {
                    0 => finish_reason(&finish),
                    _ => "tool_calls",
                });
                // The finishing chunk carries the usage too (as llama-server does), so clients
                // that do not ask for `include_usage` still see the counts.
                match self.reply.endpoint {
                    Endpoint::Chat { .. } => {
                        let mut c = self.reply.chat_chunk(None, reason);
                        c.choices[0].logprobs = self.lps.chat(false);
                        c.usage = Some(usage.with_reasoning(timings.reasoning_tokens));
                        self.push_json(&c);
                        if self.reply.settings.include_usage {
                            c.choices.clear();
                            self.push_json(&c);
                        }
                    }
                    Endpoint::Completion => {
                        let mut c = self.reply.text_chunk(String::new(), reason);
                        c.choices[0].logprobs = self.lps.text(false);
                        c.usage = Some(usage);
                        self.push_json(&c);
                        if self.reply.settings.include_usage {
                            c.choices.clear();
                            self.push_json(&c);
                        }
                    }
                }
                self.end();
            }
        }
    }
}
