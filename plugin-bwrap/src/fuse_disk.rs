//! A worker's persistent layer for an ordinary-user adapter, bounded without host root: its
//! ext4 image served by `fuse2fs`, and the root overlay by `fuse-overlayfs` on top of it,
//! each daemon jailed by bwrap.
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
//! **The daemons are jailed.** They answer file requests a hostile guest chooses, so a flaw in
//! one must not reach the host: the launcher mounts each file system itself (in the sandbox's
//! mount namespace) and hands the open FUSE device to the daemon, which runs under bwrap with
//! only its own files in view (its image, or the lower root and the disk), no other process
//! in view (a pid namespace of its own), no network, only the capabilities file serving
//! needs, and the sandbox's own seccomp filters (`seccomp-policy`: no mount, no tracing, no
//! kernel loading, no new user namespace). `fuse-overlayfs` takes the device as `/dev/fd/N`; `fuse2fs` (libfuse 2) cannot, so
//! its jail denies it `mount` and its libfuse falls back to `fusermount`, which in the jail
//! is this launcher binary answering with the device ([`answer_fusermount`]).
//!
//! **Lifetime.** The jails are tied to the launcher (which becomes bwrap): when the sandbox
//! ends they get SIGTERM, the sandbox's mount namespace goes, the overlay's mount with it,
//! `fuse-overlayfs` sees its device closed and exits, which drops the last mount of the disk,
//! and `fuse2fs` exits after writing the image out. `fuse2fs` holds the image's lock
//! (`layer_disk::lock_image`) to the end, so the next start waits for that write instead of
//! serving a half-written image, and the image is checked (`e2fsck -p`) before each start in
//! case a daemon was killed outright.

#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// The programs that serve a layer image without host root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FuseTools {
    pub fuse2fs: String,
    pub fuse_overlayfs: String,
    pub e2fsck: String,
    /// The jail of both daemons.
    pub bwrap: String,
}

/// Where a jailed daemon finds its mounted FUSE device (bwrap keeps low numbers for itself).
const DEVICE_FD: RawFd = 63;
/// The sandbox log's line when the image was not clean at a start.
pub const REPAIRED: &str =
    "the layer's image was not clean (a disk daemon was killed outright): e2fsck repaired it";
/// Where `fuse2fs` holds the image's lock.
const LOCK_FD: RawFd = 62;
/// Where bwrap reads the jail's seccomp filters (`seccomp-policy`), one per descriptor down
/// from here.
const FILTER_FDS: RawFd = 61;
/// The lowest descriptor a jail is handed: [`FILTER_FDS`] and below, one per filter.
const LOWEST_HANDED_FD: RawFd = 56;
/// libfuse 2 names the socket to send the device on in this variable when it runs
/// `fusermount`.
const FUSERMOUNT_SOCKET_ENV: &str = "_FUSE_COMMFD";

/// Capabilities of the sandbox's user namespace a daemon keeps: those of file serving
/// (owners, modes, device whiteouts), none of mounting, tracing or networking.
const OVERLAY_CAPS: [&str; 7] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_MKNOD",
    "CAP_SETFCAP",
];

impl FuseTools {
    /// The tools, when this host lets the adapter's user serve an image with FUSE; else why
    /// not, for the log and `adapter::info`.
    pub fn find(bwrap: Option<&Path>) -> Result<FuseTools, String> {
        let find = |name: &str| {
            layer_disk::find_tool(name)
                .map(|p| p.display().to_string())
                .ok_or_else(|| format!("no {name} on this host"))
        };
        let tools = FuseTools {
            fuse2fs: find("fuse2fs")?,
            fuse_overlayfs: find("fuse-overlayfs")?,
            e2fsck: find("e2fsck")?,
            bwrap: bwrap.ok_or("no bwrap on this host")?.display().to_string(),
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
        let device = mount_device(at, "fuse2fs")?;
        let shim = std::env::current_exe()?;
        let mut jail = jail(&self.bwrap, &[]);
        jail.arg("--ro-bind")
            .arg(&shim)
            .arg("/usr/bin/fusermount")
            .args(["--dev-bind", "/dev/fuse", "/dev/fuse", "--bind"])
            .arg(image)
            .args(["/disk.img", "--dir", "/mnt"]);
        let fuse2fs = [
            &self.fuse2fs,
            "/disk.img",
            "/mnt",
            "-f",
            "-o",
            "allow_other",
        ];
        spawn(jail, &fuse2fs, device, Some(lock))?;
        wait_until_served(at, "fuse2fs")
    }

    /// Serves the overlay of `lower` under the `upper` and `work` directories of `disk` (a
    /// mount of [`FuseTools::mount_image`]) at `merged`.
    pub fn mount_overlay(&self, lower: &Path, disk: &Path, merged: &Path) -> io::Result<()> {
        let device = mount_device(merged, "fuse-overlayfs")?;
        let mut jail = jail(&self.bwrap, &OVERLAY_CAPS);
        // writeback=0: a write past the bound fails at once (ENOSPC), not at a later fsync,
        // and dirty pages wait in no host cache. noacl: with ACLs on, the kernel asks for
        // the root's `system.posix_acl_access` on another uid's path walk and fails it with
        // the daemon's EOPNOTSUPP (seen on 6.18: a program switched to uid 1000 could open
        // nothing).
        jail.arg("--ro-bind")
            .arg(lower)
            .arg("/lower")
            .arg("--bind")
            .arg(disk)
            .arg("/disk");
        let device_path = format!("/dev/fd/{DEVICE_FD}");
        let overlay = [
            &self.fuse_overlayfs,
            "-f",
            "-o",
            "noacl,allow_other,writeback=0,lowerdir=/lower,upperdir=/disk/upper,workdir=/disk/work",
            &device_path,
        ];
        spawn(jail, &overlay, device, None)?;
        wait_until_served(merged, "fuse-overlayfs")
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
                Some(0) => return Ok(()),
                // To the sandbox log: a clean stop never leaves anything to repair.
                Some(1..=2) => {
                    eprintln!(
                        "{REPAIRED}: {}",
                        String::from_utf8_lossy(&output.stdout).trim()
                    );
                    return Ok(());
                }
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

/// Opens a FUSE device and mounts it at `at` (nosuid, nodev, every id of the sandbox may
/// enter); the file system answers once a daemon serves the device.
fn mount_device(at: &Path, name: &str) -> io::Result<File> {
    let device = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/fuse")?;
    let options = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other",
        device.as_raw_fd()
    );
    nix::mount::mount(
        Some(name),
        at,
        Some(format!("fuse.{name}").as_str()),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(|e| io::Error::other(format!("cannot mount {name} at {}: {e}", at.display())))?;
    Ok(device)
}

/// bwrap's arguments for a daemon's jail, up to its own binds: the system's programs and
/// libraries read-only, fresh `/dev` and `/proc`, its own pid, network, IPC and UTS
/// namespaces (the sandbox's user namespace stays, so the daemon keeps the sandbox's ids),
/// a session of its own, and `caps` alone of the namespace's capabilities.
fn jail(bwrap: &str, caps: &[&str]) -> Command {
    let mut jail = Command::new(bwrap);
    jail.args([
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--new-session",
        "--ro-bind",
        "/usr",
        "/usr",
    ]);
    // Merged-/usr systems link these into /usr; others have them as directories.
    for top in ["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"] {
        match std::fs::read_link(top) {
            Ok(target) => {
                jail.arg("--symlink").arg(target).arg(top);
            }
            Err(_) if Path::new(top).is_dir() => {
                jail.args(["--ro-bind", top, top]);
            }
            Err(_) => {}
        }
    }
    if Path::new("/etc/ld.so.cache").exists() {
        jail.args(["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]);
    }
    jail.args(["--dev", "/dev", "--proc", "/proc", "--cap-drop", "ALL"]);
    for cap in caps {
        jail.args(["--cap-add", cap]);
    }
    jail
}

/// The sandbox's seccomp filters (the agent's own, `seccomp-policy`), each in a memfd for
/// bwrap to read: with them the daemon cannot mount, trace, load anything into the kernel
/// or make a user namespace, whatever capabilities it holds.
fn seccomp_filters() -> io::Result<Vec<File>> {
    let programs = seccomp_policy::programs().map_err(io::Error::other)?;
    let mut files = Vec::with_capacity(programs.len());
    for program in &programs {
        // SAFETY: a NUL-terminated name and a flag; the returned descriptor is new and ours.
        let fd = unsafe { libc::memfd_create(c"jail-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and nothing else owns it.
        let mut file = unsafe { File::from_raw_fd(fd) };
        file.write_all(&seccomp_policy::to_bytes(program))?;
        file.seek(SeekFrom::Start(0))?;
        files.push(file);
    }
    if files.len() as RawFd > FILTER_FDS - LOWEST_HANDED_FD + 1 {
        return Err(io::Error::other(
            "more seccomp filters than descriptors kept for them",
        ));
    }
    Ok(files)
}

/// Starts `program` in `jail` with `device` as its fd [`DEVICE_FD`] (and `lock` as
/// [`LOCK_FD`]), the seccomp filters on, tied to this process (SIGTERM when it exits),
/// nothing else of ours open but stderr (the sandbox log), then closes our copy of the
/// device: from here on only the daemon holds it, so if the daemon dies the file system
/// fails (ENOTCONN) instead of hanging.
fn spawn(mut jail: Command, program: &[&str], device: File, lock: Option<File>) -> io::Result<()> {
    let launcher = std::process::id() as libc::pid_t;
    let device_fd = device.as_raw_fd();
    let lock_fd = lock.as_ref().map(AsRawFd::as_raw_fd);
    let filters = seccomp_filters()?;
    let filter_fds: Vec<(RawFd, RawFd)> = filters
        .iter()
        .zip((LOWEST_HANDED_FD..=FILTER_FDS).rev())
        .map(|(file, handed)| (file.as_raw_fd(), handed))
        .collect();
    for (_, handed) in &filter_fds {
        jail.arg("--add-seccomp-fd").arg(handed.to_string());
    }
    jail.arg("--").args(program);
    jail.stdin(Stdio::null()).stdout(Stdio::null()).env_clear();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls on plain integers.
    unsafe {
        jail.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0
                || libc::getppid() != launcher
            {
                return Err(io::Error::other("the launcher is gone"));
            }
            // dup2 leaves each copy without close-on-exec.
            if libc::dup2(device_fd, DEVICE_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            if let Some(fd) = lock_fd {
                if libc::dup2(fd, LOCK_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            for &(fd, handed) in &filter_fds {
                if libc::dup2(fd, handed) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            // The agent's channel is fd 0/1 (replaced above); anything else of the launcher's
            // (the pasta starter's pipe) must not outlive it in a daemon.
            libc::syscall(libc::SYS_close_range, 3, LOWEST_HANDED_FD - 1, 0);
            libc::syscall(libc::SYS_close_range, DEVICE_FD + 1, u32::MAX, 0);
            Ok(())
        });
    }
    // Not waited for: it lives as long as the sandbox (dropping a Child leaves it be).
    jail.spawn()?;
    drop((device, lock, filters));
    Ok(())
}

/// The first request on a fresh FUSE mount waits until the daemon has answered the kernel's
/// INIT; it fails (ENOTCONN) if the daemon died first.
fn wait_until_served(at: &Path, name: &str) -> io::Result<()> {
    std::fs::metadata(at).map(drop).map_err(|e| {
        io::Error::other(format!(
            "{name} did not serve {} ({e}; see the log above)",
            at.display()
        ))
    })
}

/// Whether this process was started as `fusermount` in a `fuse2fs` jail (see the module
/// comment): libfuse 2 runs it with a socket to send the FUSE device on.
pub fn is_fusermount_call() -> bool {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    Path::new(&argv0).file_name() == Some("fusermount".as_ref())
        && std::env::var_os(FUSERMOUNT_SOCKET_ENV).is_some()
}

/// Answers libfuse 2's `fusermount` call with the device mounted by the launcher: sends fd
/// [`DEVICE_FD`] on the socket it names, as the real `fusermount` sends the device it mounted.
pub fn answer_fusermount() -> io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let socket: RawFd = std::env::var(FUSERMOUNT_SOCKET_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| io::Error::other(format!("{FUSERMOUNT_SOCKET_ENV} names no socket")))?;
    let fds = [DEVICE_FD];
    let byte = [0u8; 1];
    let iov = [io::IoSlice::new(&byte)];
    sendmsg::<()>(
        socket,
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map_err(io::Error::from)?;
    Ok(())
}
