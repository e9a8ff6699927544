//! cpus, memory and pids limits through cgroups: cgroup v2 (`cpu.max`, `memory.max`,
//! `pids.max`) or v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`, `pids.max`). Limits fail
//! closed: a group that cannot be made or a limit that cannot be written stops the create
//! (S300 naming the limit), and a launcher that cannot join its group does not start its
//! sandbox. A host where the adapter can make no groups at all (an ordinary user without a
//! delegated cgroup) is reported by [`Instance::missing`]: the core then refuses creates
//! unless `allow_unbounded_sandboxes`.
//!
//! Every group lies in this adapter's own instance directory, `<parent>/adapter-<uuid>`,
//! locked while the adapter lives (see `instance.rs`), so adapters sharing a host never
//! remove each other's groups. Groups are made for a launcher before its sandbox is known
//! (see `launch.rs`), so they are named `launcher-<uuid>`; each sandbox's layer records that
//! name.
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

pub mod counters;
mod freezer;
mod instance;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use freezer::Freezer;
pub use instance::Instance;

const ROOT: &str = "/sys/fs/cgroup";
const GROUP: &str = "sandbox-libkrun";
const LAUNCHER_PREFIX: &str = "launcher-";
const CPU_PERIOD_US: u64 = 100_000;
/// The controllers a group uses: on v2 enabled in `cgroup.subtree_control`, on v1 one
/// hierarchy each.
const CONTROLLERS: [&str; 3] = ["memory", "cpu", "pids"];

/// What an operator does so that an ordinary user's adapter can bound its sandboxes.
pub const HOW_TO_DELEGATE: &str = "Give the adapter's user a delegated cgroup and start the \
adapter in it: on cgroup v2 run it as a systemd user service or scope with Delegate=yes (e.g. \
`systemd-run --user --scope -p Delegate=yes sandbox-libkrun ...`; the user manager must \
delegate the memory, cpu and pids controllers, Delegate=memory cpu pids in user@.service); \
on cgroup v1 a group in each of the memory, cpu and pids hierarchies owned by that user \
(its directory, cgroup.procs and tasks), as tests/e2e/delegate-cgroup.sh makes one";

/// The limit (as `limits_in_force` names it) a controller holds.
fn limit_of(controller: &str) -> &'static str {
    match controller {
        "memory" => "memory",
        "cpu" => "cpus",
        _ => "pids",
    }
}

/// The control file of `limit` in a group.
fn limit_file(v2: bool, limit: &str) -> &'static str {
    match (v2, limit) {
        (true, "memory") => "memory.max",
        (false, "memory") => "memory.limit_in_bytes",
        (true, "cpus") => "cpu.max",
        (false, "cpus") => "cpu.cfs_quota_us",
        _ => "pids.max",
    }
}

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

    /// Said before what is missing when the adapter's own cgroup is not delegated to it
    /// (then its groups go to a hierarchy root, which only root may write).
    pub fn undelegated_note(&self) -> String {
        if self.delegated {
            return String::new();
        }
        format!(
            "the adapter's own cgroup is not delegated to its user (uid {}), so its groups would \
             go to the hierarchy's root: ",
            nix::unistd::geteuid()
        )
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

/// The cgroups (one per hierarchy on v1, one on v2) of one launcher and then its sandbox,
/// in this adapter's instance.
pub struct Group {
    name: String,
    /// Each directory with the limits it holds.
    dirs: Vec<(PathBuf, Vec<&'static str>)>,
    v2: bool,
}

/// A limit that could not be written: the sandbox is not started.
#[derive(Debug)]
pub struct LimitError {
    pub limit: &'static str,
    pub file: PathBuf,
    pub source: io::Error,
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot set the sandbox's {} limit ({}): {}",
            self.limit,
            self.file.display(),
            self.source
        )
    }
}

impl std::error::Error for LimitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

impl Group {
    /// Makes a fresh group in each of `instance`'s directories (none where the instance has
    /// none: an adapter allowed to run sandboxes unbounded). Fails, leaving nothing, when one
    /// cannot be made: its limits would not hold.
    pub fn create(instance: &Instance) -> io::Result<Self> {
        let group = Self {
            name: format!("{LAUNCHER_PREFIX}{}", uuid::Uuid::new_v4()),
            dirs: Vec::new(),
            v2: instance.v2,
        };
        let mut group = group;
        for (parent, limits) in &instance.dirs {
            let dir = parent.join(&group.name);
            if let Err(e) = fs::create_dir(&dir) {
                group.remove_if_empty();
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot make the sandbox's cgroup {} (for its {} limit): {e}",
                        dir.display(),
                        limits.join(", ")
                    ),
                ));
            }
            group.dirs.push((dir, limits.clone()));
        }
        Ok(group)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group's directories (what `remove_dirs` takes).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(dir, _)| dir.clone()).collect()
    }

    /// The `cgroup.procs` files a process writes to join the group.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|(dir, _)| dir.join("cgroup.procs"))
            .collect()
    }

    /// Writes every limit the group holds; the first that cannot be written is the error.
    pub fn set_limits(&self, cpus: u32, memory_mb: u32, pids: u32) -> Result<(), LimitError> {
        let quota = u64::from(cpus) * CPU_PERIOD_US;
        for (dir, limits) in &self.dirs {
            for &limit in limits {
                let value = match (limit, self.v2) {
                    ("memory", _) => (u64::from(memory_mb) * 1024 * 1024).to_string(),
                    ("cpus", true) => format!("{quota} {CPU_PERIOD_US}"),
                    ("cpus", false) => quota.to_string(),
                    _ => pids.to_string(),
                };
                let file = dir.join(limit_file(self.v2, limit));
                fs::write(&file, value).map_err(|source| LimitError {
                    limit,
                    file,
                    source,
                })?;
            }
        }
        Ok(())
    }

    /// Removes the group now if it is empty, without waiting (a group still busy with an
    /// exiting process is left to `remove` by name, or to a later start's sweep).
    pub fn remove_if_empty(&self) {
        for (dir, _) in &self.dirs {
            let _ = fs::remove_dir(dir);
        }
    }
}

/// How long `remove` waits for a group's last processes to finish exiting.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// Removes the groups named `name` (a sandbox's, as its layer records it; also one of an
/// earlier run) whose processes are gone or dying, in whichever instance holds them. Blocks
/// up to [`EMPTY_WAIT`] in all (one deadline for every hierarchy, not one each): right after
/// bwrap is killed, the sandbox's PID 1 and its children are still exiting and the kernel
/// refuses the rmdir with EBUSY, which used to leave one empty group behind per unlucky stop.
pub fn remove(name: &str) {
    if is_group_name(name) {
        remove_dirs(&find(name));
    }
}

/// A name `Group::create` makes (what a layer's record must be to be searched for).
fn is_group_name(name: &str) -> bool {
    name.strip_prefix(LAUNCHER_PREFIX).is_some_and(|rest| {
        !rest.is_empty() && rest.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
    })
}

/// Removes the group directories `dirs` (a live sandbox's own), waiting as `remove` does.
pub fn remove_dirs(dirs: &[PathBuf]) {
    let deadline = Instant::now() + EMPTY_WAIT;
    for dir in dirs {
        remove_when_empty(dir, deadline);
    }
}

/// Group `name` wherever it lies: in an instance of a parent, or (made by an earlier
/// version) right in the parent.
fn find(name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for parent in hierarchies() {
        let legacy = parent.join(name);
        if legacy.is_dir() {
            found.push(legacy);
        }
        let Ok(entries) = fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(instance::INSTANCE_PREFIX)
            {
                let dir = entry.path().join(name);
                if dir.is_dir() {
                    found.push(dir);
                }
            }
        }
    }
    found
}

/// Removes what adapters that are gone left (their instances and empty groups, and groups
/// earlier versions made right in a parent); another live adapter's groups stay.
pub fn sweep_dead_instances() {
    freezer::sweep_dead_instances();
    instance::sweep_dead_instances(&hierarchies());
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
    fn a_limit_that_cannot_be_written_is_an_error_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("launcher-x");
        std::fs::create_dir(&dir).unwrap();
        let group = Group {
            name: "launcher-x".into(),
            dirs: vec![(dir.clone(), vec!["memory", "pids"])],
            v2: false,
        };
        group.set_limits(2, 128, 64).unwrap();
        let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
        assert_eq!(read("memory.limit_in_bytes"), (128u64 << 20).to_string());
        assert_eq!(read("pids.max"), "64");
        // A directory where the pids limit's file is: the write fails.
        std::fs::remove_file(dir.join("pids.max")).unwrap();
        std::fs::create_dir(dir.join("pids.max")).unwrap();
        let error = group.set_limits(2, 128, 64).unwrap_err();
        assert_eq!(error.limit, "pids");
        let message = error.to_string();
        assert!(
            message.starts_with("cannot set the sandbox's pids limit (")
                && message.contains("pids.max"),
            "{message}"
        );
        // v2: one directory holds all three.
        let v2 = Group {
            name: "launcher-y".into(),
            dirs: vec![(root.path().to_path_buf(), vec!["cpus", "memory", "pids"])],
            v2: true,
        };
        v2.set_limits(2, 1, 10).unwrap();
        let read = |file: &str| std::fs::read_to_string(root.path().join(file)).unwrap();
        assert_eq!(read("cpu.max"), "200000 100000");
        assert_eq!(read("memory.max"), "1048576");
    }

    #[test]
    fn remove_takes_only_a_launcher_groups_name() {
        let made = format!("{LAUNCHER_PREFIX}{}", uuid::Uuid::new_v4());
        assert!(is_group_name(&made));
        // Names a layer's record could carry that are no group of ours: never searched for.
        for name in [
            "",
            "launcher-",
            "adapter-1",
            "launcher-1/../..",
            "../launcher-1",
            "memory",
        ] {
            assert!(!is_group_name(name), "{name}");
        }
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
