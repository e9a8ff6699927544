//! A worker's persistent layer for an ordinary-user adapter, bounded without host root: its
//! ext4 image served by `fuse2fs`, and the root overlay by `fuse-overlayfs` on top of it.
//!
//! Why FUSE, and why two daemons: a loop device (how a root adapter mounts the image) needs
//! host root, and an ordinary user's namespaces may mount only tmpfs, overlayfs and FUSE. A
//! tmpfs bounds a layer but loses it at each stop. `fuse2fs` serves the image (ENOSPC at its
//! size, persistent), but the kernel's overlayfs refuses an upper layer on FUSE (it revalidates
//! its dentries), so the overlay is `fuse-overlayfs`, the one rootless podman uses, whose
//! upper and work directories sit in the image. Both come from Debian (`fuse2fs`,
//! `fuse-overlayfs`) and need `/dev/fuse` open to the adapter's user, as Debian's udev rule
//! makes it (0666).
//!
//! Both daemons run in the sandbox's user and mount namespaces (the launcher's), as the
//! sandbox's root, outside its pid namespace and seccomp filter: what a guest can send them is
//! file-system requests on its own files. They are tied to the launcher (which becomes bwrap):
//! when the sandbox ends they get SIGTERM, unmount and write the image out. `fuse2fs` holds
//! the image's lock (`layer_disk::lock_image`) for its whole life, so the next start waits for
//! that write instead of serving a half-written image, and the image is checked (`e2fsck -p`)
//! before each start in case a daemon was killed outright.

#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// The programs that serve a layer image without host root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseTools {
    pub fuse2fs: String,
    pub fuse_overlayfs: String,
    pub e2fsck: String,
}

/// How long a daemon may take to show its mount.
const MOUNT_WAIT: Duration = Duration::from_secs(20);

impl FuseTools {
    /// The tools, when this host lets the adapter's user serve an image with FUSE; else why
    /// not, for the log and `adapter::info`.
    pub fn find() -> Result<FuseTools, String> {
        let find = |name: &str| {
            layer_disk::find_tool(name)
                .map(|p| p.display().to_string())
                .ok_or_else(|| format!("no {name} on this host"))
        };
        let tools = FuseTools {
            fuse2fs: find("fuse2fs")?,
            fuse_overlayfs: find("fuse-overlayfs")?,
            e2fsck: find("e2fsck")?,
        };
        OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .map_err(|e| format!("/dev/fuse is not open to this user ({e})"))?;
        Ok(tools)
    }

    /// In the launcher (the sandbox's user and mount namespaces): checks `image` and serves
    /// it at `at`, waiting up to a minute for an earlier server of it to finish.
    pub fn mount_image(&self, image: &Path, at: &Path) -> io::Result<()> {
        let lock = layer_disk::lock_image(image)?;
        self.check(image)?;
        let mut fuse2fs = Command::new(&self.fuse2fs);
        // Foreground, so it stays this process's child and dies with it; allow_other: the
        // sandbox's other ids reach `/state` on it directly.
        fuse2fs
            .arg(image)
            .arg(at)
            .args(["-f", "-o", "allow_other,nosuid,nodev"]);
        spawn_until_mounted(fuse2fs, at, Some(lock.as_raw_fd()))
    }

    /// Serves the overlay of `lower` under `upper` (both paths already checked for the
    /// option separators) at `merged`.
    pub fn mount_overlay(&self, dirs_option: &str, merged: &Path) -> io::Result<()> {
        let mut overlay = Command::new(&self.fuse_overlayfs);
        // writeback=0: a write past the bound fails at once (ENOSPC), not at a later fsync,
        // and dirty pages wait in no host cache. noacl: with ACLs on, the kernel asks for
        // the root's `system.posix_acl_access` on another uid's path walk and fails it with
        // the daemon's EOPNOTSUPP (seen on 6.18: a program switched to uid 1000 could open
        // nothing).
        overlay
            .args(["-f", "-o"])
            .arg(format!(
                "noacl,allow_other,nosuid,nodev,writeback=0,{dirs_option}"
            ))
            .arg(merged);
        spawn_until_mounted(overlay, merged, None)
    }

    /// `e2fsck -p`, then `-y` if preening was not enough: a daemon killed outright (not by
    /// the SIGTERM it gets when the sandbox ends) leaves the image marked not clean.
    fn check(&self, image: &Path) -> io::Result<()> {
        for mode in ["-p", "-y"] {
            let output = Command::new(&self.e2fsck)
                .arg(mode)
                .arg(image)
                .stdin(Stdio::null())
                .env_clear()
                .output()?;
            // 0: clean, 1: fixed, 2: fixed (a mounted root would reboot); 4 and up: not fixed.
            match output.status.code() {
                Some(0..=2) => return Ok(()),
                _ if mode == "-p" => continue,
                code => {
                    return Err(io::Error::other(format!(
                        "e2fsck could not repair the layer's image (exit {code:?}): {}",
                        String::from_utf8_lossy(&output.stdout).trim()
                    )))
                }
            }
        }
        Ok(())
    }
}

/// Starts a FUSE daemon in the foreground, tied to this process (SIGTERM when it exits), with
/// nothing of ours open but stderr (the sandbox log) and `keep` (as its fd 3), and waits
/// until its file system shows at `at`.
fn spawn_until_mounted(mut daemon: Command, at: &Path, keep: Option<RawFd>) -> io::Result<()> {
    let launcher = std::process::id() as libc::pid_t;
    daemon
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .env_clear();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls on plain integers.
    unsafe {
        daemon.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0
                || libc::getppid() != launcher
            {
                return Err(io::Error::other("the launcher is gone"));
            }
            let mut first_closed = 3;
            if let Some(fd) = keep {
                // dup2 leaves the copy without close-on-exec: the daemon holds the lock.
                if libc::dup2(fd, 3) < 0 {
                    return Err(io::Error::last_os_error());
                }
                first_closed = 4;
            }
            // The agent's channel is fd 0/1 (replaced above); anything else of the launcher's
            // (the pasta starter's pipe) must not outlive it in a daemon.
            libc::syscall(libc::SYS_close_range, first_closed, u32::MAX, 0);
            Ok(())
        });
    }
    let name = PathBuf::from(daemon.get_program());
    let child = daemon.spawn()?;
    wait_for_mount(child, at, &name)
}

/// Polls until `at` is a mount of its own (its device differs from its parent's), failing if
/// the daemon exits first or takes longer than [`MOUNT_WAIT`].
fn wait_for_mount(mut child: Child, at: &Path, name: &Path) -> io::Result<()> {
    let parent = at.parent().unwrap_or(Path::new("/"));
    let parent_dev = std::fs::metadata(parent)?.dev();
    let deadline = Instant::now() + MOUNT_WAIT;
    loop {
        if std::fs::metadata(at).is_ok_and(|m| m.dev() != parent_dev) {
            // Not waited for: it lives as long as the sandbox (dropping a Child leaves it be).
            drop(child);
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            return Err(io::Error::other(format!(
                "{} exited before its mount showed at {} ({status}; see the log above)",
                name.display(),
                at.display()
            )));
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return Err(io::Error::other(format!(
                "{} did not mount {} within {} s",
                name.display(),
                at.display(),
                MOUNT_WAIT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}
