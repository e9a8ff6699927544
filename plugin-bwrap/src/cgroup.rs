//! cpus, memory and pids limits through cgroups, as far as the host allows: cgroup v2
//! (`cpu.max`, `memory.max`, `pids.max`) or v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`,
//! `pids.max`) under `sandbox-libkrun/<group>`. Where no writable hierarchy exists the sandbox runs without
//! limits, and a debug log says so.
//!
//! Groups are made for a launcher before its sandbox is known (see `launch.rs`), so they are
//! named `launcher-<uuid>`; each sandbox's layer records the name of the group it got.
//!
//! Placement (v2): when the adapter's own cgroup (`/proc/self/cgroup`) is not the root and is
//! writable by it (a delegated subtree: systemd's `Delegate=yes`, a container's cgroup
//! namespace), sandboxes go beneath it, at `<own>/sandboxes/launcher-<uuid>`, so a limit an
//! operator puts on the adapter's service covers them; the adapter first moves its own
//! processes to the leaf `<own>/adapter` (cgroup v2 allows no processes in a group that
//! hands controllers to its children). On v1, each controller's hierarchy on its own: when
//! the adapter's group there is not the root and is writable by it (systemd's `Delegate=yes`
//! chowns it on v1 too; an operator's `mkdir` + `chown`), at `<own>/sandboxes/launcher-<uuid>`
//! (v1 lets processes and child groups share a group, so the adapter stays where it is).
//! Otherwise `sandbox-libkrun/` at the hierarchy's root as before.

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

/// Where this adapter's groups are made: one parent on v2, one per controller on v1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub v2: bool,
    pub parents: Vec<PathBuf>,
    /// Under the adapter's own (delegated) cgroup, else at the hierarchy root.
    pub delegated: bool,
}

impl Placement {
    /// Works out (once per process) where groups go, moving the adapter to its leaf if it
    /// must.
    pub fn get() -> &'static Placement {
        static PLACEMENT: std::sync::OnceLock<Placement> = std::sync::OnceLock::new();
        PLACEMENT.get_or_init(|| {
            let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
            Placement::decide(Path::new(ROOT), &own)
        })
    }

    fn decide(root: &Path, self_cgroup: &str) -> Placement {
        let v2 = root.join("cgroup.controllers").exists();
        if !v2 {
            let parents: Vec<PathBuf> = CONTROLLERS
                .iter()
                .map(|controller| {
                    let hierarchy = root.join(controller);
                    own_v1_group(self_cgroup, controller)
                        .and_then(|own| match delegate_v1(&hierarchy.join(own)) {
                            Ok(parent) => Some(parent),
                            Err(e) => {
                                tracing::debug!(controller, own, error = %e, "the adapter's own v1 cgroup is not delegated to it");
                                None
                            }
                        })
                        .unwrap_or_else(|| hierarchy.join(GROUP))
                })
                .collect();
            let delegated = parents
                .iter()
                .zip(CONTROLLERS)
                .all(|(parent, controller)| *parent != root.join(controller).join(GROUP));
            return Placement {
                v2,
                parents,
                delegated,
            };
        }
        let own = self_cgroup
            .lines()
            .find_map(|line| line.strip_prefix("0::"))
            .map(|p| p.trim().trim_start_matches('/'))
            .filter(|p| !p.is_empty() && !p.split('/').any(|c| c == ".."));
        if let Some(own) = own {
            match delegate(&root.join(own)) {
                Ok(parent) => {
                    return Placement {
                        v2,
                        parents: vec![parent],
                        delegated: true,
                    }
                }
                Err(e) => {
                    tracing::debug!(own, error = %e, "the adapter's own cgroup is not delegated to it")
                }
            }
        }
        let enable = CONTROLLERS.map(|c| format!("+{c}")).join(" ");
        let _ = fs::write(root.join("cgroup.subtree_control"), &enable);
        let parent = root.join(GROUP);
        let _ = fs::create_dir_all(&parent);
        let _ = fs::write(parent.join("cgroup.subtree_control"), &enable);
        Placement {
            v2,
            parents: vec![parent],
            delegated: false,
        }
    }

    /// One line for `adapter::info` and the log.
    pub fn describe(&self) -> String {
        let parents: Vec<String> = self
            .parents
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        match (self.v2, self.delegated) {
            (true, true) => format!("under the adapter's own delegated cgroup: {}", parents.join(", ")),
            (true, false) => format!("at the hierarchy root (the adapter's own cgroup is the root or not writable by it): {}", parents.join(", ")),
            (false, true) => format!("cgroup v1, under the adapter's own delegated cgroup in each hierarchy: {}", parents.join(", ")),
            (false, false) => format!("cgroup v1, at a hierarchy's root where the adapter's own cgroup there is the root or not writable by it: {}", parents.join(", ")),
        }
    }
}

/// Makes `own` hand the controllers to `own/sandboxes`, with the adapter's processes moved
/// to `own/adapter` first; the parent for sandboxes' groups.
fn delegate(own: &Path) -> io::Result<PathBuf> {
    require_writable(own, &["", "cgroup.procs", "cgroup.subtree_control"])?;
    let available = fs::read_to_string(own.join("cgroup.controllers"))?;
    let wanted: Vec<&str> = CONTROLLERS
        .into_iter()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    if wanted.is_empty() {
        return Err(io::Error::other("no controller is delegated"));
    }
    let enable = wanted
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    let leaf = own.join("adapter");
    let sandboxes = own.join("sandboxes");
    for dir in [&leaf, &sandboxes] {
        match fs::create_dir(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            _ => {}
        }
    }
    // Only this process moves ("0": the writer): if others share the group (a shell's
    // session), enabling the controllers fails (EBUSY) and the hierarchy root is used.
    fs::write(leaf.join("cgroup.procs"), "0")?;
    fs::write(own.join("cgroup.subtree_control"), &enable)?;
    fs::write(sandboxes.join("cgroup.subtree_control"), &enable)?;
    Ok(sandboxes)
}

/// The adapter's own group in the v1 hierarchy of `controller` (a `N:cpu,cpuacct:/path`
/// line of `/proc/self/cgroup`), relative to that hierarchy; `None` for its root.
fn own_v1_group<'a>(self_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    self_cgroup
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers
                .split(',')
                .any(|c| c == controller)
                .then_some(path)
        })
        .next()
        .map(|p| p.trim().trim_start_matches('/'))
        .filter(|p| !p.is_empty() && !p.split('/').any(|c| c == ".."))
}

/// `own/sandboxes`, made if missing, when `own` (a v1 group) is writable by the adapter.
fn delegate_v1(own: &Path) -> io::Result<PathBuf> {
    require_writable(own, &["", "cgroup.procs"])?;
    let sandboxes = own.join("sandboxes");
    match fs::create_dir(&sandboxes) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(sandboxes),
    }
}

/// Fails unless every one of `files` in group `own` ("" for the group itself) is writable by
/// the adapter: what a delegation gives it.
fn require_writable(own: &Path, files: &[&str]) -> io::Result<()> {
    for file in files {
        let path = own.join(file);
        if nix::unistd::access(&path, nix::unistd::AccessFlags::W_OK).is_err() {
            return Err(io::Error::other(format!(
                "{} is not writable",
                path.display()
            )));
        }
    }
    Ok(())
}

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
        let placement = Placement::get();
        let dirs = placement
            .parents
            .iter()
            .map(|parent| parent.join(&name))
            .filter(|dir| fs::create_dir_all(dir).is_ok())
            .collect();
        Self {
            name,
            dirs,
            v2: placement.v2,
        }
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

/// Where groups of this adapter are, and where earlier versions made them.
fn hierarchies() -> Vec<PathBuf> {
    let mut all = Placement::get().parents.clone();
    for legacy in [
        Path::new(ROOT).join(GROUP),
        Path::new(ROOT).join("memory").join(GROUP),
        Path::new(ROOT).join("cpu").join(GROUP),
        Path::new(ROOT).join("pids").join(GROUP),
    ] {
        if !all.contains(&legacy) {
            all.push(legacy);
        }
    }
    all
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v2 hierarchy whose `own` group holds two processes.
    fn fake_v2(own: &str) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(
            root.path().join("cgroup.controllers"),
            "cpu memory pids io\n",
        )
        .unwrap();
        let own = root.path().join(own);
        std::fs::create_dir_all(&own).unwrap();
        for (file, text) in [
            ("cgroup.controllers", "memory pids\n"),
            ("cgroup.procs", "41\n42\n"),
            ("cgroup.subtree_control", ""),
        ] {
            std::fs::write(own.join(file), text).unwrap();
        }
        root
    }

    #[test]
    fn a_delegated_own_cgroup_holds_the_sandboxes_and_the_adapter_moves_to_a_leaf() {
        let root = fake_v2("system.slice/iii.service");
        let placement = Placement::decide(root.path(), "0::/system.slice/iii.service\n");
        let own = root.path().join("system.slice/iii.service");
        assert_eq!(
            placement,
            Placement {
                v2: true,
                parents: vec![own.join("sandboxes")],
                delegated: true
            }
        );
        // Only what is delegated is enabled, in both levels.
        let control = |p: &Path| std::fs::read_to_string(p.join("cgroup.subtree_control")).unwrap();
        assert_eq!(control(&own), "+memory +pids");
        assert_eq!(control(&own.join("sandboxes")), "+memory +pids");
        // The adapter itself ("0": the writing process) moved to the leaf.
        assert_eq!(
            std::fs::read_to_string(own.join("adapter/cgroup.procs")).unwrap(),
            "0"
        );
        assert!(placement.describe().contains("delegated"));
    }

    #[test]
    fn the_root_or_a_missing_own_cgroup_keeps_the_hierarchy_root() {
        let root = fake_v2("x");
        for self_cgroup in ["0::/\n", "0::/not/there\n", "0::/../etc\n", ""] {
            let placement = Placement::decide(root.path(), self_cgroup);
            assert_eq!(
                placement.parents,
                vec![root.path().join(GROUP)],
                "{self_cgroup:?}"
            );
            assert!(!placement.delegated);
        }
        // v1: one parent per controller, at its root when the own group is the root or
        // missing (here: memory's `/some/where` does not exist).
        let v1 = tempfile::tempdir().unwrap();
        let placement = Placement::decide(v1.path(), "4:memory:/some/where\n0::/\n");
        assert!(!placement.v2 && !placement.delegated);
        assert_eq!(
            placement.parents,
            CONTROLLERS.map(|c| v1.path().join(c).join(GROUP)).to_vec()
        );
    }

    #[test]
    fn v1_hierarchies_whose_own_group_is_writable_hold_the_sandboxes_beneath_it() {
        let root = tempfile::tempdir().unwrap();
        for own in ["memory/ci/job", "cpu,cpuacct/svc", "pids/svc"] {
            let own = root.path().join(own);
            std::fs::create_dir_all(&own).unwrap();
            std::fs::write(own.join("cgroup.procs"), "").unwrap();
        }
        // As on hosts that mount cpu and cpuacct together, with a `cpu` link to it.
        std::os::unix::fs::symlink("cpu,cpuacct", root.path().join("cpu")).unwrap();
        let self_cgroup = "9:pids:/svc\n4:memory:/ci/job\n2:cpu,cpuacct:/svc\n1:name=systemd:/\n";
        let placement = Placement::decide(root.path(), self_cgroup);
        let expected: Vec<PathBuf> = ["memory/ci/job", "cpu/svc", "pids/svc"]
            .iter()
            .map(|own| root.path().join(own).join("sandboxes"))
            .collect();
        assert_eq!(placement.parents, expected);
        assert!(placement.delegated && !placement.v2);
        assert!(expected.iter().all(|dir| dir.is_dir()));
        assert!(placement.describe().contains("delegated"));

        // One hierarchy at its root (pids: the adapter's group there is the root): that one
        // keeps `sandbox-libkrun/` there, and the placement is not delegated as a whole.
        let self_cgroup = "9:pids:/\n4:memory:/ci/job\n2:cpu,cpuacct:/svc\n";
        let placement = Placement::decide(root.path(), self_cgroup);
        assert_eq!(placement.parents[0], expected[0]);
        assert_eq!(placement.parents[2], root.path().join("pids").join(GROUP));
        assert!(!placement.delegated);
    }
}
