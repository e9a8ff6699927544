//! Why a boot failed, in words a caller can act on: the runner's exit status explained, its
//! own message and the tail of the guest console.

use std::path::Path;
use std::process::ExitStatus;

use vm_runner::exit::{BAD_SPEC, HOST_UNFIT, VM_FAILED};

use crate::vm_spec::VmSpecError;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("the VM runner `sandbox-libkrun-vm` was not found at {0} (set SANDBOX_LIBKRUN_VM)")]
    NoRunner(String),
    #[error("cannot prepare the sandbox layer: {0}")]
    Layer(std::io::Error),
    #[error(transparent)]
    Spec(#[from] VmSpecError),
    #[error("cannot listen for the agent on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the VM runner: {0}")]
    Spawn(std::io::Error),
    #[error("the microVM exited before its agent connected ({status}){logs}")]
    Exited { status: String, logs: String },
    #[error("the agent did not connect within {secs} s{logs}")]
    NoAgent { secs: u64, logs: String },
    #[error("accepting the agent's connection failed: {0}")]
    Accept(std::io::Error),
}

/// The runner's exit status in words.
pub fn describe_exit(status: ExitStatus) -> String {
    match status.code() {
        Some(BAD_SPEC) => format!("exit {BAD_SPEC}: the runner refused its specification"),
        Some(HOST_UNFIT) => format!("exit {HOST_UNFIT}: this host cannot boot microVMs"),
        Some(VM_FAILED) => format!("exit {VM_FAILED}: libkrun could not start the VM"),
        Some(code) => format!("exit {code}: the agent inside stopped"),
        None => format!("{status}"),
    }
}

/// The runner's messages and the console's tail, as a suffix for an error message.
pub fn log_tails(runner_log: &Path, console_log: &Path) -> String {
    sandbox_core::log_tails(&[("runner", runner_log), ("console", console_log)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn exit_statuses_are_explained() {
        assert!(describe_exit(ExitStatus::from_raw(3 << 8)).contains("cannot boot microVMs"));
        assert!(describe_exit(ExitStatus::from_raw(125 << 8)).contains("libkrun"));
        assert!(describe_exit(ExitStatus::from_raw(9)).contains("signal"));
    }

    #[test]
    fn tails_are_bounded_and_skip_missing_logs() {
        let dir = tempfile::tempdir().unwrap();
        let console = dir.path().join("console.log");
        let long = format!("{}the end\r\n", "x".repeat(10_000));
        std::fs::write(&console, long).unwrap();
        let text = log_tails(&dir.path().join("missing"), &console);
        assert!(text.starts_with("; console log tail: "), "{text}");
        assert!(text.ends_with("the end"), "{text}");
        assert!(text.len() < sandbox_core::backend::LOG_TAIL_BYTES + 40);
    }
}
