//! The error taxonomy of environments and env servers, and its one mapping to and from `tonic::Status`.

use rl_proto::env::v1 as pb;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong serving or running an environment. The kind decides whether a caller retries.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// The request is wrong; retrying cannot help.
    #[error("bad request: `{field}`: {message}")]
    BadRequest {
        /// The request field at fault (dotted path).
        field: String,
        /// What is wrong and what was expected.
        message: String,
    },
    /// The model endpoint, the network or the server is unavailable (retryable).
    #[error("infrastructure error: {0}")]
    Infrastructure(String),
    /// The model answered something unusable (retryable).
    #[error("invalid model response: {0}")]
    InvalidModelResponse(String),
    /// Something took too long (retryable).
    #[error("timed out: {0}")]
    Timeout(String),
    /// The prompt no longer fits the model's context (not retryable).
    #[error("prompt too long: {0}")]
    OverlongPrompt(String),
    /// A bug in the environment (not retryable).
    #[error("environment error: {0}")]
    Env(String),
    /// The call lacks the server's token (not retryable).
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
}

impl Error {
    /// Shorthand for a bad request about `field`.
    pub fn bad_request(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::BadRequest { field: field.into(), message: message.into() }
    }

    /// Whether running the same thing again may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, Error::Infrastructure(_) | Error::InvalidModelResponse(_) | Error::Timeout(_))
    }

    /// The wire kind of this error.
    pub fn kind(&self) -> pb::ErrorKind {
        match self {
            Error::BadRequest { .. } | Error::Unauthenticated(_) => pb::ErrorKind::BadRequest,
            Error::Infrastructure(_) => pb::ErrorKind::Infrastructure,
            Error::InvalidModelResponse(_) => pb::ErrorKind::InvalidModelResponse,
            Error::Timeout(_) => pb::ErrorKind::Timeout,
            Error::OverlongPrompt(_) => pb::ErrorKind::OverlongPrompt,
            Error::Env(_) => pb::ErrorKind::Env,
        }
    }

    /// The error as recorded on a trace.
    pub fn to_trace_error(&self) -> pb::TraceError {
        pb::TraceError { kind: self.kind() as i32, message: self.to_string(), retryable: self.retryable() }
    }

    /// Rebuilds an error recorded on a trace.
    pub fn from_trace_error(e: &pb::TraceError) -> Self {
        let m = e.message.clone();
        match pb::ErrorKind::try_from(e.kind).unwrap_or(pb::ErrorKind::Unspecified) {
            pb::ErrorKind::BadRequest => Error::bad_request("trace", m),
            pb::ErrorKind::Infrastructure => Error::Infrastructure(m),
            pb::ErrorKind::InvalidModelResponse => Error::InvalidModelResponse(m),
            pb::ErrorKind::Timeout => Error::Timeout(m),
            pb::ErrorKind::OverlongPrompt => Error::OverlongPrompt(m),
            pb::ErrorKind::Env | pb::ErrorKind::Unspecified => Error::Env(m),
        }
    }
}

/// The one mapping from the taxonomy to gRPC status codes.
impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::BadRequest { .. } => tonic::Status::invalid_argument(message),
            Error::Infrastructure(_) => tonic::Status::unavailable(message),
            Error::InvalidModelResponse(_) => tonic::Status::aborted(message),
            Error::Timeout(_) => tonic::Status::deadline_exceeded(message),
            Error::OverlongPrompt(_) => tonic::Status::failed_precondition(message),
            Error::Env(_) => tonic::Status::internal(message),
            Error::Unauthenticated(_) => tonic::Status::unauthenticated(message),
        }
    }
}

/// The inverse mapping, for clients.
impl From<tonic::Status> for Error {
    fn from(s: tonic::Status) -> Self {
        let m = s.message().to_owned();
        match s.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange | tonic::Code::NotFound => {
                Error::bad_request("request", m)
            }
            tonic::Code::Unavailable | tonic::Code::ResourceExhausted | tonic::Code::Unknown => {
                Error::Infrastructure(format!("{:?}: {m}", s.code()))
            }
            tonic::Code::Aborted => Error::InvalidModelResponse(m),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => Error::Timeout(m),
            tonic::Code::FailedPrecondition => Error::OverlongPrompt(m),
            tonic::Code::Unauthenticated => Error::Unauthenticated(m),
            _ => Error::Env(format!("{:?}: {m}", s.code())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping_round_trips_every_kind() {
        let all = [
            Error::bad_request("example.dataset.split", "x"),
            Error::Infrastructure(String::from("x")),
            Error::InvalidModelResponse(String::from("x")),
            Error::Timeout(String::from("x")),
            Error::OverlongPrompt(String::from("x")),
            Error::Env(String::from("x")),
        ];
        for e in all {
            let back = Error::from(tonic::Status::from(e.clone()));
            assert_eq!(back.kind(), e.kind(), "{e}");
            assert_eq!(back.retryable(), e.retryable(), "{e}");
            assert_eq!(Error::from_trace_error(&e.to_trace_error()).kind(), e.kind());
        }
    }

    #[test]
    fn bad_requests_become_invalid_argument_naming_the_field() {
        let s = tonic::Status::from(Error::bad_request("group_size", "must be at least 1"));
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().contains("`group_size`"));
    }
}
