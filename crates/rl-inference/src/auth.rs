//! API keys: `Authorization: Bearer <key>` on every route but `/health`, and a separate admin key
//! for the routes that change what is served (`/update_weights`, `/pause`, `/resume`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::Error;

/// The keys a route group requires (`None`: open).
#[derive(Debug, Clone, Default)]
pub(crate) struct Keys {
    /// For generation, models and tokenization.
    pub(crate) api: Option<Arc<str>>,
    /// For admin routes; falls back to `api` when unset.
    pub(crate) admin: Option<Arc<str>>,
}

impl Keys {
    /// The key admin routes require.
    pub(crate) fn admin_or_api(&self) -> Option<Arc<str>> {
        self.admin.clone().or_else(|| self.api.clone())
    }
}

/// Middleware: passes the request on when it carries `key` (or no key is required).
pub(crate) async fn require(State(key): State<Option<Arc<str>>>, req: Request, next: Next) -> Response {
    let Some(key) = key else { return next.run(req).await };
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    match given {
        Some(token) if same(token.as_bytes(), key.as_bytes()) => next.run(req).await,
        Some(_) => Error::Unauthorized(String::from("invalid API key")).into_response(),
        None => Error::Unauthorized(String::from("this server requires an API key: Authorization: Bearer <key>"))
            .into_response(),
    }
}

/// Compares without an early exit on the first differing byte (no timing hint of the prefix).
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_compare_whole() {
        assert!(super::same(b"secret", b"secret"));
        assert!(!super::same(b"secret", b"secreT"));
        assert!(!super::same(b"secret", b"secret2"));
    }
}
