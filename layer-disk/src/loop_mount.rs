//! Attaching a layer's image to a loop device and mounting it (Linux only).

use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    use crate::IMAGE_FILE;

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
}
