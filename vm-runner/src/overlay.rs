//! The writable root: an overlay mounted over the spec's `root` in a mount namespace of the
//! runner's own, before libkrun opens the root. Nothing propagates to the host, and the
//! kernel drops the mount with the namespace when the runner exits (or is killed), so no
//! mount can leak.
//!
//! Run by an ordinary user (how Compose runs the adapter), the runner first enters a user
//! namespace of its own where its uid is root (`0 <uid> 1`): that is what lets it mount the
//! overlay, and what lets libkrun's virtio-fs server act as the guest's root on files the
//! user owns (its image cache and the sandbox's layer), with no host privilege.

use std::ffi::CString;
use std::path::Path;

use crate::guest_mounts::{self, MountError};
use crate::spec::RootOverlay;

/// Why the overlay root could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OverlayError {
    #[error("cannot make a private mount namespace: {0}")]
    Unshare(std::io::Error),
    #[error("cannot map the runner's ids in its user namespace ({file}): {source}")]
    IdMap {
        file: &'static str,
        source: std::io::Error,
    },
    #[error("cannot make the mount namespace private: {0}")]
    Private(std::io::Error),
    #[error("cannot mount the overlay root at {root}: {source}")]
    Mount {
        root: String,
        source: std::io::Error,
    },
    /// The tmpfs that bounds the writable layer, or a directory in it.
    #[error("the writable layer's tmpfs: {0}")]
    Disk(#[from] MountError),
    #[error("an overlay path holds a NUL byte")]
    Nul,
    /// The ext4 image that bounds a persistent layer.
    #[error("the layer's image: {0}")]
    Image(std::io::Error),
    #[error(
        "a layer image needs a loop device, which only a runner started by host root can attach"
    )]
    ImageNeedsRoot,
}

/// Makes the calling process root of a user namespace of its own whose only ids are its own
/// (`0 <uid> 1`): with it, an ordinary user's process has the capabilities over its own
/// files that a runner of the same user has over its guest's (modes do not stop it).
pub(crate) fn become_root_of_own_namespace() -> Result<(), OverlayError> {
    // SAFETY: geteuid/getegid take nothing and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // SAFETY: plain system call on the calling process; no memory is passed.
    if unsafe { libc::unshare(libc::CLONE_NEWUSER) } != 0 {
        return Err(OverlayError::Unshare(std::io::Error::last_os_error()));
    }
    map_self_to_root(uid, gid)
}

/// In a user namespace just made: the caller's own ids become root, the only mapping an
/// unprivileged process may write (and only with setgroups denied).
fn map_self_to_root(uid: libc::uid_t, gid: libc::gid_t) -> Result<(), OverlayError> {
    for (file, text) in [
        ("/proc/self/setgroups", "deny".to_string()),
        ("/proc/self/uid_map", format!("0 {uid} 1\n")),
        ("/proc/self/gid_map", format!("0 {gid} 1\n")),
    ] {
        std::fs::write(file, text).map_err(|source| OverlayError::IdMap { file, source })?;
    }
    Ok(())
}

/// Moves the runner into a fresh mount namespace that shares nothing back with the host (for
/// an ordinary user, inside a user namespace of its own where its ids are root). Must run
/// while the process has a single thread (`unshare(CLONE_NEWNS)` refuses otherwise).
pub fn enter_private_namespace() -> Result<(), OverlayError> {
    // SAFETY: geteuid/getegid take nothing and cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let flags = if uid == 0 {
        libc::CLONE_NEWNS
    } else {
        libc::CLONE_NEWNS | libc::CLONE_NEWUSER
    };
    // SAFETY: plain system call on the calling process; no memory is passed.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(OverlayError::Unshare(std::io::Error::last_os_error()));
    }
    if uid != 0 {
        map_self_to_root(uid, gid)?;
    }
    idmap_mount::make_mounts_private().map_err(OverlayError::Private)
}

/// Whether [`enter_private_namespace`] put the runner in a user namespace of its own (it
/// then is root there, but was not on the host).
fn in_own_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map")
        .map(|map| !map.split_whitespace().eq(["0", "0", "4294967295"]))
        .unwrap_or(false)
}

/// A persistent layer's `image` (if any) mounted on its disk directory as host root, through
/// a loop device, nosuid and nodev like the tmpfs; `upper` and `work` made there on its first
/// boot, kept from earlier ones.
pub(crate) fn mount_image(overlay: &RootOverlay) -> Result<(), OverlayError> {
    let (Some(image), Some(dir)) = (&overlay.image, overlay.disk_dir()) else {
        return Ok(());
    };
    layer_disk::mount_image(image, dir, libc::MS_NOSUID | libc::MS_NODEV)
        .map_err(OverlayError::Image)?;
    for made in [&overlay.upper, &overlay.work] {
        match std::fs::create_dir(made) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(guest_mounts::io_error("make", made, e).into())
            }
            _ => {}
        }
    }
    Ok(())
}

/// Mounts `overlay` at `root`; call [`enter_private_namespace`] first. `image_mounted`: a
/// root runner that gave root up mounted the layer's image before (`drop_root.rs`).
pub fn mount(root: &Path, overlay: &RootOverlay, image_mounted: bool) -> Result<(), OverlayError> {
    // The bound of the guest's writes (ENOSPC past it): a tmpfs holding upper and work,
    // mountable by an ordinary user's runner in its own user namespace; on the host the
    // directory stays empty.
    if let (Some(size), Some(dir)) = (overlay.size_mib, overlay.disk_dir()) {
        guest_mounts::tmpfs(dir, Some(size))?;
        for made in [&overlay.upper, &overlay.work] {
            std::fs::create_dir(made).map_err(|e| guest_mounts::io_error("make", made, e))?;
        }
    }
    // A persistent layer's bound: its ext4 image, through a loop device (host root only),
    // mounted nosuid and nodev like the tmpfs; `upper` and `work` are kept from earlier boots.
    if overlay.image.is_some() && !image_mounted {
        if in_own_user_namespace() {
            return Err(OverlayError::ImageNeedsRoot);
        }
        mount_image(overlay)?;
    }
    // A snapshot's layers over the image, the top-most first, as overlayfs lists them.
    let lower = overlay
        .layers
        .iter()
        .chain(std::iter::once(&overlay.lower))
        .map(|layer| layer.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    // Mounted by a user namespace, overlayfs keeps its own xattrs in `user.*`.
    let options = format!(
        "{}lowerdir={},upperdir={},workdir={}",
        if in_own_user_namespace() {
            "userxattr,"
        } else {
            ""
        },
        lower,
        overlay.upper.display(),
        overlay.work.display()
    );
    let options = CString::new(options).map_err(|_| OverlayError::Nul)?;
    let target =
        CString::new(root.as_os_str().as_encoded_bytes()).map_err(|_| OverlayError::Nul)?;
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
