//! `sandbox-bwrap-launch`: started by the bwrap plugin ahead of a create, it does the slow part
//! of a sandbox's start while nobody waits (joins the sandbox's cgroups, unshares its mount
//! namespace), then waits on stdin for the sandbox's [`LaunchCommand`], mounts the overlay root
//! and becomes bwrap. Not meant to be run by hand.
//!
//! Usage: `sandbox-bwrap-launch --parent PID [--cgroup-procs FILE]...`
//!
//! stdout is the agent's channel from the start, so nothing is ever written there. Every
//! failure ends up in the sandbox log named by the command (what the adapter shows in a boot
//! error); failures before the command arrives are kept until then.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::unistd::{dup2, getppid, Pid};
use plugin_bwrap::launch::LaunchCommand;

fn main() -> ExitCode {
    let setup = prepare(std::env::args().skip(1).collect());
    // SAFETY: fd 0 is this process's stdin, open for its whole life; ManuallyDrop keeps the
    // `File` from closing it, since bwrap inherits it as the agent's input.
    let stdin = ManuallyDrop::new(unsafe { File::from_raw_fd(0) });
    let command = match LaunchCommand::read_from(&*stdin) {
        Ok(command) => command,
        // The adapter dropped this launcher without using it (shutdown, or a pool discarded):
        // nobody reads a log, and there is none to write to.
        Err(_) => return ExitCode::from(1),
    };
    let error = match into_log(&command.log) {
        Ok(()) => match setup.and_then(|()| launch(&command)) {
            Ok(never) => match never {},
            Err(e) => e,
        },
        Err(e) => format!("cannot open the sandbox log {}: {e}", command.log),
    };
    eprintln!("sandbox-bwrap-launch: {error}");
    ExitCode::from(1)
}

/// Dies with the adapter, joins the cgroups, and takes a private mount namespace.
fn prepare(args: Vec<String>) -> Result<(), String> {
    let mut parent = None;
    let mut cgroup_procs = Vec::new();
    let mut args = args.into_iter();
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--parent" => parent = value.parse::<i32>().ok().map(Pid::from_raw),
            "--cgroup-procs" => cgroup_procs.push(value),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| format!("cannot tie this process to the adapter: {e}"))?;
    // The adapter may have died between our fork and the line above: then nobody kills us.
    if parent.is_none_or(|parent| getppid() != parent) {
        return Err("the adapter that started this launcher is gone".into());
    }
    for procs in cgroup_procs {
        // A group that cannot be joined costs the sandbox its limits, not its start (the
        // adapter has already logged whether limits are enforced on this host).
        let _ = std::fs::write(&procs, "0");
    }
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("cannot unshare the mount namespace: {e}"))?;
    // Nothing mounted here may propagate back to the host.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("cannot make the mount namespace private: {e}"))
}

/// Points stderr at the sandbox's log.
fn into_log(log: &str) -> std::io::Result<()> {
    let file = OpenOptions::new().create(true).append(true).open(log)?;
    dup2(file.as_raw_fd(), 2)?;
    Ok(())
}

/// Mounts the overlay root and execs bwrap; returns only on failure.
fn launch(command: &LaunchCommand) -> Result<std::convert::Infallible, String> {
    let options = command.overlay_options().map_err(|e| e.to_string())?;
    mount(
        Some("overlay"),
        command.merged.as_str(),
        Some("overlay"),
        MsFlags::empty(),
        Some(options.as_str()),
    )
    .map_err(|e| format!("cannot mount the sandbox's overlay root: {e}"))?;
    let _ = std::io::stderr().flush();
    let error = Command::new(&command.bwrap)
        .args(&command.args)
        .env_clear()
        .exec();
    Err(format!("cannot start {}: {error}", command.bwrap))
}
