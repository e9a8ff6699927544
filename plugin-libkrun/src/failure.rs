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
    Exited {
        status: String,
        logs: String,
        /// libkrun logged no status from the guest: the boot itself failed (worth one retry).
        no_guest_status: bool,
    },
    #[error("the agent did not connect within {secs} s (SANDBOX_LIBKRUN_BOOT_TIMEOUT_SECS sets how long a boot may take){logs}")]
    NoAgent { secs: u64, logs: String },
    #[error("accepting the agent's connection failed: {0}")]
    Accept(std::io::Error),
}

/// What libkrun's log (the runner's, see `vm_runner::krun::DEFAULT_LOG_FILTER`) says when the
/// VM stopped with no status from the guest's init: a reset, a halt, a triple fault or a
/// kernel panic (libkrun's kernel command line reboots at once on a panic).
const NO_GUEST_STATUS: &str = "using vcpu exit code";

/// Whether the runner's log says the VM stopped without a status from the guest.
/// (The log may have been rotated just before: its older half counts too.)
pub fn stopped_without_guest_status(runner_log: &Path) -> bool {
    [runner_log.to_path_buf(), bounded_log::rotated(runner_log)]
        .iter()
        .any(|path| {
            std::fs::read(path)
                .map(|log| {
                    log.windows(NO_GUEST_STATUS.len())
                        .any(|w| w == NO_GUEST_STATUS.as_bytes())
                })
                .unwrap_or(false)
        })
}

/// The runner's exit status in words, for a VM that ended before its agent connected;
/// `no_guest_status`: libkrun logged that the guest reported none.
pub fn describe_early_exit(status: ExitStatus, no_guest_status: bool) -> String {
    if no_guest_status && status.code() == Some(0) {
        return "exit 0: the VM stopped during boot without a status from the guest \
                (a reset, halt or kernel panic)"
            .into();
    }
    describe_exit(status)
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
    fn an_exit_0_without_a_guest_status_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("runner.log");
        std::fs::write(&log, "[2026 DEBUG krun_vmm] using vcpu exit code: 0\n").unwrap();
        assert!(stopped_without_guest_status(&log));
        let text = describe_early_exit(ExitStatus::from_raw(0), true);
        assert!(text.contains("without a status from the guest"), "{text}");
        std::fs::write(&log, "[2026 DEBUG krun_vmm] using vmm exit code: 0\n").unwrap();
        assert!(!stopped_without_guest_status(&log));
        assert!(!stopped_without_guest_status(&dir.path().join("missing")));
        let text = describe_early_exit(ExitStatus::from_raw(0), false);
        assert!(text.contains("the agent inside stopped"), "{text}");
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
