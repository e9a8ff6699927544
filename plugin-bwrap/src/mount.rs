//! The per-sandbox writable root: an overlay of the image's read-only root and the sandbox's
//! own upper directory, mounted in a private mount namespace made for bwrap just before it
//! starts. The mount lives only as long as the sandbox's processes, so even a `kill -9` of
//! the adapter leaves no mount behind, only files that reconciliation removes.

#![allow(unsafe_code)]

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Everything the child needs, prepared before `fork` so the child only makes system calls.
pub struct OverlaySetup {
    merged: CString,
    options: CString,
    cgroup_procs: Vec<CString>,
}

impl OverlaySetup {
    pub fn new(
        lower: &Path,
        upper: &Path,
        work: &Path,
        merged: &Path,
        cgroup_procs: Vec<CString>,
    ) -> io::Result<Self> {
        for dir in [lower, upper, work] {
            let bytes = dir.as_os_str().as_bytes();
            if bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\')) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} holds a character overlayfs options cannot carry (',', ':' or '\\')",
                        dir.display()
                    ),
                ));
            }
        }
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        Ok(Self {
            merged: cstring(merged.as_os_str().as_bytes())?,
            options: cstring(options.as_bytes())?,
            cgroup_procs,
        })
    }

    /// Runs in the forked child before `exec` of bwrap: joins the cgroups, unshares the mount
    /// namespace and mounts the overlay.
    ///
    /// # Safety
    /// Only async-signal-safe calls (`open`, `write`, `close`, `unshare`, `mount`) on memory
    /// prepared before `fork`; no allocation.
    pub unsafe fn apply_in_child(&self) -> io::Result<()> {
        for procs in &self.cgroup_procs {
            // SAFETY: `procs` is a NUL-terminated path owned by `self`; the fd is closed below.
            let fd = unsafe { libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
            if fd >= 0 {
                // SAFETY: writes one byte from a static buffer to an fd we own. "0" names the
                // writing process, so bwrap and everything it starts is in the cgroup.
                unsafe {
                    libc::write(fd, b"0".as_ptr().cast(), 1);
                    libc::close(fd);
                }
            }
        }
        // SAFETY: plain system call on the calling (child) process.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let root = c"/";
        // SAFETY: NUL-terminated static strings; makes our new namespace's mounts private so
        // nothing propagates back to the host.
        let private = unsafe {
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            )
        };
        if private != 0 {
            return Err(io::Error::last_os_error());
        }
        let overlay = c"overlay";
        // SAFETY: all pointers are NUL-terminated strings owned by `self` or static.
        let mounted = unsafe {
            libc::mount(
                overlay.as_ptr(),
                self.merged.as_ptr(),
                overlay.as_ptr(),
                0,
                self.options.as_ptr().cast(),
            )
        };
        if mounted != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}
