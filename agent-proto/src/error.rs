//! Request-level failures the agent reports (frame `Error`): the request could not run.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed (empty argv, bad JSON, unexpected frame).
    BadRequest,
    /// The exec's working directory does not exist or is not a directory.
    BadWorkdir,
    /// The program could not be started for a reason other than 126/127.
    SpawnFailed,
    /// The request id is already in use.
    DuplicateId,
    /// The agent has no handler for this request.
    Unsupported,
    /// The peer speaks another protocol version.
    VersionMismatch,
    /// A `TcpConnect` found nothing listening on the port (or the connection failed).
    ConnectFailed,
    /// The agent holds as many streams as it may ([`crate::tcp::MAX_TCP_STREAMS`]).
    Busy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RequestError {
    pub code: ErrorCode,
    pub message: String,
}

impl RequestError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> RequestError {
        RequestError {
            code,
            message: message.into(),
        }
    }
}
