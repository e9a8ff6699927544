//! Whether a process is dumpable, seen from outside: `/proc/PID/status` has no such field and
//! `PR_GET_DUMPABLE` answers only for the caller.
//!
//! 1. The kernel gives a non-dumpable process's `/proc/PID/*` files (not the directory) to
//!    the root of the user namespace its memory was made in (`task_dump_owner`), a dumpable
//!    one's to its effective ids. So `/proc/PID/environ` owned by other ids than its
//!    effective ones: not dumpable.
//! 2. Owned by its effective ids, it is dumpable, unless those ids are themselves such a
//!    root (host root, or the root of its own user namespace). Then a probe decides: a
//!    forked child of this (root) test enters the process's user namespace, takes its exact
//!    ids, keeps every capability it has there but `CAP_SYS_PTRACE`, and opens
//!    `/proc/PID/environ`. The kernel's check (`__ptrace_may_access`) then refuses only a
//!    non-dumpable process.
//! 3. A process that holds `CAP_SYS_PTRACE` in a user namespace of its own passes that check
//!    only against a caller holding it there too: the probe keeps it, and a refusal then
//!    still proves "not dumpable" (its memory was made in an outer namespace, where the
//!    probe holds nothing); a success proves nothing. Host root with `CAP_SYS_PTRACE`, and
//!    ids that differ among real, effective and saved, cannot be probed at all. The table
//!    then says `unknown` and why.

use nix::libc;

use super::caps::CAP_SYS_PTRACE;
use super::procfs::RawProcess;

pub fn judge(p: &RawProcess) -> String {
    let uids = p.ids("Uid");
    let gids = p.ids("Gid");
    if p.environ_owner != (uids[1], gids[1]) {
        return "no".into();
    }
    let ns_root = |map: &[[u64; 3]]| {
        map.iter()
            .find(|line| line[0] == 0)
            .and_then(|line| u32::try_from(line[1]).ok())
    };
    let is_a_root = (uids[1] == 0 && gids[1] == 0)
        || (Some(uids[1]) == ns_root(&p.uid_map) && Some(gids[1]) == ns_root(&p.gid_map));
    if !is_a_root {
        return "yes".into();
    }
    if uids.iter().any(|u| *u != uids[0]) || gids.iter().any(|g| *g != gids[0]) {
        return "unknown (its ids differ, no probe can match them)".into();
    }
    let ptrace = p.cap("CapPrm") & (1 << CAP_SYS_PTRACE) != 0;
    let host_ns = std::fs::metadata("/proc/self/ns/user")
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    if ptrace && p.ns.get("user").copied() == host_ns {
        return "unknown (host root with CAP_SYS_PTRACE: no probe can tell)".into();
    }
    match (probe(p, ptrace), ptrace) {
        (Ok(true), false) => "yes".into(),
        (Ok(false), _) => "no".into(),
        (Ok(true), true) => {
            "unknown (it holds CAP_SYS_PTRACE in its namespace: a probe passes either way)".into()
        }
        (Err(why), _) => format!("unknown (the probe failed: {why})"),
    }
}

/// Inside ids of host id `host` in a map.
fn inside(map: &[[u64; 3]], host: u32) -> Option<u32> {
    let host = u64::from(host);
    map.iter()
        .find(|[_, outside, count]| host >= *outside && host < outside + count)
        .and_then(|[inside, outside, _]| u32::try_from(inside + (host - outside)).ok())
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// See the module's comment; `Ok(readable)`. `keep_ptrace`: the probe keeps
/// `CAP_SYS_PTRACE` in the process's namespace.
fn probe(p: &RawProcess, keep_ptrace: bool) -> Result<bool, String> {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    let (Some(uid), Some(gid)) = (
        inside(&p.uid_map, p.ids("Uid")[1]),
        inside(&p.gid_map, p.ids("Gid")[1]),
    ) else {
        return Err("its ids are not mapped in its own namespace".into());
    };
    let ours = std::fs::metadata("/proc/self/ns/user").map_err(|e| e.to_string())?;
    let theirs_path = format!("/proc/{}/ns/user", p.pid);
    let theirs = std::fs::File::open(&theirs_path).map_err(|e| e.to_string())?;
    use std::os::unix::fs::MetadataExt;
    let same_ns = theirs.metadata().map_err(|e| e.to_string())?.ino() == ours.ino();
    let environ = CString::new(format!("/proc/{}/environ", p.pid)).map_err(|e| e.to_string())?;
    let ns_fd = theirs.as_raw_fd();
    // SAFETY: the child runs only raw system calls (no allocation, no lock: this process is
    // multi-threaded) and ends with _exit; the parent waits for it.
    let child = unsafe { libc::fork() };
    if child < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    if child == 0 {
        // SAFETY: each call takes plain integers or pointers to this frame's locals (or the
        // CString made before the fork), and the child exits right after.
        unsafe {
            if !same_ns && libc::syscall(libc::SYS_setns, ns_fd, libc::CLONE_NEWUSER) != 0 {
                libc::_exit(10);
            }
            if libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0 {
                libc::_exit(11);
            }
            if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
                libc::_exit(12);
            }
            let mut header = CapHeader {
                version: 0x2008_0522,
                pid: 0,
            };
            let mut data = [CapData::default(); 2];
            if libc::syscall(
                libc::SYS_capget,
                &mut header as *mut CapHeader,
                data.as_mut_ptr(),
            ) != 0
            {
                libc::_exit(13);
            }
            data[0].effective = match keep_ptrace {
                true => data[0].permitted,
                false => data[0].permitted & !(1 << CAP_SYS_PTRACE),
            };
            data[1].effective = data[1].permitted;
            if libc::syscall(
                libc::SYS_capset,
                &mut header as *mut CapHeader,
                data.as_ptr(),
            ) != 0
            {
                libc::_exit(14);
            }
            let fd = libc::open(environ.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                libc::_exit(0);
            }
            match *libc::__errno_location() {
                libc::EACCES | libc::EPERM => libc::_exit(1),
                _ => libc::_exit(15),
            }
        }
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above; `status` is a local.
    let waited = unsafe { libc::waitpid(child, &mut status, 0) };
    if waited != child || !libc::WIFEXITED(status) {
        return Err(format!("the probe ended without a verdict ({status:#x})"));
    }
    match libc::WEXITSTATUS(status) {
        0 => Ok(true),
        1 => Ok(false),
        step => Err(format!("probe step {step} failed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inside_ids_follow_the_map() {
        let map = [[0, 1000, 1], [1, 300000, 65535]];
        assert_eq!(inside(&map, 1000), Some(0));
        assert_eq!(inside(&map, 300000), Some(1));
        assert_eq!(inside(&map, 300010), Some(11));
        assert_eq!(inside(&map, 5), None);
    }
}
