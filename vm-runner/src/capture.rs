//! `sandbox-libkrun-vm --capture-layer PID UPPER INTO LIMIT`: copies the upper directory of
//! the sandbox whose runner is PID (UPPER as that runner's root shows it, see
//! [`crate::VmSpec::upper_seen_by_runner`]) into INTO, an empty directory of the adapter's,
//! for a snapshot (the copy itself is the `layer-capture` crate's). Prints the bytes counted;
//! exits `layer_capture::OVER_BUDGET_EXIT` past LIMIT.
//!
//! The copy runs with the ids the runner runs libkrun's file server with, so it reads every
//! file the guest wrote and gives the copy the same owners: a root adapter's copy is host root
//! (the runner's files hold its range's host ids); an ordinary user's becomes root of a user
//! namespace of its own ids, as its runner is (where its guest's files are all that user's).
//!
//! libkrun's virtio-fs server does not offer the guest writeback caching (libkrun 1.19.7
//! leaves it off), so every write the guest made has reached the upper directory when its
//! write returned: the adapter stops the runner (every vCPU and the file server) and copies.
//! Pages of a shared mapping the guest has not flushed are not there yet, as on a crash.

use std::path::Path;

/// The exit status of a copy; `args` are the four after `--capture-layer`.
pub fn capture_layer(args: &[String]) -> u8 {
    const USAGE: &str = "usage: sandbox-libkrun-vm --capture-layer PID UPPER INTO LIMIT";
    let [pid, upper, into, limit] = args else {
        eprintln!("{USAGE}");
        return crate::exit::BAD_SPEC as u8;
    };
    let (Ok(pid), Ok(limit)) = (pid.parse::<u32>(), limit.parse::<u64>()) else {
        eprintln!("{USAGE}");
        return crate::exit::BAD_SPEC as u8;
    };
    let become_owner = || {
        if nix::unistd::geteuid().is_root() {
            return Ok(());
        }
        crate::overlay::become_root_of_own_namespace().map_err(std::io::Error::other)
    };
    layer_capture::copy_as_process(
        "sandbox-libkrun-vm",
        pid,
        Path::new(upper),
        Path::new(into),
        limit,
        become_owner,
    )
}
