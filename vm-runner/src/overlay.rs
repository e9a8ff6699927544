//! The writable root: an overlay mounted over the spec's `root` in a mount namespace of the
//! runner's own, before libkrun opens the root. Nothing propagates to the host, and the
//! kernel drops the mount with the namespace when the runner exits (or is killed), so no
//! mount can leak.

use std::ffi::CString;
use std::path::Path;

use crate::spec::RootOverlay;

/// Why the overlay root could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("cannot make a private mount namespace: {0}")]
    Unshare(std::io::Error),
    #[error("cannot make the mount namespace private: {0}")]
    Private(std::io::Error),
    #[error("cannot mount the overlay root at {root}: {source}")]
    Mount {
        root: String,
        source: std::io::Error,
    },
    #[error("an overlay path holds a NUL byte")]
    Nul,
}

/// Mounts `overlay` at `root` in a fresh private mount namespace. Must run while the
/// process has a single thread (`unshare(CLONE_NEWNS)` refuses otherwise).
pub fn mount_private(root: &Path, overlay: &RootOverlay) -> Result<(), OverlayError> {
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        overlay.lower.display(),
        overlay.upper.display(),
        overlay.work.display()
    );
    let options = CString::new(options).map_err(|_| OverlayError::Nul)?;
    let target =
        CString::new(root.as_os_str().as_encoded_bytes()).map_err(|_| OverlayError::Nul)?;

    // SAFETY: plain system call on the calling process; no memory is passed.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(OverlayError::Unshare(std::io::Error::last_os_error()));
    }
    // SAFETY: NUL-terminated static strings and null pointers, as mount(2) allows for a
    // propagation change.
    let private = unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if private != 0 {
        return Err(OverlayError::Private(std::io::Error::last_os_error()));
    }
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let mounted = unsafe {
        libc::mount(
            c"overlay".as_ptr(),
            target.as_ptr(),
            c"overlay".as_ptr(),
            0,
            options.as_ptr().cast(),
        )
    };
    if mounted != 0 {
        return Err(OverlayError::Mount {
            root: root.display().to_string(),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}
