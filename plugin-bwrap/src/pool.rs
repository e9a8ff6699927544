//! One `sandbox-bwrap-launch` kept waiting, so that a create finds its cgroup joined and its
//! mount namespace made (see `launch.rs` for why that matters). Taking it starts the next one
//! in the background; when creates come faster than that (parallel creates), the extra ones
//! start their own launcher on the spot, which costs what a create cost before the pool.

use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::process::{Child, Command};

use crate::cgroup::{self, Group, Instance};
use crate::userns::IdMap;

/// A started launcher waiting for its command on stdin, and its (empty) cgroup.
pub struct Launcher {
    pub child: Child,
    pub group: Group,
    /// The read end of the launcher's stderr, a pipe from its start: the sandbox's log once
    /// a create takes the launcher (see `backend.rs`).
    pub log: io::PipeReader,
}

pub struct LauncherPool {
    program: PathBuf,
    id_map: IdMap,
    waiting: Mutex<Option<Launcher>>,
    refilling: AtomicBool,
}

impl LauncherPool {
    pub fn new(program: PathBuf, id_map: IdMap) -> Self {
        Self {
            program,
            id_map,
            waiting: Mutex::new(None),
            refilling: AtomicBool::new(false),
        }
    }

    /// The waiting launcher if it is still alive, else a new one; starts the next in the
    /// background. Must run on a tokio worker thread: bwrap's `--die-with-parent` ties every
    /// sandbox to the thread that forked its launcher, and worker threads live as long as the
    /// runtime (blocking-pool threads do not).
    pub fn take(self: &Arc<Self>) -> io::Result<Launcher> {
        let waiting = self.slot().take();
        let launcher = match waiting {
            Some(mut launcher) => {
                if matches!(launcher.child.try_wait(), Ok(None)) {
                    launcher
                } else {
                    discard(launcher);
                    self.start()?
                }
            }
            None => self.start()?,
        };
        self.refill();
        Ok(launcher)
    }

    fn start(&self) -> io::Result<Launcher> {
        // Fails closed: a launcher without its group would start a sandbox without limits.
        let group = Group::create(Instance::get())?;
        let (log, stderr) = match io::pipe() {
            Ok(pipe) => pipe,
            Err(e) => {
                group.remove_if_empty();
                return Err(e);
            }
        };
        let mut command = Command::new(&self.program);
        command.arg("--parent").arg(std::process::id().to_string());
        command.arg("--id-map").arg(self.id_map.to_arg());
        for procs in group.procs_files() {
            command.arg("--cgroup-procs").arg(procs);
        }
        let child = command
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .kill_on_drop(true)
            .spawn();
        match child {
            Ok(child) => Ok(Launcher { child, group, log }),
            Err(e) => {
                group.remove_if_empty();
                Err(e)
            }
        }
    }

    fn refill(self: &Arc<Self>) {
        if self.refilling.swap(true, Ordering::AcqRel) {
            return;
        }
        let pool = Arc::clone(self);
        tokio::spawn(async move {
            match pool.start() {
                Ok(launcher) => {
                    if let Some(extra) = pool.slot().replace(launcher) {
                        discard(extra);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot start a bwrap launcher ahead of time"),
            }
            pool.refilling.store(false, Ordering::Release);
        });
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Launcher>> {
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for LauncherPool {
    fn drop(&mut self) {
        if let Some(launcher) = self.slot().take() {
            discard(launcher);
        }
    }
}

/// Ends an unused launcher and removes its group once the launcher has left it: right after
/// the kill the dying process still holds the group and an rmdir then fails (EBUSY), which
/// left one empty group behind per discard. Without a runtime (the pool dropped at exit) the
/// group goes if it is already empty, else to the next start's sweep.
pub(crate) fn discard(launcher: Launcher) {
    let Launcher {
        mut child, group, ..
    } = launcher;
    let _ = child.start_kill();
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(async move {
                let _ = child.wait().await;
                let dirs = group.dirs();
                let _ = tokio::task::spawn_blocking(move || cgroup::remove_dirs(&dirs)).await;
            });
        }
        Err(_) => {
            drop(child);
            group.remove_if_empty();
        }
    }
}
