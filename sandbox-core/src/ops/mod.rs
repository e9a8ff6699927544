//! One module per operation of SPEC.md section 2, and `worker` for section 6.

pub mod cancel;
pub mod catalog;
pub mod create;
pub mod exec;
pub mod expose;
pub mod fs;
pub mod info;
pub mod list;
pub mod metrics;
pub mod pause;
pub mod process;
pub mod run;
pub mod snapshot;
pub mod stop;
pub mod stream;
pub mod worker;

use agent_proto::FsError;

use crate::error::SandboxError;

/// An agent's filesystem refusal as our S21x error.
pub fn fs_error(error: FsError) -> SandboxError {
    SandboxError::Fs {
        code: error.code,
        message: error.message,
        fix: None,
    }
}
