//! Per-sandbox state on disk (`<state_dir>/sandboxes/<id>/`) and the start-up reconciliation
//! of what an earlier run left behind.
//!
//! Each layer directory records its owner (the adapter's pid and start time) and, once booted,
//! the sandbox process. An adapter that died (even `kill -9`) leaves its directories with a
//! dead owner; the next start kills any recorded process still alive and removes them.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::backend::Backend;

const OWNER_FILE: &str = "owner";
const PROCESS_FILE: &str = "process";

/// A process identity that survives pid reuse: pid plus its start time in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcessId {
    pid: u32,
    start_time: u64,
}

impl ProcessId {
    /// The living process `pid`; `None` when there is none, or only its zombie (an adapter
    /// that died while its parent has not reaped it yet is dead: its sandboxes are leftovers).
    fn of(pid: u32) -> Option<Self> {
        let stat = crate::proc_counters::ProcStat::of(pid)?;
        if stat.has_exited() {
            return None;
        }
        Some(Self {
            pid,
            start_time: stat.start_time,
        })
    }

    fn is_alive(&self) -> bool {
        Self::of(self.pid) == Some(*self)
    }

    fn encode(&self) -> String {
        format!("{} {}\n", self.pid, self.start_time)
    }

    fn decode(text: &str) -> Option<Self> {
        let mut parts = text.split_whitespace();
        Some(Self {
            pid: parts.next()?.parse().ok()?,
            start_time: parts.next()?.parse().ok()?,
        })
    }
}

pub struct StateDir {
    sandboxes: PathBuf,
    me: Option<ProcessId>,
}

impl StateDir {
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        let sandboxes = state_dir.join("sandboxes");
        fs::create_dir_all(&sandboxes)?;
        Ok(Self {
            sandboxes,
            me: ProcessId::of(std::process::id()),
        })
    }

    /// Creates the layer directory of a new sandbox, owned by this adapter.
    pub fn create_layer(&self, sandbox_id: &str) -> io::Result<PathBuf> {
        let dir = self.sandboxes.join(sandbox_id);
        fs::create_dir(&dir)?;
        if let Some(me) = self.me {
            fs::write(dir.join(OWNER_FILE), me.encode())?;
        }
        Ok(dir)
    }

    /// Records the process holding the sandbox, so a later start can kill it if we die.
    pub fn record_process(&self, layer: &Path, pid: u32) {
        if let Some(process) = ProcessId::of(pid) {
            let _ = fs::write(layer.join(PROCESS_FILE), process.encode());
        }
    }

    pub fn remove_layer(&self, backend: &dyn Backend, layer: &Path) {
        backend.release_layer(layer);
        if let Err(e) = backend.remove_guest_tree(layer) {
            tracing::warn!(layer = %layer.display(), error = %e, "cannot remove sandbox layer");
        }
    }

    /// Cleans every layer whose owner is gone: kills its recorded process if still alive and
    /// removes the directory. Returns how many leftovers were cleaned.
    pub fn reconcile(&self, backend: &dyn Backend) -> usize {
        let Ok(entries) = fs::read_dir(&self.sandboxes) else {
            return 0;
        };
        let mut cleaned = 0;
        for entry in entries.flatten() {
            let layer = entry.path();
            let owner = read_process(&layer.join(OWNER_FILE));
            if owner.is_some_and(|owner| Some(owner) != self.me && owner.is_alive()) {
                continue; // another live adapter shares this state directory
            }
            if let Some(process) =
                read_process(&layer.join(PROCESS_FILE)).filter(ProcessId::is_alive)
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(process.pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            self.remove_layer(backend, &layer);
            cleaned += 1;
        }
        if cleaned > 0 {
            tracing::info!(cleaned, "removed leftovers of an earlier run");
        }
        cleaned
    }
}

/// Kills the process recorded in `dir` (by [`StateDir::record_process`]) if it still runs,
/// and forgets it: for directories that outlive their sandbox (worker VMs).
pub(crate) fn kill_recorded_process(dir: &Path) {
    let file = dir.join(PROCESS_FILE);
    if let Some(process) = read_process(&file).filter(ProcessId::is_alive) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(process.pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = fs::remove_file(file);
}

fn read_process(path: &Path) -> Option<ProcessId> {
    ProcessId::decode(&fs::read_to_string(path).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_identity_is_alive_and_round_trips() {
        let me = ProcessId::of(std::process::id()).unwrap();
        assert!(me.is_alive());
        assert_eq!(ProcessId::decode(&me.encode()), Some(me));
        let stale = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(
            !stale.is_alive(),
            "a reused pid must not count as the recorded process"
        );
    }

    #[test]
    fn a_zombie_is_dead() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let process = ProcessId::of(child.id()).expect("a running child");
        assert!(process.is_alive());
        // Exited, not reaped: only its zombie is left.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let zombie = loop {
            let stat = crate::proc_counters::ProcStat::of(child.id()).unwrap();
            if stat.state == 'Z' {
                break true;
            }
            if std::time::Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert!(zombie, "the child became a zombie");
        assert!(!process.is_alive(), "a zombie counts as dead");
        child.wait().unwrap();
        assert!(!process.is_alive());
    }
}
