//! The seam between the shared sandbox logic and an isolation technology (libkrun microVMs,
//! bubblewrap namespaces). Like cloud-hypervisor's `Hypervisor` trait: chosen by the plugin,
//! probed at start-up so an unfit host gets a fast, explained refusal; `boot` hands back a
//! byte stream to the agent inside and a handle on the process that holds the sandbox.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::SandboxError;

/// Why a backend cannot run sandboxes on this host (reported by `adapter::info` up front and
/// as S300 on create).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HostUnfit(pub String);

/// How a backend bounds each sandbox's cpus, memory and pids on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bounds {
    /// Every one holds; the text says by what.
    Held(String),
    /// Not every one can hold here: the text names what is missing, why, and how to give the
    /// adapter what it needs. A boot is then refused (S300) unless the configuration sets
    /// `allow_unbounded_sandboxes`.
    Missing(String),
}

/// Everything a backend needs to start one sandbox.
#[derive(Debug, Clone)]
pub struct BootSpec {
    pub sandbox_id: String,
    /// The image's flattened root; read-only, shared by every sandbox of the image.
    pub image_root: PathBuf,
    /// A directory owned by this sandbox for its writable layer and runtime files; removed
    /// when the sandbox stops.
    pub layer_dir: PathBuf,
    pub cpus: u32,
    pub memory_mb: u32,
    /// Processes (and threads) the sandbox may hold at once (`max_pids_per_sandbox`).
    pub pids: u32,
    /// The size of the writable layer in MiB (`default_disk_mb`): past it, ENOSPC inside.
    pub disk_mb: u32,
    /// Egress on (user-mode networking under `egress`); off: loopback only. Either way the
    /// sandbox has a network namespace of its own.
    pub network: bool,
    pub egress: crate::network::Egress,
    /// The static agent binary to run as PID 1 inside.
    pub agent_path: PathBuf,
    /// Extra mounts over the root, applied in order (a worker VM's `/worker`, `/state`, ...).
    /// Empty for plain sandboxes.
    pub mounts: Vec<GuestMount>,
    /// The writable layer outlives the sandbox (worker VMs): existing upper/work directories
    /// are reused, not refused.
    pub persistent_layer: bool,
    /// Snapshot layers stacked read-only over the image, the top-most first (a sandbox
    /// created from a snapshot or by `fork`); empty for a sandbox of the bare image.
    pub snapshot_layers: Vec<PathBuf>,
}

impl BootSpec {
    /// What no backend boots, checked before any is asked: a snapshot's layers stack under a
    /// sandbox's ephemeral layer only, never under a worker VM's persistent one.
    pub fn check(&self) -> Result<(), SandboxError> {
        if self.persistent_layer && !self.snapshot_layers.is_empty() {
            return Err(SandboxError::BackendUnsupported(
                "a worker VM cannot start from a snapshot".into(),
            ));
        }
        Ok(())
    }
}

/// One entry of [`BootSpec::mounts`], backend-neutral: bwrap turns it into `--bind`/`--tmpfs`
/// arguments, a VM into shares. Later entries may lie inside earlier ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestMount {
    /// A host file or directory at `guest`.
    Bind(Mount),
    /// An empty directory held in memory at `guest`; read-only (once the entries below it
    /// are mounted) when `read_only`.
    Tmpfs { guest: String, read_only: bool },
    /// A symbolic link at `guest` whose text is `target` (resolved inside the guest).
    Symlink { target: PathBuf, guest: String },
    /// A writable directory kept across boots (a worker's `/state`). A backend that holds
    /// the persistent layer on a bounded disk keeps it there too, so it shares the layer's
    /// `disk_mb` (ENOSPC past it); otherwise the host directory `host` is bound.
    State { host: PathBuf, guest: String },
}

/// Whether a backend whose persistent layer is a bounded image may keep the `/state` of
/// [`GuestMount::State`] there: only when its host directory `host` holds nothing (or does
/// not exist). One that holds files (written before `/state` moved into the image) stays
/// the host directory, unbounded, and the log says so: its data is never moved by the
/// adapter (a guest wrote it; a copy as root is what an attacker wants) nor dropped.
pub fn state_in_layer_image(host: &Path, sandbox_id: &str) -> bool {
    let unused = match std::fs::read_dir(host) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    if !unused {
        tracing::warn!(sandbox_id, state = %host.display(), "this worker's state directory holds files from before state moved into its disk image: it stays a host directory, NOT size-limited (destroy and prepare the worker to bound it)");
    }
    unused
}

/// A host path shown to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub host: PathBuf,
    pub guest: String,
    pub read_only: bool,
}

pub type AgentReader = Box<dyn AsyncRead + Send + Unpin>;
pub type AgentWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// A booted sandbox: the agent's byte stream and the process holding the sandbox.
pub struct Booted {
    pub reader: AgentReader,
    pub writer: AgentWriter,
    pub process: Box<dyn SandboxProcess>,
}

/// A sandbox's usage as its backend keeps it (`metrics`); `None` where it cannot tell.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// CPU time of the sandbox's processes, in milliseconds.
    pub cpu_ms: Option<u64>,
    pub memory_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    /// What its writable layer holds.
    pub disk_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// Bytes received and sent on its network interfaces (loopback aside).
    pub net_rx_bytes: Option<u64>,
    pub net_tx_bytes: Option<u64>,
}

/// The host process that holds one sandbox (bwrap, or the VM runner).
#[async_trait]
pub trait SandboxProcess: Send + Sync {
    fn pid(&self) -> Option<u32>;
    fn is_alive(&self) -> bool;
    /// Kills the sandbox and everything in it, and waits until it is gone. A paused sandbox
    /// is killed too (a backend whose frozen processes cannot die thaws them first).
    async fn kill(&self);

    /// Stops every process of the sandbox where it stands, keeping its memory, until
    /// [`SandboxProcess::resume`]. A backend that cannot answers
    /// [`SandboxError::BackendUnsupported`] saying why.
    async fn pause(&self) -> Result<(), SandboxError> {
        Err(SandboxError::BackendUnsupported(
            "this backend cannot pause a sandbox".into(),
        ))
    }

    /// What the sandbox uses now, as far as the backend can tell without asking the guest
    /// (see [`Counters`]); a field it cannot give stays `None`.
    fn counters(&self) -> Counters {
        Counters::default()
    }

    /// The last lines its host side wrote (a VM runner's log and the guest console, a bwrap
    /// sandbox's log), bounded as [`log_tails`] bounds them, each tail `; <name> log tail: ..`;
    /// empty where it keeps none. What an agent that stopped answering carries to its caller.
    fn last_words(&self) -> String {
        String::new()
    }

    /// Continues every process that [`SandboxProcess::pause`] stopped.
    async fn resume(&self) -> Result<(), SandboxError> {
        Err(SandboxError::BackendUnsupported(
            "this backend cannot pause a sandbox".into(),
        ))
    }
}

/// How much of each log a boot error carries.
pub const LOG_TAIL_BYTES: usize = 1500;

/// The last lines of each named log (its older half too, just after a rotation: see the
/// `bounded-log` crate), as a suffix for an error message (`"; console log tail: ..."`); logs
/// that are missing, empty or not regular files add nothing. Only the tail is read, however
/// large the log.
pub fn log_tails(logs: &[(&str, &Path)]) -> String {
    let mut out = String::new();
    for (name, path) in logs {
        let (bytes, _) = bounded_log::tail(path, LOG_TAIL_BYTES as u64).unwrap_or_default();
        let tail = String::from_utf8_lossy(&bytes).trim().replace('\r', "");
        if !tail.is_empty() {
            out.push_str(&format!("; {name} log tail: {tail}"));
        }
    }
    out
}

/// A sandbox held by one child process of the adapter (bwrap, the VM runner): alive while it
/// runs, ended by killing it.
pub struct ChildProcess {
    child: std::sync::Mutex<Option<tokio::process::Child>>,
    pid: Option<u32>,
}

impl ChildProcess {
    pub fn new(child: tokio::process::Child) -> Self {
        let pid = child.id();
        Self {
            child: std::sync::Mutex::new(Some(child)),
            pid,
        }
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<tokio::process::Child>> {
        self.child
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends `signal` to the process while it is alive; `Ok(false)` when it is gone (or being
    /// killed). Its id cannot name another process meanwhile: only this handle reaps it, and
    /// the slot stays locked from the liveness check to the signal.
    pub fn signal(&self, signal: nix::sys::signal::Signal) -> std::io::Result<bool> {
        let mut slot = self.slot();
        let Some(child) = slot.as_mut() else {
            return Ok(false);
        };
        if child.try_wait()?.is_some() {
            return Ok(false);
        }
        let Some(pid) = child.id() else {
            return Ok(false);
        };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal)?;
        Ok(true)
    }
}

#[async_trait]
impl SandboxProcess for ChildProcess {
    fn pid(&self) -> Option<u32> {
        self.pid
    }

    fn is_alive(&self) -> bool {
        matches!(self.slot().as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    async fn kill(&self) {
        let child = self.slot().take();
        if let Some(mut child) = child {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Short name, e.g. `libkrun` or `bwrap`.
    fn name(&self) -> &'static str;

    /// Checks, quickly and without side effects, that this host can run sandboxes.
    fn probe(&self) -> Result<(), HostUnfit>;

    /// Starts a sandbox; the agent inside must answer on the returned stream.
    async fn boot(&self, spec: &BootSpec) -> Result<Booted, SandboxError>;

    /// What this backend makes of a worker VM's tuning (`worker::status`'s `vm_tuning`): a
    /// backend that runs no VM honours none of it.
    fn worker_tuning(&self) -> crate::ops::worker::TuningSupport {
        crate::ops::worker::TuningSupport::NoVm {
            nofile: "not applied: a worker's processes get the open-file limit their launcher \
                     sets, whatever is asked",
        }
    }

    /// What the sandbox's own logs say, for an S300 raised after boot (e.g. the agent's
    /// handshake failed); a suffix such as "; console log tail: ...", or empty.
    fn boot_logs(&self, _layer_dir: &Path) -> String {
        String::new()
    }

    /// Copies the writable layer of the running sandbox held by `process` (booted with
    /// `layer_dir`) into the empty directory `into`, as a snapshot layer later boots stack
    /// (see [`BootSpec::snapshot_layers`]); returns the bytes it holds. Past `limit_bytes` it
    /// stops with [`SandboxError::ResourceLimit`]. The caller has frozen the sandbox when it
    /// could.
    async fn capture_layer(
        &self,
        _process: &dyn SandboxProcess,
        _layer_dir: &Path,
        _into: &Path,
        _limit_bytes: u64,
    ) -> Result<u64, SandboxError> {
        Err(SandboxError::BackendUnsupported(format!(
            "the {} backend cannot snapshot a sandbox's files",
            self.name()
        )))
    }

    /// Removes what a sandbox left in `layer_dir` that plain file removal cannot (mounts).
    /// Called on stop and when reconciling leftovers of an earlier run.
    fn release_layer(&self, _layer_dir: &Path) {}

    /// What the backend's own logs in `layer_dir` say about a sandbox whose agent is gone,
    /// appended to the cause `list` and later calls show (`"; ..."`, or empty).
    fn death_note(&self, _layer_dir: &Path) -> String {
        String::new()
    }

    /// Removes a tree a guest wrote into (a layer, a worker's state directory), never
    /// following a link out of it. A backend whose guests write as host ids the adapter's
    /// user cannot remove (an ordinary user's subordinate ids) removes it as those ids.
    fn remove_guest_tree(&self, path: &Path) -> std::io::Result<()> {
        crate::remove_tree::remove_tree(path)
    }

    /// The host group, besides the adapter's own user, whose processes must traverse the
    /// state directory's `sandboxes/` and `workers/` (a backend whose sandboxes set up their
    /// mounts as other host ids); `None` when only the adapter's user opens paths there. The
    /// directories are closed to everyone else (see `SandboxPlugin::start`).
    fn state_group(&self) -> Option<u32> {
        None
    }

    /// How this backend confines a sandbox on this host (ids, capabilities, seccomp, which
    /// limits are in force), for `adapter::info.backend.isolation`; null when it says nothing.
    fn isolation(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// Whether this host lets the backend bound every sandbox's cpus, memory and pids (see
    /// [`Bounds`]); decided once at start-up.
    fn bounds(&self) -> Bounds {
        Bounds::Held("the backend's own".into())
    }
}

/// A helper program of the adapter: `$env` when set, else `name` next to the running
/// executable (the shell, which the plugins are loaded into), else `name` on the PATH.
pub fn helper_program(env: &str, name: &str) -> PathBuf {
    std::env::var_os(env)
        .map(PathBuf::from)
        .or_else(|| Some(std::env::current_exe().ok()?.parent()?.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(persistent_layer: bool, snapshot_layers: Vec<PathBuf>) -> BootSpec {
        BootSpec {
            sandbox_id: "s".into(),
            image_root: PathBuf::from("/image"),
            layer_dir: PathBuf::from("/layer"),
            cpus: 1,
            memory_mb: 512,
            pids: 64,
            disk_mb: 0,
            network: false,
            egress: Default::default(),
            agent_path: PathBuf::from("/agent"),
            mounts: Vec::new(),
            persistent_layer,
            snapshot_layers,
        }
    }

    /// A snapshot's layers stack under a sandbox only; a worker VM with them is refused
    /// before any backend is asked.
    #[test]
    fn a_worker_vm_never_starts_from_a_snapshot() {
        let layers = vec![PathBuf::from("/snapshots/a")];
        assert!(spec(false, layers.clone()).check().is_ok());
        assert!(spec(true, Vec::new()).check().is_ok());
        let refused = spec(true, layers).check().unwrap_err();
        assert_eq!(
            refused.code(),
            SandboxError::BackendUnsupported(String::new()).code()
        );
        assert!(refused.to_string().contains("cannot start from a snapshot"));
    }
}
