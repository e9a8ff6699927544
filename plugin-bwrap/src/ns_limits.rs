//! A sandbox's share of what the kernel counts per user, and its processes' open-file limit.
//!
//! inotify instances and watches, and fanotify groups and marks, are counted per user
//! namespace and uid, and every count is charged up the chain of user namespaces to the
//! host's: all of an adapter's sandboxes end in ONE host counter, the one of the uid that owns
//! their user namespaces (a root adapter's subordinate base id; an ordinary user's own uid,
//! shared with that user's own programs), under the host's `fs.inotify.max_user_instances`
//! (128 by default). Measured on Linux 6.18 before this: one sandbox took all 128 instances
//! and 192,543 watches, and another sandbox, and the adapter's user, then got EMFILE.
//!
//! Each namespace has its own limits (`/proc/sys/user/max_*`), checked at every level of the
//! chain: the launcher writes a share of the host's into the sandbox's user namespace while it
//! is root there, before the sandbox's processes start in a namespace nested in it, whose root
//! can raise only its own level's limits, never this one. A sandbox then holds at most
//! [`HOST_SHARES`]-th of the host's limit: one sandbox (up to seven at once) at its maximum
//! leaves the rest to the other sandboxes and to the adapter's user. Distinct host ids per
//! sandbox would separate the host counters too, but an ordinary user's adapter has one uid.
//!
//! `RLIMIT_NOFILE` is set by the launcher before it becomes bwrap, so bwrap, the agent and
//! every process of the sandbox inherit it; raising a hard limit needs CAP_SYS_RESOURCE in the
//! host's user namespace, which no process of a sandbox has. A sandbox's open files in all
//! are bounded by `max_pids_per_sandbox` times the hard limit, and by its memory cgroup (the
//! kernel charges open files to it).

use std::io;

use serde::{Deserialize, Serialize};

/// Each sandbox may hold this fraction of the host's per-user inotify and fanotify limits.
pub const HOST_SHARES: u64 = 8;
/// A sandbox's `RLIMIT_NOFILE`: soft as most hosts' default (programs using `select` break
/// on descriptors past 1024), hard what a program may raise itself to.
pub const SANDBOX_OPEN_FILES: (u64, u64) = (1024, 4096);
/// A worker VM's, soft and hard: what libkrun's worker VMs get by default
/// (`III_VM_NOFILE_LIMIT` unset), as long-lived services may hold many connections.
pub const WORKER_OPEN_FILES: u64 = sandbox_core::ops::worker::DEFAULT_NOFILE_LIMIT;

/// The per-namespace counters, by their file under `/proc/sys/user/`.
const COUNTERS: [&str; 4] = [
    "max_inotify_instances",
    "max_inotify_watches",
    "max_fanotify_groups",
    "max_fanotify_marks",
];

/// What the launcher applies to one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ceilings {
    /// `RLIMIT_NOFILE` of every process of the sandbox (never above the launcher's own).
    pub open_files_soft: u64,
    pub open_files_hard: u64,
    /// The sandbox's user namespace's limits, in [`COUNTERS`] order; none where this kernel
    /// has no such counter.
    pub counters: [Option<u64>; 4],
}

impl Ceilings {
    /// A sandbox's ceilings on this host (a worker VM's when `worker`).
    pub fn for_sandbox(worker: bool) -> Ceilings {
        let (open_files_soft, open_files_hard) = if worker {
            (WORKER_OPEN_FILES, WORKER_OPEN_FILES)
        } else {
            SANDBOX_OPEN_FILES
        };
        Ceilings {
            open_files_soft,
            open_files_hard,
            counters: *host_shares(),
        }
    }

    /// For `adapter::info` (`isolation.ceilings`).
    pub fn describe() -> serde_json::Value {
        let sandbox = Ceilings::for_sandbox(false);
        let mut out = serde_json::json!({
            "open_files": {
                "soft": sandbox.open_files_soft,
                "hard": sandbox.open_files_hard,
                "worker_vms": WORKER_OPEN_FILES,
                "how": "RLIMIT_NOFILE of every process of a sandbox (set by its launcher, never above the adapter's own hard limit; no guest can raise the hard one)",
            },
            "how": format!("inotify and fanotify: a 1/{HOST_SHARES} share of the host's per-user limits, written into each sandbox's user namespace by its launcher (the host counts every sandbox of this adapter under one uid)"),
        });
        for (name, limit) in COUNTERS.iter().zip(sandbox.counters) {
            if let Some(limit) = limit {
                out[name.trim_start_matches("max_")] = limit.into();
            }
        }
        out
    }

    /// Writes the namespace limits into the caller's user namespace (it must be root there
    /// and the sandbox's processes must run in namespaces nested in it) and lowers
    /// `RLIMIT_NOFILE`, which every process started from here inherits.
    pub fn apply(&self) -> Result<(), String> {
        for (name, limit) in COUNTERS.iter().zip(self.counters) {
            let Some(limit) = limit else { continue };
            let file = format!("/proc/sys/user/{name}");
            std::fs::write(&file, limit.to_string())
                .map_err(|e| format!("cannot set the sandbox's {name} ({file}): {e}"))?;
        }
        self.limit_open_files()
            .map_err(|e| format!("cannot set the sandbox's RLIMIT_NOFILE: {e}"))
    }

    fn limit_open_files(&self) -> io::Result<()> {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        // In the sandbox's user namespace now: a hard limit can be lowered only.
        let (_, current_hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        let hard = self.open_files_hard.min(current_hard);
        setrlimit(
            Resource::RLIMIT_NOFILE,
            self.open_files_soft.min(hard),
            hard,
        )?;
        Ok(())
    }
}

/// The host's limits (of the adapter's user namespace, read once), each divided by
/// [`HOST_SHARES`] and at least 1.
fn host_shares() -> &'static [Option<u64>; 4] {
    static SHARES: std::sync::OnceLock<[Option<u64>; 4]> = std::sync::OnceLock::new();
    SHARES.get_or_init(|| {
        COUNTERS.map(|name| {
            let text = std::fs::read_to_string(format!("/proc/sys/user/{name}")).ok()?;
            Some(share(text.trim().parse().ok()?))
        })
    })
}

fn share(host_limit: u64) -> u64 {
    (host_limit / HOST_SHARES).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_is_an_eighth_and_never_zero() {
        assert_eq!(share(128), 16);
        assert_eq!(share(192_543), 24_067);
        assert_eq!(share(3), 1);
        assert_eq!(share(0), 1);
    }

    #[test]
    fn sandboxes_and_workers_differ_in_open_files_only() {
        let (sandbox, worker) = (Ceilings::for_sandbox(false), Ceilings::for_sandbox(true));
        assert_eq!(
            (sandbox.open_files_soft, sandbox.open_files_hard),
            (1024, 4096)
        );
        assert_eq!(worker.open_files_hard, WORKER_OPEN_FILES);
        assert_eq!(sandbox.counters, worker.counters);
        // This host's kernel counts inotify per user namespace (Linux 4.9 and later).
        assert!(sandbox.counters[0].is_some());
        let info = Ceilings::describe();
        assert_eq!(info["open_files"]["hard"], 4096);
        assert!(info["inotify_instances"].as_u64().is_some(), "{info}");
    }
}
