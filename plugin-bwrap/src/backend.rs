//! Booting a sandbox with bubblewrap: the agent as PID 1 of fresh namespaces, over the
//! sandbox's overlay root, speaking its protocol on stdin/stdout.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use sandbox_core::backend::Bounds;
use sandbox_core::{
    Backend, BootSpec, Booted, ChildProcess, GuestMount, HostUnfit, SandboxError, SandboxProcess,
};
use tokio::io::AsyncWriteExt;

use crate::cgroup;
use crate::disk::{self, Disk};
use crate::fuse_disk::FuseTools;
use crate::launch::LaunchCommand;
use crate::network::{find_in_path, resolv_conf, Boundary, HostTools, LinkPrefixes, NetworkSetup};
use crate::pool::LauncherPool;
use crate::userns::IdMap;

/// Where the agent binary appears inside the sandbox.
const AGENT_IN_SANDBOX: &str = "/.iii-agent";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Overrides where the launcher binary is found (default: next to the adapter's executable).
pub const LAUNCHER_ENV: &str = "SANDBOX_BWRAP_LAUNCH";
const LAUNCHER: &str = "sandbox-bwrap-launch";
/// Names, in each sandbox's layer, the cgroup the sandbox got from its launcher.
const GROUP_FILE: &str = "cgroup";
/// The sandbox's `/etc/resolv.conf` (egress on), in its layer.
const RESOLV_FILE: &str = "resolv.conf";
/// The sandbox's log (`sandbox.log` and its older half `sandbox.log.1`) in its layer.
const LOG_FILE: &str = "sandbox.log";
/// How long a stop waits for the sandbox's log to take in what its last processes wrote.
const LOG_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

pub struct BwrapBackend {
    bwrap: Option<PathBuf>,
    launcher: PathBuf,
    pool: Arc<LauncherPool>,
    id_map: IdMap,
    /// The limits a sandbox's cgroup can hold on this host, probed once at start.
    limits_in_force: Vec<&'static str>,
    /// Egress (`network: true`) needs pasta and nft; without them such a create is S300.
    egress_tools: HostTools,
    /// The configured prefixes of a sandbox's link to its gate (`network_link_v4` / `_v6`).
    link_prefixes: LinkPrefixes,
    /// How persistent layers (worker VMs) are bounded here (see `disk.rs`).
    worker_disks: WorkerDisks,
    /// Each sandbox's share of the host's open files and per-user counters.
    budget: crate::ns_limits::Budget,
}

impl BwrapBackend {
    pub fn new() -> Self {
        Self::for_config(&sandbox_core::Config::default())
    }

    /// Sized for `config`'s `max_concurrent_sandboxes` and `max_pids_per_sandbox`.
    pub fn for_config(config: &sandbox_core::Config) -> Self {
        let launcher = sandbox_core::helper_program(LAUNCHER_ENV, LAUNCHER);
        cgroup::sweep_dead_instances();
        let id_map = IdMap::for_process(
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        tracing::info!(ids = %id_map.describe(), "bwrap sandboxes run in user namespaces of their own");
        let instance = cgroup::Instance::get();
        let mut limits_in_force = instance.holds();
        tracing::info!(placement = %cgroup::Placement::get().describe(), instance = ?instance.dirs(), in_force = ?limits_in_force, "sandboxes' cgroups");
        if let Some(missing) = instance.missing() {
            tracing::warn!(
                in_force = ?limits_in_force,
                missing,
                "sandboxes' cpus, memory and pids cannot all be bounded on this host: creates are refused (S300) unless allow_unbounded_sandboxes"
            );
        }
        let budget = crate::ns_limits::Budget::at_start(
            config.max_concurrent_sandboxes,
            config.max_pids_per_sandbox,
            limits_in_force.contains(&"memory"),
            limits_in_force.contains(&"pids"),
        );
        // Every layer is size-limited, whoever runs the adapter (see `disk.rs`).
        limits_in_force.push("disk");
        let bwrap = find_in_path("bwrap");
        let worker_disks = WorkerDisks::find(id_map.needs_idmapped_mounts(), bwrap.as_deref());
        let worker_layers = worker_disks.describe_layers();
        if worker_disks.is_bounded() {
            tracing::info!(
                worker_layers,
                "writable layers are size-limited (sandboxes: a tmpfs of default_disk_mb, at most 3/4 of memory_mb)"
            );
        } else {
            tracing::warn!(worker_layers, "worker VMs' writable layers are not size-limited here (sandboxes are: a tmpfs of default_disk_mb, at most 3/4 of memory_mb)");
        }
        Self {
            worker_disks,
            budget,
            limits_in_force,
            egress_tools: HostTools::find(),
            link_prefixes: config.egress.link,
            bwrap,
            pool: Arc::new(LauncherPool::new(launcher.clone(), id_map)),
            launcher,
            id_map,
        }
    }
}

impl BwrapBackend {
    /// The launcher's network instructions for `spec`, and the resolver file it binds.
    fn network_setup(&self, spec: &BootSpec) -> Result<NetworkSetup, SandboxError> {
        let run_as = self
            .id_map
            .needs_idmapped_mounts()
            .then_some((self.id_map.uid_base, self.id_map.gid_base));
        let setup = self
            .egress_tools
            // The sandbox's programs open their own sockets: the rules sit in a gate namespace
            // they cannot act in.
            .setup(&spec.egress, run_as, Boundary::Gate)
            .map_err(SandboxError::BootFailed)?;
        std::fs::write(spec.layer_dir.join(RESOLV_FILE), resolv_conf()).map_err(|e| {
            SandboxError::BootFailed(format!("cannot write the sandbox's resolver file: {e}"))
        })?;
        Ok(setup)
    }
}

impl Default for BwrapBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait]
impl Backend for BwrapBackend {
    fn name(&self) -> &'static str {
        "bwrap"
    }

    fn probe(&self) -> Result<(), HostUnfit> {
        if self.bwrap.is_none() {
            return Err(HostUnfit(
                "`bwrap` is not installed (Debian package `bubblewrap`)".into(),
            ));
        }
        if !user_namespaces_allowed() {
            return Err(HostUnfit(
                "this host allows no user namespaces (`user.max_user_namespaces` is 0): each bwrap sandbox needs one of its own".into(),
            ));
        }
        if !self.launcher.is_file() {
            return Err(HostUnfit(format!(
                "the launcher `{LAUNCHER}` was not found at {} (set {LAUNCHER_ENV})",
                self.launcher.display()
            )));
        }
        Ok(())
    }

    async fn boot(&self, spec: &BootSpec) -> Result<Booted, SandboxError> {
        let boot_error =
            |what: &str, e: std::io::Error| SandboxError::BootFailed(format!("{what}: {e}"));
        let bwrap = self
            .bwrap
            .as_ref()
            .ok_or_else(|| SandboxError::BootFailed("`bwrap` is not installed".into()))?;
        let [disk_dir, merged] = [disk::DISK_DIR, "merged"].map(|d| spec.layer_dir.join(d));
        for dir in [&disk_dir, &merged] {
            // A persistent layer (worker VM) keeps what its earlier boots wrote.
            let made = if spec.persistent_layer {
                std::fs::create_dir_all(dir)
            } else {
                std::fs::create_dir(dir)
            };
            made.map_err(|e| boot_error("cannot prepare the sandbox layer", e))?;
        }
        let path = |p: &Path| p.display().to_string();
        let tmpfs = Disk {
            at: path(&disk_dir),
            size_mb: spec.disk_mb,
            image: None,
            fuse: None,
            state: false,
        };
        let disk = match (spec.persistent_layer, &self.worker_disks) {
            // Its pages are the sandbox's memory: never more than its memory allows.
            (false, _) => Some(Disk {
                size_mb: disk::sandbox_tmpfs_mb(spec.disk_mb, spec.memory_mb),
                ..tmpfs
            }),
            (true, WorkerDisks::Images { mke2fs, fuse }) => {
                let (mke2fs, layer_dir, size_mb) =
                    (mke2fs.clone(), spec.layer_dir.clone(), spec.disk_mb);
                let image = tokio::task::spawn_blocking(move || {
                    layer_disk::ensure_image(&mke2fs, &layer_dir, size_mb)
                })
                .await
                .map_err(|e| boot_error("cannot make the layer's disk image", e.into()))?
                .map_err(|e| boot_error("cannot make the layer's disk image", e))?;
                Some(Disk {
                    image: Some(path(&image)),
                    fuse: fuse.clone(),
                    ..tmpfs
                })
            }
            // The documented fallback (see `disk.rs`): plain directories of the layer.
            (true, WorkerDisks::Unbounded(_)) => None,
        };
        let (mounts, disk) = place_state(&spec.mounts, disk, &spec.sandbox_id);
        let (upper, work) = match &disk {
            Some(disk) => disk.upper_and_work(),
            None => {
                let [upper, work] = ["upper", "work"].map(|d| spec.layer_dir.join(d));
                for dir in [&upper, &work] {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| boot_error("cannot prepare the sandbox layer", e))?;
                }
                (path(&upper), path(&work))
            }
        };
        if self.id_map.needs_idmapped_mounts() {
            // A writable bind (a worker's `/state`) is shown without an idmap: what the guest
            // writes there must belong to its subordinate ids on disk (see `owners.rs`).
            for mount in &mounts {
                if let GuestMount::Bind(bind) = mount {
                    // One in the layer's image is the sandbox's own there (idmapped).
                    if !bind.read_only && !bind.host.starts_with(&spec.layer_dir) {
                        crate::owners::give_to_range(&bind.host, self.id_map).map_err(|e| {
                            boot_error(
                                &format!("cannot give {} to the sandbox's ids", bind.guest),
                                e,
                            )
                        })?;
                    }
                }
            }
        }
        // Fails closed: a sandbox past its share of the host's counters is not started.
        if let Some(why) = self.budget.refusal().filter(|_| !spec.persistent_layer) {
            return Err(SandboxError::BootFailed(why.to_string()));
        }
        let launcher = self.pool.take().map_err(|e| {
            boot_error(
                &format!("cannot start the launcher {}", self.launcher.display()),
                e,
            )
        })?;
        let group = launcher.group.dirs();
        std::fs::write(spec.layer_dir.join(GROUP_FILE), launcher.group.name())
            .map_err(|e| boot_error("cannot record the sandbox's cgroup", e))?;
        // Fails closed: a limit not written is a sandbox not started.
        if let Err(e) = launcher.group.set_limits(
            spec.cpus,
            spec.memory_mb,
            self.budget.pids(spec.pids, spec.persistent_layer),
        ) {
            crate::pool::discard(launcher);
            return Err(SandboxError::BootFailed(e.to_string()));
        }
        let network = if spec.network {
            Some(self.network_setup(spec)?)
        } else {
            None
        };
        // The launcher's stderr since it started, and so bwrap's, the agent's, pasta's and
        // the resolver proxy's: a pipe this adapter copies into the sandbox's log, rotated at
        // a fixed size (see the `bounded-log` crate; why the adapter and not a process of the
        // sandbox pumps it: the README's "Logs"). A worker VM's persistent layer keeps the
        // log of its earlier boots.
        let log = bounded_log::pump(
            launcher.log,
            &spec.layer_dir.join(LOG_FILE),
            bounded_log::LIMIT,
            bounded_log::Start::Append,
        )
        .map_err(|e| boot_error("cannot open the sandbox's log", e))?;
        let command = LaunchCommand {
            lower: path(&spec.image_root),
            layers: spec.snapshot_layers.iter().map(|l| path(l)).collect(),
            layer: path(&spec.layer_dir),
            upper,
            work,
            merged: path(&merged),
            log: crate::launch::LOG_IN_LAUNCHER.into(),
            bwrap: path(bwrap),
            args: bwrap_args(spec, &mounts, &merged, &Scratch::of(spec, disk.as_ref())),
            network,
            disk,
            ceilings: self.budget.ceilings(spec.persistent_layer),
        };
        let message = command
            .encode()
            .map_err(|e| boot_error("cannot prepare the launch", e))?;
        let mut child = launcher.child;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(SandboxError::BootFailed(
                "the launcher started without its pipes".into(),
            ));
        };
        stdin
            .write_all(&message)
            .await
            .map_err(|e| boot_error("the launcher did not take its command", e))?;
        Ok(Booted {
            reader: Box::new(stdout),
            writer: Box::new(stdin),
            process: Box::new(BwrapProcess {
                process: ChildProcess::new(child),
                log_file: spec.layer_dir.join(LOG_FILE),
                freezer: cgroup::Freezer::of(&group, cgroup::Placement::get().v2),
                group,
                log,
            }),
        })
    }

    async fn capture_layer(
        &self,
        process: &dyn sandbox_core::backend::SandboxProcess,
        layer_dir: &Path,
        into: &Path,
        limit_bytes: u64,
    ) -> Result<u64, SandboxError> {
        let pid = process
            .pid()
            .filter(|_| process.is_alive())
            .ok_or_else(|| SandboxError::Stopped("the sandbox's process is gone".into()))?;
        // Where the launcher's mount namespace holds the sandbox's upper directory: on the
        // layer's tmpfs, in the layer itself or (a root adapter's) its staged idmapped copy.
        let upper = if self.id_map.needs_idmapped_mounts() {
            Path::new(crate::launch::STAGE).join("layer")
        } else {
            layer_dir.to_path_buf()
        }
        .join(disk::DISK_DIR)
        .join("upper");
        // Run as the sandbox's ids where the adapter's user could not give the copy their
        // owners (see the launcher's `--capture-layer`).
        let mut copy = tokio::process::Command::new(&self.launcher);
        copy.arg("--capture-layer")
            .arg(pid.to_string())
            .arg(&upper)
            .arg(into)
            .arg(limit_bytes.to_string())
            .args(["--id-map", &self.id_map.to_arg()]);
        layer_capture::run(copy, limit_bytes)
            .await
            .map_err(capture_error)
    }

    fn remove_guest_tree(&self, path: &Path) -> std::io::Result<()> {
        match sandbox_core::remove_tree::remove_tree(path) {
            // What the guest's subordinate ids wrote (an ordinary user's sandbox with a full
            // map) the adapter's user cannot remove: the launcher removes it as those ids.
            Err(e)
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    && self.id_map.subordinate.is_some() =>
            {
                crate::userns::remove_tree_as_sandbox(&self.launcher, path, self.id_map)
            }
            other => other,
        }
    }

    fn worker_tuning(&self) -> sandbox_core::ops::worker::TuningSupport {
        sandbox_core::ops::worker::TuningSupport::NoVm {
            nofile: "not applied on the bwrap backend: a worker's processes get RLIMIT_NOFILE \
                     65536 (soft and hard) from its launcher, whatever is asked",
        }
    }

    fn boot_logs(&self, layer_dir: &Path) -> String {
        sandbox_core::log_tails(&[("sandbox", &layer_dir.join(LOG_FILE))])
    }

    fn state_group(&self) -> Option<u32> {
        // Run by root, bwrap sets up each sandbox's mounts from inside a user namespace whose
        // root is the first subordinate host id: its group must traverse the state directory.
        self.id_map
            .needs_idmapped_mounts()
            .then_some(self.id_map.gid_base)
    }

    fn isolation(&self) -> serde_json::Value {
        let mut network = self.egress_tools.describe(
            "always the sandbox's own (network: false: loopback only)",
            "the sandbox's namespace",
        );
        network["link"] = self.egress_tools.describe_link(&self.link_prefixes);
        serde_json::json!({
            "user_namespace": self.id_map.describe(),
            // 1: only the sandbox's root exists, so a program switching to another uid fails.
            "ids_in_sandbox": self.id_map.ids_inside(),
            "host_root_in_sandbox": false,
            "capabilities": "Docker's default set, inside the sandbox's user namespace only",
            "no_new_privs": true,
            "seccomp": true,
            "read_only": ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/proc/fs", "read-only binds (a worker's /worker, the agent)"],
            "limits_in_force": self.limits_in_force,
            "cgroups": cgroup::Placement::get().describe(),
            // Where each sandbox's `launcher-<uuid>` groups are made (one a hierarchy on v1).
            "cgroup_parents": cgroup::Placement::get().parents.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            // This adapter's own directory in each parent (locked while it lives): its
            // sandboxes' groups, and only they, lie beneath.
            "cgroup_instance": cgroup::Instance::get().dirs().iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "disk": {
                "sandboxes": "one tmpfs in the sandbox's user namespace holds the writable layer, /tmp and /dev/shm: ENOSPC past default_disk_mb, or past 3/4 of the sandbox's memory_mb when that is less (its pages are the sandbox's memory: filling it is ENOSPC, never the OOM killer)",
                "dev": "/dev read-only but for /dev/shm and /dev/pts (a worker VM's /tmp and /dev/shm: tmpfs of their own splitting the same budget, /dev/shm a quarter of it up to 64 MiB)",
                "worker_layers": self.worker_disks.describe_layers(),
                "worker_state": self.worker_disks.describe_state(),
            },
            "ceilings": self.budget.describe(),
            "network": network,
        })
    }

    fn bounds(&self) -> Bounds {
        match cgroup::Instance::get().missing() {
            None => Bounds::Held(format!(
                "each sandbox's own cgroup ({})",
                cgroup::Placement::get().describe()
            )),
            Some(missing) => Bounds::Missing(format!(
                "{}{missing}. {}",
                cgroup::Placement::get().undelegated_note(),
                cgroup::HOW_TO_DELEGATE
            )),
        }
    }

    fn release_layer(&self, layer_dir: &Path) {
        // Layers made before launchers named their group after the sandbox id.
        let group = std::fs::read_to_string(layer_dir.join(GROUP_FILE))
            .ok()
            .or_else(|| Some(layer_dir.file_name()?.to_str()?.to_string()));
        if let Some(group) = group.filter(|g| !g.is_empty() && !g.contains('/')) {
            cgroup::remove(&group);
        }
    }
}

/// Where a sandbox's `/tmp` and `/dev/shm` come from (see `disk.rs`).
enum Scratch {
    /// Directories of the sandbox's tmpfs: the layer's bound holds them too.
    InLayer { tmp: String, shm: String },
    /// Tmpfs of their own (a worker VM, whose layer is not a tmpfs), MiB.
    Own { tmp_mb: u32, shm_mb: u32 },
}

impl Scratch {
    fn of(spec: &BootSpec, disk: Option<&Disk>) -> Scratch {
        match disk.filter(|d| d.image.is_none()) {
            Some(tmpfs) => {
                let (tmp, shm) = tmpfs.tmp_and_shm();
                Scratch::InLayer { tmp, shm }
            }
            None => {
                let (tmp_mb, shm_mb) = disk::worker_scratch_mb(spec.disk_mb, spec.memory_mb);
                Scratch::Own { tmp_mb, shm_mb }
            }
        }
    }

    /// bwrap's arguments mounting `guest` (`/tmp` or `/dev/shm`).
    fn mount(&self, guest: &str) -> Vec<String> {
        let shm = guest == "/dev/shm";
        match self {
            Scratch::InLayer { tmp, shm: dir } => {
                let source = if shm { dir } else { tmp };
                vec!["--bind".into(), source.clone(), guest.into()]
            }
            Scratch::Own { tmp_mb, shm_mb } => {
                let mb = if shm { shm_mb } else { tmp_mb };
                vec![
                    "--size".into(),
                    (u64::from(*mb) * 1024 * 1024).to_string(),
                    "--tmpfs".into(),
                    guest.into(),
                ]
            }
        }
    }
}

fn bwrap_args(
    spec: &BootSpec,
    mounts: &[GuestMount],
    merged: &Path,
    scratch: &Scratch,
) -> Vec<String> {
    // Every namespace but the user one, which the launcher made: bwrap runs as root of the
    // sandbox's own user namespace, and a nested one of bwrap's would map a single id.
    let mut args: Vec<String> = [
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
    ]
    .map(String::from)
    .to_vec();
    // Egress on: the launcher has made the sandbox's network namespace (pasta, policy);
    // off: one of bwrap's with loopback only. Never the host's.
    if !spec.network {
        args.push("--unshare-net".into());
    }
    let path = |p: &Path| p.display().to_string();
    args.extend([
        "--bind".into(),
        path(merged),
        "/".into(),
        "--dev".into(),
        "/dev".into(),
    ]);
    // bwrap's /dev is a tmpfs of no size (half the host's memory) and `--size` cannot go with
    // `--dev`: read-only, but for its own mounts (/dev/pts, and /dev/shm, bounded here).
    args.extend(scratch.mount("/dev/shm"));
    args.extend(["--remount-ro".into(), "/dev".into()]);
    args.extend(["--proc".into(), "/proc".into()]);
    args.extend(scratch.mount("/tmp"));
    args.extend([
        "--ro-bind".into(),
        path(&spec.agent_path),
        AGENT_IN_SANDBOX.into(),
    ]);
    if spec.network {
        args.extend([
            "--ro-bind".into(),
            path(&spec.layer_dir.join(RESOLV_FILE)),
            "/etc/resolv.conf".into(),
        ]);
    }
    args.extend(mount_args(mounts));
    args.extend([
        "--hostname".into(),
        "sandbox".into(),
        "--setenv".into(),
        "PATH".into(),
        DEFAULT_PATH.into(),
        "--chdir".into(),
        "/".into(),
        "--".into(),
        AGENT_IN_SANDBOX.into(),
        // Read-only kernel knobs, Docker's capabilities, no_new_privs, seccomp.
        "--confine".into(),
        "--stdio".into(),
    ]);
    args
}

/// Where each `/state` of `mounts` lives (see `disk.rs`): in the layer's image when there is
/// one (`disk` is then asked to make it) and the host directory holds nothing from before
/// ([`sandbox_core::state_in_layer_image`]); else the host directory. Every other mount is
/// kept as it is.
fn place_state(
    mounts: &[GuestMount],
    mut disk: Option<Disk>,
    sandbox_id: &str,
) -> (Vec<GuestMount>, Option<Disk>) {
    let placed = mounts
        .iter()
        .map(|mount| {
            let GuestMount::State { host, guest } = mount else {
                return mount.clone();
            };
            let bind = |host: PathBuf| {
                GuestMount::Bind(sandbox_core::Mount {
                    host,
                    guest: guest.clone(),
                    read_only: false,
                })
            };
            match disk.as_mut().filter(|d| d.image.is_some()) {
                Some(image) if sandbox_core::state_in_layer_image(host, sandbox_id) => {
                    image.state = true;
                    bind(PathBuf::from(image.state_dir()))
                }
                _ => bind(host.clone()),
            }
        })
        .collect();
    (placed, disk)
}

/// The mounts of a spec as bwrap arguments, in order; read-only tmpfs directories are
/// remounted read-only last, once everything below them is in place.
fn mount_args(mounts: &[GuestMount]) -> Vec<String> {
    let mut args = Vec::new();
    let mut read_only_dirs = Vec::new();
    for mount in mounts {
        match mount {
            GuestMount::Bind(bind) => {
                let flag = if bind.read_only {
                    "--ro-bind"
                } else {
                    "--bind"
                };
                args.extend([
                    flag.into(),
                    bind.host.display().to_string(),
                    bind.guest.clone(),
                ]);
            }
            GuestMount::Tmpfs { guest, read_only } => {
                args.extend(["--tmpfs".into(), guest.clone()]);
                if *read_only {
                    read_only_dirs.push(guest.clone());
                }
            }
            // Placed by `place_state` before: here only if nothing placed it.
            GuestMount::State { host, guest } => {
                args.extend(["--bind".into(), host.display().to_string(), guest.clone()]);
            }
            GuestMount::Symlink { target, guest } => {
                args.extend([
                    "--symlink".into(),
                    target.display().to_string(),
                    guest.clone(),
                ]);
            }
        }
    }
    // `--remount-ro` is not recursive: the binds below keep their own flags.
    for dir in read_only_dirs {
        args.extend(["--remount-ro".into(), dir]);
    }
    args
}

/// bwrap, plus the sandbox's cgroups to remove once it is gone.
struct BwrapProcess {
    process: ChildProcess,
    /// The sandbox's log (its launcher's and bwrap's words), for
    /// [`SandboxProcess::last_words`].
    log_file: PathBuf,
    /// Done once the last writer of the sandbox's log is gone and all it wrote is on disk.
    log: bounded_log::Drained,
    group: Vec<PathBuf>,
    /// What pauses it; `None` for a sandbox without cgroups (`allow_unbounded_sandboxes`).
    freezer: Option<cgroup::Freezer>,
}

impl BwrapProcess {
    /// Runs a freezer step off the async workers (a freeze polls until the kernel is done).
    async fn freezer_step(
        &self,
        step: fn(&cgroup::Freezer) -> std::io::Result<()>,
    ) -> Result<(), SandboxError> {
        let Some(freezer) = self.freezer.clone() else {
            return Err(SandboxError::BackendUnsupported(
                "this sandbox has no cgroup (the adapter runs sandboxes unbounded,                  allow_unbounded_sandboxes), so nothing can freeze it"
                    .into(),
            ));
        };
        match tokio::task::spawn_blocking(move || step(&freezer)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
                Err(SandboxError::BackendUnsupported(e.to_string()))
            }
            Ok(Err(e)) => Err(SandboxError::Internal(format!(
                "the sandbox's cgroup freezer: {e}"
            ))),
            Err(e) => Err(SandboxError::Internal(format!(
                "the sandbox's cgroup freezer: {e}"
            ))),
        }
    }
}

#[async_trait]
impl SandboxProcess for BwrapProcess {
    fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    fn is_alive(&self) -> bool {
        self.process.is_alive()
    }

    fn last_words(&self) -> String {
        sandbox_core::log_tails(&[("sandbox", &self.log_file)])
    }

    async fn kill(&self) {
        // A frozen v1 process does not die until thawed: thaw first (the core thaws a paused
        // sandbox before its teardown; this covers a thaw that failed there).
        if self.freezer.is_some() {
            let _ = self.freezer_step(cgroup::Freezer::thaw).await;
        }
        // Killing bwrap kills PID 1 of the sandbox's namespace, and with it every process.
        self.process.kill().await;
        // Their last words, in the log before anyone reads its tail (a boot error's).
        let _ = tokio::time::timeout(LOG_DRAIN, self.log.wait()).await;
        // Waits (briefly) for the sandbox's last processes to exit: off the async workers.
        let mut group = self.group.clone();
        group.extend(
            self.freezer
                .as_ref()
                .and_then(cgroup::Freezer::leftover_dir),
        );
        let _ = tokio::task::spawn_blocking(move || cgroup::remove_dirs(&group)).await;
    }

    fn counters(&self) -> sandbox_core::Counters {
        cgroup::counters::read(&self.group, self.process.pid())
    }

    async fn pause(&self) -> Result<(), SandboxError> {
        self.freezer_step(cgroup::Freezer::freeze).await
    }

    async fn resume(&self) -> Result<(), SandboxError> {
        self.freezer_step(cgroup::Freezer::thaw).await
    }
}

/// How worker VMs' persistent layers (and their `/state`) are bounded on this host.
enum WorkerDisks {
    /// An ext4 image per worker: on a loop device (root adapter) or served by FUSE.
    Images {
        mke2fs: PathBuf,
        fuse: Option<FuseTools>,
    },
    /// Plain directories of the state filesystem, and why.
    Unbounded(String),
}

impl WorkerDisks {
    /// A root adapter mounts images itself; an ordinary user's needs the FUSE tools.
    fn find(root: bool, bwrap: Option<&Path>) -> WorkerDisks {
        let Some(mke2fs) = layer_disk::find_mke2fs() else {
            return WorkerDisks::Unbounded("no mke2fs on this host".into());
        };
        if root {
            return WorkerDisks::Images { mke2fs, fuse: None };
        }
        match FuseTools::find(bwrap) {
            Ok(fuse) => WorkerDisks::Images {
                mke2fs,
                fuse: Some(fuse),
            },
            Err(why) => WorkerDisks::Unbounded(format!(
                "an ordinary-user adapter has no loop devices and serves a layer's image with FUSE, but {why}"
            )),
        }
    }

    fn is_bounded(&self) -> bool {
        matches!(self, WorkerDisks::Images { .. })
    }

    /// For the log and `adapter::info`.
    fn describe_layers(&self) -> String {
        match self {
            WorkerDisks::Images { fuse: None, .. } => "an ext4 image of default_disk_mb per worker VM (sparse, on a loop device): persistent, ENOSPC past it".into(),
            WorkerDisks::Images { fuse: Some(_), .. } => "an ext4 image of default_disk_mb per worker VM (sparse), served by fuse2fs with the root overlay by fuse-overlayfs, each jailed by bwrap in the sandbox's user namespace: persistent, ENOSPC past it".into(),
            WorkerDisks::Unbounded(why) => format!("NOT bounded: a worker's persistent layer is a plain directory of the state filesystem ({why}); sandboxes are bounded"),
        }
    }

    /// Where a worker's `/state` lives here, for `adapter::info` (see `disk.rs`).
    fn describe_state(&self) -> &'static str {
        if self.is_bounded() {
            "in the worker's layer image (a directory beside its root's changes, sharing its default_disk_mb): ENOSPC past it; a /state that held files before this is kept as a host directory, NOT bounded (the log names the worker)"
        } else {
            "NOT bounded: a worker's /state is a plain directory of the state filesystem"
        }
    }
}

/// A snapshot copy's failure as the S-code a caller sees: over `max_snapshot_disk_mb` is a
/// resource limit (S400), a file the store cannot hold S310, anything else internal.
fn capture_error(error: layer_capture::RunError) -> SandboxError {
    let message = error.to_string();
    match error {
        layer_capture::RunError::OverBudget { .. } => SandboxError::ResourceLimit(message),
        layer_capture::RunError::Unstorable { .. } => SandboxError::BackendUnsupported(message),
        _ => SandboxError::Internal(message),
    }
}

fn user_namespaces_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|n| n.trim().parse::<u64>().ok())
        .is_none_or(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::Mount;

    #[test]
    fn snapshot_copy_failures_keep_their_s_codes_and_messages() {
        let over = capture_error(layer_capture::RunError::OverBudget { limit: 7 });
        assert_eq!(over.code(), "S400");
        assert!(
            matches!(&over, SandboxError::ResourceLimit(m)
                if m == "the sandbox's files are over what `max_snapshot_disk_mb` has left (7 bytes)"),
            "{over:?}"
        );
        let unstorable = capture_error(layer_capture::RunError::Unstorable {
            line: "the snapshot store cannot hold the xattr user.x (9 bytes) of the sandbox's file /a: limit".into(),
        });
        assert_eq!(unstorable.code(), "S310");
        assert!(
            matches!(&unstorable, SandboxError::BackendUnsupported(m)
                if m.ends_with("/a: limit; remove or shrink it in the sandbox and take the snapshot again")),
            "{unstorable:?}"
        );
        let silent = capture_error(layer_capture::RunError::NoSize);
        assert!(
            matches!(&silent, SandboxError::Internal(m) if m == "the copy did not say its size"),
            "{silent:?}"
        );
    }

    #[test]
    fn mounts_become_bwrap_arguments_with_read_only_tmpfs_last() {
        let mounts = vec![
            GuestMount::Tmpfs {
                guest: "/worker".into(),
                read_only: true,
            },
            GuestMount::Bind(Mount {
                host: "/p/src".into(),
                guest: "/worker/src".into(),
                read_only: true,
            }),
            GuestMount::Symlink {
                target: "src/a".into(),
                guest: "/worker/link".into(),
            },
            GuestMount::Bind(Mount {
                host: "/s/data".into(),
                guest: "/state".into(),
                read_only: false,
            }),
        ];
        let expected = [
            "--tmpfs",
            "/worker",
            "--ro-bind",
            "/p/src",
            "/worker/src",
            "--symlink",
            "src/a",
            "/worker/link",
            "--bind",
            "/s/data",
            "/state",
            "--remount-ro",
            "/worker",
        ];
        assert_eq!(mount_args(&mounts), expected);
        assert!(mount_args(&[]).is_empty());
    }

    #[test]
    fn state_lives_in_the_layer_image_unless_the_host_directory_holds_files() {
        let dir = tempfile::tempdir().unwrap();
        let host = dir.path().join("data");
        let mounts = [GuestMount::State {
            host: host.clone(),
            guest: "/state".into(),
        }];
        let bind = |host: &str| {
            vec![GuestMount::Bind(Mount {
                host: host.into(),
                guest: "/state".into(),
                read_only: false,
            })]
        };
        let tmpfs = Disk {
            at: "/l/disk".into(),
            size_mb: 64,
            image: None,
            fuse: None,
            state: false,
        };
        let image = Disk {
            image: Some("/l/disk.img".into()),
            ..tmpfs.clone()
        };
        let host_bind = bind(host.to_str().unwrap());

        // No directory yet, or an empty one: in the image, which is asked to make it.
        for _ in 0..2 {
            let (placed, disk) = place_state(&mounts, Some(image.clone()), "w");
            assert_eq!(placed, bind("/l/disk/state"));
            assert!(disk.unwrap().state);
            std::fs::create_dir_all(&host).unwrap();
        }
        // Files from before: the host directory, as it was.
        std::fs::write(host.join("old"), "x").unwrap();
        let (placed, disk) = place_state(&mounts, Some(image), "w");
        assert_eq!((placed, disk.unwrap().state), (host_bind.clone(), false));
        // No image (an ordinary user's adapter): the host directory.
        std::fs::remove_file(host.join("old")).unwrap();
        assert_eq!(place_state(&mounts, None, "w").0, host_bind);
        let (placed, disk) = place_state(&mounts, Some(tmpfs), "w");
        assert_eq!((placed, disk.unwrap().state), (host_bind, false));
    }
}
