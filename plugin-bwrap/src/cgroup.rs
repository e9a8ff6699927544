//! cpus and memory limits through cgroups, as far as the host allows: cgroup v2 (`cpu.max`,
//! `memory.max`) or v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`) under a
//! `sandbox-libkrun/<id>` group. Where no writable hierarchy exists the sandbox runs without
//! limits, and `adapter::info` says so.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ROOT: &str = "/sys/fs/cgroup";
const GROUP: &str = "sandbox-libkrun";
const CPU_PERIOD_US: u64 = 100_000;

/// The cgroups made for one sandbox.
pub struct Limits {
    dirs: Vec<PathBuf>,
}

impl Limits {
    /// Creates the sandbox's groups and writes its limits; returns the `cgroup.procs` files the
    /// child joins. Failures only cost the limits, never the sandbox.
    pub fn create(sandbox_id: &str, cpus: u32, memory_mb: u32) -> Self {
        let memory = u64::from(memory_mb) * 1024 * 1024;
        let quota = u64::from(cpus) * CPU_PERIOD_US;
        let mut dirs = Vec::new();
        if is_v2() {
            let dir = Path::new(ROOT).join(GROUP).join(sandbox_id);
            let _ = fs::write(
                Path::new(ROOT).join("cgroup.subtree_control"),
                "+cpu +memory",
            );
            let _ = fs::create_dir_all(&dir);
            let _ = fs::write(
                Path::new(ROOT).join(GROUP).join("cgroup.subtree_control"),
                "+cpu +memory",
            );
            let ok = fs::write(dir.join("memory.max"), memory.to_string()).is_ok()
                & fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}")).is_ok();
            if ok {
                dirs.push(dir);
            }
        } else {
            for (controller, file, value) in [
                ("memory", "memory.limit_in_bytes", memory.to_string()),
                ("cpu", "cpu.cfs_quota_us", quota.to_string()),
            ] {
                let dir = Path::new(ROOT)
                    .join(controller)
                    .join(GROUP)
                    .join(sandbox_id);
                if fs::create_dir_all(&dir).is_ok() && fs::write(dir.join(file), value).is_ok() {
                    dirs.push(dir);
                }
            }
        }
        Self { dirs }
    }

    pub fn procs_files(&self) -> Vec<CString> {
        self.dirs
            .iter()
            .filter_map(|dir| CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok())
            .collect()
    }

    pub fn is_enforced(&self) -> bool {
        !self.dirs.is_empty()
    }
}

/// How long `remove` waits for a group's last processes to finish exiting.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// Removes the groups of a sandbox whose processes are gone or dying (also for leftovers of
/// an earlier run). Blocks up to [`EMPTY_WAIT`]: right after bwrap is killed, the sandbox's
/// PID 1 and its children are still exiting and the kernel refuses the rmdir with EBUSY, which
/// used to leave one empty group behind per unlucky stop.
pub fn remove(sandbox_id: &str) {
    for parent in [
        Path::new(ROOT).join(GROUP),
        Path::new(ROOT).join("memory").join(GROUP),
        Path::new(ROOT).join("cpu").join(GROUP),
    ] {
        remove_when_empty(&parent.join(sandbox_id));
    }
}

fn remove_when_empty(dir: &Path) {
    let deadline = Instant::now() + EMPTY_WAIT;
    loop {
        match fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return,
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => {
                tracing::warn!(group = %dir.display(), error = %e, "cannot remove the sandbox's cgroup");
                return;
            }
        }
    }
}

fn is_v2() -> bool {
    Path::new(ROOT).join("cgroup.controllers").exists()
}
