//! The VM specification: what the runner is asked to boot, and its validation.
//!
//! Validation happens entirely before any libkrun call, so a bad specification never
//! half-configures a VM. The checks are the ones libkrun would otherwise fail on late or
//! silently (a relative path, a NUL byte, a socket path that already exists).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Upper bound on vCPUs; libkrun takes a `u8` and the guest kernel caps far lower anyway.
pub const MAX_VCPUS: u8 = 64;
/// Lower bound on guest memory: libkrunfw's kernel does not come up below this.
pub const MIN_MEMORY_MIB: u32 = 64;
/// Arguments plus environment entries: libkrun's guest init parses its JSON config with a
/// fixed token budget (16384 tokens), so we refuse well before hitting it.
pub const MAX_ARGS_AND_ENV: usize = 8000;
/// Where a root runner that gives root up gathers what the VM uses, in its private mount
/// namespace (see `drop_root.rs`): the layer directory is `layer` there.
pub const DROP_ROOT_STAGE: &str = "/tmp";

/// The most snapshot layers a root may stack (the adapter's own bound is the same): each is
/// one more entry of overlayfs's `lowerdir`, whose options must fit one page.
pub const MAX_SNAPSHOT_LAYERS: usize = 16;
/// libkrun's unix socket paths go into `sockaddr_un.sun_path` (108 bytes with the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// Who listens on a bridged vsock port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VsockDirection {
    /// The guest listens on the vsock port; the runner creates the host unix socket and
    /// forwards each connection made to it into the guest.
    GuestListens,
    /// A host program listens on the unix socket; the guest connects to CID 2 at the port.
    HostListens,
}

/// A host directory exposed to the guest over virtio-fs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Share {
    /// virtio-fs tag (what the guest mounts).
    pub tag: String,
    /// Host directory to expose.
    pub host_path: PathBuf,
    /// Absolute path where the guest mounts it.
    pub guest_path: PathBuf,
    /// Read-only on both sides (host device and guest mount).
    #[serde(default)]
    pub read_only: bool,
}

/// A vsock port bridged to a host unix socket.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VsockPort {
    pub port: u32,
    /// Host unix socket path.
    pub socket: PathBuf,
    pub direction: VsockDirection,
}

/// A writable root made of a read-only lower directory and a writable upper one, mounted
/// by the runner over `root` in its own private mount namespace before the VM starts. The
/// mount is seen by nobody else and vanishes with the runner, even after a `kill -9`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootOverlay {
    /// Read-only content (never written).
    pub lower: PathBuf,
    /// A snapshot's layers (earlier sandboxes' upper directories, copied): stacked read-only
    /// over `lower`, the top-most first. Only under an ephemeral layer (`size_mib` without a
    /// guest disk): a worker VM never starts from a snapshot.
    #[serde(default)]
    pub layers: Vec<PathBuf>,
    /// Receives every change the guest makes.
    pub upper: PathBuf,
    /// overlayfs's scratch directory; same filesystem as `upper`, empty.
    pub work: PathBuf,
    /// Bounds the writable layer: the runner first mounts a tmpfs of this many MiB on the
    /// directory holding `upper` and `work` (in its own mount namespace) and makes both in
    /// it. Past it the guest's writes fail with ENOSPC; the host pays at most this much
    /// memory and nothing on disk, and the layer goes with the runner (an ephemeral root).
    #[serde(default)]
    pub size_mib: Option<u32>,
    /// Bounds a persistent layer (a worker VM's): an ext4 image the adapter made (sparse, of
    /// the layer's size), which the runner attaches to a loop device and mounts on the
    /// directory holding `upper` and `work` (making them on its first boot). Past its size
    /// the guest's writes fail with ENOSPC; what it holds outlives the runner. Loop devices
    /// need host root: an ordinary user's runner refuses it.
    #[serde(default)]
    pub image: Option<PathBuf>,
    /// Bounds a persistent layer without loop devices (an ordinary user's runner): an ext4
    /// image the adapter made, attached to the guest as its virtio-blk disk. The guest's init
    /// mounts it (nosuid, nodev) and lays an overlay of its own over the shared root, with
    /// its upper and work there, so the guest's writes land in the image (ENOSPC past its
    /// size) and outlive the runner; the spec's mounts and shares are bound again over that
    /// overlay, as they were. Needs `size_mib`: the host-side tmpfs then holds only the
    /// runner's mount points.
    #[serde(default)]
    pub guest_disk: Option<PathBuf>,
}

impl RootOverlay {
    /// An ephemeral layer held by the runner's tmpfs (a sandbox's, not a worker VM's): its
    /// upper directory is what a snapshot copies (see `own_root.rs`).
    pub fn ephemeral(&self) -> bool {
        self.size_mib.is_some() && self.image.is_none() && self.guest_disk.is_none()
    }

    /// Where the tmpfs of `size_mib` or the `image` is mounted: the directory holding
    /// `upper` and `work`.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.upper.parent()
    }

    /// With a guest disk, where the runner makes the spec's mounts (in its host-side tmpfs,
    /// beside `upper` and `work`): shared with the guest as [`MOUNTS_TAG`], whose init binds
    /// them over its own root. Not inside the shared root: the guest sees a host mount point
    /// there as a submount, which overlayfs refuses to look up in a lower layer (EREMOTE).
    pub fn guest_mounts_dir(&self) -> Option<PathBuf> {
        self.guest_disk.as_ref()?;
        Some(self.disk_dir()?.join("mounts"))
    }

    /// Whether the runner mounts a bounded filesystem (and makes `upper` and `work` in it).
    pub fn bounded(&self) -> bool {
        self.size_mib.is_some() || self.image.is_some() || self.guest_disk.is_some()
    }
}

/// The share holding the spec's mounts when the guest has its own disk
/// ([`RootOverlay::guest_mounts_dir`]), and where the guest init mounts it.
pub const MOUNTS_TAG: &str = "iii-mounts";
pub const MOUNTS_GUEST_DIR: &str = "/.iii-mounts";

/// An extra mount the runner sets up inside the (merged) root before the guest starts; the
/// guest sees it through the root's virtio-fs share. Applied in order, so later entries may
/// lie inside earlier ones (a read-only tmpfs holding read-only binds).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum GuestMount {
    /// A host file or directory bound at `guest_path`.
    Bind {
        host_path: PathBuf,
        guest_path: String,
        #[serde(default)]
        read_only: bool,
    },
    /// An empty in-memory directory; made read-only once every mount is in place.
    Tmpfs {
        guest_path: String,
        #[serde(default)]
        read_only: bool,
    },
    /// A symbolic link whose text is `target` (resolved inside the guest).
    Symlink { target: String, guest_path: String },
    /// The directory `name` of the root overlay's bounded filesystem (its tmpfs or image,
    /// beside `upper` and `work`; made on first use), bound writable at `guest_path`: a
    /// worker's `/state` then shares the layer's bound and persists with its image.
    LayerDir { name: String, guest_path: String },
}

impl GuestMount {
    pub fn guest_path(&self) -> &str {
        match self {
            GuestMount::Bind { guest_path, .. }
            | GuestMount::Tmpfs { guest_path, .. }
            | GuestMount::Symlink { guest_path, .. }
            | GuestMount::LayerDir { guest_path, .. } => guest_path,
        }
    }
}

/// The whole VM specification, as read from JSON.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmSpec {
    pub vcpus: u8,
    pub memory_mib: u32,
    /// Host directory used as the guest's root filesystem (virtio-fs).
    pub root: PathBuf,
    /// Mount an overlay over `root` first (see [`RootOverlay`]).
    #[serde(default)]
    pub root_overlay: Option<RootOverlay>,
    #[serde(default)]
    pub shares: Vec<Share>,
    /// Mounts made inside `root` on the host side (see [`GuestMount`]).
    #[serde(default)]
    pub mounts: Vec<GuestMount>,
    #[serde(default)]
    pub vsock: Vec<VsockPort>,
    /// Program to run inside the guest (absolute guest path); it is also argv\[0\].
    pub workload: String,
    /// Arguments after argv\[0\]; passed byte for byte (quotes and spaces survive).
    #[serde(default)]
    pub argv: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Guest working directory (default `/`).
    #[serde(default)]
    pub workdir: Option<String>,
    /// Host file receiving the guest console; without it (and without `console_fd`) the
    /// console goes to libkrun's log, our stderr.
    #[serde(default)]
    pub console_log: Option<PathBuf>,
    /// A descriptor inherited from our parent (1 = our stdout, or one >= 3) receiving the
    /// guest console instead, e.g. a pipe whose reader keeps it within a bound, so a guest
    /// writing to its console without end cannot fill the host's disk. Not together with
    /// `console_log`.
    #[serde(default)]
    pub console_fd: Option<i32>,
    /// Networking (libkrun's TSI): off unless asked.
    #[serde(default)]
    pub network: bool,
    /// With `network`: the egress policy TSI's sockets are judged by. TSI turns the guest's
    /// sockets into this process's own, so the runner first moves into a network namespace of
    /// its own with this policy loaded, its resolver proxy and pasta attached (the `egress`
    /// crate, as the bwrap launcher does). Without it, `network` is the runner's own
    /// namespace as it was started (the boot tests' host loopback check).
    #[serde(default)]
    pub egress: Option<egress::network::NetworkSetup>,
    /// Nested virtualisation (`krun_set_nested_virt`): on x86_64 the guest's CPUID offers
    /// VMX/SVM when the host's KVM has them; libkrun 1.19.7 ignores it on Linux aarch64.
    #[serde(default)]
    pub nested_virt: bool,
    /// Size in MiB of the DAX window (virtio-fs shared memory region) given to each of
    /// `shares`; 0 (default) gives none. The root keeps libkrun's own 512 MiB window.
    #[serde(default)]
    pub virtiofs_shm_size_mib: u32,
    /// `RLIMIT_NOFILE`, soft and hard, that libkrun's init sets (`KRUN_RLIMITS`) before it
    /// starts ours, so the workload and all it starts inherit it; absent: the kernel's.
    #[serde(default)]
    pub nofile_limit: Option<u64>,
    /// The runner's own `RLIMIT_NOFILE` (soft and hard), which bounds the host files the
    /// guest's virtio-fs and TSI use may hold open: the adapter's share of `fs.file-max` for
    /// one sandbox; never above `RUNNER_NOFILE` (see `launch.rs`); absent: `RUNNER_NOFILE`.
    #[serde(default)]
    pub runner_nofile: Option<u64>,
    /// For a runner started by host root: the unprivileged host ids it becomes before the VM
    /// starts, and the layer directory every path of the VM's there is reached through (see
    /// `drop_root.rs`). Ignored by a runner that is not host root (it never had root to drop).
    #[serde(default)]
    pub drop_root: Option<DropRoot>,
}

/// The ids a root runner gives host root up for: it becomes root of a user namespace whose
/// ids `0..count` are host uids `uid..uid+count` and gids `gid..gid+count`, and serves the
/// image and `layer` (a directory holding every other path of the spec it needs but bind
/// sources) through idmapped mounts of that map.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropRoot {
    pub uid: u32,
    pub gid: u32,
    pub count: u32,
    pub layer: PathBuf,
}

/// Why a specification was refused.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("cannot read the specification: {0}")]
    Read(#[from] std::io::Error),
    #[error("the specification is not valid JSON for a VM spec: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("vcpus must be between 1 and {MAX_VCPUS}, got {0}")]
    Vcpus(u8),
    #[error("memory_mib must be at least {MIN_MEMORY_MIB}, got {0}")]
    Memory(u32),
    #[error("{field} must be an absolute path, got {value:?}")]
    NotAbsolute { field: &'static str, value: String },
    #[error("{field} contains a NUL byte")]
    NulByte { field: &'static str },
    #[error("{field} {path:?} is not an existing directory")]
    NotADirectory { field: &'static str, path: PathBuf },
    #[error("share tag {0:?} is invalid (1-36 characters, no NUL, not \"/dev/root\")")]
    BadTag(String),
    #[error("share tag {0:?} is used twice")]
    DuplicateTag(String),
    #[error("share guest_path {0:?} is used twice or is the root")]
    BadGuestPath(String),
    #[error("vsock port {0} is used twice or is 0")]
    BadPort(u32),
    #[error("vsock socket {path:?}: {reason}")]
    BadSocket { path: PathBuf, reason: &'static str },
    #[error("environment name {0:?} is invalid (empty, or holds '=' or NUL)")]
    BadEnvName(String),
    #[error("{0} arguments and environment entries exceed the limit of {MAX_ARGS_AND_ENV}")]
    TooManyArgs(usize),
    #[error("root_overlay {field} {path:?} holds a character overlayfs options cannot carry (',', ':' or '\\')")]
    OverlayPath { field: &'static str, path: PathBuf },
    #[error("mount guest_path {path:?}: {reason}")]
    BadMountPath { path: String, reason: &'static str },
    #[error("bind host_path {0:?} does not exist")]
    MissingBindSource(PathBuf),
    #[error("symlink at {0:?} has an empty target or one holding a NUL byte")]
    BadSymlinkTarget(String),
    #[error("console_log {0:?}: its directory does not exist")]
    BadConsoleLog(PathBuf),
    #[error("console_fd {0} must be 1 (our stdout) or an inherited descriptor of 3 or more")]
    BadConsoleFd(i32),
    #[error("give console_log or console_fd, not both")]
    TwoConsoles,
    #[error("nofile_limit must be at least 1 (leave it out for the kernel's default)")]
    NofileLimit,
    #[error("runner_nofile must be at least 1 (leave it out for the runner's default)")]
    RunnerNofile,
    #[error("egress judges the guest's network: it needs network: true")]
    EgressWithoutNetwork,
    #[error("root_overlay layers: {0} given; at most {MAX_SNAPSHOT_LAYERS}, and only with size_mib (an ephemeral layer, no image or guest_disk)")]
    Layers(usize),
    #[error("root_overlay size_mib {0} must be at least 1")]
    DiskSize(u32),
    #[error("root_overlay with size_mib or image: upper and work must be two directories in one existing directory (the mount point)")]
    DiskDirs,
    #[error("root_overlay: give size_mib (a tmpfs) or image (an ext4 image), not both")]
    TwoDisks,
    #[error("root_overlay image {0} must be an absolute path to a regular file (not a link)")]
    BadImage(PathBuf),
    #[error("layer-dir {0:?}: needs a root_overlay with size_mib or image, and a plain name other than upper and work")]
    BadLayerDir(String),
    #[error("drop_root: ids {uid}/{gid} and count {count} must be above 0 and fit in 32 bits, and layer {layer:?} an existing absolute directory")]
    BadDropRoot {
        uid: u32,
        gid: u32,
        count: u32,
        layer: PathBuf,
    },
    #[error("root_overlay guest_disk {0} must be an absolute path to a regular file (not a link), given with size_mib and without image")]
    BadGuestDisk(PathBuf),
}

/// A regular file (never a link) at an absolute path.
fn regular_file(path: &Path) -> bool {
    path.is_absolute() && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// A bounded layer: a size or an image, and `upper` and `work` side by side in an existing
/// directory; a guest disk beside a size.
fn validate_disk(overlay: &RootOverlay) -> Result<(), SpecError> {
    if let Some(disk) = &overlay.guest_disk {
        if overlay.size_mib.is_none() || overlay.image.is_some() || !regular_file(disk) {
            return Err(SpecError::BadGuestDisk(disk.clone()));
        }
    }
    match (overlay.size_mib, &overlay.image) {
        (Some(_), Some(_)) => return Err(SpecError::TwoDisks),
        (Some(0), None) => return Err(SpecError::DiskSize(0)),
        (None, Some(image)) if !regular_file(image) => {
            return Err(SpecError::BadImage(image.clone()))
        }
        _ => {}
    }
    let side_by_side = overlay.upper != overlay.work
        && overlay.upper.file_name().is_some()
        && overlay.work.file_name().is_some()
        && overlay.disk_dir() == overlay.work.parent();
    match overlay.disk_dir() {
        Some(dir) if side_by_side && dir.is_dir() => Ok(()),
        _ => Err(SpecError::DiskDirs),
    }
}

impl VmSpec {
    /// Parses and validates a specification from JSON text.
    pub fn from_json(text: &str) -> Result<Self, SpecError> {
        let spec: VmSpec = serde_json::from_str(text)?;
        spec.validate()?;
        Ok(spec)
    }

    /// Where a running runner's mount namespace (and its root: see `own_root.rs`) shows the
    /// upper directory of its ephemeral layer, which a snapshot copies through
    /// `/proc/PID/root`; `None` without one.
    pub fn upper_seen_by_runner(&self) -> Option<PathBuf> {
        let overlay = self.root_overlay.as_ref().filter(|o| o.ephemeral())?;
        let Some(drop) = &self.drop_root else {
            return Some(overlay.upper.clone());
        };
        let relative = overlay.upper.strip_prefix(&drop.layer).ok()?;
        Some(Path::new(DROP_ROOT_STAGE).join("layer").join(relative))
    }

    /// Checks everything that can be checked before touching libkrun.
    pub fn validate(&self) -> Result<(), SpecError> {
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(SpecError::Vcpus(self.vcpus));
        }
        if self.memory_mib < MIN_MEMORY_MIB {
            return Err(SpecError::Memory(self.memory_mib));
        }
        existing_dir("root", &self.root)?;
        if let Some(overlay) = &self.root_overlay {
            if overlay.bounded() {
                validate_disk(overlay)?;
            }
            if overlay.layers.len() > MAX_SNAPSHOT_LAYERS
                || (!overlay.layers.is_empty() && !overlay.ephemeral())
            {
                return Err(SpecError::Layers(overlay.layers.len()));
            }
            let fields = [
                ("lower", &overlay.lower),
                ("upper", &overlay.upper),
                ("work", &overlay.work),
            ];
            let layers = overlay.layers.iter().map(|layer| ("layers", layer));
            for (field, path) in fields.into_iter().chain(layers) {
                // With a tmpfs or an image of its own the runner makes `upper` and `work` in it.
                if field == "lower" || field == "layers" || !overlay.bounded() {
                    existing_dir("root_overlay", path)?;
                } else {
                    host_absolute("root_overlay", path)?;
                }
                let bytes = path.as_os_str().as_encoded_bytes();
                if bytes.iter().any(|b| matches!(b, b',' | b':' | b'\\')) {
                    return Err(SpecError::OverlayPath {
                        field,
                        path: path.clone(),
                    });
                }
            }
        }
        self.validate_shares()?;
        self.validate_mounts()?;
        self.validate_vsock()?;
        guest_absolute("workload", &self.workload)?;
        for arg in &self.argv {
            no_nul("argv", arg)?;
        }
        for (name, value) in &self.env {
            if name.is_empty() || name.contains('=') || name.contains('\0') {
                return Err(SpecError::BadEnvName(name.clone()));
            }
            no_nul("env value", value)?;
        }
        let count = self.argv.len() + self.env.len();
        if count > MAX_ARGS_AND_ENV {
            return Err(SpecError::TooManyArgs(count));
        }
        if let Some(dir) = &self.workdir {
            guest_absolute("workdir", dir)?;
        }
        if self.nofile_limit == Some(0) {
            return Err(SpecError::NofileLimit);
        }
        if self.runner_nofile == Some(0) {
            return Err(SpecError::RunnerNofile);
        }
        if self.egress.is_some() && !self.network {
            return Err(SpecError::EgressWithoutNetwork);
        }
        if let Some(fd) = self.console_fd {
            if fd != 1 && fd < 3 {
                return Err(SpecError::BadConsoleFd(fd));
            }
            if self.console_log.is_some() {
                return Err(SpecError::TwoConsoles);
            }
        }
        if let Some(log) = &self.console_log {
            host_absolute("console_log", log)?;
            if !log.parent().is_some_and(Path::is_dir) {
                return Err(SpecError::BadConsoleLog(log.clone()));
            }
        }
        if let Some(drop) = &self.drop_root {
            let fits = |base: u32| base > 0 && base.checked_add(drop.count).is_some();
            let usable = fits(drop.uid)
                && fits(drop.gid)
                && drop.count > 0
                && drop.layer.is_absolute()
                && drop.layer.is_dir();
            if !usable {
                return Err(SpecError::BadDropRoot {
                    uid: drop.uid,
                    gid: drop.gid,
                    count: drop.count,
                    layer: drop.layer.clone(),
                });
            }
        }
        Ok(())
    }

    fn validate_shares(&self) -> Result<(), SpecError> {
        let mut tags = BTreeSet::new();
        let mut guest_paths = BTreeSet::new();
        for share in &self.shares {
            let tag_ok = !share.tag.is_empty()
                && share.tag.len() <= 36
                && !share.tag.contains('\0')
                && share.tag != "/dev/root";
            if !tag_ok {
                return Err(SpecError::BadTag(share.tag.clone()));
            }
            if !tags.insert(share.tag.as_str()) {
                return Err(SpecError::DuplicateTag(share.tag.clone()));
            }
            existing_dir("share host_path", &share.host_path)?;
            let guest = path_str("share guest_path", &share.guest_path)?;
            guest_absolute("share guest_path", guest)?;
            let normalised = guest.trim_end_matches('/');
            if normalised.is_empty() || !guest_paths.insert(normalised.to_owned()) {
                return Err(SpecError::BadGuestPath(guest.to_owned()));
            }
        }
        Ok(())
    }

    fn validate_mounts(&self) -> Result<(), SpecError> {
        for mount in &self.mounts {
            mount_guest_path(mount.guest_path())?;
            match mount {
                GuestMount::Bind { host_path, .. } => {
                    host_absolute("bind host_path", host_path)?;
                    if !host_path.exists() {
                        return Err(SpecError::MissingBindSource(host_path.clone()));
                    }
                }
                GuestMount::Symlink { target, guest_path } => {
                    if target.is_empty() || target.contains('\0') {
                        return Err(SpecError::BadSymlinkTarget(guest_path.clone()));
                    }
                }
                GuestMount::LayerDir { name, .. } => {
                    let bounded = self.root_overlay.as_ref().is_some_and(RootOverlay::bounded);
                    let plain = !matches!(name.as_str(), "" | "." | ".." | "upper" | "work")
                        && !name.contains(['/', '\0']);
                    if !bounded || !plain {
                        return Err(SpecError::BadLayerDir(name.clone()));
                    }
                }
                GuestMount::Tmpfs { .. } => {}
            }
        }
        Ok(())
    }

    fn validate_vsock(&self) -> Result<(), SpecError> {
        let mut ports = BTreeSet::new();
        for bridge in &self.vsock {
            if bridge.port == 0 || !ports.insert(bridge.port) {
                return Err(SpecError::BadPort(bridge.port));
            }
            let bad = |reason| SpecError::BadSocket {
                path: bridge.socket.clone(),
                reason,
            };
            host_absolute("vsock socket", &bridge.socket)?;
            if bridge.socket.as_os_str().len() > MAX_SOCKET_PATH {
                return Err(bad("longer than a unix socket path may be (107 bytes)"));
            }
            if !bridge.socket.parent().is_some_and(Path::is_dir) {
                return Err(bad("its directory does not exist"));
            }
            // libkrun creates the listening socket itself and refuses an existing path.
            if bridge.direction == VsockDirection::GuestListens && bridge.socket.exists() {
                return Err(bad(
                    "already exists (the runner creates it for guest-listens)",
                ));
            }
        }
        Ok(())
    }
}

fn no_nul(field: &'static str, value: &str) -> Result<(), SpecError> {
    if value.contains('\0') {
        return Err(SpecError::NulByte { field });
    }
    Ok(())
}

fn guest_absolute(field: &'static str, value: &str) -> Result<(), SpecError> {
    no_nul(field, value)?;
    if !value.starts_with('/') {
        return Err(SpecError::NotAbsolute {
            field,
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// A mount's guest path: absolute, below the root (never the root itself), and made of
/// plain names only, so it cannot climb out of the root on the host side.
fn mount_guest_path(path: &str) -> Result<(), SpecError> {
    let bad = |reason| SpecError::BadMountPath {
        path: path.to_owned(),
        reason,
    };
    if path.contains('\0') {
        return Err(bad("holds a NUL byte"));
    }
    if !path.starts_with('/') {
        return Err(bad("is not absolute"));
    }
    let mut names = path.split('/').filter(|name| !name.is_empty()).peekable();
    if names.peek().is_none() {
        return Err(bad("is the root itself"));
    }
    if names.any(|name| name == ".." || name == ".") {
        return Err(bad("holds a '.' or '..' component"));
    }
    Ok(())
}

fn path_str<'a>(field: &'static str, path: &'a Path) -> Result<&'a str, SpecError> {
    // Paths reach libkrun and the guest as C strings in JSON: they must be UTF-8.
    path.to_str().ok_or_else(|| SpecError::NotAbsolute {
        field,
        value: path.to_string_lossy().into_owned(),
    })
}

fn host_absolute(field: &'static str, path: &Path) -> Result<(), SpecError> {
    let text = path_str(field, path)?;
    guest_absolute(field, text)
}

fn existing_dir(field: &'static str, path: &Path) -> Result<(), SpecError> {
    host_absolute(field, path)?;
    if !path.is_dir() {
        return Err(SpecError::NotADirectory {
            field,
            path: path.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base(root: &Path) -> serde_json::Value {
        json!({"vcpus": 1, "memory_mib": 256, "root": root, "workload": "/bin/echo"})
    }

    fn check(value: serde_json::Value) -> Result<VmSpec, SpecError> {
        VmSpec::from_json(&value.to_string())
    }

    #[test]
    fn minimal_spec_is_accepted_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let spec = check(base(dir.path())).unwrap();
        assert!(!spec.network);
        assert!(!spec.nested_virt);
        assert_eq!((spec.virtiofs_shm_size_mib, spec.nofile_limit), (0, None));
        assert!(spec.shares.is_empty() && spec.vsock.is_empty() && spec.argv.is_empty());
    }

    #[test]
    fn unknown_fields_and_bad_numbers_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = base(dir.path());
        v["netwrok"] = json!(true);
        assert!(matches!(check(v), Err(SpecError::Parse(_))));
        let mut v = base(dir.path());
        v["vcpus"] = json!(0);
        assert!(matches!(check(v), Err(SpecError::Vcpus(0))));
        let mut v = base(dir.path());
        v["memory_mib"] = json!(8);
        assert!(matches!(check(v), Err(SpecError::Memory(8))));
    }

    #[test]
    fn paths_must_be_absolute_and_exist() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = base(dir.path());
        v["root"] = json!("relative/root");
        assert!(matches!(check(v), Err(SpecError::NotAbsolute { .. })));
        let mut v = base(dir.path());
        v["root"] = json!(dir.path().join("missing"));
        assert!(matches!(check(v), Err(SpecError::NotADirectory { .. })));
        let mut v = base(dir.path());
        v["workload"] = json!("echo");
        assert!(matches!(check(v), Err(SpecError::NotAbsolute { .. })));
    }

    #[test]
    fn shares_need_unique_tags_and_guest_paths() {
        let dir = tempfile::tempdir().unwrap();
        let share = json!({"tag": "a", "host_path": dir.path(), "guest_path": "/mnt/a"});
        let mut v = base(dir.path());
        v["shares"] = json!([share.clone(), share.clone()]);
        assert!(matches!(check(v), Err(SpecError::DuplicateTag(_))));
        let mut other = share.clone();
        other["tag"] = json!("b");
        other["guest_path"] = json!("/mnt/a/");
        let mut v = base(dir.path());
        v["shares"] = json!([share, other]);
        assert!(matches!(check(v), Err(SpecError::BadGuestPath(_))));
    }

    #[test]
    fn vsock_sockets_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("exists.sock");
        std::fs::write(&existing, b"").unwrap();
        let mut v = base(dir.path());
        v["vsock"] = json!([{"port": 5, "socket": existing, "direction": "guest-listens"}]);
        assert!(matches!(check(v), Err(SpecError::BadSocket { .. })));
        let mut v = base(dir.path());
        let sock = dir.path().join("s.sock");
        v["vsock"] = json!([
            {"port": 5, "socket": sock, "direction": "host-listens"},
            {"port": 5, "socket": sock, "direction": "guest-listens"}
        ]);
        assert!(matches!(check(v), Err(SpecError::BadPort(5))));
    }

    #[test]
    fn a_guest_disk_is_a_regular_file_beside_a_size_and_no_image() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::create_dir(&disk).unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, b"").unwrap();
        let with = |extra: serde_json::Value| {
            let mut v = base(dir.path());
            v["root_overlay"] = json!({"lower": dir.path(), "upper": disk.join("upper"),
                "work": disk.join("work")});
            for (key, value) in extra.as_object().unwrap() {
                v["root_overlay"][key] = value.clone();
            }
            check(v)
        };
        let spec = with(json!({"guest_disk": image, "size_mib": 16})).expect("valid");
        assert_eq!(spec.root_overlay.unwrap().guest_disk, Some(image.clone()));
        let link = dir.path().join("link.img");
        std::os::unix::fs::symlink(&image, &link).unwrap();
        for bad in [
            json!({"guest_disk": image}),
            json!({"guest_disk": image, "size_mib": 16, "image": image}),
            json!({"guest_disk": link, "size_mib": 16}),
            json!({"guest_disk": "disk.img", "size_mib": 16}),
            json!({"guest_disk": disk, "size_mib": 16}),
        ] {
            assert!(
                matches!(with(bad.clone()), Err(SpecError::BadGuestDisk(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_layer_dir_needs_a_bounded_overlay_and_a_plain_name() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::create_dir(&disk).unwrap();
        let with = |size: Option<u32>, name: &str| {
            let mut v = base(dir.path());
            v["root_overlay"] = json!({"lower": dir.path(), "upper": disk.join("upper"),
                "work": disk.join("work"), "size_mib": size});
            v["mounts"] = json!([{"kind": "layer-dir", "name": name, "guest_path": "/state"}]);
            check(v)
        };
        let spec = with(Some(64), "state").expect("a plain name in a bounded layer");
        assert_eq!(
            spec.mounts,
            [GuestMount::LayerDir {
                name: "state".into(),
                guest_path: "/state".into()
            }]
        );
        for bad in ["", ".", "..", "upper", "work", "a/b", "a\0b"] {
            assert!(
                matches!(with(Some(64), bad), Err(SpecError::BadLayerDir(_))),
                "{bad:?}"
            );
        }
        // An unbounded overlay has no filesystem of its own to hold it.
        std::fs::create_dir_all(disk.join("upper")).unwrap();
        std::fs::create_dir_all(disk.join("work")).unwrap();
        assert!(matches!(
            with(None, "state"),
            Err(SpecError::BadLayerDir(_))
        ));
    }

    #[test]
    fn an_image_bounded_overlay_names_a_regular_file_and_no_size() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::create_dir(&disk).unwrap();
        let image = dir.path().join("disk.img");
        std::fs::write(&image, b"").unwrap();
        let (upper, work) = (disk.join("upper"), disk.join("work"));
        let with = |extra: serde_json::Value| {
            let mut v = base(dir.path());
            v["root_overlay"] = json!({"lower": dir.path(), "upper": upper, "work": work});
            for (key, value) in extra.as_object().unwrap() {
                v["root_overlay"][key] = value.clone();
            }
            check(v)
        };
        let spec = with(json!({"image": image})).expect("upper and work are made by the runner");
        let overlay = spec.root_overlay.unwrap();
        assert_eq!(
            (overlay.image.as_deref(), overlay.size_mib),
            (Some(&*image), None)
        );
        assert!(overlay.bounded());
        assert!(matches!(
            with(json!({"image": image, "size_mib": 64})),
            Err(SpecError::TwoDisks)
        ));
        let link = dir.path().join("link.img");
        std::os::unix::fs::symlink(&image, &link).unwrap();
        for bad in [
            link,
            dir.path().join("missing.img"),
            PathBuf::from("disk.img"),
            disk,
        ] {
            assert!(
                matches!(with(json!({"image": bad})), Err(SpecError::BadImage(_))),
                "{}",
                bad.display()
            );
        }
    }

    #[test]
    fn a_bounded_overlay_names_its_size_and_two_new_dirs_in_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("disk");
        std::fs::create_dir(&disk).unwrap();
        let bounded = |upper: &Path, work: &Path, size: u32| {
            let mut v = base(dir.path());
            v["root_overlay"] =
                json!({"lower": dir.path(), "upper": upper, "work": work, "size_mib": size});
            check(v)
        };
        let (upper, work) = (disk.join("upper"), disk.join("work"));
        let spec = bounded(&upper, &work, 64).expect("upper and work are made by the runner");
        let overlay = spec.root_overlay.unwrap();
        assert_eq!(
            (overlay.size_mib, overlay.disk_dir()),
            (Some(64), Some(&*disk))
        );
        assert!(matches!(
            bounded(&upper, &work, 0),
            Err(SpecError::DiskSize(0))
        ));
        let elsewhere = dir.path().join("work");
        for (upper, work) in [(&upper, &elsewhere), (&upper, &upper)] {
            assert!(matches!(bounded(upper, work, 64), Err(SpecError::DiskDirs)));
        }
        let (no_disk_upper, no_disk_work) = (dir.path().join("x/upper"), dir.path().join("x/work"));
        assert!(matches!(
            bounded(&no_disk_upper, &no_disk_work, 64),
            Err(SpecError::DiskDirs)
        ));
        assert!(bounded(Path::new("rel/upper"), Path::new("rel/work"), 64).is_err());
    }

    #[test]
    fn root_overlay_dirs_must_exist_and_be_mountable() {
        let dir = tempfile::tempdir().unwrap();
        let ok = json!({"lower": dir.path(), "upper": dir.path(), "work": dir.path()});
        let mut v = base(dir.path());
        v["root_overlay"] = ok.clone();
        assert!(check(v).unwrap().root_overlay.is_some());
        let mut missing = ok.clone();
        missing["upper"] = json!(dir.path().join("missing"));
        let mut v = base(dir.path());
        v["root_overlay"] = missing;
        assert!(matches!(check(v), Err(SpecError::NotADirectory { .. })));
        let odd = dir.path().join("a,b");
        std::fs::create_dir(&odd).unwrap();
        let mut comma = ok;
        comma["lower"] = json!(odd);
        let mut v = base(dir.path());
        v["root_overlay"] = comma;
        assert!(matches!(
            check(v),
            Err(SpecError::OverlayPath { field: "lower", .. })
        ));
    }

    #[test]
    fn tuning_fields_are_read_and_a_zero_nofile_limit_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = base(dir.path());
        v["nested_virt"] = json!(true);
        v["virtiofs_shm_size_mib"] = json!(256);
        v["nofile_limit"] = json!(65536);
        let spec = check(v).unwrap();
        assert!(spec.nested_virt);
        assert_eq!(spec.virtiofs_shm_size_mib, 256);
        assert_eq!(spec.nofile_limit, Some(65536));
        let mut v = base(dir.path());
        v["nofile_limit"] = json!(0);
        assert!(matches!(check(v), Err(SpecError::NofileLimit)));
        let mut v = base(dir.path());
        v["runner_nofile"] = json!(0);
        assert!(matches!(check(v), Err(SpecError::RunnerNofile)));
        let mut v = base(dir.path());
        v["runner_nofile"] = json!(38593);
        assert_eq!(check(v).unwrap().runner_nofile, Some(38593));
        let mut v = base(dir.path());
        v["egress"] = json!({"nft": "nft", "ip": "ip", "rules": "", "pasta": "pasta",
            "pasta_args": [], "forwarded_ports": [], "boundary": "Starter", "bus_forward": null,
            "run_as": null,
            "dns": {"upstream": [], "allow_names": [], "deny_names": [],
                "names_within_defaults": false}});
        assert!(matches!(check(v), Err(SpecError::EgressWithoutNetwork)));
        let mut v = base(dir.path());
        v["hyperthreading"] = json!(true);
        assert!(
            matches!(check(v), Err(SpecError::Parse(_))),
            "no SMT switch to give"
        );
    }

    #[test]
    fn mounts_of_the_three_kinds_are_accepted_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("app.txt");
        std::fs::write(&file, b"x").unwrap();
        let mut v = base(dir.path());
        v["mounts"] = json!([
            {"kind": "tmpfs", "guest_path": "/worker", "read_only": true},
            {"kind": "bind", "host_path": file, "guest_path": "/worker/app.txt", "read_only": true},
            {"kind": "symlink", "target": "../etc/passwd", "guest_path": "/worker/link"},
            {"kind": "bind", "host_path": dir.path(), "guest_path": "/state"}
        ]);
        let spec = check(v).unwrap();
        assert_eq!(
            spec.mounts,
            vec![
                GuestMount::Tmpfs {
                    guest_path: "/worker".into(),
                    read_only: true
                },
                GuestMount::Bind {
                    host_path: file,
                    guest_path: "/worker/app.txt".into(),
                    read_only: true
                },
                GuestMount::Symlink {
                    target: "../etc/passwd".into(),
                    guest_path: "/worker/link".into()
                },
                GuestMount::Bind {
                    host_path: dir.path().to_path_buf(),
                    guest_path: "/state".into(),
                    read_only: false
                },
            ]
        );
    }

    #[test]
    fn mount_guest_paths_must_stay_below_the_root() {
        let dir = tempfile::tempdir().unwrap();
        for path in ["worker", "/", "//", "/worker/../etc", "/a/./b", "/a\u{0}b"] {
            let mut v = base(dir.path());
            v["mounts"] = json!([{"kind": "tmpfs", "guest_path": path}]);
            assert!(
                matches!(check(v), Err(SpecError::BadMountPath { .. })),
                "{path:?} accepted"
            );
        }
    }

    #[test]
    fn bind_sources_symlink_targets_and_unknown_kinds_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = base(dir.path());
        v["mounts"] =
            json!([{"kind": "bind", "host_path": dir.path().join("gone"), "guest_path": "/w"}]);
        assert!(matches!(check(v), Err(SpecError::MissingBindSource(_))));
        let mut v = base(dir.path());
        v["mounts"] = json!([{"kind": "bind", "host_path": "rel", "guest_path": "/w"}]);
        assert!(matches!(check(v), Err(SpecError::NotAbsolute { .. })));
        let mut v = base(dir.path());
        v["mounts"] = json!([{"kind": "symlink", "target": "", "guest_path": "/w"}]);
        assert!(matches!(check(v), Err(SpecError::BadSymlinkTarget(_))));
        let mut v = base(dir.path());
        v["mounts"] = json!([{"kind": "overlay", "guest_path": "/w"}]);
        assert!(matches!(check(v), Err(SpecError::Parse(_))));
        let mut v = base(dir.path());
        v["mounts"] = json!([{"kind": "tmpfs", "guest_path": "/w", "size": 1}]);
        assert!(matches!(check(v), Err(SpecError::Parse(_))));
    }

    #[test]
    fn env_names_and_nul_bytes_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let mut v = base(dir.path());
        v["env"] = json!({"A=B": "x"});
        assert!(matches!(check(v), Err(SpecError::BadEnvName(_))));
        let mut v = base(dir.path());
        v["argv"] = json!(["ok", "bad\u{0}"]);
        assert!(matches!(check(v), Err(SpecError::NulByte { .. })));
    }
}
