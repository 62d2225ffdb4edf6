//! The HTTP routes: parsing a request, rendering and tokenizing its prompt, queueing it on a
//! slot and answering.

use super::api::{self, GenSettings, SamplingDefaults};
use super::auth;
use super::error::ApiError;
use super::metrics::Metrics;
use super::reasoning::prompt_opens_thinking;
use super::scheduler::{Job, Scheduler};
use super::stream::{CancelOnDrop, Endpoint, Reply};
use super::structured::ExtraFields;
use crate::chat_template::{ChatTemplate, TemplateContext};
use crate::constrain::ConstraintFactory;
use crate::engine::{CancelToken, Engine, Prompt, StopConditions};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// What every handler shares.
#[derive(Debug)]
pub struct AppState {
    /// The model.
    pub engine: Engine,
    /// Slots and queue.
    pub scheduler: Arc<Scheduler>,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// The id `/v1/models` lists and responses carry.
    pub model_id: String,
    /// Unix seconds at start.
    pub created: u64,
    /// Request body limit (for the 413 message).
    pub max_body_bytes: usize,
    /// A chat template replacing the model's (`--chat-template-file`).
    pub template: Option<ChatTemplate>,
    /// Sampling of requests that leave fields out.
    pub defaults: SamplingDefaults,
    /// The grammar compiler for the engine's vocabulary, built by the first request that
    /// constrains its output (or the reason it cannot be).
    pub constraints: OnceLock<Result<ConstraintFactory, String>>,
}

/// Compiles the grammar `extras` ask for into `settings` (in a blocking task: compiling a
/// large schema takes milliseconds, the token trie of a first request longer).
async fn add_constraint(
    st: &Shared,
    extras: &ExtraFields,
    settings: &mut GenSettings,
) -> Result<(), ApiError> {
    let Some((grammar, field)) = extras.grammar()? else {
        return Ok(());
    };
    let state = Arc::clone(st);
    let constraint = blocking(move || {
        let factory = state
            .constraints
            .get_or_init(|| {
                ConstraintFactory::new(state.engine.tokenizer()).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| ApiError::internal(e.clone()))?;
        factory
            .compile(&grammar)
            .map_err(|e| ApiError::invalid_param(field, e.to_string()))
    })
    .await?;
    settings.params.constraint = Some(constraint);
    Ok(())
}

type Shared = Arc<AppState>;

/// The application: routes, body limit, API key and request counting.
pub fn router(state: Shared, api_key: Option<String>) -> Router {
    let limit = state.max_body_bytes;
    let metrics = Arc::clone(&state.metrics);
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/", get(super::webui::index))
        .route("/webui/app.js", get(super::webui::app_js))
        .route("/webui/style.css", get(super::webui::style_css))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn_with_state(
            Arc::new(api_key),
            auth::require_key,
        ))
        .layer(middleware::from_fn_with_state(metrics, count_requests))
}

async fn count_requests(State(m): State<Arc<Metrics>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    m.record_request(&path, response.status().as_u16());
    response
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::invalid(format!("method not allowed on {}", uri.path()))
    }
}

async fn health(State(st): State<Shared>) -> Response {
    let g = st.scheduler.gauges();
    axum::Json(json!({
        "status": "ok",
        "slots_idle": g.slots - g.busy_slots,
        "slots_busy": g.busy_slots,
        "queue": g.queue_depth,
    }))
    .into_response()
}

async fn metrics_text(State(st): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(st.scheduler.gauges()),
    )
        .into_response()
}

async fn models(State(st): State<Shared>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "pn",
            "meta": {
                "n_ctx": st.engine.context(),
                "n_params": st.engine.n_params(),
                "size": st.engine.file_size(),
            },
        }],
    }))
    .into_response()
}

fn body_bytes(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: Some("request_too_large"),
                ..ApiError::invalid(format!(
                    "the request body is larger than the limit of {limit} bytes (--max-body-bytes)"
                ))
            }
        } else {
            ApiError::invalid(format!("could not read the request body: {rejection}"))
        }
    })
}

fn next_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!(
        "{prefix}-{t:x}{:04x}",
        N.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Runs blocking prompt preparation (template rendering, tokenizing) off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("preparing the prompt failed: {e}")))?
}

async fn chat(State(st): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(body, st.max_body_bytes)?;
        let (req, fields, extras) = api::parse_chat(&body)?;
        req.check_supported()?;
        let mut settings =
            fields.settings(req.max_completion_tokens, None, &extras, &st.defaults)?;
        add_constraint(&st, &extras, &mut settings).await?;
        let messages = req.template_messages()?;
        let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(effort) = &req.reasoning_effort {
            kwargs
                .entry("reasoning_effort")
                .or_insert_with(|| effort.clone().into());
        }
        let tools = req.tools.clone();
        let engine = st.engine.clone();
        let state = Arc::clone(&st);
        let (text, tokens) = blocking(move || {
            let mut ctx = TemplateContext::new();
            ctx.set("messages", &messages);
            if let Some(tools) = &tools {
                ctx.set("tools", tools);
            }
            if !kwargs.is_empty() {
                let json = serde_json::Value::Object(kwargs).to_string();
                ctx.set_kwargs_json(&json)
                    .map_err(|e| ApiError::invalid_param("chat_template_kwargs", e.to_string()))?;
            }
            ctx.add_generation_prompt(true);
            let template = state.template.as_ref().unwrap_or(engine.chat_template());
            // Control tokens only from the template: a message cannot forge a turn.
            let prompt = template
                .render_prompt(&ctx, engine.tokenizer())
                .map_err(|e| match e {
                    crate::chat_template::ChatTemplateError::Tokenize(e) => {
                        ApiError::internal(format!("tokenizing the prompt: {e}"))
                    }
                    e => ApiError::invalid_param("messages", format!("chat template: {e}")),
                })?;
            Ok((prompt.text, prompt.tokens))
        })
        .await?;
        // Constrained output is all content: the grammar starts at the first token, so a
        // thinking block the prompt opens is not expected to close.
        let thinking = settings.params.constraint.is_none() && prompt_opens_thinking(&text);
        let endpoint = Endpoint::Chat { thinking };
        let budget = super::thinking::budget(
            req.reasoning_effort.as_deref(),
            req.thinking_budget_tokens,
            settings.max_tokens,
        )?;
        settings.thinking = super::thinking::ThinkingControl::for_tokenizer(
            st.engine.tokenizer(),
            thinking,
            budget,
        );
        start(&st, tokens, settings, endpoint, arrival, "messages").await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(st): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    let arrival = Instant::now();
    let result = async {
        let body = body_bytes(body, st.max_body_bytes)?;
        let (req, fields, extras) = api::parse_completion(&body)?;
        // OpenAI's default for this endpoint.
        let mut settings = fields.settings(None, Some(16), &extras, &st.defaults)?;
        add_constraint(&st, &extras, &mut settings).await?;
        let prompt = req.prompt()?;
        let engine = st.engine.clone();
        let n_vocab = engine.tokenizer().n_vocab();
        let tokens = blocking(move || match prompt {
            Prompt::Text(t) => engine
                .tokenizer()
                .encode(&t)
                .map_err(|e| ApiError::internal(format!("tokenizing the prompt: {e}"))),
            Prompt::Tokens(t) => {
                if let Some(bad) = t.iter().find(|&&id| id as usize >= n_vocab) {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        format!("token id {bad} is outside the vocabulary of {n_vocab}"),
                    ));
                }
                Ok(t)
            }
        })
        .await?;
        start(
            &st,
            tokens,
            settings,
            Endpoint::Completion,
            arrival,
            "prompt",
        )
        .await
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Checks the prompt against the context, queues it and answers.
async fn start(
    st: &Shared,
    tokens: Vec<u32>,
    mut settings: GenSettings,
    endpoint: Endpoint,
    arrival: Instant,
    what: &str,
) -> Result<Response, ApiError> {
    let context = st.engine.context();
    let n = tokens.len();
    if n == 0 {
        return Err(ApiError::invalid_param(what, "the prompt is empty"));
    }
    if n >= context {
        return Err(ApiError::invalid_param(
            what,
            format!(
                "This model's maximum context length is {context} tokens. However, your {what} resulted in {n} tokens (and at least one more is needed to generate). Shorten the {what} or start the server with a larger -c."
            ),
        )
        .with_code("context_length_exceeded"));
    }
    // As llama-server: a `max_tokens` beyond the slot's room is clamped to it, and the reply
    // finishes with `length` there (clients that always send 4096 still get an answer).
    settings.max_tokens = settings.max_tokens.map(|m| m.min(context - n));
    let cancel = CancelToken::new();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let job = Job {
        prompt: tokens,
        params: settings.params.clone(),
        stop: StopConditions {
            max_tokens: settings.max_tokens,
            strings: settings.stop.clone(),
            tokens: settings.stop_tokens.clone(),
            ignore_eog: settings.ignore_eos,
            cancel: Some(cancel.clone()),
        },
        cancel: cancel.clone(),
        events: tx,
        logprobs: settings.logprobs,
        thinking: settings.thinking.clone(),
    };
    st.scheduler.submit(job)?;
    let guard = CancelOnDrop(cancel);
    let stream = settings.stream;
    let reply = Reply {
        endpoint,
        id: next_id(match endpoint {
            Endpoint::Chat { .. } => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }),
        created: unix_now(),
        model: st.model_id.clone(),
        prompt_tokens: n,
        arrival,
        metrics: Arc::clone(&st.metrics),
        settings,
    };
    Ok(if stream {
        reply.streamed(rx, guard)
    } else {
        reply.whole(rx, guard).await
    })
}
