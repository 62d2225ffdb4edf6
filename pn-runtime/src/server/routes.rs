//! The HTTP routes: parsing a request, rendering and tokenizing its prompt, queueing it on a
//! slot and answering.

use super::api::{self, GenSettings, SamplingDefaults};
use super::auth;
use super::error::ApiError;
use super::metrics::Metrics;
use super::reasoning::prompt_opens_thinking;
use super::scheduler::{Event, Job, Scheduler};
use super::stream::{CancelOnDrop, Endpoint, Reply};
use super::structured::ExtraFields;
use super::tools::grammar as tool_grammar;
use super::tools::ToolConfig;
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
use tokio::sync::mpsc::UnboundedReceiver;

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
    settings.params.constraint = Some(compile_grammar(st, grammar, field).await?);
    Ok(())
}

/// Compiles `grammar` for the engine's vocabulary; a bad grammar is a 400 naming `field`.
async fn compile_grammar(
    st: &Shared,
    grammar: crate::constrain::Grammar,
    field: &'static str,
) -> Result<crate::constrain::Constraint, ApiError> {
    let state = Arc::clone(st);
    blocking(move || {
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
    .await
}

type Shared = Arc<AppState>;

/// The application: routes, body limit, API key and request counting.
pub fn router(state: Shared, api_key: Option<String>) -> Router {
    let limit = state.max_body_bytes;
    let metrics = Arc::clone(&state.metrics);
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/messages", post(super::anthropic::messages))
        .route(
            "/v1/messages/count_tokens",
            post(super::anthropic::count_tokens),
        )
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

pub(super) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: Some("request_too_large"),
                ..ApiError::invalid(format!(
                    "the request body is larger than the limit of {limit} bytes (--max-body-bytes)"
                ))
            }
        } else if let Some(timeout) = super::limits::BodyTimeout::find(&rejection) {
            timeout
        } else {
            ApiError::invalid(format!("could not read the request body: {rejection}"))
        }
    })
}

pub(super) fn next_id(prefix: &str) -> String {
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
        let tools = ToolConfig::from_openai(
            req.tools.as_deref(),
            req.tool_choice.as_ref(),
            req.parallel_tool_calls,
        )?;
        let job = ChatJob {
            messages,
            template_tools: req.tools.clone(),
            tools,
            kwargs,
            thinking_budget: super::thinking::budget(
                req.reasoning_effort.as_deref(),
                req.thinking_budget_tokens,
                settings.max_tokens,
            )?,
            settings,
        };
        let q = queue_chat(&st, job).await?;
        let endpoint = Endpoint::Chat {
            thinking: q.thinking,
        };
        Ok::<_, ApiError>(respond(&st, q, endpoint, arrival).await)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// A chat request of either API, ready to render and queue.
pub(super) struct ChatJob {
    /// Template input messages.
    pub messages: Vec<serde_json::Value>,
    /// Tool definitions for the template (`tools.choice == None` drops them).
    pub template_tools: Option<Vec<serde_json::Value>>,
    /// Tool settings.
    pub tools: Option<ToolConfig>,
    /// Template variables.
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    /// Thinking budget in tokens (`None`: unlimited), enforced when the output starts inside a
    /// thinking block.
    pub thinking_budget: Option<usize>,
    /// Generation settings (a grammar from the request's extras already set).
    pub settings: GenSettings,
}

/// A queued generation.
pub(super) struct Queued {
    /// Its events.
    pub rx: UnboundedReceiver<Event>,
    /// Cancels it when the response is dropped.
    pub guard: CancelOnDrop,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// The output starts inside a thinking block.
    pub thinking: bool,
    /// Its settings (`max_tokens` clamped to the context).
    pub settings: GenSettings,
    /// Tools whose calls are parsed out of the output.
    pub tools: Option<ToolConfig>,
}

/// Renders the chat prompt, adds the grammar a forced tool call needs, and queues it.
pub(super) async fn queue_chat(st: &Shared, job: ChatJob) -> Result<Queued, ApiError> {
    let ChatJob {
        messages,
        template_tools,
        tools,
        kwargs,
        thinking_budget,
        mut settings,
    } = job;
    let template_tools = match &tools {
        Some(t) if !t.parses_calls() => None,
        _ => template_tools,
    };
    let (text, tokens) = render_chat(st, messages, template_tools, kwargs).await?;
    let opens = prompt_opens_thinking(&text);
    let mut thinking = settings.params.constraint.is_none() && opens;
    if let Some(cfg) = tools.as_ref().filter(|t| t.forces_call()) {
        if settings.params.constraint.is_some() {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "a forced tool call cannot be combined with response_format or a grammar",
            ));
        }
        let lark = tool_grammar::call_grammar(cfg, tool_grammar::CallForm::of_prompt(&text), opens);
        let grammar = crate::constrain::Grammar::Lark(lark);
        settings.params.constraint = Some(compile_grammar(st, grammar, "tool_choice").await?);
        // The grammar lets the thinking block finish first.
        thinking = opens;
    }
    settings.thinking = super::thinking::ThinkingControl::for_tokenizer(
        st.engine.tokenizer(),
        thinking,
        thinking_budget,
    );
    let (rx, guard, prompt_tokens) = submit(st, tokens, &mut settings, "messages")?;
    Ok(Queued {
        rx,
        guard,
        prompt_tokens,
        thinking,
        settings,
        tools: tools.filter(ToolConfig::parses_calls),
    })
}

/// Renders and tokenizes a chat prompt (off the async threads).
pub(super) async fn render_chat(
    st: &Shared,
    messages: Vec<serde_json::Value>,
    tools: Option<Vec<serde_json::Value>>,
    kwargs: serde_json::Map<String, serde_json::Value>,
) -> Result<(String, Vec<u32>), ApiError> {
    let engine = st.engine.clone();
    let state = Arc::clone(st);
    blocking(move || {
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
    .await
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
        let (rx, guard, prompt_tokens) = submit(&st, tokens, &mut settings, "prompt")?;
        let q = Queued {
            rx,
            guard,
            prompt_tokens,
            thinking: false,
            settings,
            tools: None,
        };
        Ok::<_, ApiError>(respond(&st, q, Endpoint::Completion, arrival).await)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Checks the prompt against the context and queues it: its events, the guard that cancels
/// it, and the prompt length.
pub(super) fn submit(
    st: &Shared,
    tokens: Vec<u32>,
    settings: &mut GenSettings,
    what: &str,
) -> Result<(UnboundedReceiver<Event>, CancelOnDrop, usize), ApiError> {
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
    Ok((rx, CancelOnDrop(cancel), n))
}

/// Answers a queued OpenAI request, whole or streamed.
async fn respond(st: &Shared, q: Queued, endpoint: Endpoint, arrival: Instant) -> Response {
    let stream = q.settings.stream;
    let reply = Reply {
        endpoint,
        id: next_id(match endpoint {
            Endpoint::Chat { .. } => "chatcmpl",
            Endpoint::Completion => "cmpl",
        }),
        created: unix_now(),
        model: st.model_id.clone(),
        prompt_tokens: q.prompt_tokens,
        arrival,
        metrics: Arc::clone(&st.metrics),
        settings: q.settings,
        tools: q.tools,
    };
    if stream {
        reply.streamed(q.rx, q.guard)
    } else {
        reply.whole(q.rx, q.guard).await
    }
}
