//! `--api-key`: every route but `/health` and the chat page's (`/`, `/webui/*`) needs
//! `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`), compared in constant time so
//! the response time does not reveal how much of a guess was right.

use super::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Compares `given` with `expected` in time that depends only on `expected`'s length.
pub fn constant_time_eq(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = u8::from(given.len() != expected.len());
    for (i, &e) in expected.iter().enumerate() {
        // Index modulo so a shorter guess still costs one comparison per key byte.
        let g = if given.is_empty() {
            0
        } else {
            given[i % given.len()]
        };
        diff |= std::hint::black_box(g ^ e);
    }
    std::hint::black_box(diff) == 0
}

/// Whether the request's `Authorization` (or `x-api-key`) header carries `key`.
pub fn authorized(headers: &axum::http::HeaderMap, key: &str) -> bool {
    if let Some(v) = headers.get("x-api-key") {
        if constant_time_eq(v.as_bytes().trim_ascii(), key.as_bytes()) {
            return true;
        }
    }
    let Some(value) = headers.get(AUTHORIZATION) else {
        return false;
    };
    let value = value.as_bytes();
    let token = value
        .strip_prefix(b"Bearer ")
        .or_else(|| value.strip_prefix(b"bearer "))
        .unwrap_or(b"");
    constant_time_eq(token.trim_ascii(), key.as_bytes())
}

/// Middleware: rejects requests without the key (when one is set) with a 401.
pub async fn require_key(
    State(key): State<Arc<Option<String>>>,
    request: Request,
    next: Next,
) -> Response {
    match key.as_deref() {
        Some(k)
            if request.uri().path() != "/health"
                && !super::webui::is_public(request.uri().path())
                && !authorized(request.headers(), k) =>
        {
            if request.uri().path().starts_with("/v1/messages") {
                super::anthropic::error_response(ApiError::unauthorized())
            } else {
                ApiError::unauthorized().into_response()
            }
        }
        _ => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    #[test]
    fn equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret1", b"secret"));
        assert!(!constant_time_eq(b"secre", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(!constant_time_eq(b"sec", b""));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn bearer_header() {
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, "k1"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert!(authorized(&h, "k1"));
        assert!(!authorized(&h, "k2"));
        h.insert(AUTHORIZATION, HeaderValue::from_static("k1"));
        assert!(!authorized(&h, "k1"));
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        assert!(authorized(&h, "k1"));
        assert!(!authorized(&h, "k2"));
    }
}
