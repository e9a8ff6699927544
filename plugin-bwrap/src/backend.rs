//! Booting a sandbox with bubblewrap: the agent as PID 1 of fresh namespaces, over the
//! sandbox's overlay root, speaking its protocol on stdin/stdout.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;
use sandbox_core::{
    Backend, BootSpec, Booted, ChildProcess, HostUnfit, SandboxError, SandboxProcess,
};
use tokio::process::Command;

use crate::cgroup::{self, Limits};
use crate::mount::OverlaySetup;

/// Where the agent binary appears inside the sandbox.
const AGENT_IN_SANDBOX: &str = "/.iii-agent";
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub struct BwrapBackend {
    bwrap: Option<PathBuf>,
}

impl BwrapBackend {
    pub fn new() -> Self {
        Self {
            bwrap: find_in_path("bwrap"),
        }
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
        if !nix::unistd::geteuid().is_root() {
            return Err(HostUnfit(
                "the bwrap backend runs as root: it mounts each sandbox's overlay root".into(),
            ));
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
        let [upper, work, merged] = ["upper", "work", "merged"].map(|d| spec.layer_dir.join(d));
        for dir in [&upper, &work, &merged] {
            std::fs::create_dir(dir)
                .map_err(|e| boot_error("cannot prepare the sandbox layer", e))?;
        }
        let limits = Limits::create(&spec.sandbox_id, spec.cpus, spec.memory_mb);
        if !limits.is_enforced() {
            tracing::debug!(sandbox_id = %spec.sandbox_id, "no writable cgroup hierarchy: cpus and memory are not enforced");
        }
        let overlay = OverlaySetup::new(
            &spec.image_root,
            &upper,
            &work,
            &merged,
            limits.procs_files(),
        )
        .map_err(|e| boot_error("cannot prepare the overlay", e))?;
        let log = std::fs::File::create(spec.layer_dir.join("sandbox.log"))
            .map_err(|e| boot_error("cannot open the sandbox log", e))?;

        let mut command = Command::new(bwrap);
        command
            .args(bwrap_args(spec, &merged))
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true);
        // SAFETY: `apply_in_child` makes only async-signal-safe system calls on memory prepared
        // before fork (see its contract); `overlay` lives until `spawn` returns.
        #[allow(unsafe_code)]
        unsafe {
            command.pre_exec(move || overlay.apply_in_child());
        }
        // bwrap's --die-with-parent ties the sandbox to the thread that spawns it; tokio's
        // worker threads live as long as the runtime, unlike its blocking pool threads.
        let mut child = command
            .spawn()
            .map_err(|e| boot_error("cannot start bwrap", e))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(SandboxError::BootFailed(
                "bwrap started without its pipes".into(),
            ));
        };
        Ok(Booted {
            reader: Box::new(stdout),
            writer: Box::new(stdin),
            process: Box::new(BwrapProcess {
                process: ChildProcess::new(child),
                sandbox_id: spec.sandbox_id.clone(),
            }),
        })
    }

    fn boot_logs(&self, layer_dir: &Path) -> String {
        sandbox_core::log_tails(&[("sandbox", &layer_dir.join("sandbox.log"))])
    }

    fn release_layer(&self, layer_dir: &Path) {
        if let Some(id) = layer_dir.file_name().and_then(|n| n.to_str()) {
            cgroup::remove(id);
        }
    }
}

fn bwrap_args(spec: &BootSpec, merged: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--unshare-all",
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
    ]
    .map(String::from)
    .to_vec();
    if spec.network {
        args.push("--share-net".into());
    }
    let path = |p: &Path| p.display().to_string();
    args.extend([
        "--bind".into(),
        path(merged),
        "/".into(),
        "--dev".into(),
        "/dev".into(),
        "--proc".into(),
        "/proc".into(),
        "--tmpfs".into(),
        "/tmp".into(),
        "--ro-bind".into(),
        path(&spec.agent_path),
        AGENT_IN_SANDBOX.into(),
        "--hostname".into(),
        "sandbox".into(),
        "--setenv".into(),
        "PATH".into(),
        DEFAULT_PATH.into(),
        "--chdir".into(),
        "/".into(),
        "--".into(),
        AGENT_IN_SANDBOX.into(),
        "--stdio".into(),
    ]);
    args
}

/// bwrap, plus the sandbox's cgroups to remove once it is gone.
struct BwrapProcess {
    process: ChildProcess,
    sandbox_id: String,
}

#[async_trait]
impl SandboxProcess for BwrapProcess {
    fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    fn is_alive(&self) -> bool {
        self.process.is_alive()
    }

    async fn kill(&self) {
        // Killing bwrap kills PID 1 of the sandbox's namespace, and with it every process.
        self.process.kill().await;
        // Waits (briefly) for the sandbox's last processes to exit: off the async workers.
        let id = self.sandbox_id.clone();
        let _ = tokio::task::spawn_blocking(move || cgroup::remove(&id)).await;
    }
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}
