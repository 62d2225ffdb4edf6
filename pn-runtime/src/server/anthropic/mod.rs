//! The Anthropic Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! A request is mapped onto the same path as an OpenAI chat request: its `system`, messages
//! and content blocks become chat-template messages ([`request`]), its `tools` and
//! `tool_choice` a [`ToolConfig`](super::tools::ToolConfig) (`any` and `tool` force a call by
//! constrained decoding), `thinking` the template's `enable_thinking` (off unless enabled, the
//! Messages API's default). The output is split into `thinking`, `text` and `tool_use` blocks
//! ([`response`]), whole or streamed with the API's events (`message_start`,
//! `content_block_start`, `content_block_delta` with `text_delta` / `thinking_delta` /
//! `signature_delta` / `input_json_delta`, `content_block_stop`, `message_delta`,
//! `message_stop`, `ping`). Errors have Anthropic's shape
//! (`{"type": "error", "error": {"type", "message"}}`), and `x-api-key` is accepted like the
//! bearer key ([`auth`](super::auth)).

pub mod request;
pub mod response;
#[cfg(test)]
mod tests;

use super::error::ApiError;
use super::reasoning::ReasoningSplitter;
use super::routes::{body_bytes, next_id, queue_chat, render_chat, AppState, ChatJob, Queued};
use super::scheduler::Event;
use super::tools::{CallStream, Piece};
use crate::engine::FinishReason;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use response::{BlockStream, SseOut};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

type Shared = Arc<AppState>;

/// Anthropic's error type for an error.
fn error_type(e: &ApiError) -> &'static str {
    match e.status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    }
}

/// `{"type": "error", "error": {"type", "message"}}`.
pub fn error_body(e: &ApiError) -> Value {
    json!({"type": "error", "error": {"type": error_type(e), "message": e.message}})
}

/// An error as an Anthropic response.
pub fn error_response(e: ApiError) -> Response {
    let mut r = (e.status, axum::Json(error_body(&e))).into_response();
    if let Some(secs) = e.retry_after {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    r
}

/// `POST /v1/messages`.
pub async fn messages(State(st): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(body, st.max_body_bytes)?;
        let req = request::parse(&body)?;
        let settings = req.settings(&st.defaults, false)?;
        let messages = req.template_messages()?;
        let (template_tools, tools) = req.tools()?;
        let job = ChatJob {
            messages,
            template_tools,
            tools,
            kwargs: req.kwargs()?,
            thinking_budget: req.thinking_budget(),
            settings,
        };
        let q = queue_chat(&st, job).await?;
        Ok::<_, ApiError>((q, req.model.clone().unwrap_or_else(|| st.model_id.clone())))
    }
    .await;
    match result {
        Err(e) => error_response(e),
        Ok((q, model)) => {
            let gen = Gen::new(&st, &q, model, arrival);
            if q.settings.stream {
                gen.streamed(q)
            } else {
                gen.whole(q).await
            }
        }
    }
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}` of the rendered prompt.
pub async fn count_tokens(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let result = async {
        let body = body_bytes(body, st.max_body_bytes)?;
        let req = request::parse(&body)?;
        req.settings(&st.defaults, true)?;
        let messages = req.template_messages()?;
        let (template_tools, tools) = req.tools()?;
        let template_tools =
            template_tools.filter(|_| tools.as_ref().is_none_or(|t| t.parses_calls()));
        let (_, tokens) = render_chat(&st, messages, template_tools, req.kwargs()?).await?;
        Ok::<_, ApiError>(axum::Json(json!({"input_tokens": tokens.len()})).into_response())
    }
    .await;
    result.unwrap_or_else(error_response)
}

/// One generation's state: text splitting, call parsing, blocks.
struct Gen {
    id: String,
    model: String,
    prompt_tokens: usize,
    processed: usize,
    splitter: ReasoningSplitter,
    calls: Option<CallStream>,
    blocks: BlockStream,
    arrival: Instant,
    first_token: bool,
    metrics: Arc<super::metrics::Metrics>,
}

impl Gen {
    fn new(st: &Shared, q: &Queued, model: String, arrival: Instant) -> Gen {
        Gen {
            id: next_id("msg").replace('-', "_"),
            model,
            prompt_tokens: q.prompt_tokens,
            processed: q.prompt_tokens,
            splitter: ReasoningSplitter::new(q.thinking),
            calls: q.tools.as_ref().map(|t| CallStream::new(t, "toolu_")),
            blocks: BlockStream::default(),
            arrival,
            first_token: true,
            metrics: Arc::clone(&st.metrics),
        }
    }

    fn text(&mut self, t: &str) -> Vec<SseOut> {
        if self.first_token {
            self.first_token = false;
            self.metrics.record_ttft(self.arrival.elapsed());
        }
        let split = self.splitter.push(t);
        let pieces = match self.calls.as_mut() {
            Some(c) => c.push(split),
            None => vec![Piece::Text(split)],
        };
        self.blocks.push(pieces)
    }

    fn finish(&mut self) -> Vec<SseOut> {
        let rest = self.splitter.finish();
        let pieces = match self.calls.as_mut() {
            Some(c) => {
                let mut p = c.push(rest);
                p.extend(c.finish());
                p
            }
            None => vec![Piece::Text(rest)],
        };
        let mut out = self.blocks.push(pieces);
        out.extend(self.blocks.finish());
        out
    }

    fn message(&self, content: Value, stop: Option<(&'static str, Value)>, output: usize) -> Value {
        let (reason, seq) = stop.map_or((Value::Null, Value::Null), |(r, s)| (r.into(), s));
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": reason, "stop_sequence": seq,
            "usage": response::usage(self.prompt_tokens, self.processed, output),
        })
    }

    async fn whole(mut self, mut q: Queued) -> Response {
        let _guard = q.guard;
        while let Some(event) = q.rx.recv().await {
            match event {
                Event::Started { processed } => self.processed = processed,
                Event::Text(t) => {
                    self.text(&t);
                }
                Event::Failed(e) => return error_response(e),
                // Log probabilities are not part of the Messages API (never requested here).
                Event::Logprob(_) => {}
                Event::Done { finish, timings } => {
                    if finish == FinishReason::Cancelled {
                        return error_response(ApiError::shutting_down());
                    }
                    self.finish();
                    let stop = self.blocks.stop(&finish);
                    let content = Value::Array(std::mem::take(&mut self.blocks.blocks));
                    let m = self.message(content, Some(stop), timings.generated_tokens);
                    return axum::Json(m).into_response();
                }
            }
        }
        error_response(ApiError::internal(
            "the slot stopped without finishing the request",
        ))
    }

    fn streamed(self, q: Queued) -> Response {
        struct St {
            gen: Gen,
            q: Queued,
            out: VecDeque<SseOut>,
            started: bool,
            done: bool,
        }
        let st = St {
            gen: self,
            q,
            out: VecDeque::new(),
            started: false,
            done: false,
        };
        let stream = futures_util::stream::unfold(st, |mut st| async move {
            loop {
                if let Some((name, data)) = st.out.pop_front() {
                    let ev = SseEvent::default().event(name).data(data.to_string());
                    return Some((Ok::<_, Infallible>(ev), st));
                }
                if st.done {
                    return None;
                }
                let event = st.q.rx.recv().await;
                if let Some(Event::Started { processed }) = &event {
                    st.gen.processed = *processed;
                }
                if !st.started {
                    st.started = true;
                    let m = st.gen.message(json!([]), None, 0);
                    st.out.push_back((
                        "message_start",
                        json!({"type": "message_start", "message": m}),
                    ));
                    st.out.push_back(("ping", json!({"type": "ping"})));
                }
                match event {
                    Some(Event::Started { .. } | Event::Logprob(_)) => {}
                    Some(Event::Text(t)) => st.out.extend(st.gen.text(&t)),
                    Some(Event::Done { finish, timings }) => {
                        st.done = true;
                        if finish == FinishReason::Cancelled {
                            st.out
                                .push_back(("error", error_body(&ApiError::shutting_down())));
                            continue;
                        }
                        st.out.extend(st.gen.finish());
                        let (reason, seq) = st.gen.blocks.stop(&finish);
                        st.out.push_back((
                            "message_delta",
                            json!({"type": "message_delta",
                                   "delta": {"stop_reason": reason, "stop_sequence": seq},
                                   "usage": {"output_tokens": timings.generated_tokens}}),
                        ));
                        st.out
                            .push_back(("message_stop", json!({"type": "message_stop"})));
                    }
                    Some(Event::Failed(e)) => {
                        st.done = true;
                        st.out.push_back(("error", error_body(&e)));
                    }
                    None => {
                        st.done = true;
                        let e = ApiError::internal("the slot stopped without finishing");
                        st.out.push_back(("error", error_body(&e)));
                    }
                }
            }
        });
        Sse::new(stream)
            .keep_alive(KeepAlive::default())
            .into_response()
    }
}
