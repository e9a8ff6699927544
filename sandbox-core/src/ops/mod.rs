//! One module per operation of SPEC.md section 2.

pub mod catalog;
pub mod create;
pub mod exec;
pub mod info;
pub mod list;
pub mod run;
pub mod stop;

use agent_proto::{FsError, FsErrorCode};

use crate::error::{FsCode, SandboxError};

/// An agent's filesystem refusal as our S21x error.
pub fn fs_error(error: FsError) -> SandboxError {
    let code = match error.code {
        FsErrorCode::BadRequest => FsCode::BadRequest,
        FsErrorCode::NotFound => FsCode::NotFound,
        FsErrorCode::WrongType => FsCode::WrongType,
        FsErrorCode::Exists => FsCode::Exists,
        FsErrorCode::NotEmpty => FsCode::NotEmpty,
        FsErrorCode::Permission => FsCode::Permission,
        FsErrorCode::Io => FsCode::Io,
        FsErrorCode::BadRegex => FsCode::BadRegex,
        FsErrorCode::StreamAborted => FsCode::StreamAborted,
        FsErrorCode::Unsupported => FsCode::Unsupported,
    };
    SandboxError::Fs {
        code,
        message: error.message,
        fix: None,
    }
}
