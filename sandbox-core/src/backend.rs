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
    pub network: bool,
    /// The static agent binary to run as PID 1 inside.
    pub agent_path: PathBuf,
}

pub type AgentReader = Box<dyn AsyncRead + Send + Unpin>;
pub type AgentWriter = Box<dyn AsyncWrite + Send + Unpin>;

/// A booted sandbox: the agent's byte stream and the process holding the sandbox.
pub struct Booted {
    pub reader: AgentReader,
    pub writer: AgentWriter,
    pub process: Box<dyn SandboxProcess>,
}

/// The host process that holds one sandbox (bwrap, or the VM runner).
#[async_trait]
pub trait SandboxProcess: Send + Sync {
    fn pid(&self) -> Option<u32>;
    fn is_alive(&self) -> bool;
    /// Kills the sandbox and everything in it, and waits until it is gone.
    async fn kill(&self);
}

#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Short name, e.g. `libkrun` or `bwrap`.
    fn name(&self) -> &'static str;

    /// Checks, quickly and without side effects, that this host can run sandboxes.
    fn probe(&self) -> Result<(), HostUnfit>;

    /// Starts a sandbox; the agent inside must answer on the returned stream.
    async fn boot(&self, spec: &BootSpec) -> Result<Booted, SandboxError>;

    /// Removes what a sandbox left in `layer_dir` that plain file removal cannot (mounts).
    /// Called on stop and when reconciling leftovers of an earlier run.
    fn release_layer(&self, _layer_dir: &Path) {}
}
