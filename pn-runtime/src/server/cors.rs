//! `--cors-origin`: which web pages, other than the server's own chat page, may call the API
//! from a browser. Off unless asked for: without the flag no response carries
//! `Access-Control-Allow-Origin`, so a page on another site cannot read answers (a browser
//! still sends simple requests, which `--api-key` guards), and preflights (`OPTIONS`) get 405.

use axum::extract::{Request, State};
use axum::http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS, ACCESS_CONTROL_REQUEST_METHOD, ORIGIN,
    VARY,
};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::sync::Arc;

/// Headers a preflight may ask for when it names none.
const ALLOWED_HEADERS: &str = "authorization, content-type, x-api-key, anthropic-version";

/// Adds CORS to `app` for `origins` (exact `scheme://host[:port]` strings, or `*` for any);
/// with none, `app` is returned as it is.
pub fn layer(app: Router, origins: &[String]) -> Router {
    if origins.is_empty() {
        return app;
    }
    let allowed: Arc<Vec<String>> = Arc::new(
        origins
            .iter()
            .map(|o| o.trim_end_matches('/').to_string())
            .collect(),
    );
    // Outside the API key check: a browser's preflight never carries credentials.
    app.layer(middleware::from_fn_with_state(allowed, cors))
}

/// Whether `origin` is in `allowed`.
fn allows(allowed: &[String], origin: &[u8]) -> bool {
    allowed
        .iter()
        .any(|a| a == "*" || a.as_bytes().eq_ignore_ascii_case(origin))
}

async fn cors(State(allowed): State<Arc<Vec<String>>>, request: Request, next: Next) -> Response {
    let origin = request
        .headers()
        .get(ORIGIN)
        .filter(|o| allows(&allowed, o.as_bytes()))
        .cloned();
    let Some(origin) = origin else {
        return next.run(request).await;
    };
    let preflight = request.method() == Method::OPTIONS
        && request
            .headers()
            .contains_key(ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight {
        let asked = request
            .headers()
            .get(ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or(HeaderValue::from_static(ALLOWED_HEADERS));
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(
            ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked);
        h.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        r
    } else {
        next.run(request).await
    };
    let h = response.headers_mut();
    h.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.append(VARY, HeaderValue::from_static("origin"));
    response
}

#[cfg(test)]
mod tests {
    use super::allows;

    #[test]
    fn origin_matching() {
        let list = vec!["https://app.example".to_string()];
        assert!(allows(&list, b"https://app.example"));
        assert!(allows(&list, b"HTTPS://APP.EXAMPLE"));
        assert!(!allows(&list, b"https://app.example.evil"));
        assert!(!allows(&list, b"http://app.example"));
        assert!(allows(&["*".to_string()], b"https://anything"));
        assert!(!allows(&[], b"https://app.example"));
    }
}
