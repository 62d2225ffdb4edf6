//! The HTTP connection layer: the accept loop, one hyper HTTP/1.1 connection task per client,
//! and the [`Limits`] a client cannot go past.
//!
//! `axum::serve` was used before; it has no connection limit, no way to set hyper's header
//! timeout (it gives hyper no timer, so a client could take forever to send its headers) and
//! no body or write timeout. This loop is the same shape (accept, serve each connection on a
//! task, watch them for a graceful shutdown) with those limits added.

use super::limits::{self, Limits, TimedBody, TimedIo};
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Refused connections answered at once; beyond that a refused connection is closed
/// without an answer (a flood must not turn the refusals themselves into a resource).
const REFUSALS_IN_FLIGHT: usize = 256;

/// Longest a refused connection is kept while its 503 is written and read.
const REFUSAL_TIME: Duration = Duration::from_secs(2);

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then waits for the
/// open connections to finish their responses.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) {
    let app = app.layer(middleware::from_fn_with_state(
        limits.body_timeout,
        time_body,
    ));
    let service = TowerToHyperService::new(app);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_header_size(limits.max_header_bytes.max(limits::MIN_HEADER_BYTES))
        .max_headers(limits.max_headers);
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusing = Arc::new(Semaphore::new(REFUSALS_IN_FLIGHT));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors (EMFILE) or a connection reset before it was
                    // accepted: wait a little rather than spin, and go on.
                    if !is_per_connection(&e) {
                        eprintln!("pn serve: accept: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&open).try_acquire_owned() else {
            refuse(stream, limits.max_connections, &refusing);
            continue;
        };
        // Tokens go out as they are made: do not let Nagle hold a small SSE chunk back.
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(TimedIo::new(stream, limits.write_timeout));
        let connection = graceful.watch(http.serve_connection(io, service.clone()));
        tokio::spawn(async move {
            // A connection error (a reset, a timeout, a malformed request hyper answered
            // itself) ends that connection only.
            let _ = connection.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Accept errors that concern one connection only.
fn is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    )
}

/// Answers a connection over the limit with a 503 (JSON body, `Retry-After`) and closes it.
fn refuse(stream: TcpStream, limit: usize, refusing: &Arc<Semaphore>) {
    let Ok(permit) = Arc::clone(refusing).try_acquire_owned() else {
        return; // dropped: closed without an answer
    };
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tokio::time::timeout(REFUSAL_TIME, answer_refused(stream, limit)).await;
    });
}

/// Writes the 503 to a refused connection and closes it gracefully. (With tokio's readiness
/// calls: its `io-util` extension traits are not built in.)
async fn answer_refused(stream: TcpStream, limit: usize) -> std::io::Result<()> {
    // Take what the client sent first (a request, if it sent one at once) so that closing
    // the socket does not reset the connection before it reads the answer.
    let mut buf = [0u8; 4096];
    if tokio::time::timeout(Duration::from_millis(100), stream.readable())
        .await
        .is_ok()
    {
        let _ = stream.try_read(&mut buf);
    }
    let answer = limits::too_many_connections(limit);
    let mut sent = 0;
    while sent < answer.len() {
        stream.writable().await?;
        match stream.try_write(&answer[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    let stream = stream.into_std()?;
    stream.shutdown(std::net::Shutdown::Write)?;
    let stream = TcpStream::from_std(stream)?;
    // Until the client closes its side (or the refusal time is up).
    loop {
        stream.readable().await?;
        match stream.try_read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
}

/// Middleware: the request body must arrive within the body timeout (see [`TimedBody`]).
async fn time_body(State(timeout): State<Duration>, request: Request, next: Next) -> Response {
    let request = request.map(|body| axum::body::Body::new(TimedBody::new(body, timeout)));
    next.run(request).await
}
