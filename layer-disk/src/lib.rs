//! A worker's persistent writable layer as an ext4 image of a fixed size: past it the guest
//! sees ENOSPC, and the host's filesystem never pays more than that (the file is sparse).
//!
//! The adapter makes the image once ([`ensure_image`], with `mke2fs`); whoever mounts the
//! layer (the bwrap launcher, the libkrun VM runner) attaches it to a loop device that the
//! kernel clears once its mount is gone ([`mount_image`]), in a mount namespace of its own.
//! Loop devices need host root: an ordinary-user adapter cannot use this (see each plugin's
//! `worker_layers` in `adapter::info`). The guest never sees the image file, only the
//! filesystem in it, so it cannot hand the host's ext4 driver bytes of its choosing.
//!
//! Hand-written because no maintained crate wraps `LOOP_CONFIGURE` (loopdev's last release
//! predates it) and the rest is two system calls.

// Loop devices are ioctls no crate we use wraps.
#![allow(unsafe_code)]

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

// Loop devices and mount(2) are Linux's: elsewhere (macOS) images are made, never mounted.
#[cfg(target_os = "linux")]
mod loop_mount;
#[cfg(target_os = "linux")]
pub use loop_mount::{lock_image, mount_image, EARLIER_MOUNT_WAIT};

/// A persistent layer's ext4 image, in the layer directory.
pub const IMAGE_FILE: &str = "disk.img";

/// `mke2fs` from `PATH`, else where Debian puts it (`/usr/sbin` is not on every user's PATH).
pub fn find_mke2fs() -> Option<PathBuf> {
    find_tool("mke2fs")
}

/// A program from `PATH`, else from the `sbin` directories where Debian puts e2fsprogs'.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let in_path = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    });
    in_path.or_else(|| {
        ["/usr/sbin", "/sbin", "/usr/bin"]
            .into_iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|p| p.is_file())
    })
}

/// Makes `layer_dir`'s ext4 image of `size_mb` unless it exists: a sparse file formatted by
/// `mke2fs` under a temporary name, renamed into place once complete. Never follows a link
/// (an existing image must be a regular file). Blocks for the mke2fs run (tens of ms).
pub fn ensure_image(mke2fs: &Path, layer_dir: &Path, size_mb: u32) -> io::Result<PathBuf> {
    let image = layer_dir.join(IMAGE_FILE);
    match std::fs::symlink_metadata(&image) {
        Ok(meta) if meta.file_type().is_file() => return Ok(image),
        Ok(_) => {
            return Err(io::Error::other(format!(
                "{} is not a regular file",
                image.display()
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let partial = layer_dir.join(format!("{IMAGE_FILE}.partial"));
    let _ = std::fs::remove_file(&partial);
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&partial)?;
    file.set_len(u64::from(size_mb) * 1024 * 1024)?;
    drop(file);
    // No blocks reserved for root (the guest's root is the only user), lazy init so the
    // sparse file stays small, the image's root directory owned by on-disk root.
    let output = Command::new(mke2fs)
        .args(["-q", "-F", "-t", "ext4", "-m", "0"])
        .args([
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
        ])
        .arg(&partial)
        .env_clear()
        .output()?;
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        return Err(io::Error::other(format!(
            "mke2fs failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    std::fs::rename(&partial, &image)?;
    Ok(image)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_made_once_sparse_and_a_planted_link_is_refused() {
        let Some(mke2fs) = find_mke2fs() else {
            println!("DID NOT RUN: no mke2fs on this host");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let image = ensure_image(&mke2fs, dir.path(), 64).unwrap();
        let meta = std::fs::metadata(&image).unwrap();
        assert_eq!(meta.len(), 64 * 1024 * 1024);
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < 16 * 1024 * 1024,
            "sparse: {}",
            meta.blocks()
        );
        let inode = meta.ino();
        ensure_image(&mke2fs, dir.path(), 64).unwrap();
        assert_eq!(std::fs::metadata(&image).unwrap().ino(), inode, "kept");
        assert!(!dir.path().join("disk.img.partial").exists());

        let other = tempfile::tempdir().unwrap();
        let target = other.path().join("target");
        std::fs::write(&target, b"host file").unwrap();
        std::os::unix::fs::symlink(&target, other.path().join(IMAGE_FILE)).unwrap();
        assert!(ensure_image(&mke2fs, other.path(), 64).is_err());
        // A link where the partial image goes is replaced, never written through.
        std::fs::remove_file(other.path().join(IMAGE_FILE)).unwrap();
        std::os::unix::fs::symlink(&target, other.path().join("disk.img.partial")).unwrap();
        ensure_image(&mke2fs, other.path(), 64).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"host file");
    }
}
