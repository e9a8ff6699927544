//! Booting a sandbox as a libkrun microVM: listen on the layer's agent socket, start
//! `sandbox-libkrun-vm` on a specification built for the sandbox, and accept the agent's
//! connection (or report why it never came).

use std::path::{Path, PathBuf};
use std::process::Stdio;

use std::time::Duration;

use async_trait::async_trait;
use bounded_log::Start;
use egress::network::{resolv_conf, Boundary, HostTools, NetworkSetup};
use nix::sys::signal::Signal;
use sandbox_core::ops::worker::VmTuning;
use sandbox_core::proc_counters;
use sandbox_core::{
    Backend, BootSpec, Booted, ChildProcess, HostUnfit, SandboxError, SandboxProcess,
};
use tokio::net::UnixListener;
use tokio::process::Command;

use crate::failure::{describe_early_exit, log_tails, stopped_without_guest_status, BootError};
use crate::layout::Layout;
use crate::runner_files::RunnerFiles;
use crate::vm_spec;

/// The runner binary's name, looked up next to the adapter's executable.
pub const RUNNER: &str = "sandbox-libkrun-vm";
/// Environment variable naming the runner binary instead.
pub const RUNNER_ENV: &str = "SANDBOX_LIBKRUN_VM";
/// How long a runner that exited may take to have its last output in the logs (its pipes
/// end with it, unless something it started still holds them).
const LOG_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

pub struct LibkrunBackend {
    runner: PathBuf,
    /// The `III_VM_*` tuning given to worker VMs (never to sandboxes).
    tuning: VmTuning,
    /// How long a boot may take until its agent connects (see [`crate::agent_wait`]).
    agent_wait: Duration,
    /// A sandbox's egress (`network: true`) needs pasta and nft; without them it is S300.
    egress_tools: HostTools,
    /// Worker VMs' persistent layers as ext4 images, with `mke2fs`; else plain directories,
    /// unbounded (see `worker_layers`).
    mke2fs: Option<PathBuf>,
    /// The adapter is host root, with the subordinate ids (uid and gid base) its runners give
    /// host root up for and its pasta runs as: its runner attaches the images to loop
    /// devices; without it (an ordinary user) the VM mounts its image as a virtio-blk disk.
    root_ids: Option<(u32, u32)>,
    /// Each sandbox runner's share of the host's open files (see `runner_files`).
    runner_files: RunnerFiles,
}

/// A root adapter's subordinate ids (`root`), read once.
fn root_ids(root: bool) -> Option<(u32, u32)> {
    root.then(sandbox_core::subordinate::root_bases)
}

impl LibkrunBackend {
    /// Uses `$SANDBOX_LIBKRUN_VM`, else `sandbox-libkrun-vm` next to the current executable,
    /// and the `III_VM_*` tuning of the adapter's environment.
    pub fn new() -> Self {
        Self::with_runner(sandbox_core::helper_program(RUNNER_ENV, RUNNER))
    }

    pub fn with_runner(runner: PathBuf) -> Self {
        Self {
            runner,
            tuning: VmTuning::get(),
            agent_wait: crate::agent_wait::from_env(),
            egress_tools: HostTools::find(),
            mke2fs: layer_disk::find_mke2fs(),
            root_ids: root_ids(nix::unistd::geteuid().is_root()),
            runner_files: RunnerFiles::at_start(
                sandbox_core::Config::default().max_concurrent_sandboxes,
            ),
        }
    }

    /// Sizes each sandbox runner's open files for `cap` sandboxes at once
    /// (`max_concurrent_sandboxes`).
    pub fn with_sandbox_cap(mut self, cap: usize) -> Self {
        self.runner_files = RunnerFiles::at_start(cap);
        self
    }

    /// The layout of `spec`'s layer: a worker VM's bounded by its image when we make them,
    /// which a root runner mounts through a loop device and an ordinary user's VM as its
    /// virtio-blk disk.
    fn layout(&self, spec: &BootSpec) -> Layout {
        let layout = Layout::new(&spec.layer_dir, spec.persistent_layer);
        match (
            spec.persistent_layer && self.mke2fs.is_some(),
            self.root_ids.is_some(),
        ) {
            (true, true) => layout.with_image(&spec.layer_dir),
            (true, false) => layout.with_guest_disk(&spec.layer_dir),
            (false, _) => layout,
        }
    }

    /// How worker VMs' persistent layers are bounded here, for `adapter::info`.
    fn worker_layer_disk(&self) -> &'static str {
        match (self.mke2fs.is_some(), self.root_ids.is_some()) {
            (true, true) => "an ext4 image of default_disk_mb per worker VM (sparse, in its layer directory), which the VM runner mounts through a loop device in its own mount namespace: persistent, ENOSPC in the guest past it",
            (true, false) => "an ext4 image of default_disk_mb per worker VM (sparse, in its layer directory), the VM's virtio-blk disk, which its init mounts under an overlay of its own: persistent, ENOSPC in the guest past it",
            (false, _) => "NOT bounded: a worker's persistent layer is a plain directory of the state filesystem (mke2fs is missing); sandboxes are bounded",
        }
    }

    /// Where a worker's `/state` lives here, for `adapter::info`.
    fn worker_state_disk(&self) -> &'static str {
        if self.mke2fs.is_some() {
            "in the worker's layer image (a directory beside its root's changes, sharing its default_disk_mb): ENOSPC in the guest past it; a /state that held files before this is kept as a host directory, NOT bounded (the log names the worker)"
        } else {
            "NOT bounded: a worker's /state is a plain directory of the state filesystem"
        }
    }

    /// The same backend giving worker VMs `tuning` instead.
    pub fn with_tuning(self, tuning: VmTuning) -> Self {
        Self { tuning, ..self }
    }

    /// The same backend making worker VMs' layer images with `mke2fs` (or not, with `None`),
    /// for a root runner's loop device (`root`) or the VM's own disk.
    #[cfg(test)]
    pub(crate) fn with_mke2fs(self, mke2fs: Option<PathBuf>, root: bool) -> Self {
        Self {
            mke2fs,
            root_ids: root_ids(root),
            ..self
        }
    }

    /// The runner binary this backend starts.
    pub fn runner(&self) -> &Path {
        &self.runner
    }

    async fn boot_vm(
        &self,
        spec: &BootSpec,
        egress: Option<&NetworkSetup>,
    ) -> Result<Booted, BootError> {
        if !self.runner.is_file() {
            return Err(BootError::NoRunner(self.runner.display().to_string()));
        }
        let layout = self.layout(spec);
        layout.prepare(&spec.agent_path).map_err(BootError::Layer)?;
        if let (Some(mke2fs), Some(_)) = (&self.mke2fs, layout.layer_image()) {
            let (mke2fs, layer_dir, size_mb) =
                (mke2fs.clone(), spec.layer_dir.clone(), spec.disk_mb);
            tokio::task::spawn_blocking(move || {
                layer_disk::ensure_image(&mke2fs, &layer_dir, size_mb)
            })
            .await
            .map_err(|e| BootError::Layer(std::io::Error::other(e)))?
            .map_err(BootError::Layer)?;
        }
        if egress.is_some() {
            std::fs::write(&layout.resolv_conf, resolv_conf()).map_err(BootError::Layer)?;
        }
        let (vm_spec, _) = vm_spec::build(
            spec,
            &layout,
            &self.tuning,
            egress,
            self.root_ids,
            self.runner_files.limit(),
        )?;
        std::fs::write(&layout.spec, vm_spec.to_string()).map_err(BootError::Layer)?;
        // Listening before the VM exists, so the agent's first dial finds us.
        let listener = UnixListener::bind(&layout.socket).map_err(|source| BootError::Listen {
            path: layout.socket.display().to_string(),
            source,
        })?;
        // The guest console on the runner's stdout, libkrun's log on its stderr: both through
        // pipes into files kept within a bound (a guest must not fill the host's disk).
        let (console_out, console_drained) =
            bounded_log::start(&layout.console_log, bounded_log::LIMIT, Start::Fresh)
                .map_err(BootError::Layer)?;
        let (log_out, log_drained) =
            bounded_log::start(&layout.runner_log, bounded_log::LIMIT, Start::Fresh)
                .map_err(BootError::Layer)?;
        // The runner asks for PR_SET_PDEATHSIG, which follows the spawning *thread*: this runs
        // on a tokio worker thread, which lives as long as the plugin's runtime.
        let mut child = Command::new(&self.runner)
            .arg("--spec")
            .arg(&layout.spec)
            .env_clear()
            .envs(runner_env())
            .stdin(Stdio::null())
            .stdout(console_out)
            .stderr(log_out)
            .kill_on_drop(true)
            .spawn()
            .map_err(BootError::Spawn)?;
        let accepted = tokio::select! {
            accepted = tokio::time::timeout(self.agent_wait, listener.accept()) => accepted,
            status = child.wait() => {
                // What the runner and the guest wrote last explains the exit: read it all.
                let drained = async { tokio::join!(console_drained.wait(), log_drained.wait()) };
                let _ = tokio::time::timeout(LOG_DRAIN_TIMEOUT, drained).await;
                let no_guest_status = stopped_without_guest_status(&layout.runner_log);
                let status = status
                    .map(|s| describe_early_exit(s, no_guest_status))
                    .unwrap_or_else(|e| e.to_string());
                return Err(BootError::Exited {
                    status,
                    logs: log_tails(&layout.runner_log, &layout.console_log),
                    no_guest_status,
                });
            }
        };
        let stream = match accepted {
            Ok(Ok((stream, _))) => stream,
            Ok(Err(e)) => return Err(BootError::Accept(e)),
            Err(_) => {
                return Err(BootError::NoAgent {
                    secs: self.agent_wait.as_secs(),
                    logs: log_tails(&layout.runner_log, &layout.console_log),
                })
            }
        };
        // One agent per sandbox: nobody else may connect later.
        drop(listener);
        let _ = std::fs::remove_file(&layout.socket);
        let (reader, writer) = stream.into_split();
        Ok(Booted {
            reader: Box::new(reader),
            writer: Box::new(writer),
            // The VM, its overlay mount, its virtio-fs servers and its network namespace
            // (pasta, the resolver proxy) all live and die with the runner process.
            process: Box::new(VmProcess {
                runner: ChildProcess::new(child),
                logs: (layout.runner_log.clone(), layout.console_log.clone()),
            }),
        })
    }
}

impl LibkrunBackend {
    /// What a boot that failed left in the layer, removed before booting again: for a
    /// sandbox everything (its root must be fresh), for a worker VM only the runtime files
    /// (its layer persists; the guest never got to run the workload).
    fn clear_failed_boot(&self, spec: &BootSpec) -> std::io::Result<()> {
        let layout = self.layout(spec);
        let mut dirs = vec![&layout.root, &layout.agent_dir];
        // A sandbox's upper and work went with its runner's tmpfs, a worker VM's stay in its
        // image; on the host the mount point is an empty directory.
        dirs.extend(&layout.disk);
        for dir in dirs {
            match sandbox_core::remove_tree::remove_tree(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        for file in [&layout.socket, &layout.spec] {
            match std::fs::remove_file(file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// The runner's process.
struct VmProcess {
    runner: ChildProcess,
    /// The runner's log and the guest console's, for [`SandboxProcess::last_words`].
    logs: (PathBuf, PathBuf),
}

#[async_trait]
impl SandboxProcess for VmProcess {
    fn pid(&self) -> Option<u32> {
        self.runner.pid()
    }

    fn is_alive(&self) -> bool {
        self.runner.is_alive()
    }

    fn last_words(&self) -> String {
        log_tails(&self.logs.0, &self.logs.1)
    }

    /// The VM as the host pays for it: the runner's CPU time (every vCPU and device thread)
    /// and resident memory (the guest's RAM it has touched, its own besides), and the bytes
    /// on its network namespace's link to pasta, which carries every guest socket (TSI). The
    /// guest's processes and its layer (in the runner's own mount namespace, or a worker's
    /// image) are out of the host's sight: `pids` and `disk_bytes` stay null.
    fn counters(&self) -> sandbox_core::Counters {
        let Some(pid) = self.runner.pid().filter(|_| self.runner.is_alive()) else {
            return sandbox_core::Counters::default();
        };
        let (memory_bytes, memory_peak_bytes) = proc_counters::resident_bytes(pid).unzip();
        let (net_rx_bytes, net_tx_bytes) = proc_counters::net_bytes(pid).unzip();
        sandbox_core::Counters {
            cpu_ms: proc_counters::cpu_ms(pid),
            memory_bytes,
            memory_peak_bytes,
            disk_bytes: None,
            pids: None,
            net_rx_bytes,
            net_tx_bytes,
        }
    }

    async fn kill(&self) {
        // A stopped process dies of SIGKILL as it stands: a paused VM needs no resume first.
        self.runner.kill().await;
    }

    /// Stops the runner, and with it every vCPU and device thread of the VM: the guest's
    /// processes stand where they are, its memory kept. A job-control stop, decided on the
    /// host: nothing in the guest can see it coming or undo it. The runner's helpers (pasta,
    /// the resolver proxy) are not the guest's and stay as they are, idle without it.
    async fn pause(&self) -> Result<(), SandboxError> {
        self.signal(Signal::SIGSTOP)?;
        let pid = self.runner.pid();
        let stopped = tokio::task::spawn_blocking(move || {
            pid.is_some_and(|pid| runner_stops_within(pid, PAUSE_WAIT))
        })
        .await
        .unwrap_or(false);
        if !stopped {
            let _ = self.signal(Signal::SIGCONT);
            return Err(SandboxError::Internal(format!(
                "the VM runner did not stop within {PAUSE_WAIT:?}; it keeps running"
            )));
        }
        Ok(())
    }

    async fn resume(&self) -> Result<(), SandboxError> {
        self.signal(Signal::SIGCONT)
    }
}

/// How long every thread of a runner may take to stop once told to.
const PAUSE_WAIT: Duration = Duration::from_secs(5);

impl VmProcess {
    fn signal(&self, signal: Signal) -> Result<(), SandboxError> {
        match self.runner.signal(signal) {
            Ok(true) => Ok(()),
            Ok(false) => Err(SandboxError::Internal(
                "the VM runner has already exited".into(),
            )),
            Err(e) => Err(SandboxError::Internal(format!(
                "cannot send {signal} to the VM runner: {e}"
            ))),
        }
    }
}

/// Whether every thread of `pid` shows as stopped (`T`) within `limit`: a vCPU leaves the
/// guest at the signal, so this takes a moment, not a guest's cooperation.
/// A snapshot copy's failure as the S-code a caller sees: over `max_snapshot_disk_mb` is a
/// resource limit (S400), a file the store cannot hold S310, anything else internal.
#[cfg(target_os = "linux")]
fn capture_error(error: layer_capture::RunError) -> SandboxError {
    let message = error.to_string();
    match error {
        layer_capture::RunError::OverBudget { .. } => SandboxError::ResourceLimit(message),
        layer_capture::RunError::Unstorable { .. } => SandboxError::BackendUnsupported(message),
        _ => SandboxError::Internal(message),
    }
}

fn runner_stops_within(pid: u32, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if all_threads_stopped(pid) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut seen = 0;
    for task in tasks.flatten() {
        let Some(stat) = sandbox_core::proc_counters::ProcStat::read(&task.path().join("stat"))
        else {
            continue; // a thread that just ended
        };
        if stat.state != 'T' {
            return false;
        }
        seen += 1;
    }
    seen > 0
}

impl Default for LibkrunBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// What the runner may see of our environment: enough to find libkrunfw (`$HOME/.iii/lib`,
/// `LD_LIBRARY_PATH`) and to log; never the adapter's tokens.
fn runner_env() -> Vec<(String, String)> {
    ["HOME", "LD_LIBRARY_PATH", "PATH", "RUST_LOG"]
        .iter()
        .filter_map(|name| Some((name.to_string(), std::env::var(name).ok()?)))
        .collect()
}

#[async_trait]
impl Backend for LibkrunBackend {
    fn name(&self) -> &'static str {
        "libkrun"
    }

    fn probe(&self) -> Result<(), HostUnfit> {
        vm_runner::probe::host_can_boot().map_err(|unfit| HostUnfit(unfit.to_string()))?;
        if !self.runner.is_file() {
            return Err(HostUnfit(
                BootError::NoRunner(self.runner.display().to_string()).to_string(),
            ));
        }
        // No root needed: an ordinary user's runner mounts the overlay root from a user
        // namespace of its own (vm_runner::overlay), and /dev/kvm comes through its group.
        Ok(())
    }

    fn bounds(&self) -> sandbox_core::backend::Bounds {
        // No cgroup needed: the guest's cpus and memory are the VM's, and its processes live
        // in the guest kernel. `allow_unbounded_sandboxes` does not apply here.
        sandbox_core::backend::Bounds::Held(
            "the microVM itself: its vCPUs are the sandbox's cpus, its RAM is memory_mb, and \
             its processes live in the guest's own kernel (allow_unbounded_sandboxes does not \
             apply)"
                .into(),
        )
    }

    fn isolation(&self) -> serde_json::Value {
        let mut network = self.egress_tools.describe(
            "network: false: no network device and no TSI; network: true: libkrun's TSI, whose sockets are the VM runner's own, in a network namespace of the runner's own (its loopback is not the host's)",
            "the runner's namespace",
        );
        network["worker_vms"] = "the same egress policy as a sandbox with network (TSI in the runner's own network namespace), and the bus: the engine's one port, forwarded by pasta from that namespace's loopback (or allowed, for an engine on another host)".into();
        let runner = if let Some((uid, gid)) = self.root_ids {
            format!(
                "the VM runner (libkrun and its virtio-fs server) gives host root up before the VM \
                 starts: root of a user namespace whose ids 0..{range} are host uids {uid}.. and \
                 gids {gid}.., keeping only /dev/kvm's group; the image and the layer are shown \
                 to it through idmapped mounts (a state directory on ext4, xfs or btrfs)",
                range = sandbox_core::subordinate::RANGE
            )
        } else {
            "the VM runner (libkrun and its virtio-fs server) is the adapter's user, root only \
             of a user namespace of its own mapping that one uid"
                .to_string()
        };
        serde_json::json!({
            "boundary": "a microVM per sandbox and per worker VM (its own kernel, KVM)",
            "runner": runner,
            "ceilings": { "open_files": self.runner_files.describe() },
            "network": network,
            "disk": {
                "sandboxes": "a tmpfs of default_disk_mb in the VM runner's own mount namespace holds the writable layer (ENOSPC in the guest past it; the host's disk pays nothing, its memory at most that much)",
                "worker_layers": self.worker_layer_disk(),
                "worker_state": self.worker_state_disk(),
            },
        })
    }

    fn death_note(&self, layer_dir: &Path) -> String {
        // A VM that ended under a running sandbox with no status from its init was reset,
        // halted or panicked: say so, with the logs that tell which.
        let layout = Layout::new(layer_dir, false);
        if !stopped_without_guest_status(&layout.runner_log) {
            return String::new();
        }
        format!(
            "; the microVM stopped without a status from the guest (a reset, a halt, a triple \
             fault or a kernel panic){}",
            log_tails(&layout.runner_log, &layout.console_log)
        )
    }

    /// Copies the sandbox's upper directory, which lives on its runner's tmpfs in the
    /// runner's own mount namespace, through `/proc/PID/root` of the runner (whose own root
    /// serves it read-only for this), by the runner binary's `--capture-layer` (see
    /// `vm_runner::capture`: why stopping the runner is a consistent point).
    #[cfg(target_os = "linux")]
    async fn capture_layer(
        &self,
        process: &dyn SandboxProcess,
        layer_dir: &Path,
        into: &Path,
        limit_bytes: u64,
    ) -> Result<u64, SandboxError> {
        let pid = process
            .pid()
            .filter(|_| process.is_alive())
            .ok_or_else(|| SandboxError::Stopped("the sandbox's process is gone".into()))?;
        // The specification the runner was started with (ours, in the layer directory the
        // guest never reaches) says where its root shows the upper directory.
        let layout = Layout::new(layer_dir, false);
        let upper = std::fs::read_to_string(&layout.spec)
            .ok()
            .and_then(|text| serde_json::from_str::<vm_runner::VmSpec>(&text).ok())
            .and_then(|spec| spec.upper_seen_by_runner())
            .ok_or_else(|| {
                SandboxError::Internal(format!(
                    "the runner's specification {} names no ephemeral layer to copy",
                    layout.spec.display()
                ))
            })?;
        let mut copy = Command::new(&self.runner);
        copy.arg("--capture-layer")
            .arg(pid.to_string())
            .arg(&upper)
            .arg(into)
            .arg(limit_bytes.to_string())
            .env_clear()
            .envs(runner_env());
        layer_capture::run(copy, limit_bytes)
            .await
            .map_err(capture_error)
    }

    fn worker_tuning(&self) -> sandbox_core::ops::worker::TuningSupport {
        sandbox_core::ops::worker::TuningSupport::MicroVm {
            // Shown in `worker::status` when hyperthreading is asked for.
            no_smt: "libkrun 1.19.7's krun_set_vm_config hard-codes ht_enabled to false and no \
                     other call of its API sets it, so the guest always sees one thread per \
                     core; honouring it needs another VMM crate (e.g. microsandbox's msb_krun \
                     fork, whose machine builder has hyperthreading)",
        }
    }

    fn boot_logs(&self, layer_dir: &Path) -> String {
        // The logs are where they are for both kinds of layer.
        let layout = Layout::new(layer_dir, false);
        log_tails(&layout.runner_log, &layout.console_log)
    }

    async fn boot(&self, spec: &BootSpec) -> Result<Booted, SandboxError> {
        // Fails closed: a sandbox whose runner's share of the host's files is too small to
        // boot is not started (worker VMs are not counted against the cap).
        if let Some(why) = self
            .runner_files
            .refusal()
            .filter(|_| !spec.persistent_layer)
        {
            return Err(SandboxError::BootFailed(why.to_string()));
        }
        let egress = self.egress_for(spec)?;
        self.probe()
            .map_err(|unfit| SandboxError::BootFailed(unfit.to_string()))?;
        match self.boot_vm(spec, egress.as_ref()).await {
            Err(
                first @ BootError::Exited {
                    no_guest_status: true,
                    ..
                },
            ) => {
                // The guest stopped during boot without a word (seen under emulated nested
                // virtualisation, with no workload at all): one more boot, on a clean layer.
                tracing::warn!(sandbox = %spec.sandbox_id, "{first}; booting once more");
                self.clear_failed_boot(spec).map_err(|e| {
                    SandboxError::BootFailed(format!(
                        "{first}; and the layer could not be reset for a retry: {e}"
                    ))
                })?;
                self.boot_vm(spec, egress.as_ref()).await.map_err(|second| {
                    SandboxError::BootFailed(format!("{second} (a second boot, after: {first})"))
                })
            }
            other => other.map_err(|e| SandboxError::BootFailed(e.to_string())),
        }
    }
}

impl LibkrunBackend {
    /// What judges `spec`'s network, if it has one. libkrun's TSI turns a guest's sockets
    /// into the runner's own, so a sandbox asking for network gets TSI only with its runner in
    /// a network namespace of its own, behind the egress policy (the `egress` crate, as on
    /// bwrap); where that cannot be had it is refused, never given the host's network. A
    /// worker VM (always with network) gets the same, with its endpoint of the adapter's bus
    /// guard as the one way to the engine: the engine's port on the namespace's loopback,
    /// forwarded by pasta to the guard on the host's loopback, and no other host port.
    fn egress_for(&self, spec: &BootSpec) -> Result<Option<NetworkSetup>, SandboxError> {
        if !spec.network {
            return Ok(None);
        }
        if spec.persistent_layer && spec.egress.bus.is_none() && spec.egress.bus_guard.is_none() {
            return Err(SandboxError::BootFailed(
                "worker VMs need the engine's address (III_URL) for their way to the bus".into(),
            ));
        }
        // pasta never runs as host root: a root runner's network namespace belongs to the
        // adapter's subordinate ids, which pasta runs as; an ordinary user's runner owns its
        // own namespaces, and pasta keeps that user's ids.
        self.egress_tools
            .setup(&spec.egress, self.root_ids, Boundary::Starter)
            .map(Some)
            .map_err(SandboxError::BootFailed)
    }
}

#[cfg(test)]
mod tests;
