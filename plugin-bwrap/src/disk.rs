//! The writable layer's size limit (`default_disk_mb`): past it the sandbox sees ENOSPC, and
//! the host's filesystem never pays more than that.
//!
//! - **Sandboxes** (ephemeral layers): one tmpfs, mounted by the launcher in the sandbox's own
//!   user namespace, holds the overlay's upper and work directories and the directories
//!   shown as `/tmp` and `/dev/shm`, so everything a sandbox writes shares one bound. It works
//!   the same for a root and an ordinary-user adapter (tmpfs is mountable in a user
//!   namespace; loop devices and project quotas need host root and a prepared filesystem),
//!   costs nothing at create and goes with the sandbox's mount namespace. Its pages are
//!   charged to the sandbox's memory cgroup, so its size is `disk_mb` but never more than
//!   three quarters of `memory_mb` ([`sandbox_tmpfs_mb`]): a full layer is ENOSPC while its
//!   programs still have a quarter of the memory, never the OOM killer. Measured before: at
//!   the defaults (512 MiB of memory, 1024 MiB of disk) a program writing 4 GiB was killed
//!   (137) at about 509 MiB. Chosen over an ext4 image on a loop device (what workers get):
//!   that costs a create 15-30 ms of `mke2fs` and 16-35 ms to attach and mount, and 30-70 ms
//!   to take down, needs host root (an ordinary user's adapter would still need this bound),
//!   and `/tmp` and `/dev/shm` would stay in memory anyway.
//! - **A worker's `/tmp` and `/dev/shm`** are tmpfs of their own (its layer lives on, they
//!   do not), splitting the same budget ([`worker_scratch_mb`]).
//! - **Worker VMs** (persistent layers), root adapter: an ext4 image file of `disk_mb` in the
//!   layer directory (sparse: the host pays only for what was written, never more than its
//!   size), made once with `mke2fs` and attached by the launcher to a loop device
//!   (auto-clearing) in its private mount namespace before the sandbox's namespaces exist
//!   (the `layer-disk` crate, shared with the libkrun VM runner).
//! - **A worker's `/state`**, root adapter: a directory `state` of the same image, beside
//!   `upper` and `work`, so the worker's root changes and its state share `disk_mb` together.
//!   A worker whose host `/state` directory already holds files (written before `/state`
//!   moved into the image) keeps that directory, NOT bounded, saying so in the log: its data
//!   is never moved by the adapter (a guest wrote it; a copy as root is what an attacker
//!   wants) nor dropped. Destroying and preparing the worker again bounds it.
//! - **Worker VMs, ordinary-user adapter**: loop devices need host root, so the same image is
//!   served by FUSE daemons in the sandbox's namespaces (`fuse_disk.rs`) where the host has
//!   `fuse2fs`, `fuse-overlayfs` and a `/dev/fuse` open to the adapter's user. Without them a
//!   tmpfs would bound the layer but lose the worker's root changes at each restart, which
//!   workers rely on, so the fallback keeps the layer and `/state` plain directories, NOT
//!   bounded, and `adapter::info` and the log say so.

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::fuse_disk::FuseTools;

/// Where a layer's size-limited filesystem is mounted, in the layer directory.
pub const DISK_DIR: &str = "disk";

/// The filesystem that holds a sandbox's upper and work directories.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// The mount point, a directory of the layer; `upper` and `work` are made in it.
    pub at: String,
    pub size_mb: u32,
    /// An ext4 image file (persistent layer), attached through a loop device (root adapter)
    /// or served by [`Disk::fuse`]; none: a tmpfs.
    pub image: Option<String>,
    /// Serves [`Disk::image`] and the overlay over it without host root (ordinary-user
    /// adapter); the launcher then mounts no kernel overlay.
    #[serde(default)]
    pub fuse: Option<FuseTools>,
    /// Also holds the worker's `/state`, the directory [`STATE_DIR`] of the mount.
    #[serde(default)]
    pub state: bool,
}

/// The directory of a layer image that holds a worker's `/state`.
pub const STATE_DIR: &str = "state";
/// The directories of a sandbox's tmpfs shown as its `/tmp` and `/dev/shm`.
pub const TMP_DIR: &str = "tmp";
pub const SHM_DIR: &str = "shm";

/// A sandbox's tmpfs, MiB: `disk_mb`, but at most three quarters of `memory_mb` (its pages
/// are the sandbox's memory; the quarter left is for its programs), and at least 1.
pub fn sandbox_tmpfs_mb(disk_mb: u32, memory_mb: u32) -> u32 {
    let three_quarters = u32::try_from(u64::from(memory_mb) * 3 / 4).unwrap_or(u32::MAX);
    disk_mb.min(three_quarters).max(1)
}

/// A worker's `/tmp` and `/dev/shm`, MiB: the budget of [`sandbox_tmpfs_mb`], of which
/// `/dev/shm` gets a quarter up to 64 MiB.
pub fn worker_scratch_mb(disk_mb: u32, memory_mb: u32) -> (u32, u32) {
    let budget = sandbox_tmpfs_mb(disk_mb, memory_mb);
    let shm = (budget / 4).clamp(1, 64);
    (budget.saturating_sub(shm).max(1), shm)
}

impl Disk {
    /// The upper and work directories inside the mount.
    pub fn upper_and_work(&self) -> (String, String) {
        (self.path("upper"), self.path("work"))
    }

    /// Where the worker's `/state` is, inside the mount.
    pub fn state_dir(&self) -> String {
        self.path(STATE_DIR)
    }

    /// What a tmpfs shows as `/tmp` and `/dev/shm`.
    pub fn tmp_and_shm(&self) -> (String, String) {
        (self.path(TMP_DIR), self.path(SHM_DIR))
    }

    fn path(&self, name: &str) -> String {
        Path::new(&self.at).join(name).display().to_string()
    }

    /// Mounts the filesystem at [`Disk::at`] (in the caller's mount namespace) and makes
    /// `upper`, `work` (and `state` when it holds one) in it. A tmpfs, and an image served by
    /// FUSE, must be mounted from the sandbox's user namespace (their files are then the
    /// sandbox's own); an image on a loop device from the host's, as host root.
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
            Some(image) => match &self.fuse {
                Some(fuse) => fuse.mount_image(Path::new(image), Path::new(&self.at))?,
                None => {
                    layer_disk::mount_image(Path::new(image), Path::new(&self.at), flags.bits())?
                }
            },
        }
        let (upper, work) = self.upper_and_work();
        let state = self.state.then(|| self.state_dir());
        for dir in [Some(upper), Some(work), state].into_iter().flatten() {
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        if self.image.is_none() {
            use std::os::unix::fs::PermissionsExt;
            let (tmp, shm) = self.tmp_and_shm();
            for dir in [tmp, shm] {
                std::fs::create_dir(&dir)?;
                // Everyone's, sticky, as a `/tmp` is.
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777))?;
            }
        }
        Ok(())
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
            fuse: None,
            state: false,
        };
        assert_eq!(
            disk.upper_and_work(),
            ("/state/s/disk/upper".into(), "/state/s/disk/work".into())
        );
        assert_eq!(disk.state_dir(), "/state/s/disk/state");
        assert_eq!(
            disk.tmp_and_shm(),
            ("/state/s/disk/tmp".into(), "/state/s/disk/shm".into())
        );
    }

    #[test]
    fn a_tmpfs_never_holds_more_than_three_quarters_of_the_memory() {
        // The defaults: 1024 MiB of disk, 512 of memory.
        assert_eq!(sandbox_tmpfs_mb(1024, 512), 384);
        assert_eq!(sandbox_tmpfs_mb(1024, 4096), 1024);
        assert_eq!(sandbox_tmpfs_mb(64, 512), 64);
        assert_eq!(sandbox_tmpfs_mb(1024, 16), 12);
        assert_eq!(sandbox_tmpfs_mb(1024, 1), 1);
        assert_eq!(sandbox_tmpfs_mb(u32::MAX, u32::MAX), u32::MAX / 4 * 3 + 2);
        // A worker's /tmp and /dev/shm split the same budget.
        assert_eq!(worker_scratch_mb(1024, 512), (320, 64));
        assert_eq!(worker_scratch_mb(64, 512), (48, 16));
        assert_eq!(worker_scratch_mb(1, 512), (1, 1));
    }
}
