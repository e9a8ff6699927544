//! The one error type of every sandbox operation, and its S-code body (SPEC.md section 4).

use plugin_api::ErrorBody;
use serde_json::Value;

/// Every way a sandbox call fails, one variant per S-code family.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("unknown sandbox {0}")]
    UnknownSandbox(String),
    #[error("sandbox {sandbox_id} already runs {cap} execs, its limit")]
    ExecLimit { sandbox_id: String, cap: usize },
    #[error("sandbox {0} is stopped")]
    Stopped(String),
    #[error("{0}")]
    ImageNotAllowed(String),
    #[error("{0}")]
    ImageNotInstalled(String),
    #[error("{0}")]
    PullFailed(String),
    /// Over `max_image_size_mb` (or a bomb): S102 like a failed pull, but pulling again
    /// cannot help.
    #[error("{0}")]
    ImageTooLarge(String),
    #[error("exec timed out after {timeout_ms} ms")]
    ExecTimedOut { timeout_ms: u64, partial: Value },
    #[error("{message}")]
    Fs {
        code: FsCode,
        message: String,
        fix: Option<(Value, String)>,
    },
    #[error("VM could not boot: {0}")]
    BootFailed(String),
    #[error("resource limit: {0}")]
    ResourceLimit(String),
    #[error("{0}")]
    HostPathOutside(String),
    #[error("{0}")]
    Unsupported(String),
    /// An operation this backend cannot perform on this host (pause on libkrun, or where
    /// the cgroup freezer is out of the adapter's reach): S310.
    #[error("not supported by this backend: {0}")]
    BackendUnsupported(String),
    /// No snapshot of that name: S601.
    #[error("no snapshot named `{0}`")]
    SnapshotNotFound(String),
    /// A snapshot of that name exists already: S602.
    #[error("a snapshot named `{0}` exists already; delete it first or pick another name")]
    SnapshotExists(String),
    /// A create names a snapshot of another image, or the snapshot's image has changed
    /// since it was taken: S603.
    #[error("{0}")]
    SnapshotImageMismatch(String),
    #[error("internal error: {0}")]
    Internal(String),
}

/// The filesystem codes S210..S219 are the agent protocol's: the agent decides them.
pub use agent_proto::FsErrorCode as FsCode;

/// The body's `type` for a filesystem code.
fn fs_kind(code: FsCode) -> &'static str {
    match code {
        FsCode::BadRequest => "fs_bad_request",
        FsCode::NotFound => "fs_not_found",
        FsCode::WrongType => "fs_wrong_type",
        FsCode::Exists => "fs_exists",
        FsCode::NotEmpty => "fs_not_empty",
        FsCode::Permission => "fs_permission",
        FsCode::Io => "fs_io",
        FsCode::BadRegex => "fs_bad_regex",
        FsCode::StreamAborted => "fs_stream_aborted",
        FsCode::Unsupported => "fs_unsupported",
    }
}

impl SandboxError {
    /// The S-code and the `type` of the body.
    pub fn code_and_kind(&self) -> (&'static str, &'static str) {
        match self {
            SandboxError::InvalidRequest(_) => ("S001", "invalid_request"),
            SandboxError::UnknownSandbox(_) => ("S002", "sandbox_not_found"),
            SandboxError::ExecLimit { .. } => ("S003", "exec_limit"),
            SandboxError::Stopped(_) => ("S004", "sandbox_stopped"),
            SandboxError::ImageNotAllowed(_) => ("S100", "image_not_allowed"),
            SandboxError::ImageNotInstalled(_) => ("S101", "image_not_installed"),
            SandboxError::PullFailed(_) => ("S102", "image_pull_failed"),
            SandboxError::ImageTooLarge(_) => ("S102", "image_too_large"),
            SandboxError::ExecTimedOut { .. } => ("S200", "exec_timeout"),
            SandboxError::Fs { code, .. } => (code.s_code(), fs_kind(*code)),
            SandboxError::BootFailed(_) => ("S300", "vm_boot_failed"),
            SandboxError::ResourceLimit(_) => ("S400", "resource_limit"),
            SandboxError::HostPathOutside(_) => ("S501", "host_path_outside_roots"),
            SandboxError::Unsupported(_) => ("S219", "unsupported"),
            SandboxError::BackendUnsupported(_) => ("S310", "backend_unsupported"),
            SandboxError::SnapshotNotFound(_) => ("S601", "snapshot_not_found"),
            SandboxError::SnapshotExists(_) => ("S602", "snapshot_exists"),
            SandboxError::SnapshotImageMismatch(_) => ("S603", "snapshot_image_mismatch"),
            SandboxError::Internal(_) => (plugin_api::error::INTERNAL, "internal_error"),
        }
    }

    pub fn code(&self) -> &'static str {
        self.code_and_kind().0
    }

    /// Whether the same call may succeed if simply tried again.
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            SandboxError::ExecLimit { .. }
                | SandboxError::PullFailed(_)
                | SandboxError::ResourceLimit(_)
                | SandboxError::Fs {
                    code: FsCode::StreamAborted,
                    ..
                }
        )
    }

    pub fn to_body(&self) -> ErrorBody {
        let (code, kind) = self.code_and_kind();
        let mut body = ErrorBody::new(code, kind, self.to_string()).retryable(self.retryable());
        match self {
            SandboxError::Fs {
                fix: Some((fix, note)),
                ..
            } => {
                body = body.with_fix(fix.clone(), note.clone());
            }
            // The iii console reads a timed-out exec's partial output from `fix`; `output`
            // stays for callers of earlier versions.
            SandboxError::ExecTimedOut { partial, .. } => {
                body = body.with_output(partial.clone()).with_fix(
                    partial.clone(),
                    "the output until the timeout, in the exec response's shape; each stream \
                     keeps its head (the first 1 MiB) when it was cut",
                );
            }
            _ => {}
        }
        body
    }
}

impl From<SandboxError> for ErrorBody {
    fn from(error: SandboxError) -> Self {
        error.to_body()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_spec_table() {
        let cases = [
            (SandboxError::InvalidRequest("x".into()), "S001"),
            (SandboxError::UnknownSandbox("x".into()), "S002"),
            (
                SandboxError::ExecLimit {
                    sandbox_id: "x".into(),
                    cap: 4,
                },
                "S003",
            ),
            (SandboxError::Stopped("x".into()), "S004"),
            (SandboxError::ImageNotAllowed("x".into()), "S100"),
            (SandboxError::ImageNotInstalled("x".into()), "S101"),
            (SandboxError::PullFailed("x".into()), "S102"),
            (SandboxError::ImageTooLarge("x".into()), "S102"),
            (
                SandboxError::ExecTimedOut {
                    timeout_ms: 1,
                    partial: Value::Null,
                },
                "S200",
            ),
            (
                SandboxError::Fs {
                    code: FsCode::NotFound,
                    message: "x".into(),
                    fix: None,
                },
                "S211",
            ),
            (SandboxError::BootFailed("x".into()), "S300"),
            (SandboxError::ResourceLimit("x".into()), "S400"),
            (SandboxError::HostPathOutside("x".into()), "S501"),
            (SandboxError::BackendUnsupported("x".into()), "S310"),
            (SandboxError::SnapshotNotFound("x".into()), "S601"),
            (SandboxError::SnapshotExists("x".into()), "S602"),
            (SandboxError::SnapshotImageMismatch("x".into()), "S603"),
        ];
        for (error, code) in cases {
            assert_eq!(error.to_body().code, code, "{error}");
        }
    }

    #[test]
    fn timeout_carries_partial_output_and_pull_is_retryable() {
        let body = SandboxError::ExecTimedOut {
            timeout_ms: 5,
            partial: serde_json::json!({"stdout": "a"}),
        }
        .to_body();
        assert_eq!(body.fix["stdout"], "a");
        assert_eq!(body.output.unwrap()["stdout"], "a");
        assert!(SandboxError::PullFailed("x".into()).to_body().retryable);
        assert!(!SandboxError::ImageTooLarge("x".into()).to_body().retryable);
        assert!(!SandboxError::InvalidRequest("x".into()).to_body().retryable);
    }

    #[test]
    fn fs_errors_carry_their_fix() {
        let error = SandboxError::Fs {
            code: FsCode::NotFound,
            message: "parent missing".into(),
            fix: Some((
                serde_json::json!({"parents": true}),
                "create the parents".into(),
            )),
        };
        assert_eq!(error.to_body().fix, serde_json::json!({"parents": true}));
    }
}
