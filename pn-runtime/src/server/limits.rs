//! What one client may hold of the server: time to send its headers and its body, time the
//! server waits for it to take the response, header size and count, and how many connections
//! are open at once. The connection layer ([`super::conn`]) applies them; each has a
//! `pn serve` flag.
//!
//! | limit | flag | default | a client over it gets |
//! |---|---|---|---|
//! | header read time | `--header-timeout` | 30 s | the connection closed (also the keep-alive idle limit) |
//! | body read time | `--body-timeout` | 60 s | 408 `request_timeout`, connection closed |
//! | a write that cannot proceed | `--write-timeout` | 60 s | the connection closed, its generation cancelled |
//! | header bytes | `--max-header-bytes` | 64 KiB | 431 (hyper's automatic answer, empty body) |
//! | header count | (fixed) | 100 | 431 |
//! | open connections | `--max-connections` | 512 | 503 `too_many_connections`, `Retry-After: 1` |

use super::error::ApiError;
use axum::http::StatusCode;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// The per-client limits (see the module table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Time a client has to send a request's head (request line and headers), counted from
    /// the connection's opening or the end of its previous response; an idle keep-alive
    /// connection is closed after the same time.
    pub header_timeout: Duration,
    /// Time a client has to send a request's whole body, counted once the head is read.
    pub body_timeout: Duration,
    /// Longest a write to the client may stay blocked (the client stopped reading).
    pub write_timeout: Duration,
    /// Largest request head (request line and headers) in bytes.
    pub max_header_bytes: usize,
    /// Most headers in one request.
    pub max_headers: usize,
    /// Most connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(30),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(60),
            max_header_bytes: 64 << 10,
            max_headers: 100,
            max_connections: 512,
        }
    }
}

/// hyper's smallest read buffer (`max_buf_size` panics below it); the head limit is never
/// set lower than this.
pub const MIN_HEADER_BYTES: usize = 8192;

/// The request body did not arrive within [`Limits::body_timeout`].
#[derive(Debug, Error)]
#[error("the request body did not arrive within {0:?} (--body-timeout)")]
pub struct BodyTimeout(pub Duration);

impl BodyTimeout {
    /// The 408 answer.
    pub fn api_error(&self) -> ApiError {
        ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            code: Some("request_timeout"),
            ..ApiError::invalid(format!(
                "the request body did not arrive within {} s (--body-timeout)",
                self.0.as_secs_f64()
            ))
        }
    }

    /// Whether `error` (or an error it wraps) is a body timeout; the 408 it maps to.
    pub fn find(error: &(dyn std::error::Error + 'static)) -> Option<ApiError> {
        let mut e = Some(error);
        while let Some(err) = e {
            if let Some(t) = err.downcast_ref::<BodyTimeout>() {
                return Some(t.api_error());
            }
            e = err.source();
        }
        None
    }
}

/// A request body that fails with [`BodyTimeout`] once its deadline passes.
pub struct TimedBody<B> {
    inner: B,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<B> TimedBody<B> {
    /// `inner`, which must be read to its end within `timeout` from now.
    pub fn new(inner: B, timeout: Duration) -> Self {
        TimedBody {
            inner,
            timeout,
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        ready!(this.deadline.as_mut().poll(cx));
        Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout)))))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection whose writes fail with `TimedOut` when they stay blocked longer than the
/// write timeout: a client that stops reading its stream loses the connection (and the
/// response being dropped cancels its generation) instead of holding a slot and the
/// response's buffers forever.
pub struct TimedIo<T> {
    inner: T,
    timeout: Duration,
    /// Running while a write or flush is blocked; `None` once one proceeds.
    blocked: Option<Pin<Box<Sleep>>>,
}

impl<T> TimedIo<T> {
    /// `inner` with writes limited to `timeout` each.
    pub fn new(inner: T, timeout: Duration) -> Self {
        TimedIo {
            inner,
            timeout,
            blocked: None,
        }
    }

    /// Called when a write returned `Pending`: fails once it has been blocked too long.
    fn check_blocked(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let timeout = self.timeout;
        let sleep = self
            .blocked
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the client took nothing for {} s (--write-timeout)",
                    timeout.as_secs_f64()
                ),
            )),
            Poll::Pending => Ok(()),
        }
    }

    fn on_write<R>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<R>>) -> Poll<io::Result<R>> {
        match r {
            Poll::Pending => match self.check_blocked(cx) {
                Ok(()) => Poll::Pending,
                Err(e) => Poll::Ready(Err(e)),
            },
            ready => {
                self.blocked = None;
                ready
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.on_write(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.on_write(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.on_write(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.on_write(cx, r)
    }
}

/// The 503 a connection over [`Limits::max_connections`] gets, as raw HTTP/1.1 (it is
/// written before hyper sees the connection).
pub fn too_many_connections(limit: usize) -> Vec<u8> {
    let e = ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "server_error",
        code: Some("too_many_connections"),
        retry_after: Some(1),
        ..ApiError::invalid(format!(
            "the server has {limit} connections open, its limit (--max-connections); retry later"
        ))
    };
    let body = e.body().to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test(flavor = "current_thread")]
    async fn body_timeout_fires_and_is_found() {
        // A body that never sends a frame.
        let never = futures_util::stream::pending::<Result<Frame<axum::body::Bytes>, io::Error>>();
        let body = http_body_util::StreamBody::new(never);
        let timed = TimedBody::new(body, Duration::from_millis(50));
        let err = timed.collect().await.expect_err("timed out");
        let api = BodyTimeout::find(&*err).expect("a BodyTimeout");
        assert_eq!(api.status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(api.code, Some("request_timeout"));
    }

    #[test]
    fn connection_refusal_is_valid_http_with_an_openai_body() {
        let raw = String::from_utf8(too_many_connections(7)).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }
}
