//! OpenAI-style error responses: `{"error": {"message", "type", "param", "code"}}` with the HTTP
//! status clients key their retry logic on.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// An error returned to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`, `server_error`, ...).
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, `invalid_api_key`, ...).
    pub code: Option<&'static str>,
    /// Seconds after which a retry may succeed (sent as `Retry-After`).
    pub retry_after: Option<u64>,
}

impl ApiError {
    /// A 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// A 400 naming the field at fault.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.into()),
            ..Self::invalid(message)
        }
    }

    /// A 500 `server_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            ..Self::invalid(message)
        }
    }

    /// A 401 for a missing or wrong API key.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            code: Some("invalid_api_key"),
            ..Self::invalid("Incorrect or missing API key: send `Authorization: Bearer KEY`")
        }
    }

    /// A 429: every slot is busy and the waiting queue is full.
    pub fn overloaded(queue: usize, retry_after: u64) -> Self {
        ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            kind: "rate_limit_error",
            code: Some("server_busy"),
            retry_after: Some(retry_after),
            ..Self::invalid(format!(
                "the server is busy: all slots are generating and {queue} requests are already waiting; retry later"
            ))
        }
    }

    /// A 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            kind: "server_error",
            code: Some("shutting_down"),
            ..Self::invalid("the server is shutting down")
        }
    }

    /// A 404 for an unknown route.
    pub fn not_found(path: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            code: Some("not_found"),
            ..Self::invalid(format!("no such endpoint: {path}"))
        }
    }

    /// Sets the machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct Inner<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'a str,
            param: Option<&'a str>,
            code: Option<&'a str>,
        }
        serde_json::json!({ "error": Inner {
            message: &self.message,
            kind: self.kind,
            param: self.param.as_deref(),
            code: self.code,
        }})
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_body_has_the_openai_shape() {
        let e = ApiError::invalid_param("temperature", "bad").with_code("x");
        let v = e.body();
        assert_eq!(v["error"]["message"], "bad");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["code"], "x");
        let v = ApiError::invalid("m").body();
        assert!(v["error"]["param"].is_null() && v["error"]["code"].is_null());
    }

    #[test]
    fn overloaded_sets_retry_after() {
        let r = ApiError::overloaded(3, 2).into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }
}
