//! The libkrun plugin: sandbox-core over libkrun microVMs. Adapter name `sandbox-libkrun`.
//!
//! Each VM runs in its own child process (`sandbox-libkrun-vm`, crate `vm-runner`), because
//! `krun_start_enter` never returns. This crate itself holds no VM code.

#![forbid(unsafe_code)]

use std::sync::Arc;

use plugin_api::{Manifest, Plugin};
use sandbox_core::{Backend, HostUnfit, SandboxPlugin};

pub const ADAPTER: &str = "sandbox-libkrun";

pub struct LibkrunBackend;

impl Backend for LibkrunBackend {
    fn name(&self) -> &'static str {
        "libkrun"
    }

    fn probe(&self) -> Result<(), HostUnfit> {
        probe::host_can_boot()
    }
}

mod probe;

fn manifest() -> Manifest {
    sandbox_core::functions::manifest(ADAPTER, env!("CARGO_PKG_VERSION"))
}

fn init(config: &serde_json::Value) -> Result<Arc<dyn Plugin>, String> {
    Ok(Arc::new(SandboxPlugin::new(
        ADAPTER,
        env!("CARGO_PKG_VERSION"),
        config,
        LibkrunBackend,
    )?))
}

plugin_api::export_plugin!(manifest, init);
