//! Booting a sandbox as a libkrun microVM: listen on the layer's agent socket, start
//! `sandbox-libkrun-vm` on a specification built for the sandbox, and accept the agent's
//! connection (or report why it never came).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use std::time::Duration;

use async_trait::async_trait;
use sandbox_core::ops::worker::VmTuning;
use sandbox_core::{Backend, BootSpec, Booted, ChildProcess, HostUnfit, SandboxError};
use tokio::net::UnixListener;
use tokio::process::Command;

use crate::failure::{describe_exit, log_tails, BootError};
use crate::layout::Layout;
use crate::vm_spec;

/// The runner binary's name, looked up next to the adapter's executable.
pub const RUNNER: &str = "sandbox-libkrun-vm";
/// Environment variable naming the runner binary instead.
pub const RUNNER_ENV: &str = "SANDBOX_LIBKRUN_VM";
/// How long a booting microVM may take until its agent connects (under the VM lab's
/// emulation a boot takes 4-10 s; the host may be loaded).
const AGENT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

pub struct LibkrunBackend {
    runner: PathBuf,
    /// The `III_VM_*` tuning given to worker VMs (never to sandboxes).
    tuning: VmTuning,
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
        }
    }

    /// The same backend giving worker VMs `tuning` instead.
    pub fn with_tuning(self, tuning: VmTuning) -> Self {
        Self { tuning, ..self }
    }

    /// The runner binary this backend starts.
    pub fn runner(&self) -> &Path {
        &self.runner
    }

    async fn boot_vm(&self, spec: &BootSpec) -> Result<Booted, BootError> {
        if !self.runner.is_file() {
            return Err(BootError::NoRunner(self.runner.display().to_string()));
        }
        let layout = Layout::new(&spec.layer_dir);
        layout.prepare(&spec.agent_path).map_err(BootError::Layer)?;
        let (vm_spec, _) = vm_spec::build(spec, &layout, &self.tuning)?;
        std::fs::write(&layout.spec, vm_spec.to_string()).map_err(BootError::Layer)?;
        // Listening before the VM exists, so the agent's first dial finds us.
        let listener = UnixListener::bind(&layout.socket).map_err(|source| BootError::Listen {
            path: layout.socket.display().to_string(),
            source,
        })?;
        let log = std::fs::File::create(&layout.runner_log).map_err(BootError::Layer)?;
        let log_out = log.try_clone().map_err(BootError::Layer)?;
        // The runner asks for PR_SET_PDEATHSIG, which follows the spawning *thread*: this runs
        // on a tokio worker thread, which lives as long as the plugin's runtime.
        let mut child = Command::new(&self.runner)
            .arg("--spec")
            .arg(&layout.spec)
            .env_clear()
            .envs(runner_env())
            .stdin(Stdio::null())
            .stdout(log_out)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(BootError::Spawn)?;
        let accepted = tokio::select! {
            accepted = tokio::time::timeout(AGENT_CONNECT_TIMEOUT, listener.accept()) => accepted,
            status = child.wait() => {
                let status = status.map(describe_exit).unwrap_or_else(|e| e.to_string());
                return Err(BootError::Exited {
                    status,
                    logs: log_tails(&layout.runner_log, &layout.console_log),
                });
            }
        };
        let stream = match accepted {
            Ok(Ok((stream, _))) => stream,
            Ok(Err(e)) => return Err(BootError::Accept(e)),
            Err(_) => {
                return Err(BootError::NoAgent {
                    secs: AGENT_CONNECT_TIMEOUT.as_secs(),
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
            // The VM, its overlay mount and its virtio-fs servers all live and die with the
            // runner process.
            process: Box::new(ChildProcess::new(child)),
        })
    }
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
        // /proc/self belongs to the effective user; no unsafe call needed to ask.
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        if !root {
            return Err(HostUnfit(
                "the libkrun backend runs as root: the VM runner mounts each sandbox's overlay root"
                    .into(),
            ));
        }
        Ok(())
    }

    fn boot_logs(&self, layer_dir: &Path) -> String {
        let layout = Layout::new(layer_dir);
        log_tails(&layout.runner_log, &layout.console_log)
    }

    async fn boot(&self, spec: &BootSpec) -> Result<Booted, SandboxError> {
        refuse_worker_spec(spec)?;
        refuse_egress(spec)?;
        self.probe()
            .map_err(|unfit| SandboxError::BootFailed(unfit.to_string()))?;
        self.boot_vm(spec)
            .await
            .map_err(|e| SandboxError::BootFailed(e.to_string()))
    }
}

/// Worker VMs need extra mounts (a tmpfs with read-only binds, symlinks) and a persistent
/// layer, which the VM runner's virtio-fs shares do not express yet: refused up front rather
/// than booted without them.
fn refuse_worker_spec(spec: &BootSpec) -> Result<(), SandboxError> {
    if spec.mounts.is_empty() && !spec.persistent_layer {
        return Ok(());
    }
    Err(SandboxError::BootFailed(
        "worker VMs are not served by the libkrun plugin yet (use the bwrap plugin)".into(),
    ))
}

/// libkrun's TSI maps a guest's `connect()` onto the host's own sockets, the host's loopback
/// (and so the engine) included; until egress goes through passt with the policy, a create
/// asking for network is refused rather than given the host's network.
fn refuse_egress(spec: &BootSpec) -> Result<(), SandboxError> {
    if !spec.network {
        return Ok(());
    }
    Err(SandboxError::BootFailed(
        "network egress is not served by the libkrun plugin yet: its TSI networking would reach the host's loopback and the engine, and no egress policy can judge it; create without `network` (or use the bwrap plugin)".into(),
    ))
}

#[cfg(test)]
mod tests;
