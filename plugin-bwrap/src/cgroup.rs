//! cpus, memory and pids limits through cgroups, as far as the host allows: cgroup v2
//! (`cpu.max`, `memory.max`, `pids.max`) or v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`,
//! `pids.max`) under `sandbox-libkrun/<group>`. Where no writable hierarchy exists the sandbox runs without
//! limits, and a debug log says so.
//!
//! Groups are made for a launcher before its sandbox is known (see `launch.rs`), so they are
//! named `launcher-<uuid>`; each sandbox's layer records the name of the group it got.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const ROOT: &str = "/sys/fs/cgroup";
const GROUP: &str = "sandbox-libkrun";
const LAUNCHER_PREFIX: &str = "launcher-";
const CPU_PERIOD_US: u64 = 100_000;
/// The controllers a group uses: on v2 enabled in `cgroup.subtree_control`, on v1 one
/// hierarchy each.
const CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// The cgroups (one per hierarchy on v1, one on v2) of one launcher and then its sandbox.
pub struct Group {
    name: String,
    dirs: Vec<PathBuf>,
    /// The unified hierarchy (one dir, `cpu.max` / `memory.max`), else v1.
    v2: bool,
}

impl Group {
    /// Makes a fresh group in every writable hierarchy. Failures only cost the limits.
    pub fn create() -> Self {
        let name = format!("{LAUNCHER_PREFIX}{}", uuid::Uuid::new_v4());
        let mut dirs = Vec::new();
        let v2 = is_v2();
        if v2 {
            let enable = CONTROLLERS.map(|c| format!("+{c}")).join(" ");
            let _ = fs::write(Path::new(ROOT).join("cgroup.subtree_control"), &enable);
            let dir = Path::new(ROOT).join(GROUP).join(&name);
            let _ = fs::create_dir_all(&dir);
            let _ = fs::write(
                Path::new(ROOT).join(GROUP).join("cgroup.subtree_control"),
                &enable,
            );
            if dir.is_dir() {
                dirs.push(dir);
            }
        } else {
            for controller in CONTROLLERS {
                let dir = Path::new(ROOT).join(controller).join(GROUP).join(&name);
                if fs::create_dir_all(&dir).is_ok() {
                    dirs.push(dir);
                }
            }
        }
        Self { name, dirs, v2 }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limits this group can hold (`cpus`, `memory`, `pids`), from the control files it
    /// has.
    pub fn enforceable(&self) -> Vec<&'static str> {
        let has = |file: &str| self.dirs.iter().any(|dir| dir.join(file).exists());
        let (cpu, memory) = if self.v2 {
            ("cpu.max", "memory.max")
        } else {
            ("cpu.cfs_quota_us", "memory.limit_in_bytes")
        };
        [("cpus", cpu), ("memory", memory), ("pids", "pids.max")]
            .into_iter()
            .filter(|(_, file)| has(file))
            .map(|(limit, _)| limit)
            .collect()
    }

    /// The `cgroup.procs` files a process writes to join the group.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    /// Writes the sandbox's limits; true when all three are enforced.
    pub fn set_limits(&self, cpus: u32, memory_mb: u32, pids: u32) -> bool {
        let memory = (u64::from(memory_mb) * 1024 * 1024).to_string();
        let quota = u64::from(cpus) * CPU_PERIOD_US;
        let pids = pids.to_string();
        let (mut memory_set, mut cpu_set, mut pids_set) = (false, false, false);
        for dir in &self.dirs {
            let write = |file: &str, value: &str| fs::write(dir.join(file), value).is_ok();
            let v1 = |controller: &str| dir.starts_with(Path::new(ROOT).join(controller));
            if self.v2 {
                memory_set = write("memory.max", &memory);
                cpu_set = write("cpu.max", &format!("{quota} {CPU_PERIOD_US}"));
                pids_set = write("pids.max", &pids);
            } else if v1("memory") {
                memory_set = write("memory.limit_in_bytes", &memory);
            } else if v1("pids") {
                pids_set = write("pids.max", &pids);
            } else {
                cpu_set = write("cpu.cfs_quota_us", &quota.to_string());
            }
        }
        memory_set && cpu_set && pids_set
    }

    /// Removes the group now if it is empty, without waiting (a group still busy with an
    /// exiting process is left to the next start's sweep).
    pub fn remove_if_empty(&self) {
        for dir in &self.dirs {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// How long `remove` waits for a group's last processes to finish exiting.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// Removes the groups named `name` whose processes are gone or dying (also for leftovers of
/// an earlier run). Blocks up to [`EMPTY_WAIT`] in all (one deadline for every hierarchy, not
/// one each): right after bwrap is killed, the sandbox's PID 1 and its children are still
/// exiting and the kernel refuses the rmdir with EBUSY, which used to leave one empty group
/// behind per unlucky stop.
pub fn remove(name: &str) {
    let deadline = Instant::now() + EMPTY_WAIT;
    for parent in hierarchies() {
        remove_when_empty(&parent.join(name), deadline);
    }
}

/// Removes the empty groups of launchers that never got a sandbox (an adapter killed with
/// one waiting). A group still in use, by a launcher of another adapter, stays.
pub fn sweep_unused_launcher_groups() {
    for parent in hierarchies() {
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(LAUNCHER_PREFIX)
            {
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
}

fn hierarchies() -> [PathBuf; 4] {
    [
        Path::new(ROOT).join(GROUP),
        Path::new(ROOT).join("memory").join(GROUP),
        Path::new(ROOT).join("cpu").join(GROUP),
        Path::new(ROOT).join("pids").join(GROUP),
    ]
}

fn remove_when_empty(dir: &Path, deadline: Instant) {
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
