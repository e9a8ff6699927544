//! The sandbox's user namespace: why its root is never the host's root.
//!
//! Every sandbox runs in a user namespace of its own, made by its launcher before the sandbox
//! is known:
//! - **adapter run as root**: ids `0..count` inside are host ids `base..base+count` (a
//!   subordinate range: `/etc/subuid`'s entry for root, else [`DEFAULT_ROOT_BASE`]). The
//!   image cache and the sandbox's layer stay on disk with the image's own owners; the launcher
//!   shows them to the sandbox through idmapped mounts (`mount_setattr(MOUNT_ATTR_IDMAP)`), so
//!   a file the image gives uid 0 is uid 0 inside and host uid `base` to the kernel. Chosen
//!   over a shifted copy of each root: one syscall per mount instead of a chown walk of every
//!   image, and the cache stays shared with the libkrun plugin unchanged.
//! - **adapter run as an ordinary user** (how Compose runs it): the one id it owns is root
//!   inside (`0 -> the adapter's uid`), nothing else is mapped. Its image cache is already
//!   owned by that uid, so no idmapping is needed (nor possible: it takes host privilege).
//!   Programs that switch to another uid inside fail (EINVAL): written down in the README.
//!
//! Either way the sandbox's capabilities are those of its own namespace: useless against the
//! host's files, kernel knobs and other tenants.

// Namespaces and mounts are syscalls nix does not wrap (open_tree, mount_setattr, move_mount).
#![allow(unsafe_code)]

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, setgroups, setresgid, setresuid, ForkResult, Gid, Uid};

/// The host ids a root adapter's sandboxes get when `/etc/subuid` names no range for root:
/// high enough to collide with no ordinary account or the usual `useradd` ranges.
pub const DEFAULT_ROOT_BASE: u32 = 2_000_000_000;
/// The ids a sandbox has when the adapter may map a whole range.
pub const RANGE: u32 = 65_536;

/// Which host ids a sandbox's ids `0..count` are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMap {
    pub uid_base: u32,
    pub gid_base: u32,
    pub count: u32,
}

impl IdMap {
    /// The mapping for an adapter running with these effective ids.
    pub fn for_process(euid: u32, egid: u32) -> IdMap {
        if euid != 0 {
            return IdMap {
                uid_base: euid,
                gid_base: egid,
                count: 1,
            };
        }
        let range = |file: &str| {
            std::fs::read_to_string(file)
                .ok()
                .and_then(|text| subordinate_range(&text, "root"))
        };
        IdMap {
            uid_base: range("/etc/subuid").unwrap_or(DEFAULT_ROOT_BASE),
            gid_base: range("/etc/subgid").unwrap_or(DEFAULT_ROOT_BASE),
            count: RANGE,
        }
    }

    /// Whether the sandbox's files must be shown through idmapped mounts: the on-disk owners
    /// are the image's own ids, which the sandbox's namespace does not map one to one.
    pub fn needs_idmapped_mounts(&self) -> bool {
        self.count > 1
    }

    /// `UID:GID:COUNT`, the launcher's `--id-map` argument.
    pub fn to_arg(self) -> String {
        format!("{}:{}:{}", self.uid_base, self.gid_base, self.count)
    }

    pub fn parse_arg(text: &str) -> Option<IdMap> {
        let mut parts = text.split(':').map(|p| p.parse::<u32>().ok());
        let (Some(Some(uid_base)), Some(Some(gid_base)), Some(Some(count)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let fits = |base: u32| base.checked_add(count).is_some();
        (count > 0 && fits(uid_base) && fits(gid_base)).then_some(IdMap {
            uid_base,
            gid_base,
            count,
        })
    }

    /// One line, for `adapter::info` and the log.
    pub fn describe(&self) -> String {
        if self.count == 1 {
            format!(
                "sandbox root is host uid {} (the adapter's own; no other id is mapped)",
                self.uid_base
            )
        } else {
            format!(
                "sandbox ids 0..{} are host ids {}..{} (uid), {}..{} (gid)",
                self.count,
                self.uid_base,
                u64::from(self.uid_base) + u64::from(self.count),
                self.gid_base,
                u64::from(self.gid_base) + u64::from(self.count)
            )
        }
    }
}

/// The first range of at least [`RANGE`] ids that `/etc/subuid`-format `text` gives `user`.
fn subordinate_range(text: &str, user: &str) -> Option<u32> {
    text.lines().find_map(|line| {
        let mut fields = line.trim().split(':');
        let (Some(name), Some(start), Some(count)) = (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        let (start, count) = (start.parse::<u32>().ok()?, count.parse::<u32>().ok()?);
        (name == user && count >= RANGE && start > 0 && start.checked_add(RANGE).is_some())
            .then_some(start)
    })
}

/// Makes a user namespace with `map` and returns a handle on it. The namespace is made by a
/// short-lived child (a process cannot write its own full map), and outlives it through the
/// returned descriptor. A root adapter's child first becomes the sandbox's root host id, so
/// that id owns the namespace: pasta, running as it, may then join (see `netns.rs`). Call only
/// while single-threaded (it forks).
pub fn create(map: IdMap) -> io::Result<OwnedFd> {
    let (ready_read, ready_write) = nix::unistd::pipe()?;
    let (release_read, release_write) = nix::unistd::pipe()?;
    // SAFETY: the launcher is single-threaded when it calls this, so the child may run any
    // code; the child only unshares, writes, reads and exits.
    match unsafe { fork() }? {
        ForkResult::Child => {
            drop(ready_read);
            drop(release_write);
            let owner_ok = !map.needs_idmapped_mounts() || become_owner(map).is_ok();
            let ok = owner_ok && unshare(CloneFlags::CLONE_NEWUSER).is_ok();
            let mut ready = File::from(ready_write);
            let _ = ready.write_all(if ok { b"y" } else { b"n" });
            drop(ready);
            // Holds the namespace until the parent has its descriptor (EOF on release).
            let _ = File::from(release_read).read(&mut [0u8; 1]);
            // SAFETY: _exit ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        ForkResult::Parent { child } => {
            drop(ready_write);
            drop(release_read);
            let mut answer = [0u8; 1];
            let made = File::from(ready_read).read(&mut answer);
            let result = match made {
                Ok(1) if answer[0] == b'y' => write_maps(child.as_raw(), map).and_then(|()| {
                    File::open(format!("/proc/{}/ns/user", child.as_raw())).map(OwnedFd::from)
                }),
                Ok(_) => Err(io::Error::other(
                    "cannot create a user namespace (are unprivileged user namespaces enabled?)",
                )),
                Err(e) => Err(e),
            };
            drop(release_write);
            let _ = waitpid(child, None);
            result
        }
    }
}

/// The host ids the namespace's root will have (a root adapter's child only).
fn become_owner(map: IdMap) -> nix::Result<()> {
    let (uid, gid) = (Uid::from_raw(map.uid_base), Gid::from_raw(map.gid_base));
    setgroups(&[])?;
    setresgid(gid, gid, gid)?;
    setresuid(uid, uid, uid)
}

fn write_maps(pid: i32, map: IdMap) -> io::Result<()> {
    let proc_file = |name: &str| format!("/proc/{pid}/{name}");
    if map.count == 1 {
        // An unprivileged owner may map its own ids only, and only with setgroups denied.
        std::fs::write(proc_file("setgroups"), "deny")?;
    }
    let write = |name: &str, base: u32| {
        std::fs::write(proc_file(name), format!("0 {base} {}\n", map.count))
            .map_err(|e| io::Error::new(e.kind(), format!("cannot write {name}: {e}")))
    };
    write("uid_map", map.uid_base)?;
    write("gid_map", map.gid_base)
}

/// Joins the namespace and becomes its root (uid and gid 0 inside, no supplementary groups),
/// with every capability of that namespace and none of the host's.
pub fn enter(userns: &OwnedFd, map: IdMap) -> io::Result<()> {
    setns(userns, CloneFlags::CLONE_NEWUSER)
        .map_err(|e| io::Error::other(format!("cannot enter the sandbox's user namespace: {e}")))?;
    // setgroups is denied in a single-id namespace; there are no groups to drop there anyway.
    if map.count > 1 {
        setgroups(&[]).map_err(|e| io::Error::other(format!("cannot drop groups: {e}")))?;
    }
    let root_gid = Gid::from_raw(0);
    let root_uid = Uid::from_raw(0);
    setresgid(root_gid, root_gid, root_gid)
        .and_then(|()| setresuid(root_uid, root_uid, root_uid))
        .map_err(|e| io::Error::other(format!("cannot become the namespace's root: {e}")))
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
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
    clone_with_idmap(path, userns, false)
}

/// [`idmapped_clone`] of the mount at `path` and every mount below it.
pub fn idmapped_clone_tree(path: &Path, userns: &OwnedFd) -> io::Result<OwnedFd> {
    clone_with_idmap(path, userns, true)
}

fn clone_with_idmap(path: &Path, userns: &OwnedFd, recursive: bool) -> io::Result<OwnedFd> {
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
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
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
        return Err(context("cannot idmap", io::Error::last_os_error()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ordinary_user_maps_only_itself() {
        let map = IdMap::for_process(1000, 1001);
        assert_eq!(
            map,
            IdMap {
                uid_base: 1000,
                gid_base: 1001,
                count: 1
            }
        );
        assert!(!map.needs_idmapped_mounts());
    }

    #[test]
    fn root_never_maps_host_root() {
        let map = IdMap::for_process(0, 0);
        assert_eq!(map.count, RANGE);
        assert!(map.uid_base > 0 && map.gid_base > 0);
        assert!(map.needs_idmapped_mounts());
    }

    #[test]
    fn subordinate_ranges_are_read_for_the_user_only_when_big_enough() {
        let text = "alice:100000:65536\nroot:200000:1000\nroot:300000:65536\n";
        assert_eq!(subordinate_range(text, "root"), Some(300000));
        assert_eq!(subordinate_range(text, "alice"), Some(100000));
        assert_eq!(subordinate_range(text, "bob"), None);
        assert_eq!(subordinate_range("root:0:65536\n", "root"), None);
        assert_eq!(subordinate_range("root:4294967000:65536\n", "root"), None);
        assert_eq!(subordinate_range("garbage\nroot:x:y\n", "root"), None);
    }

    #[test]
    fn the_argument_round_trips_and_refuses_nonsense() {
        let map = IdMap {
            uid_base: 5,
            gid_base: 6,
            count: 7,
        };
        assert_eq!(IdMap::parse_arg(&map.to_arg()), Some(map));
        for bad in ["", "1:2", "1:2:3:4", "a:2:3", "1:2:0", "4294967295:0:2"] {
            assert_eq!(IdMap::parse_arg(bad), None, "{bad}");
        }
    }
}
