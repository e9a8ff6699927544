//! Mounts seen through an id map: a detached copy of a mount ([`idmapped_clone`]) whose
//! on-disk id `k` the kernel shows as the host id that `k` is in a user namespace (a sandbox's
//! `0..65536 -> base..`), attached where the caller wants it ([`attach`]). A root process
//! shows the image cache and a layer to a sandbox's unprivileged ids this way, as the files'
//! owners, without a chown walk. Needs host root, and a filesystem that supports idmapped
//! mounts (ext4, xfs, btrfs; tmpfs from Linux 6.3).
//!
//! [`new_user_namespace`] makes the namespace such a map comes from.
//!
//! Hand-written: `open_tree`, `mount_setattr` and `move_mount` are system calls neither libc
//! nor nix wraps yet.

#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::sched::{unshare, CloneFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, setgroups, setresgid, setresuid, ForkResult, Gid, Uid};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x0000_0001;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn c_string(path: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL"))
}

/// A detached copy of the mount at `path` (a directory or a file) whose ids are seen through
/// `userns`: on-disk id `k` appears as host id `base + k`, which the sandbox sees as `k`, and
/// a write by the sandbox's `k` is stored as `k`. Needs host root.
pub fn idmapped_clone(path: &Path, userns: &OwnedFd) -> io::Result<OwnedFd> {
    clone_with_attrs(path, Some(userns), false, false)
}

/// [`idmapped_clone`] of the mount at `path` and every mount below it.
pub fn idmapped_clone_tree(path: &Path, userns: &OwnedFd) -> io::Result<OwnedFd> {
    clone_with_attrs(path, Some(userns), false, true)
}

/// A detached copy of the mount at `path` with its ids as they are on disk (a directory the
/// sandbox's subordinate ids own, see `owners.rs`).
pub fn plain_clone(path: &Path) -> io::Result<OwnedFd> {
    clone_with_attrs(path, None, false, false)
}

/// [`plain_clone`] of the mount at `path` and every mount below it (what `mount --rbind`
/// copies).
pub fn plain_clone_tree(path: &Path) -> io::Result<OwnedFd> {
    clone_with_attrs(path, None, false, true)
}

/// [`plain_clone_tree`], read-only: no write reaches the files through it, whatever their
/// modes, and its other flags (nosuid, nodev) stay as they were. Needs no host root: the
/// caller's own mounts (in a mount namespace of its user namespace) are enough.
pub fn read_only_clone_tree(path: &Path) -> io::Result<OwnedFd> {
    clone_with_attrs(path, None, true, true)
}

fn clone_with_attrs(
    path: &Path,
    userns: Option<&OwnedFd>,
    read_only: bool,
    recursive: bool,
) -> io::Result<OwnedFd> {
    let at_recursive = if recursive { libc::AT_RECURSIVE } else { 0 } as libc::c_uint;
    let context = |what: &str, e: io::Error| {
        io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
    };
    let c_path = c_string(path)?;
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call; open_tree
    // only reads it and returns a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | at_recursive,
        )
    };
    if tree < 0 {
        return Err(context(
            "cannot clone the mount of",
            io::Error::last_os_error(),
        ));
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    if userns.is_none() && !read_only {
        return Ok(tree);
    }
    let mut attr = MountAttr {
        attr_set: 0,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    if let Some(userns) = userns {
        attr.attr_set |= MOUNT_ATTR_IDMAP;
        attr.userns_fd = userns.as_raw_fd() as u64;
    }
    if read_only {
        attr.attr_set |= MOUNT_ATTR_RDONLY;
    }
    let empty = c"";
    // SAFETY: `tree` is an open descriptor, `empty` a valid empty string, `attr` a properly
    // laid out mount_attr whose size is passed; the kernel only reads them.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | at_recursive,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(context(
            "cannot set the attributes (idmap, read-only) of",
            io::Error::last_os_error(),
        ));
    }
    Ok(tree)
}

/// Attaches a detached mount (from [`idmapped_clone`]) at `target`, an existing directory
/// or file of the caller's mount namespace.
pub fn attach(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    let c_target = c_string(target)?;
    let empty = c"";
    // SAFETY: both strings are valid and NUL-terminated, `tree` is open; move_mount only
    // reads its arguments.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c_target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot attach a mount at {}: {e}", target.display()),
        ));
    }
    Ok(())
}

/// Makes a user namespace and returns a handle on it. A short-lived child makes it (a
/// process cannot write its own map beyond its one id) and `write_maps` writes the child's
/// maps from here (`/proc/<pid>/uid_map`, ...); the namespace outlives the child through the
/// returned descriptor. With `owner` (uid, gid), the child first becomes those host ids, so
/// they own the namespace: a process running as them (pasta) may then join it. Call only
/// while single-threaded (it forks).
pub fn new_user_namespace(
    owner: Option<(u32, u32)>,
    write_maps: impl FnOnce(i32) -> io::Result<()>,
) -> io::Result<OwnedFd> {
    hold_new_namespaces(owner, CloneFlags::empty(), write_maps)?.open("user")
}

/// New namespaces held by a child of ours until this is dropped: a user namespace (its maps
/// written by the caller) and the others asked for with it, all owned by that namespace.
/// While held they can be named by the child's pid (`ip link ... netns PID`).
pub struct HeldNamespaces {
    pid: nix::unistd::Pid,
    release: Option<OwnedFd>,
}

impl HeldNamespaces {
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// A descriptor of the held namespace of `kind` (`user`, `net`, ...).
    pub fn open(&self, kind: &str) -> io::Result<OwnedFd> {
        File::open(format!("/proc/{}/ns/{kind}", self.pid)).map(OwnedFd::from)
    }
}

impl Drop for HeldNamespaces {
    fn drop(&mut self) {
        drop(self.release.take());
        let _ = waitpid(self.pid, None);
    }
}

/// [`new_user_namespace`] with `others` (e.g. `CLONE_NEWNET`) made in the same step, so the
/// user namespace owns them, held until the returned value is dropped. Call only while
/// single-threaded (it forks).
pub fn hold_new_namespaces(
    owner: Option<(u32, u32)>,
    others: CloneFlags,
    write_maps: impl FnOnce(i32) -> io::Result<()>,
) -> io::Result<HeldNamespaces> {
    let (ready_read, ready_write) = nix::unistd::pipe()?;
    let (release_read, release_write) = nix::unistd::pipe()?;
    // SAFETY: the caller is single-threaded, so the child may run any code; the child only
    // changes its own ids, unshares, writes, reads and exits.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(ready_read);
            drop(release_write);
            let owner_ok = owner.is_none_or(|(uid, gid)| become_owner(uid, gid).is_ok());
            // Never outlives its maker, whatever happens to the release pipe (set after the
            // change of ids, which clears it).
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            // A caller that entered a user namespace or changed ids is not dumpable, and
            // neither would we be: our /proc/<pid>/uid_map would then be host root's, closed
            // to a caller that is root of a namespace only. Nothing but our maker can see us.
            let _ = nix::sys::prctl::set_dumpable(true);
            let ok = owner_ok && unshare(CloneFlags::CLONE_NEWUSER | others).is_ok();
            let mut ready = File::from(ready_write);
            let _ = ready.write_all(if ok { b"y" } else { b"n" });
            drop(ready);
            // Holds the namespaces until the parent lets go (EOF on release).
            let _ = File::from(release_read).read(&mut [0u8; 1]);
            // SAFETY: _exit ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            drop(ready_write);
            drop(release_read);
            let held = HeldNamespaces {
                pid: child,
                release: Some(release_write),
            };
            let mut answer = [0u8; 1];
            match File::from(ready_read).read(&mut answer) {
                Ok(1) if answer[0] == b'y' => {
                    write_maps(child.as_raw())?;
                    Ok(held)
                }
                Ok(_) => Err(io::Error::other(
                    "cannot create a user namespace (are unprivileged user namespaces enabled?)",
                )),
                Err(e) => Err(e),
            }
        }
    }
}

/// The host ids that will own the namespace (a root caller's child only).
fn become_owner(uid: u32, gid: u32) -> nix::Result<()> {
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    setgroups(&[])?;
    setresgid(gid, gid, gid)?;
    setresuid(uid, uid, uid)
}

/// A tmpfs (mode 0755, nosuid, nodev) where a root process gathers idmapped copies for an
/// unprivileged user namespace to reach: mounted over `dir` in the caller's private mount
/// namespace, it covers what is there (clone first), and its own mode lets those ids through
/// where the originals' parents (`/root`, a 0700 state directory) would stop them.
pub struct Stage {
    dir: std::path::PathBuf,
}

impl Stage {
    pub fn mount(dir: &Path) -> io::Result<Stage> {
        use nix::mount::{mount, MsFlags};
        mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("mode=0755"),
        )
        .map_err(|e| io::Error::other(format!("cannot mount the stage {}: {e}", dir.display())))?;
        Ok(Stage {
            dir: dir.to_path_buf(),
        })
    }

    /// Attaches `tree` (a directory's copy when `is_dir`, else a file's) as `name` on the stage.
    pub fn place(
        &self,
        tree: &OwnedFd,
        name: &str,
        is_dir: bool,
    ) -> io::Result<std::path::PathBuf> {
        let target = self.dir.join(name);
        if is_dir {
            std::fs::create_dir(&target)?;
        } else {
            File::create(&target)?;
        }
        attach(tree, &target)?;
        Ok(target)
    }
}

/// Moves the caller into a mount namespace of its own (owned by its user namespace, where it
/// may mount) from which nothing propagates back. Call only while single-threaded.
pub fn private_mount_namespace() -> io::Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)
        .map_err(|e| io::Error::other(format!("cannot unshare the mount namespace: {e}")))?;
    make_mounts_private()
}

/// Makes every mount of the caller's (new) mount namespace private, so that nothing mounted
/// here propagates back to the namespace it was copied from, nor the other way.
pub fn make_mounts_private() -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| io::Error::other(format!("cannot make the mount namespace private: {e}")))
}
