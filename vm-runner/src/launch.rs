//! Turns a validated specification into a running libkrun VM.

use std::convert::Infallible;

use crate::firmware::{self, FirmwareError};
use crate::krun::{Context, KrunError};
use crate::launch_file::{self, INIT_PATH, LAUNCH_PATH};
use crate::overlay::{self, OverlayError};
use crate::probe::{self, HostUnfit};
use crate::spec::{VmSpec, VsockDirection};

/// The guest init shim, built statically from `guest/vm-init.c` by the build script.
pub const GUEST_INIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/vm-init"));

/// Why the VM did not start.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("this host cannot boot microVMs: {0}")]
    HostUnfit(#[from] HostUnfit),
    #[error(transparent)]
    Firmware(#[from] FirmwareError),
    #[error(transparent)]
    Overlay(#[from] OverlayError),
    #[error(transparent)]
    Krun(#[from] KrunError),
    #[error("cannot arrange to die with the parent process: {0}")]
    DeathSignal(std::io::Error),
}

/// Makes the kernel SIGKILL us when the parent dies, so no VM outlives its owner.
pub fn die_with_parent() -> Result<(), LaunchError> {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    // SAFETY: PR_SET_PDEATHSIG takes a signal number and touches no memory of ours.
    let ret = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    if ret != 0 {
        return Err(LaunchError::DeathSignal(std::io::Error::last_os_error()));
    }
    // The parent may have died before the prctl: then nobody would ever kill us.
    // SAFETY: getppid has no preconditions.
    if unsafe { libc::getppid() } != parent {
        return Err(LaunchError::DeathSignal(std::io::Error::other(
            "the parent exited before the VM started",
        )));
    }
    Ok(())
}

/// Probes the host, configures libkrun from `spec` and boots. Never returns on success:
/// libkrun exits the process with the guest workload's status.
pub fn boot(spec: &VmSpec) -> Result<Infallible, LaunchError> {
    probe::host_can_boot()?;
    firmware::preload(&probe::find_libkrunfw()?)?;
    // Before libkrun starts any thread: unshare(CLONE_NEWNS) needs a single-threaded process.
    if let Some(root_overlay) = &spec.root_overlay {
        overlay::mount_private(&spec.root, root_overlay)?;
    }

    let ctx = Context::new()?;
    ctx.set_vm_config(spec.vcpus, spec.memory_mib)?;
    ctx.set_root(&spec.root.to_string_lossy())?;
    for share in &spec.shares {
        ctx.add_virtiofs(
            &share.tag,
            &share.host_path.to_string_lossy(),
            share.read_only,
        )?;
    }
    if !spec.network {
        ctx.disable_networking()?;
    }
    for bridge in &spec.vsock {
        let guest_listens = bridge.direction == VsockDirection::GuestListens;
        ctx.add_vsock_port(bridge.port, &bridge.socket.to_string_lossy(), guest_listens)?;
    }
    if let Some(log) = &spec.console_log {
        ctx.set_console_output(&log.to_string_lossy())?;
    }

    // libkrun's init reads /.krun_config.json and starts our shim, which reads the launch
    // file; both are overlay entries, so the root directory is never written. They live
    // as long as the process, as libkrun requires.
    let krun_config: &'static [u8] = launch_file::krun_init_config().into_bytes().leak();
    let launch: &'static [u8] = launch_file::encode(spec).leak();
    ctx.add_root_overlay_file("/.krun_config.json", krun_config, 0o444)?;
    ctx.add_root_overlay_file(LAUNCH_PATH, launch, 0o400)?;
    ctx.add_root_overlay_file(INIT_PATH, GUEST_INIT, 0o555)?;

    Ok(ctx.start_enter()?)
}
