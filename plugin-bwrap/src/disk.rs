//! The writable layer's size limit (`default_disk_mb`): past it the sandbox sees ENOSPC, and
//! the host's filesystem never pays more than that.
//!
//! - **Sandboxes** (ephemeral layers): a tmpfs of `size=disk_mb`, mounted by the launcher in
//!   the sandbox's own user namespace, holds the overlay's upper and work directories. It
//!   works the same for a root and an ordinary-user adapter (tmpfs is mountable in a user
//!   namespace; loop devices and project quotas need host root and a prepared filesystem),
//!   costs nothing at create and goes with the sandbox's mount namespace. Its pages are
//!   charged to the sandbox's memory cgroup: what a sandbox writes counts against its
//!   `memory_mb` too.
//! - **Worker VMs** (persistent layers), root adapter: an ext4 image file of `disk_mb` in the
//!   layer directory (sparse: the host pays only for what was written, never more than its
//!   size), made once with `mke2fs` and attached by the launcher to a loop device
//!   (auto-clearing) in its private mount namespace before the sandbox's namespaces exist.
//! - **Worker VMs, ordinary-user adapter**: loop devices need host root; FUSE (`fuse2fs`)
//!   needs a usable `/dev/fuse` and a daemon per worker, not done yet. A tmpfs would bound the
//!   layer but lose the worker's root changes at each restart, which workers rely on, so the
//!   fallback keeps the layer a plain directory, NOT bounded, and `adapter::info` and the log
//!   say so. (Worker's `/state` is a host directory either way.)

// Loop devices are ioctls nix does not wrap.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Where a layer's size-limited filesystem is mounted, in the layer directory.
pub const DISK_DIR: &str = "disk";
/// A persistent layer's ext4 image, in the layer directory.
pub const IMAGE_FILE: &str = "disk.img";

/// The filesystem that holds a sandbox's upper and work directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// The mount point, a directory of the layer; `upper` and `work` are made in it.
    pub at: String,
    pub size_mb: u32,
    /// An ext4 image file attached through a loop device (root adapter, persistent layer);
    /// none: a tmpfs.
    pub image: Option<String>,
}

impl Disk {
    /// The upper and work directories inside the mount.
    pub fn upper_and_work(&self) -> (String, String) {
        let at = Path::new(&self.at);
        let path = |name: &str| at.join(name).display().to_string();
        (path("upper"), path("work"))
    }

    /// Mounts the filesystem at [`Disk::at`] (in the caller's mount namespace) and makes
    /// `upper` and `work` in it. A tmpfs must be mounted from the sandbox's user namespace
    /// (its files are then the sandbox's own); an image from the host's, as host root.
    pub fn mount(&self) -> io::Result<()> {
        use nix::mount::{mount, MsFlags};
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        match &self.image {
            None => {
                let options = format!("size={}m,mode=0755", self.size_mb);
                mount(
                    Some("tmpfs"),
                    self.at.as_str(),
                    Some("tmpfs"),
                    flags,
                    Some(options.as_str()),
                )
                .map_err(|e| io::Error::other(format!("cannot mount the layer's tmpfs: {e}")))?;
            }
            Some(image) => {
                let device = LoopDevice::attach(Path::new(image))?;
                // The mount holds the device from here; closing ours lets autoclear free it
                // once the mount is gone.
                mount(
                    Some(device.path.as_path()),
                    self.at.as_str(),
                    Some("ext4"),
                    flags,
                    None::<&str>,
                )
                .map_err(|e| {
                    io::Error::other(format!(
                        "cannot mount the layer's image {image} ({}): {e}",
                        device.path.display()
                    ))
                })?;
            }
        }
        let (upper, work) = self.upper_and_work();
        for dir in [upper, work] {
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// Makes `layer_dir`'s ext4 image of `size_mb` unless it exists: a sparse file formatted by
/// `mke2fs` under a temporary name, renamed into place once complete. The adapter's side.
pub async fn ensure_image(mke2fs: &Path, layer_dir: &Path, size_mb: u32) -> io::Result<PathBuf> {
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
    // No blocks reserved for root (the sandbox's root is the only user), lazy init so the
    // sparse file stays small, the image's root directory owned by on-disk root.
    let output = tokio::process::Command::new(mke2fs)
        .args(["-q", "-F", "-t", "ext4", "-m", "0"])
        .args([
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
        ])
        .arg(&partial)
        .env_clear()
        .output()
        .await?;
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

impl LoopDevice {
    fn attach(image: &Path) -> io::Result<LoopDevice> {
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
        let control = OpenOptions::new()
            .read(true)
            .write(true)
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
    fn upper_and_work_are_in_the_mount() {
        let disk = Disk {
            at: "/state/s/disk".into(),
            size_mb: 64,
            image: None,
        };
        assert_eq!(
            disk.upper_and_work(),
            ("/state/s/disk/upper".into(), "/state/s/disk/work".into())
        );
    }

    #[test]
    fn the_loop_structs_have_the_kernels_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[tokio::test]
    async fn an_image_is_made_once_sparse_and_a_planted_link_is_refused() {
        let Some(mke2fs) = ["/usr/sbin/mke2fs", "/sbin/mke2fs"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.is_file())
        else {
            println!("DID NOT RUN: no mke2fs on this host");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let image = ensure_image(mke2fs, dir.path(), 64).await.unwrap();
        let meta = std::fs::metadata(&image).unwrap();
        assert_eq!(meta.len(), 64 * 1024 * 1024);
        use std::os::unix::fs::MetadataExt;
        assert!(
            meta.blocks() * 512 < 16 * 1024 * 1024,
            "sparse: {}",
            meta.blocks()
        );
        let inode = meta.ino();
        ensure_image(mke2fs, dir.path(), 64).await.unwrap();
        assert_eq!(std::fs::metadata(&image).unwrap().ino(), inode, "kept");
        assert!(!dir.path().join("disk.img.partial").exists());

        let other = tempfile::tempdir().unwrap();
        let target = other.path().join("target");
        std::fs::write(&target, b"host file").unwrap();
        std::os::unix::fs::symlink(&target, other.path().join(IMAGE_FILE)).unwrap();
        assert!(ensure_image(mke2fs, other.path(), 64).await.is_err());
        // A link where the partial image goes is replaced, never written through.
        std::fs::remove_file(other.path().join(IMAGE_FILE)).unwrap();
        std::os::unix::fs::symlink(&target, other.path().join("disk.img.partial")).unwrap();
        ensure_image(mke2fs, other.path(), 64).await.unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"host file");
    }
}
