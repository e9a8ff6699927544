//! What each process does when its parent dies, measured by a controlled kill: the
//! parent-death signal (`PR_SET_PDEATHSIG`) is in no file of `/proc`, and a change of
//! credentials clears it silently, so only its effect is proof.
//!
//! The test process makes itself a child subreaper, stops every watched process (SIGSTOP),
//! then kills the adapter with SIGKILL. A process whose parent dies before it is reparented
//! to the test, which reaps it and so reads how it ended. While stopped, a process can only
//! be ended by a kill signal: its parent-death signal (or bwrap's `--die-with-parent`), so
//! one that dies then is `SIGKILL` (the signal's name). Once the deaths stop, the rest are
//! continued (SIGCONT): one that then ends by itself (it saw its parent's pipes close) is
//! `exit N`; one still alive 10 s after its parent died `survives`, and is killed in the
//! next round (everything stopped again first) so that its own children are measured in
//! turn. A process reaped by someone else died before its parent: `gone before its parent`.
//! Stopping first makes the verdict deterministic: without it, a process with both a
//! parent-death signal and a closed pipe races the two.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use nix::libc;

use super::procfs;

/// How long an orphan may take to die before it counts as surviving its parent.
const GRACE: Duration = Duration::from_secs(10);

/// One process to watch: its role, pid and start time (`/proc/PID/stat` field 22, against
/// pid reuse).
#[derive(Debug, Clone)]
pub struct Watched {
    pub role: String,
    pub pid: u32,
    pub start_time: u64,
}

pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let tail = stat.rsplit_once(')')?.1;
    tail.split_whitespace().nth(19)?.parse().ok()
}

fn alive(w: &Watched) -> bool {
    procfs::stat(&format!("/proc/{}", w.pid)).is_some_and(|(_, _, state)| state != "Z")
        && start_time(w.pid) == Some(w.start_time)
}

fn is_zombie(w: &Watched) -> bool {
    procfs::stat(&format!("/proc/{}", w.pid)).is_some_and(|(_, _, state)| state == "Z")
        && start_time(w.pid) == Some(w.start_time)
}

fn ppid(w: &Watched) -> Option<u32> {
    procfs::stat(&format!("/proc/{}", w.pid)).map(|(_, ppid, _)| ppid)
}

/// Sets or clears this process's child-subreaper flag.
fn subreaper(on: bool) {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag.
    unsafe {
        libc::prctl(
            libc::PR_SET_CHILD_SUBREAPER,
            libc::c_ulong::from(on),
            0,
            0,
            0,
        )
    };
}

/// Reaps `pid` if it is a dead child of ours: how it ended.
fn reap(pid: u32) -> Option<String> {
    let mut status = 0;
    // SAFETY: waitpid on one pid with WNOHANG; `status` is a local.
    let got = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if got != pid as i32 {
        return None;
    }
    Some(if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        match nix::sys::signal::Signal::try_from(signal) {
            Ok(s) => s.as_str().to_string(),
            Err(_) => format!("signal {signal}"),
        }
    } else {
        format!("exit {}", libc::WEXITSTATUS(status))
    })
}

fn signal(w: &Watched, signal: libc::c_int) {
    if alive(w) {
        // SAFETY: kill takes plain integers; `alive` checked the pid is still this process.
        unsafe { libc::kill(w.pid as i32, signal) };
    }
}

fn is_stopped(w: &Watched) -> bool {
    procfs::stat(&format!("/proc/{}", w.pid)).is_some_and(|(_, _, state)| state == "T")
}

/// Records every watched process that ended since the last call: reaped by us (`how`
/// names the signal, else the exit status), or gone by another's hand.
fn collect(watched: &[Watched], outcome: &mut BTreeMap<String, String>) -> bool {
    let mut changed = false;
    for w in watched {
        if outcome.contains_key(&w.role) {
            continue;
        }
        if let Some(how) = reap(w.pid) {
            outcome.insert(w.role.clone(), how);
            changed = true;
        } else if !alive(w) && !is_zombie(w) {
            outcome.insert(w.role.clone(), "gone before its parent".into());
            changed = true;
        }
    }
    changed
}

fn kill_and_reap(victims: &[Watched]) {
    for w in victims {
        signal(w, libc::SIGKILL);
        let mut status = 0;
        // SAFETY: reaps that child of ours (an orphan reparented to us); `status` is a local.
        unsafe { libc::waitpid(w.pid as i32, &mut status, 0) };
    }
}

/// Kills the adapter (`kill_adapter` must SIGKILL and reap it) and measures what every
/// watched process does once its parent is dead: role -> outcome.
pub fn measure(watched: &[Watched], kill_adapter: impl FnOnce()) -> BTreeMap<String, String> {
    let me = std::process::id();
    subreaper(true);
    let mut outcome: BTreeMap<String, String> = BTreeMap::new();
    let mut victims: Vec<Watched> = Vec::new();
    let mut kill_adapter = Some(kill_adapter);
    for _round in 0..watched.len() + 1 {
        let living: Vec<&Watched> = watched
            .iter()
            .filter(|w| !outcome.contains_key(&w.role))
            .collect();
        if living.is_empty() {
            break;
        }
        for w in &living {
            signal(w, libc::SIGSTOP);
        }
        let stopped = Instant::now() + Duration::from_secs(10);
        while Instant::now() < stopped && !living.iter().all(|w| is_stopped(w) || !alive(w)) {
            std::thread::sleep(Duration::from_millis(10));
        }
        match kill_adapter.take() {
            Some(kill) => kill(),
            None => kill_and_reap(&std::mem::take(&mut victims)),
        }
        // Deaths while everything is stopped: only kill signals.
        let mut quiet_since = Instant::now();
        let limit = Instant::now() + Duration::from_secs(20);
        while quiet_since.elapsed() < Duration::from_millis(500) && Instant::now() < limit {
            if collect(watched, &mut outcome) {
                quiet_since = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The rest run again: which ones end by themselves, now that their parent is gone.
        for w in watched.iter().filter(|w| !outcome.contains_key(&w.role)) {
            signal(w, libc::SIGCONT);
        }
        let grace = Instant::now() + GRACE;
        loop {
            collect(watched, &mut outcome);
            let orphans: Vec<&Watched> = watched
                .iter()
                .filter(|w| !outcome.contains_key(&w.role) && ppid(w) == Some(me))
                .collect();
            if orphans.is_empty() || Instant::now() > grace {
                victims = orphans.into_iter().cloned().collect();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for w in &victims {
            outcome.insert(w.role.clone(), "survives".into());
        }
    }
    // Survivors of the last round have nothing left below them to measure.
    kill_and_reap(&victims);
    subreaper(false);
    for w in watched {
        outcome
            .entry(w.role.clone())
            .or_insert_with(|| "(no verdict)".into());
    }
    outcome
}
