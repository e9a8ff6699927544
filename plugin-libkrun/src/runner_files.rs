//! Each sandbox's VM runner's share of the host's open-file table. The guest's open files
//! become the runner's host descriptors (virtio-fs keeps one for every inode the guest's
//! kernel holds; TSI's sockets are the runner's), so the runner's `RLIMIT_NOFILE` bounds what
//! a sandbox can take of `fs.file-max`, which once full refuses a new file to every process
//! of the host without CAP_SYS_ADMIN. As on bwrap, 1/[`HOST_FILE_RESERVE_SHARES`] of
//! `fs.file-max` is kept for the host and the rest divided by `max_concurrent_sandboxes`; a
//! runner's limit is its share, never above `vm_runner::launch::RUNNER_NOFILE`. Worker VMs
//! are not counted against `max_concurrent_sandboxes`: their runners keep `RUNNER_NOFILE`.

use sandbox_core::file_share::{kept_and_each, read_file_max, HOST_FILE_RESERVE_SHARES};
use vm_runner::launch::RUNNER_NOFILE;

/// The fewest files a sandbox's runner is started with: libkrun's own descriptors (KVM, its
/// vCPUs, event fds, the console and vsock sockets) plus virtio-fs's one per guest inode, of
/// which a guest program importing the Python iii-sdk holds about 800; below about 2048 such
/// a guest's opens fail with EMFILE. A share below it refuses every create (S300) rather than
/// boot guests that cannot run.
pub const MIN_RUNNER_FILES: u64 = 2048;

/// What a sandbox's runner gets, decided once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerFiles {
    cap: u64,
    file_max: u64,
    kept: u64,
    each: u64,
    /// A sandbox runner's `RLIMIT_NOFILE`, soft and hard.
    limit: u64,
    /// Why no sandbox can start within its share (every create is S300).
    refusal: Option<String>,
}

impl RunnerFiles {
    /// Reads `fs.file-max` (unreadable counts as none, which refuses creates) and logs the share.
    pub fn at_start(cap: usize) -> RunnerFiles {
        let files = RunnerFiles::plan(cap as u64, read_file_max().unwrap_or(0));
        match &files.refusal {
            Some(why) => tracing::warn!(why, "creates are refused (S300)"),
            None => tracing::info!(
                runner_open_files = files.limit,
                file_max = files.file_max,
                per_sandbox_files = files.each,
                "each sandbox's VM runner's share of the host's open files"
            ),
        }
        files
    }

    fn plan(cap: u64, file_max: u64) -> RunnerFiles {
        let cap = cap.max(1);
        let (kept, each) = kept_and_each(file_max, HOST_FILE_RESERVE_SHARES, cap);
        let limit = each.min(RUNNER_NOFILE);
        let refusal = (limit < MIN_RUNNER_FILES).then(|| {
            format!(
                "fs.file-max ({file_max}) leaves {each} open files for each of \
                 max_concurrent_sandboxes ({cap}) sandboxes' VM runners once {kept} are kept \
                 for the host, under the {MIN_RUNNER_FILES} a runner needs (RLIMIT_NOFILE); \
                 lower max_concurrent_sandboxes or raise fs.file-max on the host"
            )
        });
        RunnerFiles {
            cap,
            file_max,
            kept,
            each,
            limit,
            refusal,
        }
    }

    /// A sandbox runner's `RLIMIT_NOFILE` (soft and hard).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Why a sandbox cannot start within its share (its create is S300).
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.as_deref()
    }

    /// For `adapter::info` (`isolation.ceilings.open_files`).
    pub fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "soft": self.limit,
            "hard": self.limit,
            "per_sandbox": self.limit,
            "sandboxes_together": self.limit.saturating_mul(self.cap),
            "file_max": {
                "host_limit": self.file_max,
                "kept_from_sandboxes": self.kept,
                "per_sandbox": self.each,
                "raised_by_adapter": false,
            },
            "worker_vms": RUNNER_NOFILE,
            "minimum": MIN_RUNNER_FILES,
            "total": format!(
                "at most {} per sandbox (its VM runner's RLIMIT_NOFILE, which holds the host \
                 files of the guest's virtio-fs and TSI use), {} for max_concurrent_sandboxes \
                 ({}) sandboxes together, within fs.file-max {} less {} kept for the host",
                self.limit,
                self.limit.saturating_mul(self.cap),
                self.cap,
                self.file_max,
                self.kept
            ),
            "how": "RLIMIT_NOFILE of each sandbox's VM runner, soft and hard alike (set by the runner before the VM starts; no guest can raise it), sized to its share of fs.file-max, at most 65536; a runner that may not raise its hard limit (an ordinary user's) is held to that limit where it is lower; worker VMs are not counted against max_concurrent_sandboxes and their runners keep 65536",
            "refused": self.refusal,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thirty_two_runners_fit_half_of_a_large_file_max() {
        // 2.47 M files: 32 runners of 65536 would take 85% of it.
        let files = RunnerFiles::plan(32, 2_470_000);
        assert_eq!(files.limit(), 38_593);
        assert!(files.limit() * 32 <= 2_470_000 / 2);
        assert_eq!(files.refusal(), None);
        assert_eq!(files.describe()["hard"], 38_593);
        assert_eq!(files.describe()["sandboxes_together"], 38_593 * 32);
    }

    #[test]
    fn a_share_above_the_runners_own_bound_keeps_that_bound() {
        let files = RunnerFiles::plan(32, 9_223_372_036_854_775_807);
        assert_eq!(files.limit(), RUNNER_NOFILE);
        assert_eq!(files.refusal(), None);
    }

    #[test]
    fn a_share_too_small_to_boot_refuses_creates_naming_the_limit() {
        let files = RunnerFiles::plan(32, 60_000);
        assert_eq!(files.limit(), 937);
        let why = files.refusal().expect("refused");
        assert!(why.contains("fs.file-max (60000)"), "{why}");
        assert!(why.contains("RLIMIT_NOFILE"), "{why}");
        // Unreadable fs.file-max counts as none: fail closed.
        assert!(RunnerFiles::plan(1, 0).refusal().is_some());
        // The smallest share that boots.
        assert_eq!(RunnerFiles::plan(1, 2 * MIN_RUNNER_FILES).refusal(), None);
    }
}
