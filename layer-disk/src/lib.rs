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

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

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

/// How long a mount waits for an earlier mount of the same image to be gone.
pub const EARLIER_MOUNT_WAIT: Duration = Duration::from_secs(60);

/// Attaches `image` to a free loop device and mounts its ext4 filesystem at `at` with
/// `flags` (in the caller's mount namespace; host root). The mount then holds the device,
/// which the kernel frees once the mount is gone (auto-clear).
///
/// One mount of an image at a time: the image is locked (`flock`) on the descriptor the loop
/// device keeps, so the lock lasts until the kernel has let go of the filesystem, which can
/// be after the process that mounted it is gone (its mount namespace ends with the last
/// process in it, then the filesystem is flushed and the device cleared). A second mount of
/// the same image meanwhile would read it before that flush (and two ext4 instances on one
/// image corrupt it): this waits up to [`EARLIER_MOUNT_WAIT`] for the lock instead.
pub fn mount_image(image: &Path, at: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let backing = open_image(image)?;
    lock_within(&backing, image, EARLIER_MOUNT_WAIT)?;
    let device = LoopDevice::attach(&backing, image)?;
    let c_path = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::other(format!("{} holds a NUL byte", p.display())))
    };
    let (source, target) = (c_path(&device.path)?, c_path(at)?);
    // SAFETY: NUL-terminated strings that outlive the call and a null data pointer, as
    // mount(2) allows for ext4 with no options.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            c"ext4".as_ptr(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "cannot mount the layer's image {} ({}): {e}",
                image.display(),
                device.path.display()
            ),
        ));
    }
    Ok(())
}

// <linux/loop.h>
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A loop device bound to an image file, cleared by the kernel once nothing uses it.
struct LoopDevice {
    path: PathBuf,
    _device: File,
}

/// The image, read-write, never through a link, and only if it is a regular file.
fn open_image(image: &Path) -> io::Result<File> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(image)?;
    if !backing.metadata()?.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            image.display()
        )));
    }
    Ok(backing)
}

/// Opens `image` (a regular file, never through a link) and takes the same lock as
/// [`mount_image`], waiting up to [`EARLIER_MOUNT_WAIT`] for an earlier holder: for a VM that
/// gets the image as its own disk, so two VMs (a dying one and its successor) never write one
/// filesystem at once. The lock lasts while the returned file is open.
pub fn lock_image(image: &Path) -> io::Result<File> {
    let file = open_image(image)?;
    lock_within(&file, image, EARLIER_MOUNT_WAIT)?;
    Ok(file)
}

/// Takes `file`'s exclusive lock, waiting up to `wait` for whoever holds it.
fn lock_within(file: &File, image: &Path, wait: Duration) -> io::Result<()> {
    let deadline = Instant::now() + wait;
    loop {
        // SAFETY: flock on a descriptor we own; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e);
        }
        if Instant::now() >= deadline {
            return Err(io::Error::other(format!(
                "{} is still mounted by an earlier boot after {} s",
                image.display(),
                wait.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl LoopDevice {
    /// Binds a free loop device to `backing` (the opened `image`); the device keeps its own
    /// reference to that open file, and with it the file's lock.
    fn attach(backing: &File, image: &Path) -> io::Result<LoopDevice> {
        let control = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/loop-control")?;
        // Another process may take the free device between the two calls: ask again.
        for _ in 0..32 {
            // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
            let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if number < 0 {
                return Err(io::Error::last_os_error());
            }
            let path = PathBuf::from(format!("/dev/loop{number}"));
            let device = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&path)?;
            let config = LoopConfig {
                fd: backing.as_raw_fd() as u32,
                block_size: 0,
                // SAFETY: an all-zero loop_info64 is the kernel's "no options" value.
                info: LoopInfo64 {
                    lo_flags: LO_FLAGS_AUTOCLEAR,
                    ..unsafe { std::mem::zeroed() }
                },
                reserved: [0; 8],
            };
            // SAFETY: `config` is a properly laid out loop_config that outlives the call; the
            // kernel only reads it.
            let rc = unsafe {
                libc::ioctl(
                    device.as_raw_fd(),
                    LOOP_CONFIGURE,
                    &config as *const LoopConfig,
                )
            };
            if rc == 0 {
                return Ok(LoopDevice {
                    path,
                    _device: device,
                });
            }
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot attach {} to {}: {e}",
                        image.display(),
                        path.display()
                    ),
                ));
            }
        }
        Err(io::Error::other("no free loop device"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_structs_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[test]
    fn a_locked_image_waits_for_its_holder_then_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join(IMAGE_FILE);
        std::fs::write(&image, b"").unwrap();
        let holder = open_image(&image).unwrap();
        lock_within(&holder, &image, Duration::ZERO).unwrap();
        let second = open_image(&image).unwrap();
        let err = lock_within(&second, &image, Duration::from_millis(120)).unwrap_err();
        assert!(
            err.to_string().contains("still mounted by an earlier boot"),
            "{err}"
        );
        let released = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(holder);
        });
        lock_within(&second, &image, Duration::from_secs(10)).expect("taken once released");
        released.join().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&image, &link).unwrap();
        assert!(open_image(&link).is_err(), "never through a link");
    }

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
