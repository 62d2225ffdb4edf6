//! `pn serve`: an OpenAI-compatible HTTP server.
//!
//! `POST /v1/chat/completions` (with tool calls, [`tools`]), `POST /v1/completions` (both with
//! `stream` as server-sent events), the Anthropic Messages API ([`anthropic`]: `POST
//! /v1/messages`, `POST /v1/messages/count_tokens`), `GET /v1/models`, `GET /health`, `GET
//! /metrics` (Prometheus text) and a chat page at `/` ([`webui`]). Requests run on `parallel`
//! slots, the slots of one [`Batch`](crate::engine::batch::Batch) that a single engine thread
//! decodes together (one forward pass per step for all of them); more wait in a bounded queue,
//! beyond which the server answers 429 with `Retry-After`. A client
//! that disconnects cancels its generation before the next token; a request that panics gets
//! a 500 and the server goes on; SIGINT/SIGTERM stop accepting, let running generations finish
//! for a grace period, then cancel them.
//!
//! ```no_run
//! use pn_runtime::server::{serve, ServerConfig};
//! use pn_runtime::{Engine, EngineOptions};
//!
//! let engine = Engine::load(pn_runtime::DEMO_MODEL_PATH, EngineOptions::default())?;
//! serve(engine, ServerConfig::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

pub mod anthropic;
pub mod api;
pub mod auth;
pub mod conn;
pub mod cors;
pub mod error;
pub mod limits;
pub mod logprobs;
pub mod messages;
pub mod metrics;
pub mod reasoning;
pub mod routes;
pub mod scheduler;
pub mod stream;
pub mod structured;
pub mod thinking;
pub mod tools;
pub mod webui;

use crate::engine::{Engine, EngineError};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind (127.0.0.1 by default: reachable from this machine only).
    pub host: String,
    /// Port (0: any free port; the bound address is printed).
    pub port: u16,
    /// Requests generated at the same time (one session each).
    pub parallel: usize,
    /// Requests that may wait for a slot before the server answers 429.
    pub max_queue: usize,
    /// Required `Authorization: Bearer` key.
    pub api_key: Option<String>,
    /// Model id (`/v1/models`); defaults to the file name without extension.
    pub model_id: Option<String>,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// How long running generations may continue after SIGINT/SIGTERM before they are cancelled.
    pub shutdown_grace: Duration,
    /// Jinja chat template to use instead of the model's (its source text).
    pub chat_template: Option<String>,
    /// Sampling of requests that leave fields out (`pn run`'s defaults unless set).
    pub sampling: api::SamplingDefaults,
    /// Timeouts, header and connection limits of each client ([`limits`]).
    pub limits: limits::Limits,
    /// Origins whose browser pages may call the API (CORS); empty: none (no CORS headers,
    /// preflights get 405); `*`: any.
    pub cors_origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            parallel: 4,
            max_queue: 64,
            api_key: None,
            model_id: None,
            max_body_bytes: 16 << 20,
            shutdown_grace: Duration::from_secs(10),
            chat_template: None,
            sampling: api::SamplingDefaults::default(),
            limits: limits::Limits::default(),
            cors_origins: Vec::new(),
        }
    }
}

/// Why the server could not run.
#[derive(Debug, Error)]
pub enum ServerError {
    /// Binding the address or serving failed.
    #[error("server I/O on {addr}: {source}")]
    Io {
        /// The address.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// Creating the sessions failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The chat template given with the configuration does not compile.
    #[error("chat template: {0}")]
    Template(#[from] crate::chat_template::ChatTemplateError),
}

/// Called on a slot's thread with each request's prompt tokens just before the slot generates,
/// inside the slot's panic guard. See [`serve_on`].
pub type SlotHook = Arc<dyn Fn(&[u32]) + Send + Sync>;

/// Runs the server until SIGINT or SIGTERM. Prints `pn serve: listening on http://ADDR` on
/// stdout once the socket is bound (with `port: 0`, ADDR has the port chosen).
pub fn serve(engine: Engine, config: ServerConfig) -> Result<(), ServerError> {
    let addr = format!("{}:{}", config.host, config.port);
    start_runtime(&addr)?.block_on(run(engine, config, &addr, None, None))
}

/// Runs the server like [`serve`] on `listener`, already bound (`config.host` and
/// `config.port` are not used), with `before_generate` called on every request (see
/// [`SlotHook`]). For a server started in-process, e.g. by a test that binds port 0, reads the
/// address, and then talks to the server.
///
/// The hook is how the integration tests check that a request that panics in its slot is
/// answered 500 and the server keeps serving: the test injects a hook that panics on a marker
/// prompt. It replaces a hidden `--debug-panic-trigger` flag that carried the test's panic in
/// every release binary and in [`ServerConfig`]. A `test-hooks` cargo feature was the other
/// way, but a package's own integration tests cannot turn on its features (it cannot
/// dev-depend on itself), so plain `cargo test` would have skipped the test; a hook keeps the
/// test's assertion (the panic unwinds on the slot thread inside the same guard as any other,
/// and gets the same 500) with nothing test-specific in production code.
pub fn serve_on(
    listener: std::net::TcpListener,
    engine: Engine,
    config: ServerConfig,
    before_generate: Option<SlotHook>,
) -> Result<(), ServerError> {
    let addr = listener
        .local_addr()
        .map_or_else(|_| "listener".to_string(), |a| a.to_string());
    start_runtime(&addr)?.block_on(run(engine, config, &addr, Some(listener), before_generate))
}

fn start_runtime(addr: &str) -> Result<tokio::runtime::Runtime, ServerError> {
    let io = |source| ServerError::Io {
        addr: addr.to_string(),
        source,
    };
    // Two async threads are plenty: handlers only parse JSON and wait on channels, the model
    // runs on the slot threads.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(io)
}

async fn run(
    engine: Engine,
    config: ServerConfig,
    addr: &str,
    listener: Option<std::net::TcpListener>,
    before_generate: Option<SlotHook>,
) -> Result<(), ServerError> {
    let io = |source| ServerError::Io {
        addr: addr.to_string(),
        source,
    };
    let template = match &config.chat_template {
        Some(source) => Some(
            crate::chat_template::ChatTemplate::new(source)?
                .with_special_tokens_of(engine.tokenizer())
                .with_isolation(engine.chat_template().isolation().clone()),
        ),
        None => None,
    };
    let metrics = Arc::new(metrics::Metrics::default());
    let scheduler = scheduler::Scheduler::start(
        &engine,
        scheduler::SlotConfig {
            n_slots: config.parallel,
            max_queue: config.max_queue,
            before_generate,
        },
        metrics.clone(),
    )?;
    let listener = match listener {
        Some(l) => {
            l.set_nonblocking(true).map_err(io)?;
            tokio::net::TcpListener::from_std(l).map_err(io)?
        }
        None => tokio::net::TcpListener::bind(addr).await.map_err(io)?,
    };
    let bound = listener.local_addr().map_err(io)?;
    let model_id = config.model_id.clone().unwrap_or_else(|| {
        engine
            .path()
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    let state = Arc::new(routes::AppState {
        engine: engine.clone(),
        scheduler: Arc::clone(&scheduler),
        metrics,
        model_id,
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        max_body_bytes: config.max_body_bytes,
        template,
        defaults: config.sampling.clone(),
        constraints: std::sync::OnceLock::new(),
    });
    let app = cors::layer(
        routes::router(state, config.api_key.clone()),
        &config.cors_origins,
    );
    eprintln!(
        "pn serve: model {} | {} slots of {} tokens | queue {} | api key {}",
        engine.path().display(),
        config.parallel.max(1),
        engine.context(),
        config.max_queue,
        if config.api_key.is_some() {
            "required"
        } else {
            "off"
        },
    );
    if !bound.ip().is_loopback() && config.api_key.is_none() {
        eprintln!(
            "pn serve: warning: listening on {bound}, reachable from other machines, without \
             --api-key: anyone who can connect can use the model"
        );
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "pn serve: listening on http://{bound}");
        let _ = out.flush();
    }
    let grace = config.shutdown_grace;
    let shutdown = async move {
        wait_for_signal().await;
        let running = scheduler.begin_shutdown();
        eprintln!(
            "pn serve: shutting down: {running} generations running, cancelling them in {:.1} s",
            grace.as_secs_f64()
        );
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            if scheduler.busy() > 0 {
                eprintln!("pn serve: grace period over, cancelling running generations");
            }
            scheduler.cancel_all();
            // Connections that still do not close (a client that stopped reading) must not
            // keep the process alive.
            tokio::time::sleep(Duration::from_secs(5)).await;
            eprintln!("pn serve: connections still open after the grace period; exiting");
            std::process::exit(0);
        });
    };
    conn::serve(listener, app, &config.limits, shutdown).await;
    eprintln!("pn serve: stopped");
    Ok(())
}

async fn wait_for_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
