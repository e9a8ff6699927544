//! Descriptors the adapter inherited from whoever started it (a service manager's, a build
//! tool's jobserver pipe) are marked close-on-exec before anything else runs: otherwise every
//! launcher, bwrap, pasta and agent the adapter starts would hold them, a channel between
//! sandboxes and to the adapter's starter. The adapter uses none of them.

use nix::fcntl::{fcntl, FcntlArg, FdFlag};

/// The process's open descriptors, one entry each.
#[cfg(target_os = "linux")]
const FD_DIR: &str = "/proc/self/fd";
/// macOS has no `/proc`; its `/dev/fd` lists the same (untested here: no macOS host).
#[cfg(not(target_os = "linux"))]
const FD_DIR: &str = "/dev/fd";

/// Marks every descriptor above stderr close-on-exec. Call first in `main`, single-threaded.
pub fn close_on_exec() {
    let Ok(dir) = std::fs::read_dir(FD_DIR) else {
        return;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The directory's own descriptor is in the list and gone by now: EBADF, harmless.
        let _ = fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC));
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use nix::fcntl::{fcntl, FcntlArg, FdFlag};

    #[test]
    fn an_inherited_descriptor_is_closed_on_exec() {
        let (read, _write) = nix::unistd::pipe().unwrap();
        let flags = |fd| FdFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFD).unwrap());
        fcntl(read.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty())).unwrap();
        assert!(!flags(read.as_raw_fd()).contains(FdFlag::FD_CLOEXEC));
        super::close_on_exec();
        assert!(flags(read.as_raw_fd()).contains(FdFlag::FD_CLOEXEC));
    }
}
