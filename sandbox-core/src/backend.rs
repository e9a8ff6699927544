//! The seam between the shared sandbox logic and an isolation technology (libkrun microVMs,
//! bubblewrap namespaces). Like cloud-hypervisor's `Hypervisor` trait: chosen at build time
//! by the plugin, probed at start-up so an unfit host gets a fast, explained refusal.

/// Why a backend cannot run sandboxes on this host (reported by `adapter::info` up front and
/// as S300 on create).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HostUnfit(pub String);

pub trait Backend: Send + Sync + 'static {
    /// Short name, e.g. `libkrun` or `bwrap`.
    fn name(&self) -> &'static str;

    /// Checks, quickly and without side effects, that this host can run sandboxes.
    fn probe(&self) -> Result<(), HostUnfit>;
}
