//! This adapter's own place in each cgroup parent: a directory `adapter-<uuid>` made at
//! start-up and held with an exclusive `flock` on it for the adapter's whole life. Every
//! group the adapter makes lies beneath it, so adapters sharing a host (and a parent) never
//! touch each other's groups: a start-up sweep removes only instances whose lock nobody
//! holds, which is exactly those of adapters that are gone (the kernel drops a dead
//! process's locks, however it died).
//!
//! Why a lock and not a pid in the name: a pid can be reused, and an adapter in another pid
//! namespace (a container sharing the host's cgroups) has pids this one cannot check; a
//! lock is the kernel's own word on whether its holder lives. cgroupfs directories take
//! `flock` like any other file.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};

use super::{limit_file, Placement, CONTROLLERS, LAUNCHER_PREFIX};

/// How an instance directory is named: `adapter-<uuid>`.
pub const INSTANCE_PREFIX: &str = "adapter-";
/// Groups of earlier versions (`launcher-*` right in a parent) older than this are leftovers:
/// a live launcher joins its fresh group within milliseconds, and then it is not empty.
const LEGACY_GRACE: Duration = Duration::from_secs(60);
/// Names tried before giving up on a parent (a concurrent sweep can take a fresh one).
const CLAIM_TRIES: usize = 8;

/// This adapter's directory in each parent, with the limits each holds.
pub struct Instance {
    pub(super) v2: bool,
    /// One per parent that took it (one on v2, one a hierarchy on v1), each with the limits
    /// (`cpus`, `memory`, `pids`) its groups hold.
    pub(super) dirs: Vec<(PathBuf, Vec<&'static str>)>,
    /// Why each limit not held cannot be, one entry a limit.
    missing: Vec<String>,
    /// Held (never read) while the adapter lives: what tells other adapters it does.
    _locks: Vec<Flock<File>>,
}

impl Instance {
    /// Made once per process, on first use.
    pub fn get() -> &'static Instance {
        static INSTANCE: std::sync::OnceLock<Instance> = std::sync::OnceLock::new();
        INSTANCE.get_or_init(|| Instance::make(Placement::get()))
    }

    pub(super) fn make(placement: &Placement) -> Instance {
        let mut instance = Instance {
            v2: placement.v2,
            dirs: Vec::new(),
            missing: Vec::new(),
            _locks: Vec::new(),
        };
        for (index, parent) in placement.parents.iter().enumerate() {
            // v2: one parent for every controller; v1: the parents follow CONTROLLERS.
            let wanted: Vec<&'static str> = if placement.v2 {
                CONTROLLERS.to_vec()
            } else {
                CONTROLLERS.get(index).into_iter().copied().collect()
            };
            let (dir, lock) = match claim(parent) {
                Ok(claimed) => claimed,
                Err(e) => {
                    for controller in &wanted {
                        instance.missing.push(format!(
                            "{}: cannot make a group in {}: {e}",
                            super::limit_of(controller),
                            parent.display()
                        ));
                    }
                    continue;
                }
            };
            let available = if placement.v2 {
                enable_v2(&dir, &wanted).unwrap_or_else(|e| {
                    instance.missing.push(format!(
                        "cannot hand the controllers to {}: {e}",
                        dir.display()
                    ));
                    Vec::new()
                })
            } else {
                wanted.clone()
            };
            let mut limits = Vec::new();
            for controller in &wanted {
                let limit = super::limit_of(controller);
                let file = dir.join(limit_file(placement.v2, limit));
                if !available.contains(controller) {
                    instance.missing.push(format!(
                        "{limit}: the {controller} controller is not available in {}",
                        parent.display()
                    ));
                } else if nix::unistd::access(&file, nix::unistd::AccessFlags::W_OK).is_err() {
                    instance.missing.push(format!(
                        "{limit}: {} is not writable by the adapter",
                        file.display()
                    ));
                } else {
                    limits.push(limit);
                }
            }
            instance.dirs.push((dir, limits));
            instance._locks.push(lock);
        }
        instance
    }

    /// The limits this adapter's groups hold, in a fixed order (`cpus`, `memory`, `pids`).
    pub fn holds(&self) -> Vec<&'static str> {
        ["cpus", "memory", "pids"]
            .into_iter()
            .filter(|limit| self.dirs.iter().any(|(_, held)| held.contains(limit)))
            .collect()
    }

    /// Why the limits not held cannot be; `None` when all three are.
    pub fn missing(&self) -> Option<String> {
        (self.holds().len() < 3).then(|| self.missing.join("; "))
    }

    /// The instance's directories, for `adapter::info` (and tests counting this adapter's
    /// groups, not the host's).
    pub fn dirs(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|(dir, _)| dir.clone()).collect()
    }
}

/// Makes a fresh `adapter-<uuid>` in `parent` and locks it. A sweep by another adapter
/// that saw the directory before it was locked may have removed it: it is ours only if
/// the path still names the directory we hold.
fn claim(parent: &Path) -> io::Result<(PathBuf, Flock<File>)> {
    fs::create_dir_all(parent)?;
    let mut last = io::Error::other("no name tried");
    for _ in 0..CLAIM_TRIES {
        let dir = parent.join(format!("{INSTANCE_PREFIX}{}", uuid::Uuid::new_v4()));
        fs::create_dir(&dir)?;
        let locked = File::open(&dir).and_then(|file| {
            Flock::lock(file, FlockArg::LockExclusiveNonblock)
                .map_err(|(_, errno)| io::Error::from(errno))
        });
        match locked {
            Ok(lock) if same_dir(&dir, &lock) => return Ok((dir, lock)),
            Ok(_) => last = io::Error::other("removed by another adapter's sweep"),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn same_dir(path: &Path, file: &File) -> bool {
    match (fs::metadata(path), file.metadata()) {
        (Ok(named), Ok(held)) => named.dev() == held.dev() && named.ino() == held.ino(),
        _ => false,
    }
}

/// Enables in `dir` (v2) the wanted controllers it has; the ones enabled.
fn enable_v2(dir: &Path, wanted: &[&'static str]) -> io::Result<Vec<&'static str>> {
    let available = fs::read_to_string(dir.join("cgroup.controllers"))?;
    let enabled: Vec<&'static str> = wanted
        .iter()
        .copied()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    if !enabled.is_empty() {
        let line = enabled
            .iter()
            .map(|c| format!("+{c}"))
            .collect::<Vec<_>>()
            .join(" ");
        fs::write(dir.join("cgroup.subtree_control"), line)?;
    }
    Ok(enabled)
}

/// Removes, in each of `parents`, the instances nobody holds (adapters that are gone) with
/// their empty groups, and the groups earlier versions left right in a parent. A group still
/// busy (a dead adapter's sandbox still exiting) stays for the next sweep.
pub fn sweep_dead_instances(parents: &[PathBuf]) {
    let mut removed = 0usize;
    for parent in parents {
        let Ok(entries) = fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            if name.starts_with(INSTANCE_PREFIX) {
                let Ok(file) = File::open(&path) else {
                    continue;
                };
                // Held: its adapter lives (this one's own included).
                let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
                    continue;
                };
                removed += remove_groups_in(&path);
                if fs::remove_dir(&path).is_ok() {
                    removed += 1;
                }
                drop(lock);
            } else if name.starts_with(LAUNCHER_PREFIX) && older_than(&path, LEGACY_GRACE) {
                removed += usize::from(fs::remove_dir(&path).is_ok());
            }
        }
    }
    if removed > 0 {
        tracing::info!(removed, "removed the cgroups of adapters that are gone");
    }
}

/// Removes the empty `launcher-*` groups in `dir`; how many went.
fn remove_groups_in(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(LAUNCHER_PREFIX))
        .filter(|e| fs::remove_dir(e.path()).is_ok())
        .count()
}

fn older_than(path: &Path, age: Duration) -> bool {
    let Ok(meta) = fs::metadata(path) else {
        return false;
    };
    let made = SystemTime::UNIX_EPOCH + Duration::from_secs(meta.ctime().max(0) as u64);
    SystemTime::now()
        .duration_since(made)
        .is_ok_and(|elapsed| elapsed > age)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake v1 placement: one parent a controller, in a temporary directory (a tmpfs
    /// takes `flock` as cgroupfs does).
    fn v1(root: &Path) -> Placement {
        Placement {
            v2: false,
            parents: CONTROLLERS
                .iter()
                .map(|c| root.join(c).join("sandbox-libkrun"))
                .collect(),
            delegated: false,
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    #[test]
    fn a_sweep_leaves_live_adapters_groups_and_removes_those_of_adapters_gone() {
        let root = tempfile::tempdir().unwrap();
        let placement = v1(root.path());
        let first = Instance::make(&placement);
        let second = Instance::make(&placement);
        assert_eq!(first.dirs.len(), 3, "one instance a hierarchy");
        // The first adapter's launcher waits: its group is made and still empty.
        let waiting = super::super::Group::create(&first).unwrap();
        let waiting_dirs = waiting.dirs();
        // The second adapter starts up and sweeps.
        sweep_dead_instances(&placement.parents);
        for dir in waiting_dirs.iter().chain(first.dirs().iter()) {
            assert!(dir.is_dir(), "{} was swept", dir.display());
        }
        // The first adapter dies: its locks go with it, and the next sweep removes its
        // instance and the empty group in it, but not the second's.
        let gone = first.dirs();
        drop(first);
        sweep_dead_instances(&placement.parents);
        for dir in waiting_dirs.iter().chain(gone.iter()) {
            assert!(!dir.exists(), "{} is left", dir.display());
        }
        for dir in second.dirs() {
            assert!(dir.is_dir(), "{} was swept", dir.display());
        }
        for parent in &placement.parents {
            assert_eq!(entries(parent).len(), 1, "{}", parent.display());
        }
    }

    #[test]
    fn an_earlier_versions_groups_in_the_parent_go_only_once_old() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("pids");
        let fresh = parent.join("launcher-fresh");
        fs::create_dir_all(&fresh).unwrap();
        sweep_dead_instances(std::slice::from_ref(&parent));
        assert!(fresh.is_dir(), "a fresh group may be a live launcher's");
        assert!(older_than(&fresh, Duration::ZERO));
        assert!(!older_than(&fresh, LEGACY_GRACE));
    }

    #[test]
    fn a_parent_the_adapter_cannot_write_names_every_limit_missing() {
        let root = tempfile::tempdir().unwrap();
        // A file where the parent should be: no group can be made beneath it.
        let parents: Vec<PathBuf> = CONTROLLERS.iter().map(|c| root.path().join(c)).collect();
        for parent in &parents {
            fs::write(parent, "").unwrap();
        }
        let placement = Placement {
            v2: false,
            parents,
            delegated: false,
        };
        let instance = Instance::make(&placement);
        assert!(instance.holds().is_empty());
        let missing = instance.missing().expect("limits are missing");
        for limit in ["memory", "cpus", "pids"] {
            assert!(
                missing.contains(&format!("{limit}: cannot make a group in")),
                "{missing}"
            );
        }
        // Such an adapter's groups hold nothing, and making one costs nothing.
        let group = super::super::Group::create(&instance).unwrap();
        assert!(group.procs_files().is_empty());
        group.set_limits(1, 64, 64).unwrap();
    }

    #[test]
    fn a_v2_instance_hands_its_groups_the_controllers_it_has() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("cgroup.controllers"), "cpu io memory\n").unwrap();
        let enabled = enable_v2(dir.path(), &CONTROLLERS).unwrap();
        assert_eq!(enabled, ["memory", "cpu"]);
        assert_eq!(
            fs::read_to_string(dir.path().join("cgroup.subtree_control")).unwrap(),
            "+memory +cpu"
        );
        // Without the kernel's list (not a cgroup): an error, so nothing is claimed held.
        let plain = tempfile::tempdir().unwrap();
        assert!(enable_v2(plain.path(), &CONTROLLERS).is_err());
    }

    #[test]
    fn v1_instances_hold_the_limits_whose_files_the_adapter_can_write() {
        let root = tempfile::tempdir().unwrap();
        let placement = v1(root.path());
        let instance = Instance::make(&placement);
        // A fake hierarchy has no control files: nothing is held, and each says why.
        assert!(instance.holds().is_empty());
        let missing = instance.missing().unwrap();
        assert!(
            missing.contains("memory.limit_in_bytes is not writable"),
            "{missing}"
        );
        assert!(missing.contains("pids.max is not writable"), "{missing}");
    }
}
