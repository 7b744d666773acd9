//! The error type of `rl-inference` and its one mapping to HTTP status codes.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong serving a request.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The request is invalid (400).
    #[error("{0}")]
    BadRequest(String),
    /// The request body is larger than the server accepts (413).
    #[error("{0}")]
    TooLarge(String),
    /// No such model is served (404).
    #[error("{0}")]
    UnknownModel(String),
    /// Too many requests are pending (503).
    #[error("{0}")]
    Overloaded(String),
    /// No such route (404).
    #[error("{0}")]
    NotFound(String),
    /// The route exists but not for this method (405).
    #[error("{0}")]
    WrongMethod(String),
    /// A required API key is missing or wrong (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The engine cannot serve: stopped or stuck (503 from `/health`).
    #[error("{0}")]
    Unhealthy(String),
    /// The request took too long (504).
    #[error("{0}")]
    Timeout(String),
    /// The engine failed (500).
    #[error("engine error: {0}")]
    Engine(String),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Engine(e.to_string())
    }
}

impl From<rl_model::Error> for Error {
    fn from(e: rl_model::Error) -> Self {
        match e {
            rl_model::Error::Input(m) | rl_model::Error::Template(m) | rl_model::Error::Tokenizer(m) => {
                Error::BadRequest(m)
            }
            other => Error::Engine(other.to_string()),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let (status, kind) = match &self {
            Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
            Error::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error"),
            Error::UnknownModel(_) => (StatusCode::NOT_FOUND, "model_not_found"),
            Error::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "authentication_error"),
            Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found_error"),
            Error::WrongMethod(_) => (StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error"),
            Error::Overloaded(_) => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Error::Unhealthy(_) => (StatusCode::SERVICE_UNAVAILABLE, "unhealthy"),
            Error::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout"),
            Error::Engine(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error"),
        };
        let body = serde_json::json!({"error": {"message": self.to_string(), "type": kind, "code": status.as_u16()}});
        (status, axum::Json(body)).into_response()
    }
}

/// A JSON request body whose rejections (malformed JSON, wrong field types, missing content type,
/// too large) answer with the OpenAI error object like every other error, not the framework's
/// plain text.
#[derive(Debug, Clone)]
pub(crate) struct ApiJson<T>(pub(crate) T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for ApiJson<T> {
    type Rejection = Error;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(Error::TooLarge(rejection.body_text()))
            }
            Err(rejection) => Err(Error::BadRequest(rejection.body_text())),
        }
    }
}
