//! The built-in chat page at `GET /`: static HTML, JavaScript and CSS compiled into the binary
//! (`include_str!`; no build step, no CDN, no external fonts). The page streams
//! `/v1/chat/completions` with `fetch` (server-sent events parsed by hand), shows reasoning
//! collapsed in a `<details>`, stops a reply with an `AbortController` (the closed connection
//! cancels the generation), keeps the conversation in `localStorage`, shows tokens/s, and
//! sends the API key typed into its settings as a bearer token.
//!
//! The page and its two assets need no API key (they hold nothing secret); every API call
//! they make does, when the server has one.

use axum::http::header;
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const STYLE_CSS: &str = include_str!("style.css");

/// Paths of the page and its assets.
pub const PATHS: [&str; 3] = ["/", "/webui/app.js", "/webui/style.css"];

/// Whether `path` is one of the page's (served without the API key).
pub fn is_public(path: &str) -> bool {
    PATHS.contains(&path)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the chat page.
pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /webui/app.js`.
pub async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

/// `GET /webui/style.css`.
pub async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_assets() {
        // No CDN, no external fonts: every URL the page refers to is one of ours.
        for src in [INDEX_HTML, APP_JS, STYLE_CSS] {
            assert!(!src.contains("http://") && !src.contains("https://"));
        }
        assert!(INDEX_HTML.contains("/webui/app.js") && INDEX_HTML.contains("/webui/style.css"));
        assert!(is_public("/") && is_public("/webui/app.js") && !is_public("/v1/models"));
    }
}
