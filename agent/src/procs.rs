//! The process table and the signal thread. The agent may be PID 1: it reaps every
//! child (orphans included) with `waitpid(-1)` in one place, and hands the status of
//! its own execs to their waiting threads. Spawning happens under the table lock, so a
//! child can never be reaped before it is registered.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::log::{log, RateLimit};
use crate::sys;

/// What one exec's thread and the rest of the agent share.
pub struct ExecControl {
    /// Raw wait status, set by the reaper.
    status: Mutex<Option<libc::c_int>>,
    kill_requested: AtomicBool,
    /// A signal the host asked for (`ExecSignal`, `process::kill`), not yet sent; 0: none.
    signal_requested: AtomicI32,
    /// Output cost the host acknowledged (`OutputAck`), for a flow-controlled exec.
    output_acked: AtomicU64,
    wake_read: OwnedFd,
    wake_write: OwnedFd,
}

impl ExecControl {
    pub fn new() -> std::io::Result<Arc<ExecControl>> {
        let (wake_read, wake_write) = sys::pipe()?;
        Ok(Arc::new(ExecControl {
            status: Mutex::new(None),
            kill_requested: AtomicBool::new(false),
            signal_requested: AtomicI32::new(0),
            output_acked: AtomicU64::new(0),
            wake_read,
            wake_write,
        }))
    }

    /// Asks the exec's thread to kill its process group.
    pub fn request_kill(&self) {
        self.kill_requested.store(true, Ordering::SeqCst);
        sys::write_byte(&self.wake_write);
    }

    /// Asks the exec's thread to send `signal` to its process group (and SIGKILL after the
    /// grace unless it ends).
    pub fn request_signal(&self, signal: libc::c_int) {
        self.signal_requested.store(signal, Ordering::SeqCst);
        sys::write_byte(&self.wake_write);
    }

    /// The signal asked for since the last call, if any.
    pub fn take_signal(&self) -> Option<libc::c_int> {
        Some(self.signal_requested.swap(0, Ordering::SeqCst)).filter(|s| *s != 0)
    }

    /// The host consumed `cost` more of the exec's output: the pump may read on.
    pub fn ack_output(&self, cost: u64) {
        self.output_acked.fetch_add(cost, Ordering::SeqCst);
        sys::write_byte(&self.wake_write);
    }

    pub fn output_acked(&self) -> u64 {
        self.output_acked.load(Ordering::SeqCst)
    }

    pub fn kill_requested(&self) -> bool {
        self.kill_requested.load(Ordering::SeqCst)
    }

    pub fn status(&self) -> Option<libc::c_int> {
        *self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fd the exec's thread polls to learn about exit and kill requests.
    pub fn wake_fd(&self) -> RawFd {
        self.wake_read.as_raw_fd()
    }

    pub fn clear_wake(&self) {
        sys::drain(&self.wake_read);
    }

    fn set_status(&self, status: libc::c_int) {
        *self.status.lock().unwrap_or_else(|p| p.into_inner()) = Some(status);
        sys::write_byte(&self.wake_write);
    }
}

/// Live execs by pid (which is also their process group id).
#[derive(Clone, Default)]
pub struct ProcTable {
    inner: Arc<Mutex<HashMap<libc::pid_t, Arc<ExecControl>>>>,
}

impl ProcTable {
    fn lock(&self) -> MutexGuard<'_, HashMap<libc::pid_t, Arc<ExecControl>>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `spawn` (which returns the child's pid) with reaping held off, and registers
    /// the child before the reaper can see its exit.
    pub fn spawn_registered<T>(
        &self,
        control: &Arc<ExecControl>,
        spawn: impl FnOnce() -> std::io::Result<(libc::pid_t, T)>,
    ) -> std::io::Result<(libc::pid_t, T)> {
        let mut table = self.lock();
        let (pid, value) = spawn()?;
        table.insert(pid, control.clone());
        Ok((pid, value))
    }

    pub fn forget(&self, pid: libc::pid_t) {
        self.lock().remove(&pid);
    }

    /// Reaps every exited child; hands statuses of our execs over, drops the rest
    /// (orphaned grandchildren).
    pub fn reap(&self) {
        let table = self.lock();
        while let Some((pid, status)) = sys::reap_any() {
            if let Some(control) = table.get(&pid) {
                control.set_status(status);
            }
        }
    }

    /// Sends `sig` to the process group of every live exec.
    pub fn signal_all(&self, sig: libc::c_int) {
        for pid in self.lock().keys() {
            sys::kill_group(*pid, sig);
        }
    }
}

/// The log lines of forwarded signals: any process of the sandbox may signal the agent as
/// fast as it can, and the log is a file on the host.
static SIGNAL_LINES: RateLimit = RateLimit::new();

/// Starts the thread that reaps children and forwards SIGTERM/SIGINT to every exec's
/// process group. The signals must already be blocked (see `sys::block_handled_signals`).
pub fn start_signal_thread(table: ProcTable) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            // Wakes for the count of the lines held back only while some are.
            let due = SIGNAL_LINES.report_due_in(Instant::now());
            match sys::wait_signal(due) {
                Ok(None) => {
                    if let Some(held) = SIGNAL_LINES.held_back(Instant::now()) {
                        log!("{held} more signals forwarded to every exec, not logged one by one");
                    }
                }
                Ok(Some(libc::SIGCHLD)) => table.reap(),
                Ok(Some(sig)) => {
                    match SIGNAL_LINES.admit(Instant::now()) {
                        Some(0) => log!("got signal {sig}, forwarding it to every exec"),
                        Some(held) => log!(
                            "got signal {sig}, forwarding it to every exec ({held} more signals since the last such line, not logged)"
                        ),
                        None => {}
                    }
                    table.signal_all(sig);
                }
                Err(e) => {
                    log!("sigwait failed: {e}");
                    return;
                }
            }
        })?;
    Ok(())
}
