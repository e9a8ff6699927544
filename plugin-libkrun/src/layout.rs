//! What a libkrun sandbox keeps in its layer directory: the overlay's upper and work
//! directories, the mount point of the merged root, a private copy of the agent (shared
//! read-only with the guest), the agent's socket, the runner's specification and logs.

use std::io;
use std::path::{Path, PathBuf};

/// The guest directory holding the agent (a read-only virtio-fs share).
pub const AGENT_GUEST_DIR: &str = "/.iii-agent";
/// The agent's file name, in the share and in the guest.
pub const AGENT_FILE: &str = "sandbox-agent";

pub struct Layout {
    /// The layer directory itself: a root runner reaches everything below through an
    /// idmapped copy of it (`drop_root` in the runner's specification).
    pub dir: PathBuf,
    /// Where the runner mounts the bounded filesystem holding `upper` and `work` (on the
    /// host it stays an empty directory): for a sandbox (ephemeral layer) a tmpfs of its
    /// `disk_mb`; for a worker VM with [`Layout::image`] that image. `None` for a worker VM's
    /// persistent layer without an image, whose `upper` and `work` are directories of the
    /// layer that outlive each boot (unbounded).
    pub disk: Option<PathBuf>,
    /// A worker VM's persistent layer as an ext4 image of `disk_mb` (root adapter): see
    /// [`Layout::with_image`].
    pub image: Option<PathBuf>,
    /// A worker VM's persistent layer as an ext4 image of `disk_mb` the guest mounts itself
    /// (ordinary-user adapter): see [`Layout::with_guest_disk`].
    pub guest_disk: Option<PathBuf>,
    /// A worker VM's layer: what it holds outlives each boot.
    pub persistent: bool,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub root: PathBuf,
    pub agent_dir: PathBuf,
    pub socket: PathBuf,
    /// The vsock bus socket of earlier versions' worker VMs (now the bus is pasta's
    /// forwarded port): removed at each start of a worker VM whose layer has one.
    pub legacy_bus_socket: PathBuf,
    pub spec: PathBuf,
    pub console_log: PathBuf,
    pub runner_log: PathBuf,
    /// A sandbox with egress: its `/etc/resolv.conf` (naming the resolver proxy).
    pub resolv_conf: PathBuf,
}

impl Layout {
    /// The layout of `layer_dir`; `persistent` for a worker VM's layer (see [`Layout::disk`]).
    pub fn new(layer_dir: &Path, persistent: bool) -> Self {
        let disk = (!persistent).then(|| layer_dir.join("disk"));
        let overlay_dir = disk.clone().unwrap_or_else(|| layer_dir.to_path_buf());
        Self {
            dir: layer_dir.to_path_buf(),
            upper: overlay_dir.join("upper"),
            work: overlay_dir.join("work"),
            disk,
            image: None,
            guest_disk: None,
            persistent,
            root: layer_dir.join("root"),
            agent_dir: layer_dir.join("agent"),
            socket: layer_dir.join("agent.sock"),
            legacy_bus_socket: layer_dir.join("bus.sock"),
            spec: layer_dir.join("vm.json"),
            console_log: layer_dir.join("console.log"),
            runner_log: layer_dir.join("runner.log"),
            resolv_conf: layer_dir.join("resolv.conf"),
        }
    }

    /// A persistent layer bounded by its ext4 image (`disk.img`, made by the adapter, mounted
    /// by the root runner on `disk`): `upper` and `work` live in the image. A layer whose
    /// earlier boots used plain directories (`upper`, `work` of the layer, from before
    /// images) starts from the image's empty upper; the old directories are left as they are.
    pub fn with_image(self, layer_dir: &Path) -> Self {
        Self {
            image: Some(layer_dir.join(layer_disk::IMAGE_FILE)),
            ..self.on_disk(layer_dir)
        }
    }

    /// A persistent layer bounded by an ext4 image (`disk.img`, made by the adapter) that the
    /// VM gets as its virtio-blk disk and its init mounts under an overlay of its own: for a
    /// runner that cannot attach loop devices (an ordinary user's). On the host, `upper` and
    /// `work` are then in the runner's small tmpfs on `disk`, holding only its mount points;
    /// a layer whose earlier boots used plain directories starts from the image's empty
    /// upper, the old directories left as they are.
    pub fn with_guest_disk(self, layer_dir: &Path) -> Self {
        Self {
            guest_disk: Some(layer_dir.join(layer_disk::IMAGE_FILE)),
            ..self.on_disk(layer_dir)
        }
    }

    /// `upper` and `work` in the filesystem the runner mounts on the layer's `disk`.
    fn on_disk(self, layer_dir: &Path) -> Self {
        let disk = layer_dir.join("disk");
        Self {
            upper: disk.join("upper"),
            work: disk.join("work"),
            disk: Some(disk),
            ..self
        }
    }

    /// The ext4 image of a persistent layer, whoever mounts it.
    pub fn layer_image(&self) -> Option<&Path> {
        self.image.as_deref().or(self.guest_disk.as_deref())
    }

    /// Creates the directories and puts the agent in its share: a hard link when the state
    /// directory is on the agent's filesystem, else a copy (never the agent's own directory,
    /// which holds the adapter's other files). A `persistent` layer (worker VM) reuses what
    /// its earlier boots left: the upper and work directories as they are, the agent and the
    /// socket replaced (the adapter may have been updated, or killed before removing them).
    pub fn prepare(&self, agent: &Path) -> io::Result<()> {
        let persistent = self.persistent;
        let dirs = match &self.disk {
            // The runner makes `upper` and `work` in its tmpfs or image.
            Some(disk) => vec![disk, &self.root, &self.agent_dir],
            None => vec![&self.upper, &self.work, &self.root, &self.agent_dir],
        };
        for dir in dirs {
            if persistent {
                std::fs::create_dir_all(dir)?;
            } else {
                std::fs::create_dir(dir)?;
            }
        }
        let target = self.agent_dir.join(AGENT_FILE);
        if persistent {
            for stale in [&target, &self.socket, &self.legacy_bus_socket] {
                match std::fs::remove_file(stale) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
        }
        if std::fs::hard_link(agent, &target).is_err() {
            std::fs::copy(agent, &target)?;
        }
        Ok(())
    }
}

/// The agent's path inside the guest.
pub fn agent_in_guest() -> String {
    format!("{AGENT_GUEST_DIR}/{AGENT_FILE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_makes_the_directories_and_a_runnable_agent_copy() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("the-agent");
        std::fs::write(&agent, b"\x7fELF not really").unwrap();
        let layer = dir.path().join("layer");
        std::fs::create_dir(&layer).unwrap();
        let layout = Layout::new(&layer, false);
        layout.prepare(&agent).unwrap();
        let disk = layout.disk.clone().expect("a sandbox's layer has a disk");
        for d in [&disk, &layout.root] {
            assert!(d.is_dir(), "{}", d.display());
        }
        // Made by the runner, in the tmpfs it mounts on `disk`.
        assert_eq!(layout.upper, disk.join("upper"));
        assert_eq!(layout.work, disk.join("work"));
        assert!(!layout.upper.exists() && !layout.work.exists());
        assert_eq!(
            std::fs::read(layout.agent_dir.join(AGENT_FILE)).unwrap(),
            b"\x7fELF not really"
        );
        assert!(layout.prepare(&agent).is_err(), "a layer is prepared once");
    }

    #[test]
    fn a_persistent_layer_keeps_its_upper_and_gets_a_fresh_agent() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("the-agent");
        std::fs::write(&agent, b"old agent").unwrap();
        let layer = dir.path().join("layer");
        let layout = Layout::new(&layer, true);
        assert!(layout.disk.is_none());
        layout.prepare(&agent).unwrap();
        std::fs::create_dir(layout.upper.join("opt")).unwrap();
        std::fs::write(&layout.socket, b"").unwrap();
        std::fs::remove_file(&agent).unwrap();
        std::fs::write(&agent, b"new agent").unwrap();
        layout.prepare(&agent).unwrap();
        assert!(layout.upper.join("opt").is_dir(), "the upper layer is kept");
        assert!(!layout.socket.exists(), "a stale socket is removed");
        assert_eq!(
            std::fs::read(layout.agent_dir.join(AGENT_FILE)).unwrap(),
            b"new agent"
        );
    }
}
