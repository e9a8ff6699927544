//! The libkrun plugin: sandbox-core over libkrun microVMs. Adapter name `sandbox-libkrun`.
//!
//! Each VM runs in its own child process (`sandbox-libkrun-vm`, crate `vm-runner`), because
//! `krun_start_enter` never returns. This crate itself holds no VM code.

#![forbid(unsafe_code)]

use std::sync::Arc;

use async_trait::async_trait;
use plugin_api::{Manifest, Plugin};
use sandbox_core::{Backend, BootSpec, Booted, HostUnfit, SandboxError, SandboxPlugin};

pub const ADAPTER: &str = "sandbox-libkrun";

pub struct LibkrunBackend;

#[async_trait]
impl Backend for LibkrunBackend {
    fn name(&self) -> &'static str {
        "libkrun"
    }

    fn probe(&self) -> Result<(), HostUnfit> {
        probe::host_can_boot()
    }

    async fn boot(&self, _spec: &BootSpec) -> Result<Booted, SandboxError> {
        self.probe()
            .map_err(|unfit| SandboxError::BootFailed(unfit.to_string()))?;
        // Booting through `sandbox-libkrun-vm` (vsock-bridged agent) is the next step; until it
        // lands, say so instead of pretending.
        Err(SandboxError::BootFailed(
            "this build of the libkrun plugin does not boot sandboxes yet; use the bwrap plugin"
                .into(),
        ))
    }
}

mod probe;

fn manifest() -> Manifest {
    sandbox_core::functions::manifest(ADAPTER, env!("CARGO_PKG_VERSION"))
}

fn init(config: &serde_json::Value) -> Result<Arc<dyn Plugin>, String> {
    Ok(SandboxPlugin::start(
        ADAPTER,
        env!("CARGO_PKG_VERSION"),
        config,
        LibkrunBackend,
    )?)
}

plugin_api::export_plugin!(manifest, init);
