//! Pausing a sandbox with the cgroup freezer: every process of the sandbox stops where it
//! stands, its memory kept, and uses no CPU until thawed.
//!
//! cgroup v2: the sandbox's own group has `cgroup.freeze` (a core file, no controller
//! needed); `cgroup.events` says when the whole group is frozen.
//!
//! cgroup v1: the freezer is a hierarchy of its own, which the sandbox's groups (memory,
//! cpu, pids) are not in. The first pause makes the sandbox a group of the same name there,
//! in this adapter's freezer instance (`<freezer>/sandbox-libkrun/adapter-<uuid>`, held with
//! an `flock` for the adapter's life like the other instances, see `instance.rs`), and moves
//! every process of the sandbox's group into it until none is left outside (a process forked
//! by one already moved is born inside), then freezes it. A v1 process frozen with a kill
//! pending does not die until thawed, so the kill of a sandbox thaws it first, and the
//! start-up sweep thaws the groups of adapters that are gone (their sandboxes are dying).
//!
//! Only the adapter's own paths are opened: the group directories it made and the pids the
//! kernel lists in them.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};

use super::{instance::INSTANCE_PREFIX, GROUP, ROOT};

/// How long a freeze may take before it is undone and reported (a process stuck in the
/// kernel, e.g. on a FUSE request, can keep a group freezing).
const FREEZE_WAIT: Duration = Duration::from_secs(5);
/// Rounds of moving a v1 sandbox's processes into its freezer group before giving up (each
/// round moves every process seen; only processes forked meanwhile by ones not yet moved
/// need another, and the sandbox's pids limit bounds them).
const MOVE_ROUNDS: usize = 64;

/// The freezer of one sandbox: its cgroup v2 group, or its v1 group's processes and the
/// name its freezer group gets.
#[derive(Debug, Clone)]
pub enum Freezer {
    V2 { group: PathBuf },
    V1 { members: PathBuf, name: String },
}

impl Freezer {
    /// The freezer of the sandbox whose groups are `dirs` (none: an unbounded sandbox, which
    /// cannot be paused).
    pub fn of(dirs: &[PathBuf], v2: bool) -> Option<Freezer> {
        let group = dirs.first()?;
        let name = group.file_name()?.to_str()?.to_string();
        Some(if v2 {
            Freezer::V2 {
                group: group.clone(),
            }
        } else {
            Freezer::V1 {
                members: group.clone(),
                name,
            }
        })
    }

    pub fn freeze(&self) -> io::Result<()> {
        match self {
            Freezer::V2 { group } => {
                fs::write(group.join("cgroup.freeze"), "1")?;
                let frozen = wait_for(|| {
                    Ok(fs::read_to_string(group.join("cgroup.events"))?
                        .lines()
                        .any(|l| l == "frozen 1"))
                });
                if let Err(e) = frozen {
                    let _ = fs::write(group.join("cgroup.freeze"), "0");
                    return Err(e);
                }
                Ok(())
            }
            Freezer::V1 { members, name } => {
                let group = v1_instance()?.join(name);
                match fs::create_dir(&group) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                        return Err(unreachable_freezer(e))
                    }
                    _ => {}
                }
                move_all(members, &group)?;
                let state = group.join("freezer.state");
                fs::write(&state, "FROZEN")?;
                let frozen = wait_for(|| Ok(fs::read_to_string(&state)?.trim() == "FROZEN"));
                if let Err(e) = frozen {
                    let _ = fs::write(&state, "THAWED");
                    return Err(e);
                }
                Ok(())
            }
        }
    }

    pub fn thaw(&self) -> io::Result<()> {
        match self {
            Freezer::V2 { group } => fs::write(group.join("cgroup.freeze"), "0"),
            Freezer::V1 { name, .. } => {
                let Some(instance) = made_v1_instance() else {
                    return Ok(()); // never paused: nothing is frozen
                };
                match fs::write(instance.join(name).join("freezer.state"), "THAWED") {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                    other => other,
                }
            }
        }
    }

    /// The v1 freezer group to remove once the sandbox's processes are gone (none on v2,
    /// where the sandbox's own group is the freezer).
    pub fn leftover_dir(&self) -> Option<PathBuf> {
        match self {
            Freezer::V2 { .. } => None,
            Freezer::V1 { name, .. } => Some(made_v1_instance()?.join(name)),
        }
    }
}

/// Moves every process of the group `members` into the freezer group `group`, until no
/// process of the sandbox is outside it.
fn move_all(members: &Path, group: &Path) -> io::Result<()> {
    for _ in 0..MOVE_ROUNDS {
        let inside = pids(group)?;
        let outside: Vec<u32> = pids(members)?
            .into_iter()
            .filter(|pid| !inside.contains(pid))
            .collect();
        if outside.is_empty() {
            return Ok(());
        }
        for pid in outside {
            match fs::write(group.join("cgroup.procs"), pid.to_string()) {
                // Exited meanwhile.
                Err(e) if e.raw_os_error() == Some(nix::libc::ESRCH) => {}
                other => other?,
            }
        }
    }
    Err(io::Error::other(
        "the sandbox's processes kept forking faster than they could be moved into its \
         freezer group",
    ))
}

fn pids(group: &Path) -> io::Result<Vec<u32>> {
    Ok(fs::read_to_string(group.join("cgroup.procs"))?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect())
}

fn wait_for(mut done: impl FnMut() -> io::Result<bool>) -> io::Result<()> {
    let deadline = Instant::now() + FREEZE_WAIT;
    loop {
        if done()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the sandbox did not freeze within {} s (a process stuck in the kernel); \
                     it was thawed again",
                    FREEZE_WAIT.as_secs()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Where v1 freezer groups go: `<freezer>/sandbox-libkrun`.
fn v1_parent() -> PathBuf {
    Path::new(ROOT).join("freezer").join(GROUP)
}

static V1_INSTANCE: OnceLock<Result<(PathBuf, Flock<File>), String>> = OnceLock::new();

/// This adapter's freezer instance, made (and locked) on the first pause.
fn v1_instance() -> io::Result<PathBuf> {
    let made = V1_INSTANCE
        .get_or_init(|| claim_v1_instance().map_err(|e| unreachable_freezer(e).to_string()));
    match made {
        Ok((dir, _)) => Ok(dir.clone()),
        Err(why) => Err(io::Error::new(io::ErrorKind::Unsupported, why.clone())),
    }
}

fn made_v1_instance() -> Option<PathBuf> {
    match V1_INSTANCE.get()? {
        Ok((dir, _)) => Some(dir.clone()),
        Err(_) => None,
    }
}

fn claim_v1_instance() -> io::Result<(PathBuf, Flock<File>)> {
    let parent = v1_parent();
    if !parent.parent().is_some_and(Path::is_dir) {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this host mounts no cgroup v1 freezer hierarchy",
        ));
    }
    match fs::create_dir(&parent) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let dir = parent.join(format!("{INSTANCE_PREFIX}{}", uuid::Uuid::new_v4()));
    fs::create_dir(&dir)?;
    let lock = Flock::lock(File::open(&dir)?, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, errno)| io::Error::from(errno))?;
    Ok((dir, lock))
}

/// Why pausing cannot work here, as the refusal the caller sees (S310 through
/// `BackendUnsupported`).
fn unreachable_freezer(e: io::Error) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!(
            "the cgroup v1 freezer ({}) is out of this adapter's reach: {e} (pausing needs \
             it; an ordinary user's adapter needs a freezer group delegated to it)",
            v1_parent().display()
        ),
    )
}

/// Thaws and removes the v1 freezer groups of adapters that are gone: their sandboxes were
/// killed with them, and a frozen process does not die until thawed. Groups whose
/// processes are still exiting stay for the next start's sweep.
pub fn sweep_dead_instances() {
    let Ok(entries) = fs::read_dir(v1_parent()) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .starts_with(INSTANCE_PREFIX)
        {
            continue;
        }
        let path = entry.path();
        let Ok(file) = File::open(&path) else {
            continue;
        };
        // Held: its adapter lives.
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue;
        };
        let groups: Vec<PathBuf> = fs::read_dir(&path)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.path())
            .collect();
        for group in &groups {
            let _ = fs::write(group.join("freezer.state"), "THAWED");
        }
        super::remove_dirs(&groups);
        let _ = fs::remove_dir(&path);
        drop(lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v2_freeze_waits_for_the_group_to_say_frozen_and_thaw_writes_zero() {
        let dir = tempfile::tempdir().unwrap();
        let group = dir.path().join("launcher-1");
        fs::create_dir(&group).unwrap();
        fs::write(group.join("cgroup.events"), "populated 1\nfrozen 1\n").unwrap();
        let freezer = Freezer::of(std::slice::from_ref(&group), true).unwrap();
        freezer.freeze().unwrap();
        assert_eq!(
            fs::read_to_string(group.join("cgroup.freeze")).unwrap(),
            "1"
        );
        freezer.thaw().unwrap();
        assert_eq!(
            fs::read_to_string(group.join("cgroup.freeze")).unwrap(),
            "0"
        );
        assert!(freezer.leftover_dir().is_none());
        assert!(
            Freezer::of(&[], true).is_none(),
            "an unbounded sandbox has none"
        );
    }

    #[test]
    fn moving_stops_once_every_member_is_inside() {
        let dir = tempfile::tempdir().unwrap();
        let (members, group) = (dir.path().join("m"), dir.path().join("f"));
        fs::create_dir(&members).unwrap();
        fs::create_dir(&group).unwrap();
        fs::write(members.join("cgroup.procs"), "7\n").unwrap();
        // A plain file stands for the kernel's: each write replaces it, as a move adds one.
        fs::write(group.join("cgroup.procs"), "").unwrap();
        move_all(&members, &group).unwrap();
        assert_eq!(pids(&group).unwrap(), vec![7]);
        // Members that never appear inside (a write the kernel ignores): an error, not a hang.
        fs::write(members.join("cgroup.procs"), "7\n8\n").unwrap();
        fs::write(group.join("cgroup.procs"), "").unwrap();
        let stuck = move_all(&members, &group);
        assert!(stuck.is_err());
    }
}
